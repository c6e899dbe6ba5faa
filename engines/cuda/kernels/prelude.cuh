// Shared by every kernel file: the engine prepends this text to each source before NVRTC
// compiles it, so no file needs an include path or a CUDA header.
//
// bf16 values are carried as their 16 raw bits: the conversions below are exact (widening)
// and round to nearest even (narrowing), the same as PyTorch's.

typedef unsigned short bf16_t;

#define WARP 32
#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)
#define FLT_MAX_VALUE 3.402823466e38f

__device__ __forceinline__ float bf16_to_f32(bf16_t v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_t)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, o);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    }
    return v;
}

// Block-wide sum; every thread gets the result. `scratch` holds one float per warp (32).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    const int warps = (blockDim.x + WARP - 1) / WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// Block-wide maximum (NaN ignored); every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    const int warps = (blockDim.x + WARP - 1) / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < warps ? scratch[lane] : NEG_INF;
    return warp_max(v);
}
