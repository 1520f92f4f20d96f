// Sampling on the device: one block per logits row, only the chosen token id leaves the GPU.
// Greedy rows take the argmax (lowest index on ties). Other rows keep the tokens that pass
// top-k, then top-p over the renormalised top-k mass, then min-p, and draw with the
// exponential-race trick: argmax_i p_i / E_i with E_i ~ Exp(1), i.e.
// argmax_i (x_i / T - log E_i). E_i comes from a counter-based hash of
// (seed, offset, i), so a request's draw is reproducible from its seed and its step.
// Filters use value thresholds found by bisection over [min, max] of the row, so no sort:
// tokens tied with the threshold are all kept.

#define SAMPLE_THREADS 1024
#define BISECT_STEPS 40

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in (0, 1): 53 random bits, never 0 or 1, so both logs stay finite.
__device__ __forceinline__ double uniform01(unsigned long long seed, unsigned long long offset,
                                            unsigned int i) {
    unsigned long long h = mix64(seed ^ mix64(offset * 0x9e3779b97f4a7c15ull + i));
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Warp-wide argmax: best value, lowest index on ties. Every lane gets the result.
__device__ __forceinline__ void warp_argmax(float& v, int& idx) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
}

// Block-wide argmax: best value, lowest index on ties. Every thread gets the result.
__device__ __forceinline__ void block_argmax(float& v, int& idx, float* sv, int* si) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    warp_argmax(v, idx);
    __syncthreads();
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = idx;
    }
    __syncthreads();
    v = lane < nwarps ? sv[lane] : -INFINITY;
    idx = lane < nwarps ? si[lane] : 0x7fffffff;
    warp_argmax(v, idx);
}

// Number of row values >= t.
__device__ __forceinline__ float count_ge(const bf16* x, int vocab, float t, float* scratch) {
    float n = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) n += bf16_to_f32(x[i]) >= t ? 1.0f : 0.0f;
    return block_sum(n, scratch);
}

// Sum of exp((x - mx) / temp) over row values >= t.
__device__ __forceinline__ float mass_ge(const bf16* x, int vocab, float t, float mx, float inv_temp,
                                         float* scratch) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = bf16_to_f32(x[i]);
        if (v >= t) s += __expf((v - mx) * inv_temp);
    }
    return block_sum(s, scratch);
}

// Per row r: temperature[r] <= 0 means greedy; top_k[r] <= 0 or >= vocab disables top-k;
// top_p[r] >= 1 disables top-p; min_p[r] <= 0 disables min-p.
// grid = (rows), block = SAMPLE_THREADS.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_rows(
    const bf16* __restrict__ logits, int vocab, const float* __restrict__ temperature,
    const int* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ min_p,
    const unsigned long long* __restrict__ seeds, const unsigned long long* __restrict__ offsets,
    unsigned int* __restrict__ out) {
    __shared__ float scratch[32];
    __shared__ float sv[32];
    __shared__ int si[32];
    int r = blockIdx.x;
    const bf16* x = logits + (size_t)r * vocab;

    float best = -INFINITY, lo = INFINITY;
    int best_i = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = bf16_to_f32(x[i]);
        if (v > best) {  // strictly greater: a thread keeps its lowest index on ties
            best = v;
            best_i = i;
        }
        lo = fminf(lo, v);
    }
    block_argmax(best, best_i, sv, si);
    float temp = temperature[r];
    if (temp <= 0.0f) {
        if (threadIdx.x == 0) out[r] = (unsigned int)best_i;
        return;
    }
    float mx = best;
    lo = -block_max(-lo, scratch);
    float inv_temp = 1.0f / temp;

    // top-k: the largest threshold t with count(x >= t) >= k.
    float thresh = lo;
    int k = top_k[r];
    if (k > 0 && k < vocab) {
        float a = lo, b = mx;  // count(>= a) >= k holds, count(>= b) may not
        for (int it = 0; it < BISECT_STEPS; ++it) {
            float mid = 0.5f * (a + b);
            if (count_ge(x, vocab, mid, scratch) >= (float)k) a = mid; else b = mid;
        }
        thresh = a;
    }
    // top-p over the top-k set: the largest t with mass(x >= t) >= p * mass(x >= thresh).
    float p = top_p[r];
    if (p < 1.0f) {
        float target = p * mass_ge(x, vocab, thresh, mx, inv_temp, scratch);
        float a = thresh, b = mx;
        for (int it = 0; it < BISECT_STEPS; ++it) {
            float mid = 0.5f * (a + b);
            if (mass_ge(x, vocab, mid, mx, inv_temp, scratch) >= target) a = mid; else b = mid;
        }
        thresh = a;
    }
    // min-p: keep p_i >= min_p * p_max, i.e. x_i >= mx + T * log(min_p).
    float mp = min_p[r];
    if (mp > 0.0f) thresh = fmaxf(thresh, mx + temp * __logf(mp));
    thresh = fminf(thresh, mx);  // the most likely token always survives

    unsigned long long seed = seeds[r], offset = offsets[r];
    float score = -INFINITY;
    int pick = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = bf16_to_f32(x[i]);
        if (v >= thresh) {
            float e = (float)(-log(uniform01(seed, offset, (unsigned int)i)));
            float s = (v - mx) * inv_temp - __logf(e);
            if (s > score) {
                score = s;
                pick = i;
            }
        }
    }
    block_argmax(score, pick, sv, si);
    if (threadIdx.x == 0) out[r] = (unsigned int)pick;
}
