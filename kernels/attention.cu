// Attention over the paged KV cache. Cache layout per layer: `[num_slots, KVH, D]` bf16 for
// K and for V, slot = block_table[pos / block_size] * block_size + pos % block_size.
// Step metadata (built by the backend, one entry per sequence of the step):
//   seq_row_start[s], seq_n_tokens[s], seq_start_pos[s]; block_tables `[S, table_stride]`.
// The K/V of the step's own tokens are already in the cache (qkv_prep ran first), so both
// kernels read every key through the block table: a cached prefix and a later chunk of a
// chunked prefill need no special case.
// Sliding windows and soft-capping: every kernel has a `*_sliding` twin taking two last
// arguments, `window` (0: every earlier key) by which a query at position p attends to keys
// p - window < k <= p only (transformers' and vLLM's `sliding_window`), and `softcap` (0: none)
// by which each scaled score s becomes softcap · tanh(s / softcap) (Gemma 2), then `sinks`
// (nullptr: none), one logit per query head that joins the head's softmax denominator and
// weighs no value (gpt-oss): only the final normalisation changes (`sink_inv`), and with
// split decode contexts `paged_decode_reduce` applies it. The plain kernels pass 0, 0 and
// nullptr to the same code, which the compiler folds away. The twins are compiled only
// with -DEXTENDED_KERNELS, which the backend passes for a model that needs them (so start-up
// compiles no more for other models).
#ifdef EXTENDED_KERNELS
#define SLIDING_TWIN(...) __VA_ARGS__
#else
#define SLIDING_TWIN(...)
#endif

// ---------------------------------------------------------------------------------------
// Decode: one query token per sequence. A block owns (KV head, sequence, split) and reads
// each K/V row once for all G query heads of the GQA group. The context is cut into
// `num_splits` equal ranges (flash-decoding); with one split the block writes the output,
// else unnormalised partials that `paged_decode_reduce` merges.
// Keys are taken DEC_TILE at a time, in three phases so that every load is 16 bytes and
// all of a tile's K and V loads are in flight together before any is used: (1) scores: KL
// lanes share a key, each lane 8 dims (one 16-byte load); (2) online softmax of the tile,
// one warp per query head; (3) P.V: thread (key group kg, lane kl) sums keys kg, kg + NKG,
// ... of the tile for its 8 dims. Key groups are merged once at the end.
// Template: G = group size rounded up to an instantiated value, KL = lanes per key
// (head_dim <= 8 * KL, a multiple of 8). grid = (KVH, num_decode_seqs, num_splits),
// block = 32 * DEC_WARPS.
#define DEC_WARPS 4
#define DEC_THREADS (32 * DEC_WARPS)
#define DEC_TILE 64

// Eight bf16 values from a 16-byte word.
__device__ __forceinline__ void unpack_bf16x8(uint4 w, float* f) {
    unsigned int u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

// The 16 bytes at `head_off` of position `t`'s row of a paged cache.
__device__ __forceinline__ uint4 load_kv16(const bf16* __restrict__ cache, const int* __restrict__ table,
                                           int t, int block_size, size_t row_stride, size_t head_off) {
    size_t slot = (size_t)table[t / block_size] * block_size + t % block_size;
    return *reinterpret_cast<const uint4*>(cache + slot * row_stride + head_off);
}

// The decode kernels' query: thread lane `kl` holds dims d0..d0 + 7 of each of the G query
// heads of KV head `kvh`, pre-scaled; the accumulators start at zero.
template <int G>
__device__ __forceinline__ void decode_load_q(const bf16* __restrict__ qkv, int qkv_stride, int row,
                                              int kvh, int group, int head_dim, int d0, bool dim_ok,
                                              float scale, float (&q)[G][8], float (&acc)[G][8]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (g < group && dim_ok) {
            const bf16* qp = qkv + (size_t)row * qkv_stride + (size_t)(kvh * group + g) * head_dim + d0;
            unpack_bf16x8(*reinterpret_cast<const uint4*>(qp), f);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            q[g][e] = f[e] * scale;
            acc[g][e] = 0.0f;
        }
    }
}

// The factor that normalises a row whose scores have max `m` and sum of exp(score - m) `l`:
// 1 / l, or with a sink s for query head `head`, exp(m - m') / (l exp(m - m') + exp(s - m'))
// where m' = max(m, s), so that the sink's exp(s) joins the denominator without overflow.
__device__ __forceinline__ float sink_inv(float m, float l, const float* __restrict__ sinks,
                                          int head) {
    if (sinks == nullptr) return 1.0f / l;
    float s = sinks[head];
    float mm = fmaxf(m, s);
    float c = m == -INFINITY ? 0.0f : __expf(m - mm);
    return c / (l * c + __expf(s - mm));
}

// The decode kernels' end: the key groups' accumulators are summed through shared memory and
// the block writes the normalised output (one split) or its unnormalised partial with its
// running max and sum (several splits, merged by paged_decode_reduce).
template <int G, int KL>
__device__ __forceinline__ void decode_write_out(
    const float (&acc)[G][8], float (*s_acc)[G][8 * KL], const float* s_m, const float* s_l, int sub,
    int d0, int tid, int group, int head_dim, int row, int kvh, int di, int split, int num_splits,
    int num_heads, float* __restrict__ part_acc, float* __restrict__ part_ml, bf16* __restrict__ out,
    int out_stride, const float* __restrict__ sinks) {
    constexpr int NKG = DEC_THREADS / KL;
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int e = 0; e < 8; ++e) s_acc[sub][g][d0 + e] = acc[g][e];
    }
    __syncthreads();

    for (int idx = tid; idx < group * head_dim; idx += DEC_THREADS) {
        int g = idx / head_dim, d = idx % head_dim;
        float a = 0.0f;
#pragma unroll 4
        for (int k = 0; k < NKG; ++k) a += s_acc[k][g][d];
        float mx = s_m[g], lsum = s_l[g];
        int hq = kvh * group + g;
        if (num_splits == 1) {
            out[(size_t)row * out_stride + (size_t)hq * head_dim + d] =
                f32_to_bf16(a * sink_inv(mx, lsum, sinks, hq));
        } else {
            size_t pi = ((size_t)di * num_heads + hq) * num_splits + split;
            part_acc[pi * head_dim + d] = a;
            if (d == 0) {
                part_ml[pi * 2] = mx;
                part_ml[pi * 2 + 1] = lsum;
            }
        }
    }
}

