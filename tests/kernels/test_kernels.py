"""The default engine's CUDA kernels, run on the CPU under `emulation.hpp`, against NumPy.

No GPU is needed: every kernel file of `engines/cuda/kernels/` is compiled with g++ together
with an emulation of the CUDA built-ins it uses (threads, blocks, `__syncthreads`, warp
shuffles), then each kernel runs on small inputs and is compared with a direct NumPy
computation. This checks the kernels' arithmetic, indexing and synchronisation; the GPU run in
`bench/gpu/` checks them on the hardware against the CPU device and `transformers`.
"""

import ctypes
import pathlib
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNELS = ROOT / "engines" / "cuda" / "kernels"
FILES = ["embedding", "norm", "rotary", "activation", "attention", "dense_attention", "sampling"]
NEG_INF = np.float32(-np.inf)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    here = pathlib.Path(__file__).parent
    parts = [(here / "emulation.hpp").read_text(), (KERNELS / "prelude.cuh").read_text()]
    parts += [(KERNELS / f"{name}.cu").read_text() for name in FILES]
    parts.append((here / "launchers.cpp").read_text())
    folder = tmp_path_factory.mktemp("kernels")
    source = folder / "kernels.cpp"
    source.write_text("\n".join(parts))
    library = folder / "kernels.so"
    subprocess.run(
        ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-Wall", "-Werror",
         "-Wno-unused-function", "-Wno-unknown-pragmas", "-o", str(library), str(source)],
        check=True,
    )
    return ctypes.CDLL(str(library))


