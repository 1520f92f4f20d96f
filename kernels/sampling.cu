// Sampling on the device: one block per logits row (f32), only the chosen token id and the
// asked-for logprobs leave the GPU.
// `apply_penalties` first masks ids (EOS and stop ids before min_tokens) and applies the
// repetition, presence and frequency penalties from a sparse list of (row, token) entries.
// `sample_rows` then takes the argmax for greedy rows (lowest index on ties). Other rows keep
// the tokens that pass top-k, then top-p over the renormalised top-k mass, then min-p, and draw
// with the exponential-race trick: argmax_i p_i / E_i with E_i ~ Exp(1), i.e.
// argmax_i (x_i / T - log E_i). E_i comes from a counter-based hash of (seed, draw, i), so a
// request's draw is reproducible from its seed and its step.
// Filters use value thresholds found by bisection over [min, max] of the row, so no sort:
// tokens tied with the threshold are all kept.
// Logprobs are those of the distribution drawn from (after penalties, temperature and the
// filters), as the CPU sampler reports them.

#define SAMPLE_THREADS 1024
#define BISECT_STEPS 40
// Words per row of `sample_rows`' output: token, its logprob, the number of top entries,
// then SAMPLE_MAX_TOP ids and SAMPLE_MAX_TOP logprobs.
#define SAMPLE_MAX_TOP 20
#define SAMPLE_OUT_WORDS (3 + 2 * SAMPLE_MAX_TOP)

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in (0, 1): 24 random bits, never 0 or 1, so both logs stay finite. Single
// precision on purpose: a double log per vocabulary entry made sampling cost more than the
// rest of a decode step's tail (as in vLLM, the exponential race is drawn in f32).
__device__ __forceinline__ float uniform01(unsigned long long seed, unsigned long long offset,
                                           unsigned int i) {
    unsigned long long h = mix64(seed ^ mix64(offset * 0x9e3779b97f4a7c15ull + i));
    return ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
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
__device__ __forceinline__ float count_ge(const float* x, int vocab, float t, float* scratch) {
    float n = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) n += x[i] >= t ? 1.0f : 0.0f;
    return block_sum(n, scratch);
}

// Sum of exp((x - mx) / temp) over row values >= t.
__device__ __forceinline__ float mass_ge(const float* x, int vocab, float t, float mx, float inv_temp,
                                         float* scratch) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (v >= t) s += __expf((v - mx) * inv_temp);
    }
    return block_sum(s, scratch);
}

// entries: `[n, 4]` ints (row, token, output count, flags); flag 1: the token is in the
// prompt or output (repetition penalty), flag 2: masked. Each (row, token) appears once.
// grid = ceil(n / 256), block = 256.
extern "C" __global__ void apply_penalties(float* __restrict__ logits, int vocab,
                                           const int* __restrict__ entries, int n,
                                           const float* __restrict__ repetition,
                                           const float* __restrict__ presence,
                                           const float* __restrict__ frequency) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const int* en = entries + 4 * e;
    int row = en[0], tok = en[1], count = en[2], flags = en[3];
    if (tok < 0 || tok >= vocab) return;
    float* l = logits + (size_t)row * vocab + tok;
    if (flags & 2) {
        *l = -INFINITY;
        return;
    }
    float v = *l;
    float rep = repetition[row];
    if ((flags & 1) && rep != 1.0f) v = v > 0.0f ? v / rep : v * rep;
    if (count > 0) v -= frequency[row] * (float)count + presence[row];
    *l = v;
}

// Per row r: temperature[r] <= 0 means greedy; top_k[r] <= 0 or >= vocab disables top-k;
// top_p[r] >= 1 disables top-p; min_p[r] <= 0 disables min-p; n_top[r] < 0 asks for no
// logprobs, else the top n_top[r] (<= SAMPLE_MAX_TOP). `out` holds SAMPLE_OUT_WORDS per row.
// grid = (rows), block = SAMPLE_THREADS.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_rows(
    const float* __restrict__ logits, int vocab, const float* __restrict__ temperature,
    const int* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ min_p,
    const unsigned long long* __restrict__ seeds, const unsigned long long* __restrict__ draws,
    const int* __restrict__ n_top, int* __restrict__ out) {
    __shared__ float scratch[32];
    __shared__ float sv[32];
    __shared__ int si[32];
    int r = blockIdx.x;
    const float* x = logits + (size_t)r * vocab;
    int* o = out + (size_t)r * SAMPLE_OUT_WORDS;

    float best = -INFINITY, lo = INFINITY;
    int best_i = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (v > best) {  // strictly greater: a thread keeps its lowest index on ties
            best = v;
            best_i = i;
        }
        if (v > -INFINITY) lo = fminf(lo, v);  // masked tokens must not drag the bisections to -inf
    }
    block_argmax(best, best_i, sv, si);
    if (best_i == 0x7fffffff) best_i = 0;  // every logit masked: token 0, as the CPU's argmax
    float mx = best;
    float temp = temperature[r];
    bool greedy = temp <= 0.0f;
    float inv_temp = greedy ? 1.0f : 1.0f / temp;
    float thresh = -INFINITY;
    int pick = best_i;

    if (!greedy) {
        lo = -block_max(-lo, scratch);
        thresh = lo;
        // top-k: the largest threshold t with count(x >= t) >= k.
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

        unsigned long long seed = seeds[r], draw = draws[r];
        float score = -INFINITY;
        int chosen = 0x7fffffff;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            float v = x[i];
            if (v >= thresh && v > -INFINITY) {
                float e = -__logf(uniform01(seed, draw, (unsigned int)i));
                float s = (v - mx) * inv_temp - __logf(e);
                if (s > score) {
                    score = s;
                    chosen = i;
                }
            }
        }
        block_argmax(score, chosen, sv, si);
        if (chosen != 0x7fffffff) pick = chosen;
    }

    int nt = n_top[r];
    if (nt < 0) {
        if (threadIdx.x == 0) o[0] = pick;
        return;
    }
    nt = min(nt, SAMPLE_MAX_TOP);
    float log_z = __logf(mass_ge(x, vocab, thresh, mx, inv_temp, scratch));
    // Top entries in (value desc, id asc) order: each round takes the best entry after the
    // previous one in that order.
    float prev_v = INFINITY;
    int prev_i = -1, found = 0;
    for (int k = 0; k < nt; ++k) {
        float v_best = -INFINITY;
        int i_best = 0x7fffffff;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            float v = x[i];
            bool after = v < prev_v || (v == prev_v && i > prev_i);
            if (after && v >= thresh && v > -INFINITY && v > v_best) {
                v_best = v;
                i_best = i;
            }
        }
        block_argmax(v_best, i_best, sv, si);
        if (i_best == 0x7fffffff) break;
        if (threadIdx.x == 0) {
            o[3 + k] = i_best;
            o[3 + SAMPLE_MAX_TOP + k] = __float_as_int((v_best - mx) * inv_temp - log_z);
        }
        prev_v = v_best;
        prev_i = i_best;
        ++found;
    }
    if (threadIdx.x == 0) {
        o[0] = pick;
        o[1] = __float_as_int((x[pick] - mx) * inv_temp - log_z);
        o[2] = found;
    }
}