// The context range a decode block reads (its split of the keys the query sees: the last
// `window` of them, all when window is 0) and its row.
struct DecodeSpan {
    int row, begin, end;
    const int* table;
};

__device__ __forceinline__ DecodeSpan decode_span(const int* __restrict__ block_tables,
                                                  int table_stride, const int* __restrict__ dec_seqs,
                                                  const int* __restrict__ seq_row_start,
                                                  const int* __restrict__ seq_n_tokens,
                                                  const int* __restrict__ seq_start_pos, int di,
                                                  int split, int num_splits, int window) {
    int seq = dec_seqs[di];
    int ctx = seq_start_pos[seq] + seq_n_tokens[seq];
    int lo = window > 0 ? max(0, ctx - window) : 0;  // the first key the query sees
    int chunk = (ctx - lo + num_splits - 1) / num_splits;
    int begin = lo + split * chunk;
    return DecodeSpan{seq_row_start[seq], begin, min(ctx, begin + chunk),
                      block_tables + (size_t)seq * table_stride};
}

// A scaled score soft-capped to cap · tanh(s / cap) (cap 0: unchanged).
__device__ __forceinline__ float soft_cap(float s, float cap) {
    return cap > 0.0f ? cap * tanhf(s / cap) : s;
}

// Phase 1 for one key: the G dot products of its 8 dims `k` held by this lane with the
// query, summed across the KL lanes of the key and soft-capped; lane 0 writes them to s_p
// (keys < n).
template <int G, int KL, int TILE>
__device__ __forceinline__ void decode_score_key(const float (&q)[G][8], const float (&k)[8], int key,
                                                 int n, int kl, float softcap, float (*s_p)[TILE]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += q[g][e] * k[e];
#pragma unroll
        for (int o = KL / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (kl == 0 && key < n) s_p[g][key] = soft_cap(dot, softcap);
    }
}

// Phase 2: the online softmax of a tile's n scores, warp w taking query heads w, w +
// DEC_WARPS, ...: s_p becomes the tile's unnormalised probabilities, s_corr the factor the
// accumulators are rescaled by, s_m and s_l the running max and sum.
template <int G, int TILE>
__device__ __forceinline__ void decode_softmax_tile(float (*s_p)[TILE], float* s_m, float* s_l,
                                                    float* s_corr, int n, int warp, int lane) {
    for (int g = warp; g < G; g += DEC_WARPS) {
        float sc[TILE / 32];
        float mt = -INFINITY;
#pragma unroll
        for (int j = 0; j < TILE / 32; ++j) {
            int key = lane + 32 * j;
            sc[j] = key < n ? s_p[g][key] : -INFINITY;
            mt = fmaxf(mt, sc[j]);
        }
        float m_old = s_m[g];
        float m_new = fmaxf(m_old, warp_max(mt));
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < TILE / 32; ++j) {
            int key = lane + 32 * j;
            float pr = key < n ? __expf(sc[j] - m_new) : 0.0f;
            s_p[g][key] = pr;
            sum += pr;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            float corr = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
            s_corr[g] = corr;
            s_l[g] = s_l[g] * corr + sum;
            s_m[g] = m_new;
        }
    }
}

// Phase 3's start: the accumulators rescaled to the tile's running max.
template <int G>
__device__ __forceinline__ void decode_rescale(float (&acc)[G][8], const float* s_corr) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float corr = s_corr[g];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
    }
}

// Phase 3 for one key: acc += p · v over this lane's 8 dims `v`.
template <int G, int TILE>
__device__ __forceinline__ void decode_add_pv(float (&acc)[G][8], const float (*s_p)[TILE], int key,
                                              const float (&v)[8]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float pr = s_p[g][key];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += pr * v[e];
    }
}

template <int G, int KL>
__device__ __forceinline__ void paged_decode_impl(
    const bf16* __restrict__ qkv, int qkv_stride, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int* __restrict__ block_tables, int table_stride,
    const int* __restrict__ dec_seqs, const int* __restrict__ seq_row_start,
    const int* __restrict__ seq_n_tokens, const int* __restrict__ seq_start_pos,
    float* __restrict__ part_acc, float* __restrict__ part_ml, bf16* __restrict__ out,
    int out_stride, int num_heads, int num_kv_heads, int head_dim, int block_size,
    int num_splits, float scale, int window, float softcap, const float* __restrict__ sinks) {
    constexpr int KEYS_PER_PASS = DEC_THREADS / KL;  // phase 1: keys scored together
    constexpr int PASSES = DEC_TILE / KEYS_PER_PASS;
    constexpr int NKG = DEC_THREADS / KL;            // phase 3: key groups
    constexpr int KEYS_PER_GROUP = DEC_TILE / NKG;
    constexpr int HD = 8 * KL;
    __shared__ float s_p[G][DEC_TILE];
    __shared__ float s_m[G], s_l[G], s_corr[G];
    __shared__ float s_acc[NKG][G][HD];

    int kvh = blockIdx.x, di = blockIdx.y, split = blockIdx.z;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int kl = tid % KL, sub = tid / KL;  // lane within a key, key (phase 1) or key group (phase 3)
    int d0 = 8 * kl;
    bool dim_ok = d0 < head_dim;
    int group = num_heads / num_kv_heads;
    DecodeSpan span = decode_span(block_tables, table_stride, dec_seqs, seq_row_start, seq_n_tokens,
                                  seq_start_pos, di, split, num_splits, window);
    int row = span.row, begin = span.begin, end = span.end;
    const int* table = span.table;
    size_t head_off = (size_t)kvh * head_dim + d0;
    size_t row_stride = (size_t)num_kv_heads * head_dim;

    float q[G][8], acc[G][8];
    decode_load_q<G>(qkv, qkv_stride, row, kvh, group, head_dim, d0, dim_ok, scale, q, acc);
    if (tid < G) {
        s_m[tid] = -INFINITY;
        s_l[tid] = 0.0f;
    }

    for (int t0 = begin; t0 < end; t0 += DEC_TILE) {
        int n = min(DEC_TILE, end - t0);
        // (1) scores. The tile's V rows are loaded here too: they do not depend on the
        // scores, so both loads are in flight together.
        uint4 kw[PASSES], vw[KEYS_PER_GROUP];
#pragma unroll
        for (int j = 0; j < KEYS_PER_GROUP; ++j) {
            int key = sub + j * NKG;
            vw[j] = key < n && dim_ok ? load_kv16(v_cache, table, t0 + key, block_size, row_stride, head_off)
                                      : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            int key = p * KEYS_PER_PASS + sub;
            kw[p] = key < n && dim_ok ? load_kv16(k_cache, table, t0 + key, block_size, row_stride, head_off)
                                      : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            float k[8];
            unpack_bf16x8(kw[p], k);
            decode_score_key<G, KL, DEC_TILE>(q, k, p * KEYS_PER_PASS + sub, n, kl, softcap, s_p);
        }
        __syncthreads();
        // (2) online softmax of the tile
        decode_softmax_tile<G, DEC_TILE>(s_p, s_m, s_l, s_corr, n, warp, lane);
        __syncthreads();
        // (3) P.V
        decode_rescale<G>(acc, s_corr);
#pragma unroll
        for (int j = 0; j < KEYS_PER_GROUP; ++j) {
            int key = sub + j * NKG;
            if (key < n) {
                float v[8];
                unpack_bf16x8(vw[j], v);
                decode_add_pv<G, DEC_TILE>(acc, s_p, key, v);
            }
        }
        __syncthreads();
    }

    decode_write_out<G, KL>(acc, s_acc, s_m, s_l, sub, d0, tid, group, head_dim, row, kvh, di, split,
                            num_splits, num_heads, part_acc, part_ml, out, out_stride, sinks);
}

