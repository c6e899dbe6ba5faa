// Sampling on the GPU: one block per sampled row turns a logits row into a token, its
// log-probability and the top log-probabilities, so only those cross to the host.
//
// The order of operations is the host sampler's (see `sampler/mod.rs`):
//  0. a row with a grammar mask (`mask_offset >= 0`: one bit per token id, 32 to a word, at
//     that word of `allowed_masks`) sees every token the grammar does not allow as -inf, as
//     the host's grammar constraint sets them before it samples;
//  1. log-probabilities of the raw logits (NaN as -inf, +inf as FLT_MAX), before anything;
//  2. repetition penalty on every listed token (prompt or output), then frequency and presence
//     penalties by generated count, then banned tokens to -inf, into a scratch copy;
//  3. greedy argmax (ties to the lowest id) when temperature <= 0; otherwise weights
//     exp((x - max) / temperature), top-k, top-p over the top-k mass, min-p, and one draw with
//     the uniform the host drew from the sequence's own seeded generator;
//  4. if nothing survives, the argmax of the raw logits (of the allowed ones, under a mask).
// Filters are thresholds found by a bitwise search over order-preserving keys of the values
// (32 passes over the row), so nothing sorts the vocabulary. A threshold keeps every token
// tied with it, and the draw walks kept tokens in id order: with the same uniform the choice
// can differ from the host sampler's, which walks them by descending probability.

#define SAMPLE_MAX_TOP 20

struct SampleRow {
    int logits_row;
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    float uniform;
    int top_logprobs;
    int penalty_begin;
    int penalty_end;
    int banned_begin;
    int banned_end;
    int mask_offset;
};

// Whether the row's grammar mask (if any) allows token `i`.
__device__ __forceinline__ bool mask_allows(const unsigned int* masks, int offset, int i) {
    return offset < 0 || ((masks[offset + (i >> 5)] >> (i & 31)) & 1u) != 0u;
}

__device__ __forceinline__ float clean_logit(float x) {
    return isnan(x) ? NEG_INF : fminf(x, FLT_MAX_VALUE);
}

__device__ __forceinline__ unsigned int order_key(float x) {
    const unsigned int u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The best (value, id) pair below `(bound_value, bound_id)` in the order value descending,
// id ascending; every thread gets it. Pass +inf and -1 for the best overall.
__device__ __forceinline__ void block_best_below(
    const float* values, int n, float bound_value, int bound_id,
    float* out_value, int* out_id, float* scratch_value, int* scratch_id
) {
    float best = NEG_INF;
    int best_id = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = values[i];
        const bool below = v < bound_value || (v == bound_value && i > bound_id);
        if (below && (v > best || (v == best && i < best_id))) {
            best = v;
            best_id = i;
        }
    }
    for (int o = WARP / 2; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, best, o);
        const int oi = __shfl_xor_sync(FULL_MASK, best_id, o);
        if (ov > best || (ov == best && oi < best_id)) {
            best = ov;
            best_id = oi;
        }
    }
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    const int warps = (blockDim.x + WARP - 1) / WARP;
    __syncthreads();
    if (lane == 0) {
        scratch_value[warp] = best;
        scratch_id[warp] = best_id;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < warps; ++w) {
            if (scratch_value[w] > best || (scratch_value[w] == best && scratch_id[w] < best_id)) {
                best = scratch_value[w];
                best_id = scratch_id[w];
            }
        }
        scratch_value[0] = best;
        scratch_id[0] = best_id;
    }
    __syncthreads();
    *out_value = scratch_value[0];
    *out_id = scratch_id[0];
    __syncthreads();
}

// Sum over kept tokens (key >= threshold) of `weight` (count when weight is 0, mass when 1).
__device__ __forceinline__ float kept_total(
    const float* x, int n, unsigned int threshold, float max_value, float temperature,
    bool mass, float* scratch
) {
    float total = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (order_key(x[i]) >= threshold && x[i] > NEG_INF) {
            total += mass ? expf((x[i] - max_value) / temperature) : 1.0f;
        }
    }
    return block_sum(total, scratch);
}

