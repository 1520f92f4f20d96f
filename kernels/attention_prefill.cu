// Attention's CUDA-core prefill kernel (after kernels/attention_decode.cu, whose shared
// pieces it uses: the paged-cache layout, `sink_inv`, `soft_cap`, `SLIDING_TWIN`).
//
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