// The parameters every decode entry point takes, and the same names as arguments.
#define DECODE_PARAMS                                                                          \
    const bf16 *qkv, int qkv_stride, const bf16 *k_cache, const bf16 *v_cache,                 \
        const int *block_tables, int table_stride, const int *dec_seqs,                        \
        const int *seq_row_start, const int *seq_n_tokens, const int *seq_start_pos,           \
        float *part_acc, float *part_ml, bf16 *out, int out_stride, int num_heads,             \
        int num_kv_heads, int head_dim, int block_size, int num_splits, float scale
#define DECODE_ARGS                                                                            \
    qkv, qkv_stride, k_cache, v_cache, block_tables, table_stride, dec_seqs, seq_row_start,    \
        seq_n_tokens, seq_start_pos, part_acc, part_ml, out, out_stride, num_heads,            \
        num_kv_heads, head_dim, block_size, num_splits, scale

// A decode kernel `NAME` on IMPL<G, KL> (no window, no cap, no sinks) and its sliding twin.
#define DECODE_ENTRIES(NAME, IMPL, G, KL)                                                      \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) NAME(DECODE_PARAMS) {            \
        IMPL<G, KL>(DECODE_ARGS, 0, 0.0f, nullptr);                                            \
    }                                                                                          \
    SLIDING_TWIN(extern "C" __global__ void __launch_bounds__(DEC_THREADS)                     \
                     NAME##_sliding(DECODE_PARAMS, int window, float softcap,                  \
                                    const float* sinks) {                                      \
                         IMPL<G, KL>(DECODE_ARGS, window, softcap, sinks);                     \
                     })

#define DECODE_KERNEL(G, KL) DECODE_ENTRIES(paged_decode_g##G##_k##KL, paged_decode_impl, G, KL)

DECODE_KERNEL(1, 2)
DECODE_KERNEL(1, 8)
DECODE_KERNEL(1, 16)
DECODE_KERNEL(1, 32)
DECODE_KERNEL(2, 2)
DECODE_KERNEL(2, 8)
DECODE_KERNEL(2, 16)
DECODE_KERNEL(2, 32)
DECODE_KERNEL(4, 2)
DECODE_KERNEL(4, 8)
DECODE_KERNEL(4, 16)
DECODE_KERNEL(4, 32)
DECODE_KERNEL(8, 2)
DECODE_KERNEL(8, 8)
DECODE_KERNEL(8, 16)
DECODE_KERNEL(8, 32)

// ---------------------------------------------------------------------------------------
// Decode with pipelined tile loads (the default; `--decode-attention direct` takes the
// kernel above): the blocks, splits,
// thread roles and arithmetic of paged_decode_g*, but the K and V rows of each tile are
// copied into shared memory with cp.async, DA_STAGES - 1 tiles ahead of the tile computed,
// so the loads of later tiles stay in flight through a tile's scores, softmax and P.V (the
// register-loaded kernel has nothing in flight while it computes: ncu read it as latency-bound,
// 50-54% of HBM peak; on an H100 this one read 57% at batch 64 x 512 beside its 54%, and 78%
// at batch 256 x 1024). Each thread copies the 16 bytes at dims 8 * kl of the keys it scores
// (sub + p * KEYS_PER_PASS), looking up each key's slot once for K and V. A tile holds
// DA_TILE keys (more where one pass scores more: head_dim <= 16). Dynamic shared memory per
// block: DA_STAGES x tile x 8 * KL bf16 for K and again for V, which the key groups'
// accumulators reuse at the end (decode_async_smem_bytes on the host: the larger of the two).
// Three stages keep a head dim of 128 at four blocks per SM (48 KiB each).
// Below sm_80 the copies are plain loads and stores (correct, not overlapped).
#define DA_TILE 32

// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned int smem_u32(const void* p) {
    unsigned int a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
#else
    *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#define DA_STAGES 3

