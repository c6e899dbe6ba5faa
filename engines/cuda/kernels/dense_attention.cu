// Attention for long prefill chunks through matrix products (gpu/dense_attention.rs): the
// chunk's context is gathered out of the paged cache into contiguous per-head K and V, the
// queries are packed per head in bf16, cuBLAS forms the scores and the weighted sum, and
// `masked_softmax` turns scores into probabilities between the two. Every kernel here needs
// head_dim % 8 == 0 (the host checks), so each position's head is whole 16-byte vectors.

// K and V of positions 0 .. gridDim.x - 1 of table row `seq` into k_out / v_out, laid out
// [kv_heads][positions][head_dim] with `positions` = gridDim.x. Grid: (positions); block: any.
extern "C" __global__ void gather_kv(
    const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache,
    const int* __restrict__ block_tables,
    const int* __restrict__ table_stride,
    int seq,
    int block_size,
    int kv_heads,
    int head_dim,
    bf16_t* __restrict__ k_out,
    bf16_t* __restrict__ v_out
) {
    const long long p = blockIdx.x;
    const long long positions = gridDim.x;
    const int* table = block_tables + (long long)seq * table_stride[0];
    const long long slot = (long long)table[p / block_size] * block_size + p % block_size;
    const int vectors = head_dim / 8;
    for (int i = threadIdx.x; i < kv_heads * vectors; i += blockDim.x) {
        const int h = i / vectors;
        const int c = i % vectors;
        const long long from = (slot * kv_heads + h) * head_dim + c * 8;
        const long long to = ((long long)h * positions + p) * head_dim + c * 8;
        *(uint4*)(k_out + to) = *(const uint4*)(k_cache + from);
        *(uint4*)(v_out + to) = *(const uint4*)(v_cache + from);
    }
}

// Queries of token rows first_row .. first_row + gridDim.x - 1, rounded to bf16 and laid out
// [q_heads][gridDim.x][head_dim]. Grid: (rows, q_heads); block: any.
extern "C" __global__ void pack_queries(
    const float* __restrict__ q,
    int first_row,
    int head_dim,
    bf16_t* __restrict__ out
) {
    const long long i = blockIdx.x;
    const long long rows = gridDim.x;
    const long long head = blockIdx.y;
    const long long q_heads = gridDim.y;
    const float* from = q + ((first_row + i) * q_heads + head) * head_dim;
    bf16_t* to = out + (head * rows + i) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        to[d] = f32_to_bf16(from[d]);
    }
}

// Row i of scores [batch][gridDim.x][width] (already scaled) into probabilities `probs` of the
// same layout: query i sits at position first_position + i and sees positions j <= it (and,
// with a window, j > position - window); soft-capped first when softcap > 0; positions it
// cannot see get 0. Grid: (rows, batch); block: up to 1024 threads.
extern "C" __global__ void masked_softmax(
    const float* __restrict__ scores,
    int width,
    int first_position,
    int window,
    float softcap,
    bf16_t* __restrict__ probs
) {
    __shared__ float scratch[WARP];
    const long long row = (long long)blockIdx.y * gridDim.x + blockIdx.x;
    const float* s = scores + row * width;
    bf16_t* out = probs + row * width;
    const int position = first_position + blockIdx.x;
    const int last = min(position, width - 1);
    const int first = window > 0 ? max(0, position - window + 1) : 0;
    float m = NEG_INF;
    for (int j = first + threadIdx.x; j <= last; j += blockDim.x) {
        float v = s[j];
        if (softcap > 0.0f) {
            v = softcap * tanhf(v / softcap);
        }
        m = fmaxf(m, v);
    }
    m = block_max(m, scratch);
    float total = 0.0f;
    for (int j = first + threadIdx.x; j <= last; j += blockDim.x) {
        float v = s[j];
        if (softcap > 0.0f) {
            v = softcap * tanhf(v / softcap);
        }
        total += expf(v - m);
    }
    total = block_sum(total, scratch);
    const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        float p = 0.0f;
        if (j >= first && j <= last) {
            float v = s[j];
            if (softcap > 0.0f) {
                v = softcap * tanhf(v / softcap);
            }
            p = expf(v - m) * inverse;
        }
        out[j] = f32_to_bf16(p);
    }
}
