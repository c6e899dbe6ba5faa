"""Diverse (group) beam search by `transformers`' own `generate`, for test_beams.py.

Runs under the pinned release that still has it (tests/numerics/requirements-group-beams.txt,
first on PYTHONPATH). Reads {"model": DIR, "end_tokens": [...], "cases": [{"ids", "width",
"groups", "n", "max_tokens", "length_penalty", "diversity_penalty"}]} on stdin; writes, per case,
each returned sequence's generated tokens (the end token excluded), whether it ended on an end
token, and each token's log-probability under the model (log-softmax of the raw logits).
"""

import json
import sys
import warnings

import torch
import transformers
from transformers import AutoModelForCausalLM

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
torch.set_num_threads(2)

job = json.load(sys.stdin)
model = AutoModelForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
ends = set(job["end_tokens"])
results = []
for case in job["cases"]:
    ids = torch.tensor([case["ids"]])
    with torch.no_grad():
        out = model.generate(ids, num_beams=case["width"], num_beam_groups=case["groups"],
                             diversity_penalty=case["diversity_penalty"], length_penalty=case["length_penalty"],
                             num_return_sequences=case["n"], max_new_tokens=case["max_tokens"], do_sample=False,
                             early_stopping=False)
    answers = []
    for row in out[:, ids.shape[1]:].tolist():
        stop = next((i for i, t in enumerate(row) if t in ends), None)
        tokens = row if stop is None else row[:stop]
        with torch.no_grad():
            logits = model(torch.tensor([case["ids"] + tokens])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        first = len(case["ids"]) - 1
        token_logprobs = [float(logprobs[first + i, t]) for i, t in enumerate(tokens)]
        answers.append({"tokens": tokens, "finish": "length" if stop is None else "stop",
                        "logprobs": token_logprobs})
    results.append(answers)
json.dump({"version": transformers.__version__, "results": results}, sys.stdout)
