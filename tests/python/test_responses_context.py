"""Managing a conversation's length with the Responses API: `truncation: "auto"` (the oldest
items go until the prompt fits the context) and `POST /v1/responses/compact` (the model's own
summary, carried in a `compaction` item that later requests send back), with the official SDK.
The `short` model echoes its prompt in a context of 512 tokens, so what the model was shown can
be read from its answer."""

import httpx
import openai
import pytest
from openresponses_types import types as spec

SHORT_CONTEXT = 512


def conversation(turns):
    """`turns` numbered question and answer pairs, each about 50 tokens."""
    items = []
    for n in range(turns):
        items.append({"role": "user", "content": f"Question number {n} asks about the colour of the sky"})
        items.append({"role": "assistant", "content": f"Answer number {n} says that the sky is blue"})
    return items


def test_auto_truncation_drops_the_oldest_items_until_the_prompt_fits(client):
    items = conversation(12) + [{"role": "user", "content": "Last question: what was asked?"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="short", input=items)
    assert err.value.body["code"] == "context_length_exceeded"
    for explicit in ({}, {"truncation": "disabled"}):
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="short", input=items, **explicit)
    response = client.responses.create(model="short", input=items, truncation="auto", max_output_tokens=16)
    assert response.truncation == "auto" and response.status in ("completed", "incomplete")
    assert response.usage.input_tokens + 16 <= SHORT_CONTEXT
    # The model saw the newest items (the echo starts with its prompt), not the oldest, and its
    # prompt starts at a question.
    assert "number 0" not in response.output_text and "Question number" in response.output_text
    assert response.usage.input_tokens >= client.responses.input_tokens.count(
        model="short", input=items[-1:]).input_tokens
    # The whole conversation is kept: the next turn continues all of it, truncated again.
    stored = client.responses.input_items.list(response.id, order="asc", limit=100)
    assert len(stored.data) == len(items)
    follow = client.responses.create(model="short", input="And now?", previous_response_id=response.id,
                                     truncation="auto", max_output_tokens=16)
    assert follow.usage.input_tokens + 16 <= SHORT_CONTEXT
    # A last item too long on its own is still refused.
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="short", input="word " * 400, truncation="auto")
    assert err.value.body["code"] == "context_length_exceeded"


def test_compaction_summarises_and_its_item_continues_the_conversation(gateway, client):
    items = conversation(2)
    raw = client.responses.with_raw_response.compact(model="echo", input=items)
    spec.CompactResource.model_validate(raw.http_response.json())
    compacted = raw.parse()
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    kinds = [(item.type, getattr(item, "role", None)) for item in compacted.output]
    assert kinds == [("message", "user"), ("message", "user"), ("compaction", None)]
    summary = compacted.output[-1]
    assert summary.id.startswith("cmp_") and summary.encrypted_content
    assert compacted.usage.input_tokens > 0 and compacted.usage.output_tokens > 0
    # The next request sends the compacted output as its input. The model is shown the summary:
    # the echo model answers with its prompt up to the first end of turn, and the echo model's
    # summary is its own prompt's first message.
    sent = raw.http_response.json()["output"]
    follow = client.responses.create(model="echo", input=[sent[-1], {"role": "user", "content": "Go on."}])
    assert follow.output_text.startswith("user\n\nA summary of the earlier conversation:")
    assert "Question number 0" in follow.output_text
    whole = client.responses.create(model="chat", input=[*sent, {"role": "user", "content": "Go on."}],
                                    max_output_tokens=4)
    stored = client.responses.input_items.list(whole.id, order="asc")
    assert [i.type for i in stored.data] == ["message", "message", "compaction", "message"]
    without = client.responses.input_tokens.count(model="chat", input=[*sent[:-1], {"role": "user", "content": "Go on."}])
    assert whole.usage.input_tokens > without.input_tokens
    # A stored conversation compacts too, with or without more input.
    first = client.responses.create(model="chat", input="Remember the number 7.", max_output_tokens=8)
    alone = client.responses.compact(model="chat", previous_response_id=first.id)
    assert [i.type for i in alone.output] == ["message", "compaction"]
    assert alone.output[0].content[0].text == "Remember the number 7."
    more = client.responses.compact(model="chat", previous_response_id=first.id, input="And 8.")
    assert [i.type for i in more.output] == ["message", "message", "compaction"]


def test_a_conversation_too_long_for_the_context_compacts_from_its_newest_items(client):
    items = conversation(12)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="short", input=items)
    compacted = client.responses.compact(model="short", input=items)
    assert [i.type for i in compacted.output] == ["message"] * 12 + ["compaction"]
    # The summary had room: the prompt left at least the default output budget (half the context).
    assert compacted.usage.input_tokens <= SHORT_CONTEXT // 2
    assert compacted.usage.output_tokens > 0


def test_compaction_refusals_are_clear(gateway, client):
    for body, status, param in (
        ({"model": "chat"}, 400, "input"),
        ({"model": "chat", "input": [{"type": "compaction", "encrypted_content": "gAAAA-not-ours"}]}, 400,
         "input[0].encrypted_content"),
        ({"model": "chat", "previous_response_id": "resp_missing"}, 404, "previous_response_id"),
        ({"model": "missing", "input": "x"}, 404, "model"),
    ):
        r = httpx.post(f"{gateway}/v1/responses/compact", json=body, timeout=30)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["param"] == param, r.text
    # A compaction item that is not ours is refused on create too.
    r = httpx.post(f"{gateway}/v1/responses", json={"model": "chat", "input": [
        {"type": "compaction", "encrypted_content": "gAAAA-not-ours"}]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].encrypted_content"
