// Rotary embeddings and the KV write, in one pass over the fused q/k/v projection.
//
// `qkv` is f32 [tokens, (q_heads + 2 * kv_heads) * head_dim] (q heads, then k, then v), with
// an optional bf16 bias of one row. `inv_freq` holds head_dim / 2 inverse frequencies that
// the host computed with the model's scaling (plain, linear or llama3), so this kernel does
// not know which. Rotation pairs element i with i + head_dim / 2 (the HF `rotate_half` form).
//
// q heads go to `q_out` (f32 [tokens, q_heads, head_dim]); k and v heads go to the paged
// cache at `slots[t]` (block * block_size + offset), laid out [slot, kv_heads, head_dim] in
// bf16. A negative slot (batch padding) writes nothing.
// Grid: (tokens, q_heads + 2 * kv_heads); block: head_dim / 2 threads.
extern "C" __global__ void __launch_bounds__(128, 1) rotary_kv_store(
    const float* __restrict__ qkv,
    const bf16_t* __restrict__ bias,
    const int* __restrict__ positions,
    const float* __restrict__ inv_freq,
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
    if (i >= half) {
        return;
    }
    const int width = (q_heads + 2 * kv_heads) * head_dim;
    const int base = head * head_dim;
    float a = qkv[t * width + base + i];
    float b = qkv[t * width + base + i + half];
    if (bias != 0) {
        a += bf16_to_f32(bias[base + i]);
        b += bf16_to_f32(bias[base + i + half]);
    }
    // HF rounds the projection to bf16 before rotating.
    a = bf16_to_f32(f32_to_bf16(a));
    b = bf16_to_f32(f32_to_bf16(b));
    const long long slot = slots[t];
    if (head < q_heads + kv_heads) {
        float s;
        float c;
        sincosf((float)positions[t] * inv_freq[i], &s, &c);
        const float ra = a * c - b * s;
        const float rb = b * c + a * s;
        if (head < q_heads) {
            float* q = q_out + (t * q_heads + head) * head_dim;
            q[i] = bf16_to_f32(f32_to_bf16(ra));
            q[i + half] = bf16_to_f32(f32_to_bf16(rb));
        } else if (slot >= 0) {
            bf16_t* k = k_cache + (slot * kv_heads + (head - q_heads)) * head_dim;
            k[i] = f32_to_bf16(ra);
            k[i + half] = f32_to_bf16(rb);
        }
    } else if (slot >= 0) {
        bf16_t* v = v_cache + (slot * kv_heads + (head - q_heads - kv_heads)) * head_dim;
        v[i] = f32_to_bf16(a);
        v[i + half] = f32_to_bf16(b);
    }
}
