"""Embeddings on the CPU: the default engine behind the real gateway (the `openai` SDK as the
client, 32 texts a request), as shipped (f32 weights) and with its weights rounded to bytes
(`cpu_weights = "int8"`), beside sentence-transformers in process (`encode`, batches of 32), on
the same BERT-base-shaped model (random weights, 110M parameters, a WordPiece vocabulary of
30522), the same texts, machine and run. Rounds alternate (A B C A B C A B C); each side's
figure is the median of its rounds, with their spread. Writes bench/results/embeddings.{json,md}.

Usage: python embeddings_bench.py TURNPIKE_BIN
"""

import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BIN = sys.argv[1]
FOLDER = ROOT / "target/bench/models/bert-base"
ROUNDS, TEXTS, BATCH = 3, 256, 32
torch.set_num_threads(os.cpu_count() or 1)


def make_model():
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    if (FOLDER / "modules.json").exists():
        return
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = set(letters) | {"##" + c for c in letters}
    while len(pieces) < 30522 - 5:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
        pieces.add(word if rng.random() < 0.6 else "##" + word)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(pieces)
    raw = FOLDER.parent / "bert-base-hf"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(raw / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab)), add_pooling_layer=False).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    transformer = models.Transformer(str(raw))
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(FOLDER))


def texts():
    rng = random.Random(1)
    words = [line for line in (FOLDER.parent / "bert-base-hf/vocab.txt").read_text().split() if line.isalpha()]
    # Sentences of 20 to 60 words: the passages a retrieval index embeds.
    return [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) for _ in range(TEXTS)]


def main():
    make_model()
    from sentence_transformers import SentenceTransformer
    import openai

    batch = texts()
    reference = SentenceTransformer(str(FOLDER), device="cpu")
    env = dict(os.environ, TURNPIKE_CACHE_DIR=str(ROOT / "target/bench/cache"))
    config = ROOT / "target/bench/embeddings-int8.toml"
    config.write_text("\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "default"',
        f'plugin = "{Path(BIN).with_name("libturnpike_cuda.so")}"', "[engines.config]", "[[engines.config.models]]",
        'id = "bert-base"', f'path = "{FOLDER}"', 'device = "cpu"', 'cpu_weights = "int8"', "[[models]]",
        'name = "bert-base"', 'engine = "default"', f'folder = "{FOLDER}"', ""]))
    servers = {
        "turnpike": [BIN, "serve", "--model", str(FOLDER), "--name", "bert-base", "--listen", "127.0.0.1:0"],
        "turnpike-int8": [BIN, "serve", "--config", str(config)],
    }
    running = {name: subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
               for name, args in servers.items()}
    try:
        clients = {}
        for name, server in running.items():
            line = server.stdout.readline()
            clients[name] = openai.OpenAI(base_url=line.split()[-1] + "/v1", api_key="unused", timeout=600)
        tokens = sum(len(reference.tokenizer(t)["input_ids"]) for t in batch)

        def ours(client):
            start = time.perf_counter()
            for i in range(0, TEXTS, BATCH):
                client.embeddings.create(model="bert-base", input=batch[i : i + BATCH])
            return TEXTS / (time.perf_counter() - start)

        def theirs():
            start = time.perf_counter()
            reference.encode(batch, batch_size=BATCH)
            return TEXTS / (time.perf_counter() - start)

        sides = {name: (lambda c=client: ours(c)) for name, client in clients.items()}
        sides["sentence-transformers"] = theirs
        for measure in sides.values():  # warm each
            measure()
        rounds = {name: [] for name in sides}
        for _ in range(ROUNDS):
            for name, measure in sides.items():
                rounds[name].append(measure())
        # The vectors agree, so the rates compare the same work.
        want = reference.encode(batch[:32])
        cosine = {}
        for name, client in clients.items():
            got = client.embeddings.create(model="bert-base", input=batch[:32]).data
            cosine[name] = min(float(sum(a * b for a, b in zip(g.embedding, w))) for g, w in zip(got, want))
    finally:
        for server in running.values():
            server.terminate()
            server.wait(timeout=30)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    median = {k: statistics.median(v) for k, v in rounds.items()}
    ratio = {name: median[name] / median["sentence-transformers"] for name in clients}
    doc = {"benchmark": "embeddings", "model": "BERT-base shape (random weights), mean pooling, normalised",
           "cpu": cpu, "cores": os.cpu_count(), "texts": TEXTS, "batch": BATCH, "tokens": tokens,
           "texts_per_s": median, "rounds": rounds, "ratio": ratio, "min_cosine": cosine}
    out = ROOT / "bench/results"
    json.dump(doc, open(out / "embeddings.json", "w"), indent=2)
    spread = {k: f"{min(v):.1f}–{max(v):.1f}" for k, v in rounds.items()}
    label = {"turnpike": "Turnpike, weights as shipped (f32)",
             "turnpike-int8": "Turnpike, `cpu_weights = \"int8\"`", "sentence-transformers": "sentence-transformers"}
    rows = [f"| {label[k]} | {median[k]:.1f} | {spread[k]} | "
            + (f"{ratio[k]:.2f}x | {cosine[k]:.6f} |" if k in ratio else "1.00x | 1 |") for k in rounds]
    (out / "embeddings.md").write_text("\n".join([
        "# Embeddings on the CPU: Turnpike vs sentence-transformers", "",
        f"BERT-base shape (110M parameters, random weights, mean pooling, normalised), {TEXTS} texts of "
        f"20–60 words ({tokens} tokens), batches of {BATCH}; {cpu}, {os.cpu_count()} cores; "
        f"{ROUNDS} alternating rounds, with `bench/run-embeddings.sh`. Turnpike is the real gateway "
        "and default engine behind HTTP (the `openai` SDK as client, on the same cores); "
        "sentence-transformers runs in process (torch, f32).", "",
        "| | texts/s (median) | rounds | vs sentence-transformers | least cosine to its vectors |",
        "|---|---:|---:|---:|---:|", *rows, ""]))
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
