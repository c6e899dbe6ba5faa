// RMSNorm of f32 rows in place, for the norms Gemma applies to the attention and MLP outputs
// before they join the residual: x = bf16(bf16(x / rms(x)) * weight), kept in f32 for the
// residual add that follows. Grid: one block per row.
extern "C" __global__ void __launch_bounds__(512, 1) rms_norm_rows(
    float* __restrict__ x,
    const bf16_t* __restrict__ weight,
    int hidden,
    float eps
) {
    __shared__ float scratch[WARP];
    float* row = x + (long long)blockIdx.x * hidden;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        sum += row[i] * row[i];
    }
    sum = block_sum(sum, scratch);
    const float inv = rsqrtf(sum / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float normed = bf16_to_f32(f32_to_bf16(row[i] * inv));
        row[i] = bf16_to_f32(f32_to_bf16(normed * bf16_to_f32(weight[i])));
    }
}

// RMSNorm fused with the residual add that precedes it:
//   resid[r] += add[r] + bias (when `add` is given; `bias` is the optional bf16 bias of the
//   product that wrote `add`);  out[o] = resid[r] / rms(resid[r]) * weight
// where o is the block index and r is `rows[o]` when `rows` is given (the final norm runs only
// on the rows whose logits are wanted), else o. The residual stays f32; `out` is bf16, the
// input of the next matrix product. Grid: one block per output row.
extern "C" __global__ void __launch_bounds__(512, 1) rms_norm_residual(
    float* __restrict__ resid,
    const float* __restrict__ add,
    const bf16_t* __restrict__ bias,
    const int* __restrict__ rows,
    const bf16_t* __restrict__ weight,
    bf16_t* __restrict__ out,
    int hidden,
    float eps
) {
    __shared__ float scratch[WARP];
    const long long o = blockIdx.x;
    const long long r = rows != 0 ? rows[o] : o;
    float* x = resid + r * hidden;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = x[i];
        if (add != 0) {
            v += add[r * hidden + i] + (bias != 0 ? bf16_to_f32(bias[i]) : 0.0f);
            x[i] = v;
        }
        sum += v * v;
    }
    sum = block_sum(sum, scratch);
    const float inv = rsqrtf(sum / (float)hidden + eps);
    bf16_t* y = out + o * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        // HF order: normalise in f32, round to the weight dtype, then scale.
        const float normed = bf16_to_f32(f32_to_bf16(x[i] * inv));
        y[i] = f32_to_bf16(normed * bf16_to_f32(weight[i]));
    }
}