// Grid: one block per sampled row; block: up to 1024 threads (a multiple of 32).
extern "C" __global__ void __launch_bounds__(1024, 1) sample_rows(
    const float* __restrict__ logits,
    int vocab,
    const SampleRow* __restrict__ params,
    const int* __restrict__ penalty_tokens,
    const int* __restrict__ penalty_counts,
    const int* __restrict__ banned_tokens,
    float* __restrict__ scratch_rows,
    int* __restrict__ out_token,
    float* __restrict__ out_logprob,
    int* __restrict__ out_top_ids,
    float* __restrict__ out_top_logprobs,
    const unsigned int* __restrict__ allowed_masks
) {
    __shared__ float reduce[WARP];
    __shared__ float best_values[WARP];
    __shared__ int best_ids[WARP];
    __shared__ float segment_mass[1024];
    __shared__ int chosen;

    const SampleRow p = params[blockIdx.x];
    const float* raw = logits + (long long)p.logits_row * vocab;
    float* x = scratch_rows + (long long)blockIdx.x * vocab;

    // 0-1. The raw distribution (under the grammar mask), for log-probabilities.
    float raw_max = NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = mask_allows(allowed_masks, p.mask_offset, i) ? clean_logit(raw[i]) : NEG_INF;
        x[i] = v;
        raw_max = fmaxf(raw_max, v);
    }
    raw_max = block_max(raw_max, reduce);
    float log_norm = 0.0f;
    if (p.top_logprobs >= 0 && raw_max > NEG_INF) {
        float sum = 0.0f;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            sum += expf(x[i] - raw_max);
        }
        log_norm = raw_max + logf(block_sum(sum, reduce));
    }
    if (p.top_logprobs > 0) {
        float bound = __int_as_float(0x7f800000);
        int bound_id = -1;
        const int k = min(min(p.top_logprobs, SAMPLE_MAX_TOP), vocab);
        for (int j = 0; j < k; ++j) {
            block_best_below(x, vocab, bound, bound_id, &bound, &bound_id, best_values, best_ids);
            if (threadIdx.x == 0) {
                const long long o = (long long)blockIdx.x * SAMPLE_MAX_TOP + j;
                out_top_ids[o] = bound_id;
                out_top_logprobs[o] = raw_max > NEG_INF ? bound - log_norm : -logf((float)vocab);
            }
        }
    }

    // 2. Penalties and bans, on the scratch copy.
    __syncthreads();
    for (int j = p.penalty_begin + threadIdx.x; j < p.penalty_end; j += blockDim.x) {
        const int id = penalty_tokens[j];
        if (id < 0 || id >= vocab) {
            continue;
        }
        float v = x[id];
        if (p.repetition_penalty != 1.0f) {
            v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
        }
        const int count = penalty_counts[j];
        if (count > 0) {
            v -= p.frequency_penalty * (float)count + p.presence_penalty;
        }
        x[id] = v;
    }
    __syncthreads();
    for (int j = p.banned_begin + threadIdx.x; j < p.banned_end; j += blockDim.x) {
        const int id = banned_tokens[j];
        if (id >= 0 && id < vocab) {
            x[id] = NEG_INF;
        }
    }
    __syncthreads();

    // 3. Choose.
    float max_value;
    int token;
    block_best_below(x, vocab, __int_as_float(0x7f800000), -1, &max_value, &token,
        best_values, best_ids);
    const bool greedy = !(p.temperature > 0.0f);
    if (!greedy && max_value > NEG_INF) {
        const float t = p.temperature;
        unsigned int threshold = 0u;
        if (p.top_k > 0 && p.top_k < vocab) {
            unsigned int found = 0u;
            for (int bit = 31; bit >= 0; --bit) {
                const unsigned int candidate = found | (1u << bit);
                if (kept_total(x, vocab, candidate, max_value, t, false, reduce) >= (float)p.top_k) {
                    found = candidate;
                }
            }
            threshold = found;
        }
        if (p.top_p < 1.0f) {
            const float goal = p.top_p * kept_total(x, vocab, threshold, max_value, t, true, reduce);
            unsigned int found = 0u;
            for (int bit = 31; bit >= 0; --bit) {
                const unsigned int candidate = found | (1u << bit);
                const unsigned int kept = max(candidate, threshold);
                if (kept_total(x, vocab, kept, max_value, t, true, reduce) >= goal) {
                    found = candidate;
                }
            }
            threshold = max(found, threshold);
        }
        if (p.min_p > 0.0f) {
            threshold = max(threshold, order_key(max_value + t * logf(p.min_p)));
        }
        // One draw: walk the kept mass in id order, one contiguous segment per thread.
        const int per_thread = (vocab + blockDim.x - 1) / blockDim.x;
        const int first = threadIdx.x * per_thread;
        const int last = min(vocab, first + per_thread);
        float mine = 0.0f;
        for (int i = first; i < last; ++i) {
            if (order_key(x[i]) >= threshold && x[i] > NEG_INF) {
                mine += expf((x[i] - max_value) / t);
            }
        }
        segment_mass[threadIdx.x] = mine;
        if (threadIdx.x == 0) {
            chosen = -1;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float total = 0.0f;
            for (int i = 0; i < (int)blockDim.x; ++i) {
                total += segment_mass[i];
            }
            const float target = p.uniform * total;
            float before = 0.0f;
            // Where the target falls inside the owner's segment; with no crossing (the
            // uniform rounded up to 1) the owner walks to its last kept token.
            float offset = __int_as_float(0x7f800000);
            int owner = -1;
            for (int i = 0; i < (int)blockDim.x; ++i) {
                if (segment_mass[i] > 0.0f) {
                    owner = i;
                    if (before + segment_mass[i] > target) {
                        offset = target - before;
                        break;
                    }
                }
                before += segment_mass[i];
            }
            segment_mass[0] = offset;
            chosen = owner;
        }
        __syncthreads();
        const int owner = chosen;
        __syncthreads();
        if ((int)threadIdx.x == owner) {
            const float target = segment_mass[0];
            float walked = 0.0f;
            int pick = -1;
            for (int i = first; i < last; ++i) {
                if (order_key(x[i]) >= threshold && x[i] > NEG_INF) {
                    pick = i;
                    walked += expf((x[i] - max_value) / t);
                    if (walked > target) {
                        break;
                    }
                }
            }
            chosen = pick;
        }
        __syncthreads();
        token = chosen;
    }

    // 4. The fallback when every token was banned or -inf.
    if (token < 0 || token >= vocab || max_value == NEG_INF) {
        __syncthreads();
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            x[i] = mask_allows(allowed_masks, p.mask_offset, i) ? raw[i] : NEG_INF;
        }
        __syncthreads();
        float unused;
        block_best_below(x, vocab, __int_as_float(0x7f800000), -1, &unused, &token,
            best_values, best_ids);
        if (token < 0 || token >= vocab) {
            token = 0;
        }
    }
    if (threadIdx.x == 0) {
        out_token[blockIdx.x] = token;
        if (p.top_logprobs >= 0) {
            out_logprob[blockIdx.x] = raw_max > NEG_INF
                ? clean_logit(raw[token]) - log_norm
                : -logf((float)vocab);
        }
    }
}
