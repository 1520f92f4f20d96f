// Shared helpers for every kernel file. The backend compiles
// every file of `SOURCES` (engine/src/backend/cuda/kernels.rs), in its order, as one NVRTC program,
// so no header lookup is needed at run time.
//
// bf16 values are carried as raw `unsigned short` bit patterns: this keeps the
// sources free of cuda_bf16.h (NVRTC then needs no include path) and lets the
// host check them with a plain C++ compiler.

// NVRTC has no math.h, so INFINITY (used by the kernels for -inf masks and maxima) is
// defined here; a host compiler that already has it keeps its own.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

typedef unsigned short bf16;

__device__ __forceinline__ float bf16_to_f32(bf16 v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

// Round to nearest even, NaN kept quiet (same as torch's conversion).
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// Rounds an f32 through bf16 (mirrors a torch op that returns a bf16 tensor).
__device__ __forceinline__ float round_bf16(float f) {
    return bf16_to_f32(f32_to_bf16(f));
}

// The gated FFNs' activations of the gate: SiLU (SwiGLU), and GELU's tanh approximation
// (GeGLU, Gemma's gelu_pytorch_tanh).
struct Silu {
    __device__ __forceinline__ float operator()(float g) const { return g / (1.0f + __expf(-g)); }
};
struct GeluTanh {
    __device__ __forceinline__ float operator()(float g) const {
        return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
    }
};

// Two adjacent bf16 values read as one 32-bit word (the address must be 4-byte aligned).
__device__ __forceinline__ void load_bf16x2(const bf16* p, float& a, float& b) {
    unsigned int w = *reinterpret_cast<const unsigned int*>(p);
    a = __uint_as_float(w << 16);
    b = __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds 32 floats.
// blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}