template <int G, int KL>
__device__ __forceinline__ void paged_decode_async_impl(
    const bf16* __restrict__ qkv, int qkv_stride, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int* __restrict__ block_tables, int table_stride,
    const int* __restrict__ dec_seqs, const int* __restrict__ seq_row_start,
    const int* __restrict__ seq_n_tokens, const int* __restrict__ seq_start_pos,
    float* __restrict__ part_acc, float* __restrict__ part_ml, bf16* __restrict__ out,
    int out_stride, int num_heads, int num_kv_heads, int head_dim, int block_size,
    int num_splits, float scale, int window, float softcap, const float* __restrict__ sinks) {
    constexpr int HD = 8 * KL, STAGES = DA_STAGES;
    constexpr int KEYS_PER_PASS = DEC_THREADS / KL;  // keys scored together
    constexpr int TILE = KEYS_PER_PASS > DA_TILE ? KEYS_PER_PASS : DA_TILE;
    constexpr int PASSES = TILE / KEYS_PER_PASS;     // keys each thread copies and scores per tile
    constexpr int NKG = DEC_THREADS / KL;         // P.V key groups
    constexpr int KEYS_PER_GROUP = TILE / NKG;
    static_assert(TILE % KEYS_PER_PASS == 0 && TILE % NKG == 0 && TILE % 32 == 0, "tile shape");
    // The stages, and after the last tile the key groups' accumulators in the same bytes.
    extern __shared__ uint4 da_smem[];
    bf16* s_k = reinterpret_cast<bf16*>(da_smem);  // [STAGES][TILE][HD]
    bf16* s_v = s_k + STAGES * TILE * HD;         // [STAGES][TILE][HD]
    auto s_acc = reinterpret_cast<float (*)[G][HD]>(da_smem);  // [NKG][G][HD]
    __shared__ float s_p[G][TILE];
    __shared__ float s_m[G], s_l[G], s_corr[G];

    int kvh = blockIdx.x, di = blockIdx.y, split = blockIdx.z;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int kl = tid % KL, sub = tid / KL;
    int d0 = 8 * kl;
    bool dim_ok = d0 < head_dim;
    int group = num_heads / num_kv_heads;
    DecodeSpan span = decode_span(block_tables, table_stride, dec_seqs, seq_row_start, seq_n_tokens,
                                  seq_start_pos, di, split, num_splits, window);
    int row = span.row, begin = span.begin, end = span.end;
    const int* table = span.table;
    int num_tiles = end > begin ? (end - begin + TILE - 1) / TILE : 0;
    size_t head_off = (size_t)kvh * head_dim + d0;
    size_t row_stride = (size_t)num_kv_heads * head_dim;

    float q[G][8], acc[G][8];
    decode_load_q<G>(qkv, qkv_stride, row, kvh, group, head_dim, d0, dim_ok, scale, q, acc);
    if (tid < G) {
        s_m[tid] = -INFINITY;
        s_l[tid] = 0.0f;
    }

    // Copies tile `t`'s rows of this thread's keys into stage `st` (rows past `end` and dims
    // past head_dim are not copied, and never read).
    auto issue = [&](int t, int st) {
        int t0 = begin + t * TILE;
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            int key = p * KEYS_PER_PASS + sub;
            int pos = t0 + key;
            if (pos < end && dim_ok) {
                size_t slot = (size_t)table[pos / block_size] * block_size + pos % block_size;
                size_t src = slot * row_stride + head_off;
                size_t dst = ((size_t)st * TILE + key) * HD + d0;
                cp_async16(s_k + dst, k_cache + src);
                cp_async16(s_v + dst, v_cache + src);
            }
        }
    };
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < num_tiles) issue(t, t);
        cp_async_commit();
    }

    for (int t = 0; t < num_tiles; ++t) {
        int st = t % STAGES;
        int n = min(TILE, end - (begin + t * TILE));
        // Tile t's group is complete once at most STAGES - 2 later ones are in flight (each
        // thread reads only the rows it copied itself, so its own wait suffices); the barrier
        // ends tile t - 1's reads of the stage that tile t + STAGES - 1 now refills.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (t + STAGES - 1 < num_tiles) issue(t + STAGES - 1, (t + STAGES - 1) % STAGES);
        cp_async_commit();
        const bf16* tk = s_k + (size_t)st * TILE * HD;
        const bf16* tv = s_v + (size_t)st * TILE * HD;
        // (1) scores
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            int key = p * KEYS_PER_PASS + sub;
            float k[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (key < n && dim_ok) unpack_bf16x8(*reinterpret_cast<const uint4*>(tk + key * HD + d0), k);
            decode_score_key<G, KL, TILE>(q, k, key, n, kl, softcap, s_p);
        }
        __syncthreads();
        // (2) online softmax of the tile
        decode_softmax_tile<G, TILE>(s_p, s_m, s_l, s_corr, n, warp, lane);
        __syncthreads();
        // (3) P.V (s_p and s_corr are next written after the next tile's first barrier)
        decode_rescale<G>(acc, s_corr);
#pragma unroll
        for (int j = 0; j < KEYS_PER_GROUP; ++j) {
            int key = sub + j * NKG;
            if (key < n && dim_ok) {
                float v[8];
                unpack_bf16x8(*reinterpret_cast<const uint4*>(tv + key * HD + d0), v);
                decode_add_pv<G, TILE>(acc, s_p, key, v);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    decode_write_out<G, KL>(acc, s_acc, s_m, s_l, sub, d0, tid, group, head_dim, row, kvh, di, split,
                            num_splits, num_heads, part_acc, part_ml, out, out_stride, sinks);
}

#define DECODE_ASYNC_KERNEL(G, KL)                                                             \
    DECODE_ENTRIES(paged_decode_async_g##G##_k##KL, paged_decode_async_impl, G, KL)

DECODE_ASYNC_KERNEL(1, 2)
DECODE_ASYNC_KERNEL(1, 8)
DECODE_ASYNC_KERNEL(1, 16)
DECODE_ASYNC_KERNEL(1, 32)
DECODE_ASYNC_KERNEL(2, 2)
DECODE_ASYNC_KERNEL(2, 8)
DECODE_ASYNC_KERNEL(2, 16)
DECODE_ASYNC_KERNEL(2, 32)
DECODE_ASYNC_KERNEL(4, 2)
DECODE_ASYNC_KERNEL(4, 8)
DECODE_ASYNC_KERNEL(4, 16)
DECODE_ASYNC_KERNEL(4, 32)
DECODE_ASYNC_KERNEL(8, 2)
DECODE_ASYNC_KERNEL(8, 8)
DECODE_ASYNC_KERNEL(8, 16)
DECODE_ASYNC_KERNEL(8, 32)

// Merges the split partials of paged_decode_*: out = sum_j acc_j e^(m_j - M) / sum_j l_j e^(m_j - M),
// a head's sink (`sinks` non-null) joining the denominator (`sink_inv`).
// grid = (H, num_decode_seqs), block = 128.
extern "C" __global__ void paged_decode_reduce(const float* __restrict__ part_acc,
                                               const float* __restrict__ part_ml,
                                               const int* __restrict__ dec_seqs,
                                               const int* __restrict__ seq_row_start,
                                               bf16* __restrict__ out, int out_stride,
                                               int num_heads, int head_dim, int num_splits,
                                               const float* __restrict__ sinks) {
    int hq = blockIdx.x, di = blockIdx.y;
    size_t base = ((size_t)di * num_heads + hq) * num_splits;
    float mx = -INFINITY;
    for (int j = 0; j < num_splits; ++j) mx = fmaxf(mx, part_ml[(base + j) * 2]);
    float lsum = 0.0f;
    for (int j = 0; j < num_splits; ++j) {
        float mj = part_ml[(base + j) * 2];
        if (mj != -INFINITY) lsum += part_ml[(base + j) * 2 + 1] * __expf(mj - mx);
    }
    int row = seq_row_start[dec_seqs[di]];
    float inv = sink_inv(mx, lsum, sinks, hq);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int j = 0; j < num_splits; ++j) {
            float mj = part_ml[(base + j) * 2];
            if (mj != -INFINITY) a += part_acc[(base + j) * head_dim + d] * __expf(mj - mx);
        }
        out[(size_t)row * out_stride + (size_t)hq * head_dim + d] = f32_to_bf16(a * inv);
    }
}

// ---------------------------------------------------------------------------------------
// Prefill: causal attention of a tile of PF_BQ query rows of one sequence and one query head
// over key tiles of PF_BK positions read from the cache. Online softmax in f32, scores and
// P·V on CUDA cores (where the tensor-core `prefill_attention_fa_d*` below cannot run).
// Thread (r = tid / 4, c = tid % 4) owns query row r, keys c + 4 * jj of each key tile and
// output dims 2c + 8j, 2c + 8j + 1. NP = dim pairs per thread (head_dim <= 8 * NP).
// Tiles: tile_seq[i] = step sequence, tile_q0[i] = first query index of the tile.
// grid = (num_tiles, H), block = PF_THREADS, dynamic shared memory = prefill_smem_bytes(D).
#define PF_BQ 32
#define PF_BK 32
#define PF_THREADS 128

template <int NP>
__device__ __forceinline__ void prefill_impl(
    const bf16* __restrict__ qkv, int qkv_stride, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int* __restrict__ block_tables, int table_stride,
    const int* __restrict__ tile_seq, const int* __restrict__ tile_q0,
    const int* __restrict__ seq_row_start, const int* __restrict__ seq_n_tokens,
    const int* __restrict__ seq_start_pos, bf16* __restrict__ out, int out_stride,
    int num_heads, int num_kv_heads, int head_dim, int block_size, float scale, int window, float softcap,
    const float* __restrict__ sinks) {
    extern __shared__ unsigned int pf_smem[];
    int ld = head_dim + 2;  // bf16 row stride (even, so rows stay 4-byte aligned)
    bf16* qs = reinterpret_cast<bf16*>(pf_smem);
    bf16* ks = qs + PF_BQ * ld;
    bf16* vs = ks + PF_BK * ld;
    float* ps = reinterpret_cast<float*>(vs + PF_BK * ld);  // [PF_BQ][PF_BK + 1]

    int tid = threadIdx.x, r = tid >> 2, c = tid & 3;
    int seq = tile_seq[blockIdx.x], q0 = tile_q0[blockIdx.x];
    int hq = blockIdx.y, kvh = hq / (num_heads / num_kv_heads);
    int n_tok = seq_n_tokens[seq], start = seq_start_pos[seq], row0 = seq_row_start[seq];
    const int* table = block_tables + (size_t)seq * table_stride;
    int half = head_dim >> 1;
    int q_last = min(n_tok, q0 + PF_BQ) - 1;
    int k_max = start + q_last;  // last key position any row of this tile sees
    int k_min = window > 0 ? max(0, start + q0 - window + 1) : 0;  // the first one

    for (int idx = tid; idx < PF_BQ * half; idx += PF_THREADS) {
        int qr = idx / half, p = idx % half;
        unsigned int w = 0;
        if (q0 + qr < n_tok) {
            const bf16* src = qkv + (size_t)(row0 + q0 + qr) * qkv_stride + (size_t)hq * head_dim + 2 * p;
            w = *reinterpret_cast<const unsigned int*>(src);
        }
        *reinterpret_cast<unsigned int*>(qs + qr * ld + 2 * p) = w;
    }

    bool row_valid = q0 + r < n_tok;
    int qpos = start + q0 + r;
    float m = -INFINITY, l = 0.0f;
    float acc[NP][2];
#pragma unroll
    for (int j = 0; j < NP; ++j) acc[j][0] = acc[j][1] = 0.0f;

    for (int kt = k_min / PF_BK; kt * PF_BK <= k_max; ++kt) {
        __syncthreads();  // previous tile fully consumed (and the q tile stored)
        for (int idx = tid; idx < PF_BK * half; idx += PF_THREADS) {
            int kr = idx / half, p = idx % half;
            int kpos = kt * PF_BK + kr;
            unsigned int kw = 0, vw = 0;
            if (kpos <= k_max) {
                size_t slot = (size_t)table[kpos / block_size] * block_size + kpos % block_size;
                size_t off = (slot * num_kv_heads + kvh) * head_dim + 2 * p;
                kw = *reinterpret_cast<const unsigned int*>(k_cache + off);
                vw = *reinterpret_cast<const unsigned int*>(v_cache + off);
            }
            *reinterpret_cast<unsigned int*>(ks + kr * ld + 2 * p) = kw;
            *reinterpret_cast<unsigned int*>(vs + kr * ld + 2 * p) = vw;
        }
        __syncthreads();

        float s[PF_BK / 4];
        float tile_max = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < PF_BK / 4; ++jj) {
            int kr = c + 4 * jj;
            int kpos = kt * PF_BK + kr;
            float dot = 0.0f;
            for (int p = 0; p < half; ++p) {
                float qa, qb, ka, kb;
                load_bf16x2(qs + r * ld + 2 * p, qa, qb);
                load_bf16x2(ks + kr * ld + 2 * p, ka, kb);
                dot += qa * ka + qb * kb;
            }
            bool seen = kpos <= qpos && (window == 0 || kpos > qpos - window);
            s[jj] = (row_valid && seen) ? soft_cap(dot * scale, softcap) : -INFINITY;
            tile_max = fmaxf(tile_max, s[jj]);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        float m_new = fmaxf(m, tile_max);
        float corr = m_new == -INFINITY ? 1.0f : __expf(m - m_new);
        float psum = 0.0f;
#pragma unroll
        for (int jj = 0; jj < PF_BK / 4; ++jj) {
            float p = s[jj] == -INFINITY ? 0.0f : __expf(s[jj] - m_new);
            psum += p;
            ps[r * (PF_BK + 1) + c + 4 * jj] = p;
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        psum += __shfl_xor_sync(0xffffffffu, psum, 2);
        l = l * corr + psum;
        m = m_new;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < NP; ++j) {
            int d = 2 * c + 8 * j;
            if (d < head_dim) {
                float a0 = acc[j][0] * corr, a1 = acc[j][1] * corr;
                for (int kr = 0; kr < PF_BK; ++kr) {
                    float p = ps[r * (PF_BK + 1) + kr];
                    float va, vb;
                    load_bf16x2(vs + kr * ld + d, va, vb);
                    a0 += p * va;
                    a1 += p * vb;
                }
                acc[j][0] = a0;
                acc[j][1] = a1;
            }
        }
    }

    if (row_valid) {
        bf16* dst = out + (size_t)(row0 + q0 + r) * out_stride + (size_t)hq * head_dim;
        float inv = sink_inv(m, l, sinks, hq);
#pragma unroll
        for (int j = 0; j < NP; ++j) {
            int d = 2 * c + 8 * j;
            if (d < head_dim) {
                dst[d] = f32_to_bf16(acc[j][0] * inv);
                dst[d + 1] = f32_to_bf16(acc[j][1] * inv);
            }
        }
    }
}

#define PREFILL_KERNEL(NP)                                                                     \
    extern "C" __global__ void __launch_bounds__(PF_THREADS) prefill_attention_np##NP(         \
        const bf16* qkv, int qkv_stride, const bf16* k_cache, const bf16* v_cache,             \
        const int* block_tables, int table_stride, const int* tile_seq, const int* tile_q0,    \
        const int* seq_row_start, const int* seq_n_tokens, const int* seq_start_pos,           \
        bf16* out, int out_stride, int num_heads, int num_kv_heads, int head_dim,              \
        int block_size, float scale) {                                                         \
        prefill_impl<NP>(qkv, qkv_stride, k_cache, v_cache, block_tables, table_stride,        \
                         tile_seq, tile_q0, seq_row_start, seq_n_tokens, seq_start_pos, out,   \
                         out_stride, num_heads, num_kv_heads, head_dim, block_size, scale, 0, 0.0f, \
                         nullptr);                                                             \
    }                                                                                          \
    SLIDING_TWIN(extern "C" __global__ void __launch_bounds__(PF_THREADS)                      \
        prefill_attention_np##NP##_sliding(                                                    \
            const bf16* qkv, int qkv_stride, const bf16* k_cache, const bf16* v_cache,         \
            const int* block_tables, int table_stride, const int* tile_seq,                    \
            const int* tile_q0, const int* seq_row_start, const int* seq_n_tokens,             \
            const int* seq_start_pos, bf16* out, int out_stride, int num_heads,                \
            int num_kv_heads, int head_dim, int block_size, float scale, int window, float softcap, \
            const float* sinks) {                                                              \
        prefill_impl<NP>(qkv, qkv_stride, k_cache, v_cache, block_tables, table_stride,        \
                         tile_seq, tile_q0, seq_row_start, seq_n_tokens, seq_start_pos, out,   \
                         out_stride, num_heads, num_kv_heads, head_dim, block_size, scale,     \
                         window, softcap, sinks);                                              \
    })

