// The gated activation over the fused gate/up projection: `gate_up` is f32 [tokens, 2 * inter]
// with the gate in the first half of each row and up in the second; `out` is bf16
// [tokens, inter], the input of the down projection: silu(gate) * up, or with `gelu` set
// gelu_tanh(gate) * up (Gemma's GeGLU). Grid: (tokens, ceil(inter / block)).
extern "C" __global__ void __launch_bounds__(256, 1) silu_and_mul(
    const float* __restrict__ gate_up,
    bf16_t* __restrict__ out,
    int inter,
    int gelu
) {
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= inter) {
        return;
    }
    const long long row = blockIdx.x;
    // HF rounds each projection to bf16 before the activation; do the same.
    const float g = bf16_to_f32(f32_to_bf16(gate_up[row * 2 * inter + i]));
    const float u = bf16_to_f32(f32_to_bf16(gate_up[row * 2 * inter + inter + i]));
    const float act = gelu != 0
        ? 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)))
        : g / (1.0f + expf(-g));
    out[row * inter + i] = f32_to_bf16(bf16_to_f32(f32_to_bf16(act)) * u);
}

// Soft-capping of logits in place: x = cap * tanh(x / cap) (Gemma 2's final logits).
// Grid: (rows, ceil(width / block)).
extern "C" __global__ void __launch_bounds__(256, 1) logit_softcap(
    float* __restrict__ logits,
    int width,
    float cap
) {
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= width) {
        return;
    }
    float* x = logits + (long long)blockIdx.x * width + i;
    *x = cap * tanhf(*x / cap);
}
