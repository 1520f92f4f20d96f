// Row-wise kernels over bf16 activations (one row = one token of the step).
// Activations are bf16 and every op rounds its result to bf16 the way the same
// torch op on a bf16 tensor does, so the backend tracks transformers' bf16 forward.
// Reductions and transcendental maths run in f32.

// out[t, :] = table[tokens[t], :]. grid = (T), block = 256.
extern "C" __global__ void embedding_gather(const bf16* __restrict__ table,
                                            const unsigned int* __restrict__ tokens,
                                            bf16* __restrict__ out, int hidden) {
    int t = blockIdx.x;
    const bf16* src = table + (size_t)tokens[t] * hidden;
    bf16* dst = out + (size_t)t * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// transformers' RMSNorm on bf16: normalise in f32, round to bf16, multiply by the weight, round.
__device__ __forceinline__ float rms_apply(float x, float inv_rms, float w) {
    return round_bf16(w * round_bf16(x * inv_rms));
}

// out = rms_norm(x) * w. grid = (T), block = 256 (multiple of 32).
extern "C" __global__ void rms_norm(const bf16* __restrict__ x, const float* __restrict__ w,
                                    bf16* __restrict__ out, int cols, float eps) {
    __shared__ float scratch[32];
    const bf16* xr = x + (size_t)blockIdx.x * cols;
    bf16* orow = out + (size_t)blockIdx.x * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = bf16_to_f32(xr[i]);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss, scratch) / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        orow[i] = f32_to_bf16(rms_apply(bf16_to_f32(xr[i]), inv, w[i]));
    }
}

// residual = bf16(residual + x); out = rms_norm(residual) * w. grid = (T), block = 256.
// Each thread re-reads only the residual elements it wrote itself.
extern "C" __global__ void add_rms_norm(bf16* __restrict__ residual, const bf16* __restrict__ x,
                                        const float* __restrict__ w, bf16* __restrict__ out,
                                        int cols, float eps) {
    __shared__ float scratch[32];
    size_t base = (size_t)blockIdx.x * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        bf16 r = f32_to_bf16(bf16_to_f32(residual[base + i]) + bf16_to_f32(x[base + i]));
        residual[base + i] = r;
        float v = bf16_to_f32(r);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss, scratch) / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        out[base + i] = f32_to_bf16(rms_apply(bf16_to_f32(residual[base + i]), inv, w[i]));
    }
}

// Pairs (i, i + head_dim/2) handled per lane: head_dim <= 2 * 32 * QKV_MAX_PAIRS.
#define QKV_MAX_PAIRS 4

// The attention prologue over a fused QKV matrix `[T, (H + 2 * KVH) * D]`, one warp per head:
//  - q and k heads: optional per-head RMSNorm (Qwen3, weights q_w / k_w of length D), then
//    optional rotate-half RoPE with row `positions[t]` of the cos / sin tables
//    (`[max_positions, R/2]`) over the first `rotary_dim` R dims of each head (pairs
//    (i, i + R/2); the rest kept, as transformers' partial rotary does), written back in place;
//  - with `do_write`, the row's k and v heads are stored into the paged cache at `slots[t]`
//    (cache layout `[num_slots, KVH, D]`); a negative slot (a padding row) is skipped.
// grid = (T, ceil((H + 2 * KVH) / 4)), block = 128.
extern "C" __global__ void qkv_prep(bf16* __restrict__ qkv, const float* __restrict__ q_w,
                                    const float* __restrict__ k_w, float eps, int do_norm,
                                    const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                    const int* __restrict__ positions, int do_rope,
                                    int rotary_dim, const int* __restrict__ slots,
                                    bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                    int do_write, int num_heads, int num_kv_heads, int head_dim) {
    int t = blockIdx.x;
    int lane = threadIdx.x & 31;
    int head = blockIdx.y * 4 + (threadIdx.x >> 5);
    int total = num_heads + 2 * num_kv_heads;
    if (head >= total) return;
    int half = head_dim >> 1;
    bf16* row = qkv + ((size_t)t * total + head) * head_dim;
    int slot = do_write ? slots[t] : -1;

    if (head >= num_heads + num_kv_heads) {
        if (slot >= 0) {
            int kvh = head - num_heads - num_kv_heads;
            bf16* dst = v_cache + ((size_t)slot * num_kv_heads + kvh) * head_dim;
            for (int i = lane; i < head_dim; i += 32) dst[i] = row[i];
        }
        return;
    }

    bool is_q = head < num_heads;
    float lo[QKV_MAX_PAIRS], hi[QKV_MAX_PAIRS];
#pragma unroll
    for (int j = 0; j < QKV_MAX_PAIRS; ++j) {
        int i = lane + 32 * j;
        lo[j] = i < half ? bf16_to_f32(row[i]) : 0.0f;
        hi[j] = i < half ? bf16_to_f32(row[i + half]) : 0.0f;
    }
    if (do_norm) {
        const float* w = is_q ? q_w : k_w;
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < QKV_MAX_PAIRS; ++j) ss += lo[j] * lo[j] + hi[j] * hi[j];
        float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
#pragma unroll
        for (int j = 0; j < QKV_MAX_PAIRS; ++j) {
            int i = lane + 32 * j;
            if (i < half) {
                lo[j] = rms_apply(lo[j], inv, w[i]);
                hi[j] = rms_apply(hi[j], inv, w[i + half]);
            }
        }
    }
    if (do_rope && rotary_dim < head_dim) {
        // Partial rotary (Qwen3.5's quarter of each head; never run on a GPU yet): the
        // normed head goes back to `row`, its first rotary_dim dims are rotated there, and
        // the halves are read again for the cache.
        int rh = rotary_dim >> 1;
#pragma unroll
        for (int j = 0; j < QKV_MAX_PAIRS; ++j) {
            int i = lane + 32 * j;
            if (i < half) {
                row[i] = f32_to_bf16(lo[j]);
                row[i + half] = f32_to_bf16(hi[j]);
            }
        }
        __syncwarp();
        const float* c = cos_t + (size_t)positions[t] * rh;
        const float* s = sin_t + (size_t)positions[t] * rh;
        for (int i = lane; i < rh; i += 32) {
            float cb = round_bf16(c[i]), sb = round_bf16(s[i]);
            float a = bf16_to_f32(row[i]), b = bf16_to_f32(row[i + rh]);
            row[i] = f32_to_bf16(round_bf16(a * cb) + round_bf16(-b * sb));
            row[i + rh] = f32_to_bf16(round_bf16(b * cb) + round_bf16(a * sb));
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < QKV_MAX_PAIRS; ++j) {
            int i = lane + 32 * j;
            lo[j] = i < half ? bf16_to_f32(row[i]) : 0.0f;
            hi[j] = i < half ? bf16_to_f32(row[i + half]) : 0.0f;
        }
    } else if (do_rope) {
        // transformers: cos/sin cast to bf16; q*cos + rotate_half(q)*sin, each product rounded.
        const float* c = cos_t + (size_t)positions[t] * half;
        const float* s = sin_t + (size_t)positions[t] * half;
#pragma unroll
        for (int j = 0; j < QKV_MAX_PAIRS; ++j) {
            int i = lane + 32 * j;
            if (i < half) {
                float cb = round_bf16(c[i]), sb = round_bf16(s[i]);
                float a = lo[j], b = hi[j];
                lo[j] = round_bf16(round_bf16(a * cb) + round_bf16(-b * sb));
                hi[j] = round_bf16(round_bf16(b * cb) + round_bf16(a * sb));
            }
        }
    }
    bf16* kdst = (!is_q && slot >= 0)
                     ? k_cache + ((size_t)slot * num_kv_heads + (head - num_heads)) * head_dim
                     : (bf16*)0;