PREFILL_KERNEL(4)
PREFILL_KERNEL(8)
PREFILL_KERNEL(16)
PREFILL_KERNEL(32)

// ---------------------------------------------------------------------------------------
// Prefill on tensor cores: the pieces of the tensor-core prefill kernel below, bf16
// `mma.sync.m16n8k16` with f32 accumulators, the online softmax in f32 on the accumulator
// fragments, P reused from the score fragments as the A operand of P·V (rounded to bf16, as
// FlashAttention does).
// Fragment layouts (PTX ISA, m16n8k16, g = lane / 4, c = lane % 4): A regs (row g, cols
// 2c..2c+1), (g + 8, 2c..), (g, 2c + 8..), (g + 8, 2c + 8..); B regs (k rows 2c..2c+1, col
// g), (k rows 2c + 8.., col g); C (row g, cols 2c, 2c + 1), (row g + 8, cols 2c, 2c + 1).

// bf16 mma.sync needs sm_80: older GPUs compile a trap (the host refuses `mma` there), so the
// rest of the program still compiles for them.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned int (&a)[4],
                                               unsigned int b0, unsigned int b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// Two f32 as a bf16 pair, `lo` in the low half (the lower k index of a fragment register).
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    return (unsigned int)f32_to_bf16(lo) | ((unsigned int)f32_to_bf16(hi) << 16);
}

