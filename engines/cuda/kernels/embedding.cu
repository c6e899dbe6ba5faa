// Embedding gather: the residual stream starts as the rows of the embedding table.
// Grid: one block per token. `out` is f32 [tokens, hidden].
extern "C" __global__ void __launch_bounds__(512, 1) embedding_gather(
    const int* __restrict__ ids,
    const bf16_t* __restrict__ table,
    float* __restrict__ out,
    int hidden
) {
    const long long row = blockIdx.x;
    const long long id = ids[row];
    const bf16_t* src = table + id * hidden;
    float* dst = out + row * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        dst[i] = bf16_to_f32(src[i]);
    }
}