def bf16(x):
    """Rounds to bf16 (nearest even) and returns the 16-bit patterns."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def rounded(x):
    return f32(bf16(x))


def ptr(array):
    return ctypes.c_void_p(None if array is None else array.ctypes.data)


def call(lib, name, grid, threads, *args):
    converted = []
    for a in args:
        if isinstance(a, np.ndarray) or a is None:
            converted.append(ptr(a))
        elif isinstance(a, float):
            converted.append(ctypes.c_float(a))
        else:
            converted.append(ctypes.c_int(a))
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    getattr(lib, f"emu_{name}")(ctypes.c_uint(gx), ctypes.c_uint(gy), ctypes.c_uint(gz), ctypes.c_uint(threads), *converted)


def close(actual, expected, tolerance):
    scale = max(float(np.max(np.abs(expected))), 1e-6)
    error = float(np.max(np.abs(actual - expected))) / scale
    assert error < tolerance, f"relative error {error:.2e}"


rng = np.random.default_rng(3)


def test_embedding_gather(lib):
    table = bf16(rng.normal(size=(50, 24)))
    ids = np.array([3, 0, 49, 3], dtype=np.int32)
    out = np.zeros((4, 24), dtype=np.float32)
    call(lib, "embedding_gather", (4,), 32, ids, table, out, 24, 1.0)
    np.testing.assert_array_equal(out, f32(table)[ids])
    # Gemma's √hidden: both factors bf16, the product rounded.
    call(lib, "embedding_gather", (4,), 32, ids, table, out, 24, float(np.sqrt(2304.0)))
    np.testing.assert_array_equal(out, rounded(f32(table)[ids] * 48.0))


def test_rms_norm_rows_normalises_in_place(lib):
    t, d, eps = 3, 40, 1e-6
    x = rng.normal(size=(t, d)).astype(np.float32) * 3
    weight = bf16(rng.normal(size=d) + 1.0)
    inv = 1.0 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + eps)
    expected = rounded(rounded(x * inv) * f32(weight))
    got = x.copy()
    call(lib, "rms_norm_rows", (t,), 32, got, weight, d, eps)
    close(got, expected, 1e-2)


def test_logit_softcap(lib):
    logits = (rng.normal(size=(2, 300)) * 40).astype(np.float32)
    got = logits.copy()
    call(lib, "logit_softcap", (2, 2), 256, got, 300, 30.0)
    close(got, 30.0 * np.tanh(logits / 30.0), 1e-5)


@pytest.mark.parametrize("threads", [32, 96])
def test_rms_norm_adds_the_residual_and_gathers_rows(lib, threads):
    t, d, eps = 5, 72, 1e-5
    resid = rng.normal(size=(t, d)).astype(np.float32)
    add = rng.normal(size=(t, d)).astype(np.float32)
    bias = bf16(rng.normal(size=d))
    weight = bf16(rng.normal(size=d) + 1.0)
    v = resid + add + f32(bias)
    inv = 1.0 / np.sqrt(np.mean(v.astype(np.float64) ** 2, axis=1, keepdims=True) + eps)
    expected = rounded(rounded(v * inv) * f32(weight))
    got = resid.copy()
    out = np.zeros((t, d), dtype=np.uint16)
    call(lib, "rms_norm_residual", (t,), threads, got, add, bias, None, weight, out, d, eps)
    close(got, v, 1e-6)
    close(f32(out), expected, 1e-2)
    rows = np.array([4, 1], dtype=np.int32)
    got = resid.copy()
    out = np.zeros((2, d), dtype=np.uint16)
    call(lib, "rms_norm_residual", (2,), threads, got, add, bias, rows, weight, out, d, eps)
    close(f32(out), expected[rows], 1e-2)
    np.testing.assert_array_equal(got[0], resid[0])


def test_silu_and_mul(lib):
    t, inter = 3, 70
    gate_up = rng.normal(size=(t, 2 * inter)).astype(np.float32) * 3
    g, u = rounded(gate_up[:, :inter]), rounded(gate_up[:, inter:])
    expected = rounded(rounded(g / (1 + np.exp(-g))) * u)
    out = np.zeros((t, inter), dtype=np.uint16)
    call(lib, "silu_and_mul", (t, 2), 64, gate_up, out, inter, 0)
    close(f32(out), expected, 1e-2)
    gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    call(lib, "silu_and_mul", (t, 2), 64, gate_up, out, inter, 1)
    close(f32(out), rounded(rounded(gelu) * u), 1e-2)


@pytest.mark.parametrize("head_norm,rotated,scale", [(False, 16, 1.0), (True, 16, 1.0), (False, 12, 1.19)],
                         ids=["plain", "qk-norm", "partial-scaled"])
def test_rotary_rotates_q_and_k_and_writes_the_cache(lib, head_norm, rotated, scale):
    """The leading `rotated` values of each head turn (Phi-4-mini turns 3/4 of a head), their
    cosines and sines times `scale` (LongRoPE's attention factor); the rest pass through."""
    t, hq, hkv, hd, slots_total = 4, 4, 2, 16, 32
    width = (hq + 2 * hkv) * hd
    qkv = rng.normal(size=(t, width)).astype(np.float32)
    bias = bf16(rng.normal(size=width) * 0.1)
    q_norm, k_norm = (bf16(1 + rng.normal(size=hd) * 0.3) for _ in range(2))
    eps = 1e-6
    positions = np.array([0, 7, 300, 12], dtype=np.int32)
    inv_freq = (1.0 / 10000 ** (np.arange(0, rotated, 2) / rotated)).astype(np.float32)
    slots = np.array([5, 17, -1, 30], dtype=np.int32)
    q_out = np.zeros((t, hq, hd), dtype=np.float32)
    k_cache = np.zeros((slots_total, hkv, hd), dtype=np.uint16)
    v_cache = np.zeros((slots_total, hkv, hd), dtype=np.uint16)
    norms = (q_norm, k_norm) if head_norm else (None, None)
    call(lib, "rotary_kv_store", (t, hq + 2 * hkv), hd // 2, qkv, bias, *norms, eps, positions,
         inv_freq, rotated // 2, scale, slots, q_out, k_cache, v_cache, hq, hkv, hd)
    x = rounded(qkv + f32(bias)).reshape(t, hq + 2 * hkv, hd)
    if head_norm:
        # Qwen3: each q and k head RMS-normalised, rounded, then scaled by its weight.
        heads = x[:, : hq + hkv]
        inv = 1 / np.sqrt((heads**2).mean(axis=2, keepdims=True) + eps)
        weight = np.concatenate([np.tile(f32(q_norm), (hq, 1)), np.tile(f32(k_norm), (hkv, 1))])
        x = x.copy()
        x[:, : hq + hkv] = rounded(rounded(heads * inv) * weight)
    angle = positions[:, None].astype(np.float32) * inv_freq[None, :]
    cos, sin = scale * np.cos(angle)[:, None, :], scale * np.sin(angle)[:, None, :]
    half = rotated // 2
    a, b, rest = x[:, :, :half], x[:, :, half:rotated], x[:, :, rotated:]
    rotated = np.concatenate([a * cos - b * sin, b * cos + a * sin, rest], axis=2)
    close(q_out, rounded(rotated[:, :hq]), 1e-2)
    for row, slot in enumerate(slots):
        if slot < 0:
            continue
        close(f32(k_cache[slot]), rotated[row, hq:hq + hkv], 1e-2)
        close(f32(v_cache[slot]), x[row, hq + hkv:], 1e-2)
    written = {int(s) for s in slots if s >= 0}
    untouched = [s for s in range(slots_total) if s not in written]
    assert not k_cache[untouched].any() and not v_cache[untouched].any()


def softmax_attention(q, keys, values, slots, kv, scale, softcap):
    """One query head against the given cache slots, in float64."""
    scores = keys[slots, kv] @ q * scale
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    weights = np.exp(scores - scores.max())
    return weights @ values[slots, kv] / weights.sum()


@pytest.mark.parametrize("splits,first,hd,window,softcap",
                         [(1, 0, 64, 0, 0.0), (4, 0, 64, 0, 0.0), (7, 0, 16, 0, 0.0), (3, 0, 80, 0, 0.0),
                          (1, 0, 64, 6, 0.0), (4, 0, 64, 3, 0.0), (4, 0, 64, 3, 2.0), (1, 0, 16, 0, 1.5),
                          (1, 0, 64, 0, 2.0), (1, 2, 64, 0, 0.0), (5, 3, 16, 4, 0.0)])
def test_paged_attention_matches_softmax_attention(lib, splits, first, hd, window, softcap):
    """Tokens first.. of the step, each context cut into `splits` even spans of its own."""
    hq, hkv, block_size, num_blocks, max_blocks = 4, 2, 4, 24, 6
    k_cache = bf16(rng.normal(size=(num_blocks * block_size, hkv, hd)))
    v_cache = bf16(rng.normal(size=(num_blocks * block_size, hkv, hd)))
    tables = rng.permutation(num_blocks)[: 3 * max_blocks].reshape(3, max_blocks).astype(np.int32)
    # A decode token of sequence 0 at position 19, then a prefill chunk of sequence 1 at
    # positions 3..7 (after a cached prefix), then sequence 2's first token.
    seq_of = np.array([0, 1, 1, 1, 1, 1, 2], dtype=np.int32)
    context = np.array([20, 4, 5, 6, 7, 8, 1], dtype=np.int32)
    t = len(seq_of)
    n = t - first
    q = rng.normal(size=(t, hq, hd)).astype(np.float32)
    scale = float(1 / np.sqrt(hd))
    part_max = np.zeros(n * hq * splits, dtype=np.float32)
    part_sum = np.zeros_like(part_max)
    part_acc = np.zeros(n * hq * splits * hd, dtype=np.float32)
    out = np.zeros((t, hq, hd), dtype=np.uint16)
    stride = np.array([max_blocks], dtype=np.int32)
    call(lib, "paged_attention", (n, hq, splits), 128, q, k_cache, v_cache, context, seq_of, tables,
         stride, block_size, hq, hkv, hd, scale, softcap, window, first, part_max, part_sum, part_acc,
         out)
    if splits > 1:
        call(lib, "attention_combine", (n, hq), 128, part_max, part_sum, part_acc, splits, hd, first, out)
    keys, values = f32(k_cache), f32(v_cache)
    expected = np.zeros((t, hq, hd), dtype=np.float64)
    for i in range(first, t):
        positions = np.arange(max(0, context[i] - window) if window else 0, context[i])
        slots = tables[seq_of[i], positions // block_size] * block_size + positions % block_size
        for h in range(hq):
            expected[i, h] = softmax_attention(q[i, h], keys, values, slots, h // (hq // hkv), scale, softcap)
    assert not out[:first].any(), "rows before the range were written"
    close(f32(out[first:]), expected[first:], 1e-2)


def test_gather_kv_lays_a_sequence_out_per_head(lib):
    hkv, hd, block_size, num_blocks, max_blocks, positions = 3, 16, 4, 12, 5, 18
    k_cache = bf16(rng.normal(size=(num_blocks * block_size, hkv, hd)))
    v_cache = bf16(rng.normal(size=(num_blocks * block_size, hkv, hd)))
    tables = rng.permutation(num_blocks)[: 2 * max_blocks].reshape(2, max_blocks).astype(np.int32)
    stride = np.array([max_blocks], dtype=np.int32)
    k_out = np.zeros((hkv, positions, hd), dtype=np.uint16)
    v_out = np.zeros_like(k_out)
    call(lib, "gather_kv", (positions,), 8, k_cache, v_cache, tables, stride, 1, block_size, hkv, hd,
         k_out, v_out)
    p = np.arange(positions)
    slots = tables[1, p // block_size] * block_size + p % block_size
    np.testing.assert_array_equal(k_out, k_cache[slots].transpose(1, 0, 2))
    np.testing.assert_array_equal(v_out, v_cache[slots].transpose(1, 0, 2))


def test_pack_queries_rounds_a_row_range_per_head(lib):
    t, hq, hd, first, rows = 9, 4, 24, 3, 5
    q = rng.normal(size=(t, hq, hd)).astype(np.float32)
    out = np.zeros((hq, rows, hd), dtype=np.uint16)
    call(lib, "pack_queries", (rows, hq), 16, q, first, hd, out)
    np.testing.assert_array_equal(out, bf16(q[first:first + rows]).transpose(1, 0, 2))


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (5, 0.0), (0, 2.0), (3, 1.5)])
def test_masked_softmax_sees_only_earlier_positions(lib, window, softcap):
    """Query i of a tile at position first + i sees positions j <= first + i (within the
    window); the rest of its row is 0. A row wider than the block's 32 threads is looped over."""
    batch, rows, first = 2, 6, 40
    width = first + rows
    scores = (rng.normal(size=(batch, rows, width)) * 3).astype(np.float32)
    probs = np.full((batch, rows, width), 0xFFFF, dtype=np.uint16)
    call(lib, "masked_softmax", (rows, batch), 32, scores, width, first, window, softcap, probs)
    expected = np.zeros((batch, rows, width))
    for b in range(batch):
        for i in range(rows):
            position = first + i
            low = max(0, position - window + 1) if window else 0
            s = scores[b, i, low:position + 1].astype(np.float64)
            if softcap:
                s = softcap * np.tanh(s / softcap)
            w = np.exp(s - s.max())
            expected[b, i, low:position + 1] = w / w.sum()
    np.testing.assert_array_equal(f32(probs) == 0, expected == 0)
    close(f32(probs), expected, 1e-2)


def test_dense_attention_composes_to_softmax_attention(lib):
    """The product path as the device runs it (the two products done here in NumPy): gather,
    pack, scores, masked softmax, weighted sum, for a chunk after a cached prefix."""
    hq, hkv, hd, block_size, num_blocks, max_blocks = 4, 2, 16, 4, 16, 8
    start, length = 5, 9
    context = start + length
    k_cache = bf16(rng.normal(size=(num_blocks * block_size, hkv, hd)))
    v_cache = bf16(rng.normal(size=(num_blocks * block_size, hkv, hd)))
    tables = rng.permutation(num_blocks)[:max_blocks].reshape(1, max_blocks).astype(np.int32)
    stride = np.array([max_blocks], dtype=np.int32)
    q = rng.normal(size=(length, hq, hd)).astype(np.float32)
    k_out = np.zeros((hkv, context, hd), dtype=np.uint16)
    v_out = np.zeros_like(k_out)
    call(lib, "gather_kv", (context,), 32, k_cache, v_cache, tables, stride, 0, block_size, hkv, hd,
         k_out, v_out)
    packed = np.zeros((hq, length, hd), dtype=np.uint16)
    call(lib, "pack_queries", (length, hq), 32, q, 0, hd, packed)
    scale, group = float(1 / np.sqrt(hd)), hq // hkv
    out = np.zeros((length, hq, hd))
    for g in range(group):
        heads = np.arange(hkv) * group + g
        scores = (np.einsum("bid,bjd->bij", f32(packed[heads]), f32(k_out)) * scale).astype(np.float32)
        probs = np.zeros(scores.shape, dtype=np.uint16)
        call(lib, "masked_softmax", (length, hkv), 32, np.ascontiguousarray(scores), context, start, 0, 0.0, probs)
        out[:, heads] = np.einsum("bij,bjd->ibd", f32(probs), f32(v_out))
    keys, values = f32(k_cache), f32(v_cache)
    for i in range(length):
        positions = np.arange(start + i + 1)
        slots = tables[0, positions // block_size] * block_size + positions % block_size
        for h in range(hq):
            close(out[i, h], softmax_attention(q[i, h], keys, values, slots, h // group, scale, 0.0), 2e-2)


class Rows:
    """Builds `SampleRow`s (the kernel's struct) and their lists."""

    DTYPE = np.dtype([
        ("logits_row", "<i4"), ("temperature", "<f4"), ("top_k", "<i4"), ("top_p", "<f4"),
        ("min_p", "<f4"), ("repetition_penalty", "<f4"), ("presence_penalty", "<f4"),
        ("frequency_penalty", "<f4"), ("uniform", "<f4"), ("top_logprobs", "<i4"),
        ("penalty_begin", "<i4"), ("penalty_end", "<i4"), ("banned_begin", "<i4"), ("banned_end", "<i4"),
        ("mask_offset", "<i4"),
    ])

    def __init__(self):
        self.rows, self.tokens, self.counts, self.banned, self.masks = [], [], [], [], []

    def add(self, logits_row=0, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition=1.0,
            presence=0.0, frequency=0.0, uniform=0.0, top_logprobs=-1, penalties=(), banned=(), allowed=None):
        """`allowed`: the token ids a grammar allows (a bitmask row), or None for no mask."""
        pb = len(self.tokens)
        for token, count in penalties:
            self.tokens.append(token)
            self.counts.append(count)
        bb = len(self.banned)
        self.banned.extend(banned)
        mask_offset = -1
        if allowed is not None:
            mask_offset = len(self.masks)
            words = [0] * ((max(allowed, default=0) // 32) + 1 + 64)
            for t in allowed:
                words[t // 32] |= 1 << (t % 32)
            self.masks.extend(words)
        self.rows.append((logits_row, temperature, top_k, top_p, min_p, repetition, presence,
                          frequency, uniform, top_logprobs, pb, len(self.tokens), bb, len(self.banned),
                          mask_offset))

    def run(self, lib, logits, threads=128):
        n, vocab = len(self.rows), logits.shape[1]
        params = np.array(self.rows, dtype=self.DTYPE)
        tokens = np.array(self.tokens + [0], dtype=np.int32)
        counts = np.array(self.counts + [0], dtype=np.int32)
        banned = np.array(self.banned + [0], dtype=np.int32)
        scratch = np.zeros((n, vocab), dtype=np.float32)
        out_token = np.full(n, -7, dtype=np.int32)
        out_logprob = np.zeros(n, dtype=np.float32)
        top_ids = np.full((n, 20), -1, dtype=np.int32)
        top_lp = np.zeros((n, 20), dtype=np.float32)
        masks = np.array(self.masks + [0], dtype=np.uint32)
        call(lib, "sample_rows", (n,), threads, np.ascontiguousarray(logits, dtype=np.float32), vocab,
             params, tokens, counts, banned, scratch, out_token, out_logprob, top_ids, top_lp, masks)
        return out_token, out_logprob, top_ids, top_lp


def draw(x, temperature, uniform, keep=None):
    """Inverse CDF in id order over the kept tokens, as the kernel draws."""
    w = np.exp((x.astype(np.float64) - x.max()) / temperature)
    if keep is not None:
        w = np.where(keep, w, 0.0)
    cumulative = np.cumsum(w)
    return int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))


def test_greedy_logprobs_bans_and_fallback(lib):
    vocab = 600
    logits = rng.normal(size=(2, vocab)).astype(np.float32) * 3
    logits[1, 17] = np.nan
    best = int(np.argmax(logits[0]))
    rows = Rows()
    rows.add(top_logprobs=5)
    rows.add(banned=[best], top_logprobs=0)
    rows.add(banned=list(range(vocab)))
    rows.add(logits_row=1, top_logprobs=3)
    token, logprob, top_ids, top_lp = rows.run(lib, logits)
    x = logits[0].astype(np.float64)
    log_softmax = x - x.max() - np.log(np.exp(x - x.max()).sum())
    order = np.argsort(-x, kind="stable")
    assert token[0] == best
    assert abs(logprob[0] - log_softmax[best]) < 1e-4
    assert list(top_ids[0, :5]) == list(order[:5])
    close(top_lp[0, :5], log_softmax[order[:5]], 1e-4)
    assert token[1] == order[1]
    # Logprobs describe the raw distribution, bans or not.
    assert abs(logprob[1] - log_softmax[order[1]]) < 1e-4
    assert token[2] == best  # every token banned: the raw argmax
    y = np.where(np.isnan(logits[1]), -np.inf, logits[1]).astype(np.float64)
    assert token[3] == int(np.argmax(y)) and top_ids[3, 0] == token[3]
    assert np.isfinite(logprob[3])


def test_a_grammar_mask_limits_every_choice_and_the_logprobs(lib):
    vocab = 700
    logits = (rng.normal(size=(1, vocab)) * 2).astype(np.float32)
    x = logits[0].astype(np.float64)
    allowed = sorted(rng.choice(vocab, size=9, replace=False).tolist())
    keep = np.zeros(vocab, dtype=bool)
    keep[allowed] = True
    masked = np.where(keep, x, -np.inf)
    log_softmax = masked - masked.max() - np.log(np.exp(masked - masked.max()).sum())
    best = int(np.argmax(masked))
    rows = Rows()
    rows.add(allowed=allowed, top_logprobs=3)
    for u in (0.1, 0.5, 0.9):
        rows.add(allowed=allowed, temperature=1.0, uniform=u)
    # Banned beyond the mask: the fallback is the best allowed token, never a disallowed one.
    rows.add(allowed=allowed, banned=allowed)
    rows.add(allowed=[vocab - 1])
    token, logprob, top_ids, top_lp = rows.run(lib, logits)
    assert token[0] == best
    assert abs(logprob[0] - log_softmax[best]) < 1e-4
    assert list(top_ids[0, :3]) == list(np.argsort(-masked, kind="stable")[:3])
    for i, u in enumerate((0.1, 0.5, 0.9), start=1):
        assert token[i] == draw(x, 1.0, u, keep), (i, token[i])
    assert token[4] == best
    assert token[5] == vocab - 1


def test_penalties_change_the_choice_as_the_host_sampler_would(lib):
    vocab = 300
    logits = (rng.normal(size=(1, vocab)) * 0.3).clip(-1.5, 1.5).astype(np.float32)
    order = np.argsort(-logits[0], kind="stable")
    first, second = int(order[0]), int(order[1])
    logits[0, first] = 2.0
    logits[0, second] = 1.9
    rows = Rows()
    rows.add(repetition=1.5, penalties=[(first, 0)])  # 2.0 / 1.5 < 1.9
    rows.add(frequency=0.05, presence=0.0, penalties=[(first, 1)])  # 2.0 - 0.05 > 1.9
    rows.add(frequency=0.05, presence=0.1, penalties=[(first, 1)])  # 2.0 - 0.15 < 1.9
    token, *_ = rows.run(lib, logits)
    assert list(token) == [second, first, second]


@pytest.mark.parametrize("threads", [128, 1024])
def test_draws_follow_the_filters(lib, threads):
    vocab = 2000
    logits = (rng.normal(size=(1, vocab)) * 2).astype(np.float32)
    x = logits[0].astype(np.float64)
    t = 0.8
    w = np.exp((x - x.max()) / t)
    order = np.argsort(-x, kind="stable")
    top5 = np.zeros(vocab, dtype=bool)
    top5[order[:5]] = True
    cumulative = np.cumsum(w[order]) / w.sum()
    nucleus = np.zeros(vocab, dtype=bool)
    nucleus[order[: int(np.searchsorted(cumulative, 0.6)) + 1]] = True
    min_p = w >= 0.2 * w.max()
    uniforms = rng.uniform(size=6 if threads <= 128 else 2)
    rows = Rows()
    # A uniform that rounded up to 1 takes the last kept token.
    rows.add(temperature=t, top_k=5, uniform=1.0)
    for u in uniforms:
        rows.add(temperature=t, uniform=float(u))
        rows.add(temperature=t, top_k=5, uniform=float(u))
        rows.add(temperature=t, top_p=0.6, uniform=float(u))
        rows.add(temperature=t, min_p=0.2, uniform=float(u))
    token, *_ = rows.run(lib, logits, threads)
    assert token[0] == int(np.flatnonzero(top5)[-1])
    token = token[1:]
    for i, u in enumerate(uniforms):
        assert token[4 * i] == draw(x, t, u)
        assert token[4 * i + 1] == draw(x, t, u, top5)
        assert token[4 * i + 2] == draw(x, t, u, nucleus)
        assert token[4 * i + 3] == draw(x, t, u, min_p)