// The online softmax of one key tile's score fragments on tensor cores (this thread's rows
// r0: s[.][0..1], r1: s[.][2..3]; the tile's first key k0): scores masked by causality, the
// window and the rows' validity, scaled and soft-capped; the running maxima and sums moved on
// and the accumulators rescaled; s left holding the tile's unnormalised probabilities.
template <int NT, int DT>
__device__ __forceinline__ void mma_softmax_tile(float (&s)[NT][4], float (&o)[DT][4], int k0, int c,
                                                 int qpos0, int qpos1, bool valid0, bool valid1,
                                                 int window, float scale, float softcap, float& m0,
                                                 float& m1, float& l0, float& l1) {
    float t0 = -INFINITY, t1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            int kpos = k0 + 8 * nt + 2 * c + e;
            bool seen0 = kpos <= qpos0 && (window == 0 || kpos > qpos0 - window);
            bool seen1 = kpos <= qpos1 && (window == 0 || kpos > qpos1 - window);
            s[nt][e] = (valid0 && seen0) ? soft_cap(s[nt][e] * scale, softcap) : -INFINITY;
            s[nt][2 + e] = (valid1 && seen1) ? soft_cap(s[nt][2 + e] * scale, softcap) : -INFINITY;
            t0 = fmaxf(t0, s[nt][e]);
            t1 = fmaxf(t1, s[nt][2 + e]);
        }
    }
    t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 1));
    t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 2));
    t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 1));
    t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 2));
    float n0 = fmaxf(m0, t0), n1 = fmaxf(m1, t1);
    float corr0 = n0 == -INFINITY ? 1.0f : __expf(m0 - n0);
    float corr1 = n1 == -INFINITY ? 1.0f : __expf(m1 - n1);
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            s[nt][e] = s[nt][e] == -INFINITY ? 0.0f : __expf(s[nt][e] - n0);
            s[nt][2 + e] = s[nt][2 + e] == -INFINITY ? 0.0f : __expf(s[nt][2 + e] - n1);
            sum0 += s[nt][e];
            sum1 += s[nt][2 + e];
        }
    }
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
    l0 = l0 * corr0 + sum0;
    l1 = l1 * corr1 + sum1;
    m0 = n0;
    m1 = n1;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
        o[dt][0] *= corr0;
        o[dt][1] *= corr0;
        o[dt][2] *= corr1;
        o[dt][3] *= corr1;
    }
}

