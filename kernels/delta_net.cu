// Gated DeltaNet layers (Qwen3-Next, Qwen3.5) and the gates beside them. Never run on a GPU
// yet: loaded only with --cuda-unverified-kernels (issue 63).
//
// A layer's projection rows are `[q k v | z | b a]` (bf16, `width` columns): q and k of
// `key_heads` heads of `dk`, v and z of `value_heads` heads of `dv`, one b and one a per value
// head. The convolution runs over the `channels` = 2 * key_heads * dk + value_heads * dv
// columns of q, k and v.
//
// A sequence's recurrent state is f32, spread over the pages of its state table (the
// table's pages in order): a page is a block of the layer index's KV cache, its K region
// then its V region read as f32 (`half` values each, whole rows of a value head). The
// state: each value head's dk x dv matrix row by row, then the convolution's last
// `kernel - 1` inputs, oldest first, each a row of every channel (the CPU backend's
// layout). A step's sequences are described by
// `seq_rows[s]` (first row), `seq_len[s]` (rows), `seq_start[s]` (first position: at 0 the
// state starts at zero) and their state tables in this layer group (`pages` entries,
// `table_stride` apart); its checkpoints by `save_seq[c]`, `save_group[c]` (those of other
// groups than `group` are skipped), `save_rows[c]` (the rows of the sequence computed before
// the state it takes) and their tables (`save_stride` apart).
#ifdef EXTENDED_KERNELS

__device__ __forceinline__ float* state_value(float* k, float* v, const unsigned int* table,
                                              long long flat, int half) {
    long long offset = flat % (2 * half);
    float* base = offset < half ? k : v;
    return base + (size_t)table[flat / (2 * half)] * half + offset % half;
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + __expf(-x)); }

// log(1 + e^x), PyTorch's threshold of 20.
__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

// The causal depthwise convolution with SiLU: mixed[r, c] = silu(sum_j conv[j, c] * in[r + j])
// over the history and the step's inputs of channel c; the history is left at the last row,
// and each checkpoint of the sequence gets the history at its row. conv is tap-major
// `[kernel, channels]`. kernel <= 8. grid = (sequences, ceil(channels / 256)), block = 256.
extern "C" __global__ void delta_net_conv(
    const bf16* __restrict__ proj, int width, const float* __restrict__ conv, int kernel,
    int channels, float* __restrict__ mixed, float* __restrict__ k_cache,
    float* __restrict__ v_cache, int half,
    long long matrices, const int* __restrict__ seq_rows, const int* __restrict__ seq_len,
    const int* __restrict__ seq_start, const unsigned int* __restrict__ tables, int table_stride,
    const int* __restrict__ save_seq, const int* __restrict__ save_group,
    const int* __restrict__ save_rows, const unsigned int* __restrict__ save_tables,
    int save_stride, int num_saves, int group) {
    int s = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    const unsigned int* table = tables + (size_t)s * table_stride;
    bool fresh = seq_start[s] == 0;
    int history = kernel - 1;
    float window[7];
    for (int j = 0; j < history; ++j) {
        window[j] = fresh ? 0.0f
                          : *state_value(k_cache, v_cache, table,
                                         matrices + (long long)j * channels + c, half);
    }
    int first = seq_rows[s];
    for (int t = 0; t < seq_len[s]; ++t) {
        float x = bf16_to_f32(proj[(size_t)(first + t) * width + c]);
        float acc = conv[(size_t)history * channels + c] * x;
        for (int j = 0; j < history; ++j) acc += conv[(size_t)j * channels + c] * window[j];
        mixed[(size_t)(first + t) * channels + c] = acc * sigmoidf(acc);
        for (int j = 0; j + 1 < history; ++j) window[j] = window[j + 1];
        if (history > 0) window[history - 1] = x;
        for (int k = 0; k < num_saves; ++k) {
            if (save_seq[k] != s || save_group[k] != group || save_rows[k] != t + 1) continue;
            const unsigned int* saved = save_tables + (size_t)k * save_stride;
            for (int j = 0; j < history; ++j) {
                *state_value(k_cache, v_cache, saved, matrices + (long long)j * channels + c,
                             half) = window[j];
            }
        }
    }
    for (int j = 0; j < history; ++j) {
        *state_value(k_cache, v_cache, table, matrices + (long long)j * channels + c, half) =
            window[j];
    }
}

