// Rotary embeddings and the KV write, in one pass over the fused q/k/v projection.
//
// `qkv` is f32 [tokens, (q_heads + 2 * kv_heads) * head_dim] (q heads, then k, then v), with
// an optional bf16 bias of one row. `inv_freq` holds `rot_half` inverse frequencies that the
// host computed with the model's scaling (plain, linear, llama3, per-pair factors), so this
// kernel does not know which; cosines and sines are multiplied by `rope_scale` (LongRoPE's
// attention factor, else 1). Rotation pairs element i with i + rot_half (the HF `rotate_half`
// form) over a head's leading 2 * rot_half values; the rest of the head passes through
// (partial rotary embeddings).
//
// When `q_norm` and `k_norm` are given (Qwen3), each query and key head is RMS-normalised
// first (in f32, rounded to bf16, then scaled by the bf16 weight of head_dim values, as HF
// does), before rotation.
//
// q heads go to `q_out` (f32 [tokens, q_heads, head_dim]); k and v heads go to the paged
// cache at `slots[t]` (block * block_size + offset), laid out [slot, kv_heads, head_dim] in
// bf16. A negative slot (batch padding) writes nothing.
// Grid: (tokens, q_heads + 2 * kv_heads); block: head_dim / 2 threads (head_dim <= 256).
extern "C" __global__ void __launch_bounds__(128, 1) rotary_kv_store(
    const float* __restrict__ qkv,
    const bf16_t* __restrict__ bias,
    const bf16_t* __restrict__ q_norm,
    const bf16_t* __restrict__ k_norm,
    float eps,
    const int* __restrict__ positions,
    const float* __restrict__ inv_freq,
    int rot_half,
    float rope_scale,
    const int* __restrict__ slots,
    float* __restrict__ q_out,
    bf16_t* __restrict__ k_cache,
    bf16_t* __restrict__ v_cache,
    int q_heads,
    int kv_heads,
    int head_dim
) {
    const long long t = blockIdx.x;
    const int head = blockIdx.y;
    const int half = head_dim / 2;
    const int i = threadIdx.x;
    // Every thread reaches the head norm's barrier; only the first `half` hold values.
    const bool live = i < half;
    const int width = (q_heads + 2 * kv_heads) * head_dim;
    const int base = head * head_dim;
    float a = live ? qkv[t * width + base + i] : 0.0f;
    float b = live ? qkv[t * width + base + i + half] : 0.0f;
    if (bias != 0 && live) {
        a += bf16_to_f32(bias[base + i]);
        b += bf16_to_f32(bias[base + i + half]);
    }
    // HF rounds the projection to bf16 before rotating.
    a = bf16_to_f32(f32_to_bf16(a));
    b = bf16_to_f32(f32_to_bf16(b));
    if (q_norm != 0 && head < q_heads + kv_heads) {
        // A plain sum over shared memory: a block may be narrower than a warp (head_dim < 64),
        // where a warp shuffle would read lanes that do not exist.
        __shared__ float squares[128];
        squares[i] = a * a + b * b;
        __syncthreads();
        float sum = 0.0f;
        for (int j = 0; j < half; ++j) {
            sum += squares[j];
        }
        const float inv = rsqrtf(sum / (float)head_dim + eps);
        if (live) {
            const bf16_t* w = head < q_heads ? q_norm : k_norm;
            a = bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(a * inv)) * bf16_to_f32(w[i])));
            b = bf16_to_f32(
                f32_to_bf16(bf16_to_f32(f32_to_bf16(b * inv)) * bf16_to_f32(w[i + half])));
        }
    }
    const long long slot = slots[t];
    if (head < q_heads + kv_heads) {
        // The whole head in shared memory: a rotated value reads its partner, which another
        // thread loaded when the rotated part is narrower than the head.
        __shared__ float values[256];
        if (live) {
            values[i] = a;
            values[i + half] = b;
        }
        __syncthreads();
        if (!live) {
            return;
        }
        // Thread i turns the pair (i, i + rot_half) by one angle; the threads past the rotated
        // pairs carry two of the values that pass through.
        int e0;
        int e1;
        float r0;
        float r1;
        if (i < rot_half) {
            float s;
            float c;
            sincosf((float)positions[t] * inv_freq[i], &s, &c);
            c *= rope_scale;
            s *= rope_scale;
            const float x = values[i];
            const float y = values[i + rot_half];
            e0 = i;
            e1 = i + rot_half;
            r0 = x * c - y * s;
            r1 = y * c + x * s;
        } else {
            e0 = 2 * rot_half + 2 * (i - rot_half);
            e1 = e0 + 1;
            r0 = values[e0];
            r1 = values[e1];
        }
        if (head < q_heads) {
            float* q = q_out + (t * q_heads + head) * head_dim;
            q[e0] = bf16_to_f32(f32_to_bf16(r0));
            q[e1] = bf16_to_f32(f32_to_bf16(r1));
        } else if (slot >= 0) {
            bf16_t* k = k_cache + (slot * kv_heads + (head - q_heads)) * head_dim;
            k[e0] = f32_to_bf16(r0);
            k[e1] = f32_to_bf16(r1);
        }
    } else if (slot >= 0 && live) {
        bf16_t* v = v_cache + (slot * kv_heads + (head - q_heads - kv_heads)) * head_dim;
        v[i] = f32_to_bf16(a);
        v[i + half] = f32_to_bf16(b);
    }
}