// The A fragment of P for keys 16kc..16kc + 15: the probabilities of score n-tiles 2kc and
// 2kc + 1, rounded to bf16 (as FlashAttention does).
template <int NT>
__device__ __forceinline__ void mma_p_fragment(const float (&s)[NT][4], int kc, unsigned int (&pa)[4]) {
    pa[0] = pack_bf16x2(s[2 * kc][0], s[2 * kc][1]);
    pa[1] = pack_bf16x2(s[2 * kc][2], s[2 * kc][3]);
    pa[2] = pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
    pa[3] = pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
}

// The tensor-core kernels' end: rows r0 and r1 of the tile normalised (`sink_inv`) and
// written to dst0 and dst1 (each at its head's first dim), rows past the sequence skipped.
template <int DT>
__device__ __forceinline__ void mma_write_rows(const float (&o)[DT][4], float m0, float m1, float l0,
                                               float l1, bool valid0, bool valid1,
                                               const float* __restrict__ sinks, int hq, int c,
                                               bf16* dst0, bf16* dst1) {
    float inv0 = valid0 ? sink_inv(m0, l0, sinks, hq) : 0.0f;
    float inv1 = valid1 ? sink_inv(m1, l1, sinks, hq) : 0.0f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
        int d = 8 * dt + 2 * c;
        if (valid0)
            *reinterpret_cast<unsigned int*>(dst0 + d) = pack_bf16x2(o[dt][0] * inv0, o[dt][1] * inv0);
        if (valid1)
            *reinterpret_cast<unsigned int*>(dst1 + d) = pack_bf16x2(o[dt][2] * inv1, o[dt][3] * inv1);
    }
}

// ---------------------------------------------------------------------------------------
// Prefill on tensor cores (`--prefill-attention mma`, the default from sm_80; checked on an
// H200 against transformers' logprobs at head dims 32, 64 and 128, and 5.1 times faster than
// the simpler tensor-core kernel it replaced over the 16k-token step): the tiles of
// `prefill_attention_np*` (PF_BQ query rows of one sequence, the same arguments, window,
// soft-cap and sinks) with the pieces above, laid out for throughput:
//   - a block holds HB query heads of one GQA group (HB = 2 where the group size is even), so
//     each K/V tile is read from the cache once for both; warp w computes the 16 query rows
//     16 * (w % 2).. of the tile's PF_BQ for head h0 + w / 2;
//   - K and V tiles are copied with cp.async into two stages, the next tile's copies in flight
//     while the current one computes; rows past the last key the block sees are zero-filled,
//     never read from the cache;
//   - fragments come from ldmatrix: Q and K as stored, V through ldmatrix.trans (V stays
//     row-major: no transposed stores into shared memory);
//   - PFA_BK keys a tile: 64 for head dims up to 64, 32 for 128 (two stages of K and V rows of
//     D + 8 bf16 stay within 48 KiB); Q is staged through the second stage's buffer before the
//     first copy into it.
// grid = (num_tiles, H / HB), block = 64 * HB, dynamic shared memory = prefill_fa_smem_bytes(D).
#define PFA_BK(D) ((D) <= 64 ? 64 : 32)

// cp_async16, or 16 zero bytes where `valid` is false (nothing is read from `gmem` then).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
#if __CUDA_ARCH__ >= 800
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
#else
    *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}

// ldmatrix: four 8x8 b16 matrices (lanes 8i..8i+7 give matrix i's row addresses), or two.
// sm_80 code only (the kernels that use it need bf16 mma.sync).
__device__ __forceinline__ void ldmatrix_x4(unsigned int (&r)[4], const bf16* p) {
#if __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
#else
    __trap();
#endif
}

// TRANS: each matrix transposed on the way (`.trans`).
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x2(unsigned int& r0, unsigned int& r1, const bf16* p) {
#if __CUDA_ARCH__ >= 800
    if constexpr (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r0), "=r"(r1)
                     : "r"(smem_u32(p))
                     : "memory");
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r0), "=r"(r1)
                     : "r"(smem_u32(p))
                     : "memory");
    }
#else
    __trap();
#endif
}

