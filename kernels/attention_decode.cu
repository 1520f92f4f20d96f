// Attention over the paged KV cache, in three files compiled in this order as one program
// (kernels/attention_decode.cu, attention_prefill.cu, attention_mma.cu): this first one
// holds what they share, then the decode kernels.
//
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