// Per row: q and k L2-normalised per key head (q also scaled by dk^-1/2), in place in
// `mixed`; per value head beta = sigmoid(b) and g = decay * softplus(a + dt_bias) into
// `gates[row, 0..value_heads]` and `gates[row, value_heads..]`. grid = (T), block = 128.
extern "C" __global__ void delta_net_prep(const bf16* __restrict__ proj, int width,
                                          float* __restrict__ mixed, int channels, int key_heads,
                                          int dk, int value_heads, int gates_at,
                                          const float* __restrict__ decay,
                                          const float* __restrict__ dt_bias,
                                          float* __restrict__ gates) {
    int row = blockIdx.x;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int warps = blockDim.x >> 5;
    float* m = mixed + (size_t)row * channels;
    float scale = rsqrtf((float)dk);
    for (int h = warp; h < 2 * key_heads; h += warps) {
        float* head = m + (size_t)h * dk;
        float ss = 0.0f;
        for (int i = lane; i < dk; i += 32) ss += head[i] * head[i];
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        float factor = rsqrtf(ss + 1e-6f) * (h < key_heads ? scale : 1.0f);
        for (int i = lane; i < dk; i += 32) head[i] *= factor;
    }
    const bf16* p = proj + (size_t)row * width + gates_at;
    for (int h = threadIdx.x; h < value_heads; h += blockDim.x) {
        gates[(size_t)row * 2 * value_heads + h] = sigmoidf(bf16_to_f32(p[h]));
        gates[(size_t)row * 2 * value_heads + value_heads + h] =
            decay[h] * softplusf(bf16_to_f32(p[value_heads + h]) + dt_bias[h]);
    }
}

// The recurrence, position by position, one block per (sequence, value head), thread j owning
// column j of the head's state (DK values in registers): S <- e^g S;
// S += k (x) beta (v - S^T k); o = S^T q. `core[row, h * dv + j]` gets o. Each checkpoint of the
// sequence gets the state after its rows. `tiled`: value head h reads key head h % key_heads
// (else h / (value_heads / key_heads)). grid = (sequences, value_heads), block = dv.
template <int DK>
__device__ void delta_net_recurrence(
    const float* __restrict__ mixed, int channels, const float* __restrict__ gates,
    float* __restrict__ core, float* __restrict__ k_cache, float* __restrict__ v_cache, int half,
    int key_heads,
    int value_heads, int dv, int tiled, const int* __restrict__ seq_rows,
    const int* __restrict__ seq_len, const int* __restrict__ seq_start,
    const unsigned int* __restrict__ tables, int table_stride, const int* __restrict__ save_seq,
    const int* __restrict__ save_group, const int* __restrict__ save_rows,
    const unsigned int* __restrict__ save_tables, int save_stride, int num_saves, int group) {
    __shared__ float q[DK];
    __shared__ float k[DK];
    int s = blockIdx.x;
    int h = blockIdx.y;
    int j = threadIdx.x;
    int kh = tiled ? h % key_heads : h / (value_heads / key_heads);
    const unsigned int* table = tables + (size_t)s * table_stride;
    bool fresh = seq_start[s] == 0;
    long long base = (long long)h * DK * dv + j;
    float state[DK];
#pragma unroll
    for (int r = 0; r < DK; ++r) {
        state[r] = fresh ? 0.0f
                         : *state_value(k_cache, v_cache, table, base + (long long)r * dv, half);
    }
    int kw = key_heads * DK;
    int first = seq_rows[s];
    for (int t = 0; t < seq_len[s]; ++t) {
        const float* m = mixed + (size_t)(first + t) * channels;
        __syncthreads();
        for (int i = j; i < DK; i += blockDim.x) {
            q[i] = m[kh * DK + i];
            k[i] = m[kw + kh * DK + i];
        }
        __syncthreads();
        float v = m[2 * kw + h * dv + j];
        float beta = gates[(size_t)(first + t) * 2 * value_heads + h];
        float decay = __expf(gates[(size_t)(first + t) * 2 * value_heads + value_heads + h]);
        float ks = 0.0f;
#pragma unroll
        for (int r = 0; r < DK; ++r) ks += k[r] * state[r];
        float delta = beta * (v - decay * ks);
        float o = 0.0f;
#pragma unroll
        for (int r = 0; r < DK; ++r) {
            state[r] = decay * state[r] + k[r] * delta;
            o += q[r] * state[r];
        }
        core[(size_t)(first + t) * value_heads * dv + h * dv + j] = o;
        for (int c = 0; c < num_saves; ++c) {
            if (save_seq[c] != s || save_group[c] != group || save_rows[c] != t + 1) continue;
            const unsigned int* saved = save_tables + (size_t)c * save_stride;
#pragma unroll
            for (int r = 0; r < DK; ++r) {
                *state_value(k_cache, v_cache, saved, base + (long long)r * dv, half) = state[r];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < DK; ++r) {
        *state_value(k_cache, v_cache, table, base + (long long)r * dv, half) = state[r];
    }
}

#define DELTA_NET_RECURRENCE(DK)                                                               \
    extern "C" __global__ void delta_net_recurrence_dk##DK(                                    \
        const float* __restrict__ mixed, int channels, const float* __restrict__ gates,       \
        float* __restrict__ core, float* __restrict__ k_cache,                                \
        float* __restrict__ v_cache, int half, int key_heads,                                 \
        int value_heads, int dv, int tiled, const int* __restrict__ seq_rows,                 \
        const int* __restrict__ seq_len, const int* __restrict__ seq_start,                   \
        const unsigned int* __restrict__ tables, int table_stride,                            \
        const int* __restrict__ save_seq, const int* __restrict__ save_group,                 \
        const int* __restrict__ save_rows, const unsigned int* __restrict__ save_tables,      \
        int save_stride, int num_saves, int group) {                                           \
        delta_net_recurrence<DK>(mixed, channels, gates, core, k_cache, v_cache, half, key_heads, \
                                 value_heads, dv, tiled, seq_rows, seq_len, seq_start, tables, \
                                 table_stride, save_seq, save_group, save_rows, save_tables,  \
                                 save_stride, num_saves, group);                               \
    }
DELTA_NET_RECURRENCE(16)
DELTA_NET_RECURRENCE(32)
DELTA_NET_RECURRENCE(64)
DELTA_NET_RECURRENCE(128)

// The gated RMSNorm over each value head of `core` (f32), times the weight and silu(z) of the
// projection row: out[row, h * dv + i] (bf16). grid = (T, value_heads), block = 128.
extern "C" __global__ void delta_net_gated_norm(const float* __restrict__ core,
                                                const bf16* __restrict__ proj, int width,
                                                int z_at, const float* __restrict__ w, int dv,
                                                float eps, bf16* __restrict__ out) {
    __shared__ float scratch[32];
    int row = blockIdx.x;
    int h = blockIdx.y;
    int value_width = gridDim.y * dv;
    const float* o = core + (size_t)row * value_width + (size_t)h * dv;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss += o[i] * o[i];
    float inv = rsqrtf(block_sum(ss, scratch) / (float)dv + eps);
    const bf16* z = proj + (size_t)row * width + z_at + (size_t)h * dv;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        float g = bf16_to_f32(z[i]);
        out[(size_t)row * value_width + (size_t)h * dv + i] =
            f32_to_bf16(o[i] * inv * w[i] * (g * sigmoidf(g)));
    }
}

