// Attention over the paged KV cache, for decode and chunked prefill alike.
//
// Query token t (t = first_token + blockIdx.x) attends to positions 0 .. context[t] - 1 of its
// own sequence, whose blocks are row `seq_of[t]` of `block_tables` ([seqs, *table_stride]; the
// stride is read from device memory so a captured graph serves steps of any width). Causality
// is in the lengths: a prefill token at position p has context p + 1, and a chunk that follows
// a prefix-cache hit reads the cached blocks like any others.
//
// A sliding layer (`window` > 0) sees only the last `window` positions of the context; a
// `softcap` > 0 turns each score into softcap * tanh(score / softcap) (Gemma 2). Scores are
// q · k * `scale`.
//
// The positions a token sees are cut into `splits` equal spans, computed from its own context,
// so a graph captured with a fixed split count spreads a short context over every split as
// well as a long one. With one split the block writes the output; with several it writes its
// running maximum, sum and unnormalised accumulator (rows indexed from `first_token`), and
// `attention_combine` merges them. An empty span writes an empty partial.
//
// Grid: (tokens, q_heads, splits); block: ATTN_WARPS warps. Warp w takes positions
// w, w + ATTN_WARPS, ... of the span; lane l holds elements l, l + 32, ... of the head, so
// loads of one position are coalesced. head_dim <= 256 (any value; lanes past it idle).

#define ATTN_WARPS 4
#define ATTN_MAX_PER_LANE 8

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * WARP, 1) paged_attention(
    const float* __restrict__ q,
    const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache,
    const int* __restrict__ context,
    const int* __restrict__ seq_of,
    const int* __restrict__ block_tables,
    const int* __restrict__ table_stride,
    int block_size,
    int q_heads,
    int kv_heads,
    int head_dim,
    float scale,
    float softcap,
    int window,
    int first_token,
    float* __restrict__ part_max,
    float* __restrict__ part_sum,
    float* __restrict__ part_acc,
    bf16_t* __restrict__ out
) {
    __shared__ float s_max[ATTN_WARPS];
    __shared__ float s_sum[ATTN_WARPS];
    __shared__ float s_acc[ATTN_WARPS][ATTN_MAX_PER_LANE * WARP];

    const long long row = blockIdx.x;
    const long long t = first_token + row;
    const int head = blockIdx.y;
    const int split = blockIdx.z;
    const int splits = gridDim.z;
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    const int per_lane = (head_dim + WARP - 1) / WARP;
    const int kv_head = head / (q_heads / kv_heads);
    const int length = context[t];
    const int first = window > 0 ? max(0, length - window) : 0;
    const int span = (length - first + splits - 1) / splits;
    const int begin = first + split * span;
    const int end = min(length, begin + span);
    const int* table = block_tables + (long long)seq_of[t] * table_stride[0];

    float qv[ATTN_MAX_PER_LANE];
    float acc[ATTN_MAX_PER_LANE];
    const float* qrow = q + (t * q_heads + head) * head_dim;
#pragma unroll
    for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
        qv[j] = j * WARP + lane < head_dim ? qrow[j * WARP + lane] * scale : 0.0f;
        acc[j] = 0.0f;
    }
    float running_max = NEG_INF;
    float running_sum = 0.0f;
    for (int p = begin + warp; p < end; p += ATTN_WARPS) {
        const long long slot = (long long)table[p / block_size] * block_size + p % block_size;
        const long long offset = (slot * kv_heads + kv_head) * head_dim;
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
            if (j < per_lane && j * WARP + lane < head_dim) {
                dot += qv[j] * bf16_to_f32(k_cache[offset + j * WARP + lane]);
            }
        }
        float score = warp_sum(dot);
        if (softcap > 0.0f) {
            score = softcap * tanhf(score / softcap);
        }
        const float new_max = fmaxf(running_max, score);
        const float correction = expf(running_max - new_max);
        const float weight = expf(score - new_max);
        running_sum = running_sum * correction + weight;
#pragma unroll
        for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
            if (j < per_lane && j * WARP + lane < head_dim) {
                acc[j] = acc[j] * correction
                    + weight * bf16_to_f32(v_cache[offset + j * WARP + lane]);
            }
        }
        running_max = new_max;
    }
    if (lane == 0) {
        s_max[warp] = running_max;
        s_sum[warp] = running_sum;
    }
#pragma unroll
    for (int j = 0; j < ATTN_MAX_PER_LANE; ++j) {
        if (j < per_lane && j * WARP + lane < head_dim) {
            s_acc[warp][j * WARP + lane] = acc[j];
        }
    }
    __syncthreads();

    float block_max_value = NEG_INF;
    for (int w = 0; w < ATTN_WARPS; ++w) {
        block_max_value = fmaxf(block_max_value, s_max[w]);
    }
    float total = 0.0f;
    for (int w = 0; w < ATTN_WARPS; ++w) {
        if (s_max[w] > NEG_INF) {
            total += s_sum[w] * expf(s_max[w] - block_max_value);
        }
    }
    const long long partial = (row * q_heads + head) * splits + split;
    if (splits > 1 && threadIdx.x == 0) {
        part_max[partial] = block_max_value;
        part_sum[partial] = total;
    }
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float value = 0.0f;
        for (int w = 0; w < ATTN_WARPS; ++w) {
            if (s_max[w] > NEG_INF) {
                value += s_acc[w][i] * expf(s_max[w] - block_max_value);
            }
        }
        if (splits > 1) {
            part_acc[partial * head_dim + i] = value;
        } else {
            out[(t * q_heads + head) * head_dim + i] =
                f32_to_bf16(total > 0.0f ? value / total : 0.0f);
        }
    }
}

// Merges the splits of `paged_attention` for tokens first_token .. first_token + gridDim.x - 1.
// Grid: (tokens, q_heads); block: any.
extern "C" __global__ void attention_combine(
    const float* __restrict__ part_max,
    const float* __restrict__ part_sum,
    const float* __restrict__ part_acc,
    int splits,
    int head_dim,
    int first_token,
    bf16_t* __restrict__ out
) {
    const long long row = (long long)blockIdx.x * gridDim.y + blockIdx.y;
    const long long first = row * splits;
    const long long out_row = ((long long)first_token + blockIdx.x) * gridDim.y + blockIdx.y;
    float m = NEG_INF;
    for (int s = 0; s < splits; ++s) {
        m = fmaxf(m, part_max[first + s]);
    }
    float total = 0.0f;
    for (int s = 0; s < splits; ++s) {
        if (part_max[first + s] > NEG_INF) {
            total += part_sum[first + s] * expf(part_max[first + s] - m);
        }
    }
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float value = 0.0f;
        for (int s = 0; s < splits; ++s) {
            if (part_max[first + s] > NEG_INF) {
                value += part_acc[(first + s) * head_dim + i] * expf(part_max[first + s] - m);
            }
        }
        out[out_row * head_dim + i] = f32_to_bf16(total > 0.0f ? value / total : 0.0f);
    }
}