#pragma unroll
    for (int j = 0; j < QKV_MAX_PAIRS; ++j) {
        int i = lane + 32 * j;
        if (i < half) {
            bf16 a = f32_to_bf16(lo[j]), b = f32_to_bf16(hi[j]);
            row[i] = a;
            row[i + half] = b;
            if (kdst) {
                kdst[i] = a;
                kdst[i + half] = b;
            }
        }
    }
}

// x[t, i] = bf16(x[t, i] + bias[i]) (linear layers with a bias, e.g. Qwen2's q/k/v).
// grid = (ceil(cols / 256), T), block = 256.
extern "C" __global__ void add_bias(bf16* __restrict__ x, const float* __restrict__ bias, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    size_t at = (size_t)blockIdx.y * cols + i;
    x[at] = f32_to_bf16(bf16_to_f32(x[at]) + bias[i]);
}

// out[t, i] = bf16(bf16(act(gate[t, i])) * up[t, i]) with rows `[gate | up]`.
// grid = (ceil(inter / 256), T), block = 256.
template <class Act>
__device__ __forceinline__ void gated_mul(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                                          int inter, Act act) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= inter) return;
    size_t t = blockIdx.y;
    float g = bf16_to_f32(gate_up[t * 2 * inter + i]);
    float u = bf16_to_f32(gate_up[t * 2 * inter + inter + i]);
    out[t * inter + i] = f32_to_bf16(round_bf16(act(g)) * u);
}

// SwiGLU: gated_mul with SiLU.
extern "C" __global__ void silu_mul(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                                    int inter) {
    gated_mul(gate_up, out, inter, Silu());
}

#ifdef EXTENDED_KERNELS
// Compiled for the models that need them only (KernelSet::Extended).

// GeGLU: gated_mul with GELU's tanh approximation (Gemma's gelu_pytorch_tanh).
extern "C" __global__ void gelu_tanh_mul(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                                         int inter) {
    gated_mul(gate_up, out, inter, GeluTanh());
}

// x[i] = bf16(x[i] * factor) (Gemma's embeddings). grid = ceil(n / 256), block = 256.
extern "C" __global__ void scale_bf16(bf16* __restrict__ x, float factor, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = f32_to_bf16(bf16_to_f32(x[i]) * factor);
}

// x[i] = bf16(cap * tanh(x[i] / cap)) (Gemma 2's final logits). grid = ceil(n / 256), block = 256.
extern "C" __global__ void softcap_bf16(bf16* __restrict__ x, float cap, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = f32_to_bf16(cap * tanhf(bf16_to_f32(x[i]) / cap));
}
#endif

// out[i, :] = x[rows[i], :]. grid = (n), block = 256.
extern "C" __global__ void gather_rows(const bf16* __restrict__ x, const int* __restrict__ rows,
                                       bf16* __restrict__ out, int cols) {
    const bf16* src = x + (size_t)rows[blockIdx.x] * cols;
    bf16* dst = out + (size_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = src[i];
}

// Widens bf16 to f32 (logits before sampling or on their way to the host). grid = ceil(n / 256), block = 256.
extern "C" __global__ void bf16_to_f32_kernel(const bf16* __restrict__ x, float* __restrict__ out,
                                              long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_to_f32(x[i]);
}