// Copies `n` pages of state (each a block's K and V regions of `half` f32) from blocks
// `from[i]` to blocks `to[i]` of a layer index's KV cache. grid = (n), block = 256.
extern "C" __global__ void copy_state_pages(float* __restrict__ k_cache,
                                            float* __restrict__ v_cache,
                                            const unsigned int* __restrict__ from,
                                            const unsigned int* __restrict__ to, int half) {
    for (int r = 0; r < 2; ++r) {
        float* base = r == 0 ? k_cache : v_cache;
        const float* src = base + (size_t)from[blockIdx.x] * half;
        float* dst = base + (size_t)to[blockIdx.x] * half;
        for (int i = threadIdx.x; i < half; i += blockDim.x) dst[i] = src[i];
    }
}

// x[i] = bf16(x[i] * sigmoid(gate[i])), element by element (an attention output gate).
// grid = (ceil(n / 256)), block = 256.
extern "C" __global__ void sigmoid_gate_bf16(bf16* __restrict__ x, const bf16* __restrict__ gate,
                                             long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = f32_to_bf16(bf16_to_f32(x[i]) * sigmoidf(bf16_to_f32(gate[i])));
}

// out[r, :] = bf16(out[r, :] + sigmoid(gate[r]) * x[r, :]) (a gated shared expert).
// grid = (rows), block = 256.
extern "C" __global__ void add_gated_bf16(bf16* __restrict__ out, const bf16* __restrict__ x,
                                          const bf16* __restrict__ gate, int cols) {
    size_t base = (size_t)blockIdx.x * cols;
    float g = sigmoidf(bf16_to_f32(gate[blockIdx.x]));
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        out[base + i] = f32_to_bf16(bf16_to_f32(out[base + i]) + g * bf16_to_f32(x[base + i]));
    }
}

#endif
