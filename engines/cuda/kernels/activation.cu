// SiLU-and-multiply over the fused gate/up projection: `gate_up` is f32 [tokens, 2 * inter]
// with the gate in the first half of each row and up in the second; `out` is bf16
// [tokens, inter], the input of the down projection. Grid: (tokens, ceil(inter / block)).
extern "C" __global__ void __launch_bounds__(256, 1) silu_and_mul(
    const float* __restrict__ gate_up,
    bf16_t* __restrict__ out,
    int inter
) {
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= inter) {
        return;
    }
    const long long row = blockIdx.x;
    // HF rounds each projection to bf16 before the activation; do the same.
    const float g = bf16_to_f32(f32_to_bf16(gate_up[row * 2 * inter + i]));
    const float u = bf16_to_f32(f32_to_bf16(gate_up[row * 2 * inter + inter + i]));
    const float silu = bf16_to_f32(f32_to_bf16(g / (1.0f + expf(-g))));
    out[row * inter + i] = f32_to_bf16(silu * u);
}
