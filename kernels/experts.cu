// Mixture-of-experts FFNs (Qwen3-MoE, gpt-oss): routing on the device, the step's (token, slot)
// entries grouped by expert, each expert's gated FFN over its entries, and each token's
// weighted sum. Every launch's grid depends only on the model's shapes and the step's row
// count, so a decode step with experts is captured in a CUDA graph like any other.
// Checked on an H200 against the CPU (Qwen3-MoE, gpt-oss with its MXFP4 experts).
#ifdef EXTENDED_KERNELS

// Routes token t = blockIdx.x: logits[e] = x[t] · router[e] (+ bias[e] when `bias` is not
// null; x bf16, router f32). With `top_k_first` 0 (Qwen3-MoE): a softmax over the experts in
// f32, the top_k most probable, their probabilities renormalised to sum to 1 when `norm`;
// with 1 (gpt-oss): the top_k largest logits, then a softmax over those. Ties go to the lower
// index (strict >). Writes ids[t * top_k + j] and weights[t * top_k + j], best first.
// grid = T, block = 128, shared = num_experts floats.
extern "C" __global__ void moe_route(const bf16* __restrict__ x, const float* __restrict__ router,
                                     const float* __restrict__ bias, int* __restrict__ ids,
                                     float* __restrict__ weights, int hidden, int num_experts,
                                     int top_k, int norm, int top_k_first) {
    extern __shared__ float score[];
    size_t t = blockIdx.x;
    const bf16* row = x + t * hidden;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int e = warp; e < num_experts; e += warps) {
        const float* w = router + (size_t)e * hidden;
        float s = 0.0f;
        for (int c = lane; c < hidden; c += 32) s += bf16_to_f32(row[c]) * w[c];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) score[e] = bias != nullptr ? s + bias[e] : s;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    float m = score[0];
    for (int e = 1; e < num_experts; ++e) m = fmaxf(m, score[e]);
    // The softmax's denominator over every expert (Qwen3-MoE's).
    float sum = 0.0f;
    for (int e = 0; e < num_experts; ++e) sum += expf(score[e] - m);
    // The top_k by logit (as the CPU ranks them, whatever exp underflows to), best first.
    float chosen = 0.0f;
    for (int j = 0; j < top_k; ++j) {
        int best = -1;
        for (int e = 0; e < num_experts; ++e) {
            bool taken = false;
            for (int i = 0; i < j; ++i) taken |= ids[t * top_k + i] == e;
            if (!taken && (best < 0 || score[e] > score[best])) best = e;
        }
        float p = expf(score[best] - m);
        ids[t * top_k + j] = best;
        weights[t * top_k + j] = top_k_first ? p : p / sum;
        chosen += weights[t * top_k + j];
    }
    if (norm || top_k_first) {
        for (int j = 0; j < top_k; ++j) weights[t * top_k + j] /= chosen;
    }
}

// Groups the step's `entries` (token, slot) entries i = t * top_k + j by expert: entries routed
// to expert e are order[offsets[e] .. offsets[e + 1]] (in no set order: each entry's result is
// its own, and moe_combine sums a token's slots in slot order). grid = 1, block = 1024,
// shared = num_experts ints.
extern "C" __global__ void moe_group(const int* __restrict__ ids, int entries, int num_experts,
                                     int* __restrict__ offsets, int* __restrict__ order) {
    extern __shared__ int cursor[];
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) cursor[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < entries; i += blockDim.x) atomicAdd(&cursor[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int e = 0; e < num_experts; ++e) {
            int count = cursor[e];
            offsets[e] = run;
            cursor[e] = run;
            run += count;
        }
        offsets[num_experts] = run;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < entries; i += blockDim.x) order[atomicAdd(&cursor[ids[i]], 1)] = i;
}

