// Attention's tensor-core prefill kernel (after kernels/attention_decode.cu and
// attention_prefill.cu, whose shared pieces it uses).
//
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