template <int D, int HB>
__device__ __forceinline__ void prefill_fa_impl(
    const bf16* __restrict__ qkv, int qkv_stride, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int* __restrict__ block_tables, int table_stride,
    const int* __restrict__ tile_seq, const int* __restrict__ tile_q0,
    const int* __restrict__ seq_row_start, const int* __restrict__ seq_n_tokens,
    const int* __restrict__ seq_start_pos, bf16* __restrict__ out, int out_stride,
    int num_heads, int num_kv_heads, int block_size, float scale, int window, float softcap,
    const float* __restrict__ sinks) {
    constexpr int BK = PFA_BK(D);
    constexpr int LD = D + 8;          // row stride (bf16): 16 bytes of padding
    constexpr int KSTEPS = D / 16;     // k steps of Q·Kᵀ
    constexpr int NT = BK / 8;         // key n-tiles of S
    constexpr int DT = D / 8;          // dim n-tiles of O
    constexpr int THREADS = 64 * HB;
    constexpr int CHUNKS = D / 8;      // 16-byte chunks a row
    constexpr int STAGE = 2 * BK * LD; // bf16 a stage: its K tile, then its V tile
    static_assert(D % 16 == 0, "head_dim must be a multiple of the mma k step");
    static_assert(BK % 16 == 0, "P·V takes keys 16 at a time");
    static_assert(HB * PF_BQ * LD <= STAGE, "Q is staged through one stage");
    extern __shared__ uint4 fa_smem[];
    bf16* smem = reinterpret_cast<bf16*>(fa_smem);

    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    int seq = tile_seq[blockIdx.x], q0 = tile_q0[blockIdx.x];
    int h0 = blockIdx.y * HB;
    int hq = h0 + warp / 2;
    int kvh = h0 / (num_heads / num_kv_heads);
    int n_tok = seq_n_tokens[seq], start = seq_start_pos[seq], row0 = seq_row_start[seq];
    const int* table = block_tables + (size_t)seq * table_stride;
    int q_last = min(n_tok, q0 + PF_BQ) - 1;
    int k_max = start + q_last;  // the last key any row of the tile sees
    int k_min = window > 0 ? max(0, start + q0 - window + 1) : 0;
    int kt_first = k_min / BK, kt_last = k_max / BK;
    size_t row_stride = (size_t)num_kv_heads * D;

    // Copies key tile `kt` into stage `st` (cp.async; rows past k_max zero-filled).
    auto issue = [&](int kt, int st) {
        bf16* ks = smem + st * STAGE;
        bf16* vs = ks + BK * LD;
        for (int idx = tid; idx < BK * CHUNKS; idx += THREADS) {
            int kr = idx / CHUNKS, ch = idx % CHUNKS;
            int kpos = kt * BK + kr;
            bool valid = kpos <= k_max;
            size_t off = 0;
            if (valid) {
                size_t slot = (size_t)table[kpos / block_size] * block_size + kpos % block_size;
                off = slot * row_stride + (size_t)kvh * D + 8 * ch;
            }
            cp_async16_zfill(ks + kr * LD + 8 * ch, k_cache + off, valid);
            cp_async16_zfill(vs + kr * LD + 8 * ch, v_cache + off, valid);
        }
    };

    issue(kt_first, 0);
    cp_async_commit();
    // Q through the second stage: head hh's rows at hh * PF_BQ.
    bf16* qs = smem + STAGE;
    for (int idx = tid; idx < HB * PF_BQ * CHUNKS; idx += THREADS) {
        int hr = idx / CHUNKS, ch = idx % CHUNKS;
        int hh = hr / PF_BQ, qr = hr % PF_BQ;
        uint4 w = make_uint4(0, 0, 0, 0);
        if (q0 + qr < n_tok) {
            w = *reinterpret_cast<const uint4*>(qkv + (size_t)(row0 + q0 + qr) * qkv_stride +
                                                 (size_t)(h0 + hh) * D + 8 * ch);
        }
        *reinterpret_cast<uint4*>(qs + hr * LD + 8 * ch) = w;
    }
    __syncthreads();
    int wr = (warp / 2) * PF_BQ + 16 * (warp % 2);  // the warp's first row in qs
    unsigned int qa[KSTEPS][4];
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        ldmatrix_x4(qa[kk], qs + (wr + (lane % 16)) * LD + 16 * kk + (lane / 16) * 8);
    }
    __syncthreads();  // Q is in registers: the second stage may be refilled

    int r0 = 16 * (warp % 2) + g, r1 = r0 + 8;  // this thread's rows of the tile
    bool valid0 = q0 + r0 < n_tok, valid1 = q0 + r1 < n_tok;
    int qpos0 = start + q0 + r0, qpos1 = start + q0 + r1;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

    for (int kt = kt_first; kt <= kt_last; ++kt) {
        int st = (kt - kt_first) & 1;
        if (kt < kt_last) issue(kt + 1, st ^ 1);
        cp_async_commit();
        cp_async_wait<1>();  // tile kt's copies are done (the next tile's may be in flight)
        __syncthreads();
        const bf16* ks = smem + st * STAGE;
        const bf16* vs = ks + BK * LD;

        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                unsigned int b0, b1;
                ldmatrix_x2<false>(b0, b1, ks + (8 * nt + (lane % 8)) * LD + 16 * kk + ((lane / 8) % 2) * 8);
                mma_bf16_16816(s[nt], qa[kk], b0, b1);
            }
        }
        mma_softmax_tile(s, o, kt * BK, c, qpos0, qpos1, valid0, valid1, window, scale, softcap,
                         m0, m1, l0, l1);
        // O += P·V, 16 keys a k step: the score fragments of n-tiles 2kc, 2kc + 1 are the A
        // fragment of P; V's B fragments come transposed from its row-major tile.
#pragma unroll
        for (int kc = 0; kc < BK / 16; ++kc) {
            unsigned int pa[4];
            mma_p_fragment(s, kc, pa);
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                unsigned int b0, b1;
                ldmatrix_x2<true>(b0, b1, vs + (16 * kc + (lane % 8) + ((lane / 8) % 2) * 8) * LD + 8 * dt);
                mma_bf16_16816(o[dt], pa, b0, b1);
            }
        }
        __syncthreads();  // this stage is refilled by the next iteration's copies
    }
    cp_async_wait<0>();

    mma_write_rows(o, m0, m1, l0, l1, valid0, valid1, sinks, hq, c,
                   out + (size_t)(row0 + q0 + r0) * out_stride + (size_t)hq * D,
                   out + (size_t)(row0 + q0 + r1) * out_stride + (size_t)hq * D);
}

#define PREFILL_FA_KERNEL(D, HB)                                                               \
    extern "C" __global__ void __launch_bounds__(64 * HB) prefill_attention_fa_d##D##_h##HB(   \
        const bf16* qkv, int qkv_stride, const bf16* k_cache, const bf16* v_cache,             \
        const int* block_tables, int table_stride, const int* tile_seq, const int* tile_q0,    \
        const int* seq_row_start, const int* seq_n_tokens, const int* seq_start_pos,           \
        bf16* out, int out_stride, int num_heads, int num_kv_heads, int head_dim,              \
        int block_size, float scale) {                                                         \
        prefill_fa_impl<D, HB>(qkv, qkv_stride, k_cache, v_cache, block_tables, table_stride,  \
                               tile_seq, tile_q0, seq_row_start, seq_n_tokens, seq_start_pos,  \
                               out, out_stride, num_heads, num_kv_heads, block_size, scale, 0, \
                               0.0f, nullptr);                                                 \
    }                                                                                          \
    SLIDING_TWIN(extern "C" __global__ void __launch_bounds__(64 * HB)                         \
        prefill_attention_fa_d##D##_h##HB##_sliding(                                           \
            const bf16* qkv, int qkv_stride, const bf16* k_cache, const bf16* v_cache,         \
            const int* block_tables, int table_stride, const int* tile_seq,                    \
            const int* tile_q0, const int* seq_row_start, const int* seq_n_tokens,             \
            const int* seq_start_pos, bf16* out, int out_stride, int num_heads,                \
            int num_kv_heads, int head_dim, int block_size, float scale, int window, float softcap, \
            const float* sinks) {                                                              \
        prefill_fa_impl<D, HB>(qkv, qkv_stride, k_cache, v_cache, block_tables, table_stride,  \
                               tile_seq, tile_q0, seq_row_start, seq_n_tokens, seq_start_pos,  \
                               out, out_stride, num_heads, num_kv_heads, block_size, scale,    \
                               window, softcap, sinks);                                        \
    })

PREFILL_FA_KERNEL(16, 1)
PREFILL_FA_KERNEL(16, 2)
PREFILL_FA_KERNEL(32, 1)
PREFILL_FA_KERNEL(32, 2)
PREFILL_FA_KERNEL(64, 1)
PREFILL_FA_KERNEL(64, 2)
PREFILL_FA_KERNEL(128, 1)
PREFILL_FA_KERNEL(128, 2)