// Expert e = blockIdx.y's gate and up rows r over its entries: g = bf16(x[i / top_k] ·
// gate_up_e[r] (+ its bias)) and u = bf16(x[i / top_k] · gate_up_e[inter + r] (+ its bias)), as
// the dense path's GEMM rounds; then act[i, r] = bf16(bf16(silu(g)) * u) (`limit` 0, the same
// Silu as silu_mul), or gpt-oss's clamped SwiGLU bf16((clamp(u, -limit, limit) + 1) ·
// bf16(g' σ(alpha g'))) with g' = min(g, limit).
// gate_up_w[e] points at expert e's fused `[2 × inter, hidden]` weight, gate_up_b[e] (when the
// table is not null) at its `[2 × inter]` f32 bias. One warp per row r.
// grid = (ceil(inter / 8), num_experts), block = 256.
extern "C" __global__ void moe_gate_up(const bf16* __restrict__ x,
                                       const unsigned long long* __restrict__ gate_up_w,
                                       const unsigned long long* __restrict__ gate_up_b,
                                       const int* __restrict__ offsets,
                                       const int* __restrict__ order, bf16* __restrict__ act,
                                       int hidden, int inter, int top_k, float alpha, float limit) {
    int e = blockIdx.y;
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= inter) return;
    const bf16* w = (const bf16*)gate_up_w[e];
    const bf16* wg = w + (size_t)r * hidden;
    const bf16* wu = w + (size_t)(inter + r) * hidden;
    const float* b = gate_up_b != nullptr ? (const float*)gate_up_b[e] : nullptr;
    float bg = b != nullptr ? b[r] : 0.0f, bu = b != nullptr ? b[inter + r] : 0.0f;
    for (int p = offsets[e]; p < offsets[e + 1]; ++p) {
        int i = order[p];
        const bf16* xr = x + (size_t)(i / top_k) * hidden;
        float g = 0.0f, u = 0.0f;
        for (int c = lane; c < hidden; c += 32) {
            float xv = bf16_to_f32(xr[c]);
            g += xv * bf16_to_f32(wg[c]);
            u += xv * bf16_to_f32(wu[c]);
        }
        for (int o = 16; o > 0; o >>= 1) {
            g += __shfl_xor_sync(0xffffffffu, g, o);
            u += __shfl_xor_sync(0xffffffffu, u, o);
        }
        if (lane == 0) {
            g = round_bf16(g + bg);
            u = round_bf16(u + bu);
            float v;
            if (limit > 0.0f) {
                float gc = fminf(g, limit);
                float uc = fminf(fmaxf(u, -limit), limit);
                v = (uc + 1.0f) * round_bf16(gc / (1.0f + __expf(-alpha * gc)));
            } else {
                v = round_bf16(Silu()(g)) * u;
            }
            act[(size_t)i * inter + r] = f32_to_bf16(v);
        }
    }
}

// Expert e = blockIdx.y's down row c over its entries: y[i, c] = bf16(act[i] · down_e[c]
// (+ its bias)) (the dense path's GEMM output). down_w[e] points at expert e's `[hidden, inter]`
// weight, down_b[e] (when the table is not null) at its `[hidden]` f32 bias. One warp per
// row c.
// grid = (ceil(hidden / 8), num_experts), block = 256.
extern "C" __global__ void moe_down(const bf16* __restrict__ act,
                                    const unsigned long long* __restrict__ down_w,
                                    const unsigned long long* __restrict__ down_b,
                                    const int* __restrict__ offsets,
                                    const int* __restrict__ order, bf16* __restrict__ y,
                                    int hidden, int inter) {
    int e = blockIdx.y;
    int c = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (c >= hidden) return;
    const bf16* w = (const bf16*)down_w[e] + (size_t)c * inter;
    float bias = down_b != nullptr ? ((const float*)down_b[e])[c] : 0.0f;
    for (int p = offsets[e]; p < offsets[e + 1]; ++p) {
        int i = order[p];
        const bf16* a = act + (size_t)i * inter;
        float s = 0.0f;
        for (int k = lane; k < inter; k += 32) s += bf16_to_f32(a[k]) * bf16_to_f32(w[k]);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) y[(size_t)i * hidden + c] = f32_to_bf16(s + bias);
    }
}

// out[t, c] = bf16(sum over slots j of weights[t * top_k + j] * y[t * top_k + j, c]), the slots
// in order. grid = (ceil(hidden / 256), T), block = 256.
extern "C" __global__ void moe_combine(const bf16* __restrict__ y,
                                       const float* __restrict__ weights, bf16* __restrict__ out,
                                       int hidden, int top_k) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    size_t t = blockIdx.y;
    float s = 0.0f;
    for (int j = 0; j < top_k; ++j) {
        size_t i = t * top_k + j;
        s += weights[i] * bf16_to_f32(y[i * hidden + c]);
    }
    out[t * hidden + c] = f32_to_bf16(s);
}

#endif
