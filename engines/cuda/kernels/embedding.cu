// Embedding gather: the residual stream starts as the rows of the embedding table, multiplied
// by `scale` where it is not 1 (Gemma's √hidden, rounded to bf16 and the product rounded, as
// HF multiplies two bf16 tensors). Grid: one block per token. `out` is f32 [tokens, hidden].
extern "C" __global__ void __launch_bounds__(512, 1) embedding_gather(
    const int* __restrict__ ids,
    const bf16_t* __restrict__ table,
    float* __restrict__ out,
    int hidden,
    float scale
) {
    const float factor = bf16_to_f32(f32_to_bf16(scale));
    const long long row = blockIdx.x;
    const long long id = ids[row];
    const bf16_t* src = table + id * hidden;
    float* dst = out + row * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = bf16_to_f32(src[i]);
        dst[i] = scale == 1.0f ? v : bf16_to_f32(f32_to_bf16(v * factor));
    }
}
