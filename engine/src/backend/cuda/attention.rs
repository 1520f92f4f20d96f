//! Attention on the device (`kernels/attention*.cu`): the KV cache, the deferred q/k norm
//! and RoPE fused with the cache write, the prefill and decode kernels' choice and launch,
//! and the split-K partials of long decodes.

use anyhow::{anyhow, ensure, Context};
use cudarc::driver::sys::CUfunction_attribute_enum;
use half::bf16;

use crate::backend::{AttentionOps, KvCacheShape, QkvLayout, ScoreSpec};
use crate::config::AttentionSpan;

use super::step::CudaStep;
use super::{
    choose_kernel, decode_async_smem_bytes, decode_kernel_name, int, kernels, prefill_kernel_name,
    prefill_smem_bytes, sliding_twin, with_twin, CudaAct, CudaBackend, CudaKvCache, CudaParam,
    DecodeAttention, KArg, KernelSet, PrefillAttention,
};

/// Deferred in-place work on a QKV matrix: q/k norm and RoPE, run fused by `attention`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pub(super) qkv: u64,
    pub(super) rows: usize,
    pub(super) layout: QkvLayout,
    pub(super) norm: Option<(u64, u64, f32)>,
    /// cos table, sin table, per-row positions, rotated dims of a head.
    pub(super) rope: Option<(u64, u64, u64, usize)>,
}

impl CudaBackend {
    /// The backend with prefill attention on `kernel` for a model of `head_dim`: a named
    /// tensor-core kernel is refused where it cannot run; `None` takes it where it can and
    /// the CUDA-core kernel elsewhere.
    pub fn with_prefill_attention(
        mut self,
        kernel: Option<PrefillAttention>,
        head_dim: usize,
    ) -> anyhow::Result<Self> {
        let (major, minor) = self.compute_capability()?;
        let mma_usable = || -> anyhow::Result<()> {
            ensure!(
                major >= 8,
                "--prefill-attention mma needs bf16 tensor cores (sm_80 or newer); this GPU is \
                 sm_{major}{minor}"
            );
            kernels::prefill_fa_kernel(head_dim, 1).map(|_| ())
        };
        self.prefill_attention = choose_kernel(
            kernel,
            (PrefillAttention::Mma, PrefillAttention::Scalar),
            mma_usable,
            "prefill attention on CUDA cores",
        )?;
        Ok(self)
    }

    /// The backend with decode attention on `kernel` for a model's GQA group size and head
    /// dim: the pipelined kernel's shared memory is raised for it (a GPU that cannot give a
    /// block that much refuses it when named); `None` takes it on sm_80 or newer where it fits
    /// (its copies overlap the compute only there) and the direct kernel elsewhere.
    pub fn with_decode_attention(
        mut self,
        kernel: Option<DecodeAttention>,
        group: usize,
        head_dim: usize,
    ) -> anyhow::Result<Self> {
        let (major, minor) = self.compute_capability()?;
        let pipelined_fits = || -> anyhow::Result<()> {
            let name = decode_kernel_name(DecodeAttention::Pipelined, group, head_dim).ok_or_else(
                || anyhow!("no decode kernel for group size {group} and head_dim {head_dim}"),
            )?;
            let smem = decode_async_smem_bytes(group, head_dim)
                .ok_or_else(|| anyhow!("no pipelined decode kernel for head_dim {head_dim}"))?;
            for name in with_twin(&name, self.kernel_set) {
                self.kernels
                    .get(&name)?
                    .set_attribute(
                        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        int(smem, "decode shared memory")?,
                    )
                    .with_context(|| {
                        format!(
                            "--decode-attention pipelined: `{name}` needs {smem} bytes of shared \
                             memory per block, more than this GPU (sm_{major}{minor}) gives"
                        )
                    })?;
            }
            Ok(())
        };
        self.decode_attention = if kernel.is_none() && major < 8 {
            DecodeAttention::Direct
        } else {
            choose_kernel(
                kernel,
                (DecodeAttention::Pipelined, DecodeAttention::Direct),
                pipelined_fits,
                "decode attention loads into registers",
            )?
        };
        Ok(self)
    }

    /// Runs deferred q/k norm and RoPE (without a KV write).
    pub(super) fn flush(&self) -> anyhow::Result<()> {
        let pending = self.state()?.pending.take();
        match pending {
            Some(p) => self.qkv_prep(&p, None),
            None => Ok(()),
        }
    }

    /// Queues norm or RoPE work on `qkv`, flushing work queued for another matrix or that
    /// must run first.
    pub(super) fn defer(
        &self,
        qkv: u64,
        rows: usize,
        layout: QkvLayout,
        f: impl Fn(&mut Pending) -> bool,
    ) -> anyhow::Result<()> {
        let mut st = self.state()?;
        let mut p = match st.pending.take() {
            Some(p) if p.qkv == qkv && p.rows == rows && p.layout == layout => p,
            other => {
                drop(st);
                if let Some(o) = other {
                    self.qkv_prep(&o, None)?;
                }
                st = self.state()?;
                Pending {
                    qkv,
                    rows,
                    layout,
                    norm: None,
                    rope: None,
                }
            }
        };
        if !f(&mut p) {
            drop(st);
            self.qkv_prep(&p, None)?;
            st = self.state()?;
            p = Pending {
                qkv,
                rows,
                layout,
                norm: None,
                rope: None,
            };
            ensure!(f(&mut p), "cannot queue an op on a fresh QKV state");
        }
        st.pending = Some(p);
        Ok(())
    }

    /// Launches `qkv_prep` for `p`, writing K/V into `cache` at the step's slots when given.
    pub(super) fn qkv_prep(
        &self,
        p: &Pending,
        write: Option<(&CudaKvCache, &CudaStep, usize)>,
    ) -> anyhow::Result<()> {
        let l = p.layout;
        let heads = l.num_heads + 2 * l.num_kv_heads;
        let (q_w, k_w, eps) = p.norm.unwrap_or((0, 0, 0.0));
        let (cos, sin, positions, rotary_dim) = p.rope.unwrap_or((0, 0, 0, l.head_dim));
        let (slots, kc, vc) = match write {
            Some((c, s, group)) => (s.slots(group)?, self.ptr(&c.k), self.ptr(&c.v)),
            None => (0, 0, 0),
        };
        let args = [
            KArg::Ptr(p.qkv),
            KArg::Ptr(q_w),
            KArg::Ptr(k_w),
            KArg::F32(eps),
            KArg::I32(p.norm.is_some() as i32),
            KArg::Ptr(cos),
            KArg::Ptr(sin),
            KArg::Ptr(positions),
            KArg::I32(p.rope.is_some() as i32),
            KArg::I32(int(rotary_dim, "rotary dims")?),
            KArg::Ptr(slots),
            KArg::Ptr(kc),
            KArg::Ptr(vc),
            KArg::I32(write.is_some() as i32),
            KArg::I32(int(l.num_heads, "num_heads")?),
            KArg::I32(int(l.num_kv_heads, "num_kv_heads")?),
            KArg::I32(int(l.head_dim, "head_dim")?),
        ];
        let grid = (int(p.rows, "rows")? as u32, heads.div_ceil(4) as u32, 1);
        self.launch("qkv_prep", grid, 128, 0, &args)
    }

    /// Grow-only split-K partial buffers; returns their pointers.
    pub(super) fn partials(&self, acc_len: usize, ml_len: usize) -> anyhow::Result<(u64, u64)> {
        let mut st = self.state()?;
        let grew = st.part_acc.as_ref().is_none_or(|b| b.len() < acc_len)
            || st.part_ml.as_ref().is_none_or(|b| b.len() < ml_len);
        if st.part_acc.as_ref().is_none_or(|b| b.len() < acc_len) {
            // SAFETY: the decode kernel writes every partial the reduce kernel reads.
            st.part_acc = Some(
                unsafe { self.stream.alloc::<f32>(acc_len) }
                    .context("allocating attention partials")?,
            );
        }
        if st.part_ml.as_ref().is_none_or(|b| b.len() < ml_len) {
            // SAFETY: as above.
            st.part_ml = Some(
                unsafe { self.stream.alloc::<f32>(ml_len) }
                    .context("allocating attention partials")?,
            );
        }
        if grew {
            st.graphs.epoch += 1;
        }
        let a = st.part_acc.as_ref().map(|b| self.ptr(b)).unwrap_or(0);
        let m = st.part_ml.as_ref().map(|b| self.ptr(b)).unwrap_or(0);
        Ok((a, m))
    }

    /// Context splits for a decode batch: enough blocks to fill the SMs with about eight
    /// resident blocks each (a block alone cannot keep enough loads in flight), at most 32,
    /// and at least two key tiles (128 positions) per split.
    pub(super) fn decode_splits(&self, num_kv_heads: usize, n_dec: usize, max_ctx: usize) -> usize {
        let base = (num_kv_heads * n_dec).max(1);
        let want = (8 * self.num_sms).div_ceil(base);
        want.clamp(1, 32).min(max_ctx.div_ceil(128).max(1))
    }
}

impl AttentionOps for CudaBackend {
    fn kv_value_bytes(&self) -> usize {
        std::mem::size_of::<bf16>()
    }

    fn keeps_windows(&self) -> bool {
        self.keeps_windows
    }

    fn new_kv_cache(&self, shape: KvCacheShape) -> anyhow::Result<CudaKvCache> {
        let n = shape.values()?;
        let k = self
            .stream
            .alloc_zeros::<bf16>(n)
            .context("allocating the K cache")?;
        let v = self
            .stream
            .alloc_zeros::<bf16>(n)
            .context("allocating the V cache")?;
        Ok(CudaKvCache {
            k,
            v,
            num_kv_heads: shape.num_kv_heads,
            head_dim: shape.head_dim,
            block_size: shape.block_size,
        })
    }

    fn attention(
        &self,
        qkv: &CudaAct,
        layout: QkvLayout,
        span: AttentionSpan,
        scores: ScoreSpec,
        sinks: Option<&CudaParam>,
        cache: &mut CudaKvCache,
        step: &CudaStep,
        group: usize,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        let window = match span {
            AttentionSpan::Full => None,
            AttentionSpan::Sliding { window } => Some(int(window, "sliding window")?),
        };
        // The plain kernel, or its sliding twin with the window, the soft-cap (0 for none)
        // and the sinks (null for none) as its last arguments.
        let sinks_ptr = sinks.map_or(0, |s| self.ptr(&s.data));
        let twin = window.is_some() || scores.softcap.is_some() || sinks.is_some();
        ensure!(
            !twin || self.kernel_set == KernelSet::Extended,
            "attention: this backend's kernels were compiled for a model without sliding \
             windows, soft-capped scores or sinks"
        );
        if let Some(s) = sinks {
            ensure!(
                s.len == layout.num_heads,
                "attention: {} sinks for {} heads",
                s.len,
                layout.num_heads
            );
        }
        let kernel = |name: String| if twin { sliding_twin(&name) } else { name };
        let window_arg = |args: &mut Vec<KArg>| {
            if twin {
                args.push(KArg::I32(window.unwrap_or(0)));
                args.push(KArg::F32(scores.softcap.unwrap_or(0.0)));
                args.push(KArg::Ptr(sinks_ptr));
            }
        };
        ensure!(
            qkv.cols == layout.qkv_width() && qkv.rows == step.rows,
            "attention: qkv is {}x{}",
            qkv.rows,
            qkv.cols
        );
        ensure!(
            cache.num_kv_heads == layout.num_kv_heads
                && cache.head_dim == layout.head_dim
                && cache.block_size == step.block_size,
            "attention: cache layout does not match the model"
        );
        let qkv_ptr = self.ptr(qkv.slice()?);
        let queued = self.state()?.pending.take();
        let prep = match queued {
            Some(p) if p.qkv == qkv_ptr && p.rows == qkv.rows && p.layout == layout => p,
            other => {
                if let Some(o) = other {
                    self.qkv_prep(&o, None)?;
                }
                Pending {
                    qkv: qkv_ptr,
                    rows: qkv.rows,
                    layout,
                    norm: None,
                    rope: None,
                }
            }
        };
        self.qkv_prep(&prep, Some((cache, step, group)))?;
        let tables = step.tables(group)?;

        let (h, kvh, d) = (layout.num_heads, layout.num_kv_heads, layout.head_dim);
        let o = self.shape(out, qkv.rows, layout.q_width())?;
        let at = |off: usize| KArg::Ptr(step.at(off));
        let scale = scores.scale;
        let common = |v: &mut Vec<KArg>| {
            v.push(KArg::Ptr(qkv_ptr));
            v.push(KArg::I32(layout.qkv_width() as i32));
            v.push(KArg::Ptr(self.ptr(&cache.k)));
            v.push(KArg::Ptr(self.ptr(&cache.v)));
            v.push(KArg::Ptr(tables));
            v.push(KArg::I32(step.table_stride as i32));
        };
        if step.n_dec > 0 {
            let kind = self.decode_attention;
            let name = decode_kernel_name(kind, layout.group_size(), d).ok_or_else(|| {
                anyhow!(
                    "no decode kernel for {} query heads per KV head and head_dim {d}",
                    layout.group_size()
                )
            })?;
            let name = kernel(name);
            // A windowed query reads at most its window.
            let keys = window.map_or(step.max_ctx, |w| step.max_ctx.min(w as usize));
            let splits = self.decode_splits(kvh, step.n_dec, keys);
            let (pa, pm) =
                self.partials(step.n_dec * h * splits * d, step.n_dec * h * splits * 2)?;
            let mut args = Vec::with_capacity(20);
            common(&mut args);
            args.extend([
                at(step.off.dec),
                at(step.off.row_start),
                at(step.off.n_tokens),
                at(step.off.start_pos),
            ]);
            args.extend([
                KArg::Ptr(pa),
                KArg::Ptr(pm),
                KArg::Ptr(o),
                KArg::I32(int(layout.q_width(), "q width")?),
            ]);
            args.extend([
                KArg::I32(h as i32),
                KArg::I32(kvh as i32),
                KArg::I32(d as i32),
            ]);
            args.extend([
                KArg::I32(int(step.block_size, "block size")?),
                KArg::I32(splits as i32),
                KArg::F32(scale),
            ]);
            window_arg(&mut args);
            let grid = (
                kvh as u32,
                int(step.n_dec, "decode seqs")? as u32,
                splits as u32,
            );
            let smem = match kind {
                DecodeAttention::Direct => 0,
                DecodeAttention::Pipelined => int(
                    decode_async_smem_bytes(layout.group_size(), d)
                        .ok_or_else(|| anyhow!("no pipelined decode kernel for head_dim {d}"))?,
                    "decode shared memory",
                )? as u32,
            };
            self.launch(&name, grid, kernels::DECODE_THREADS, smem, &args)?;
            if splits > 1 {
                let args = [
                    KArg::Ptr(pa),
                    KArg::Ptr(pm),
                    at(step.off.dec),
                    at(step.off.row_start),
                    KArg::Ptr(o),
                    KArg::I32(layout.q_width() as i32),
                    KArg::I32(h as i32),
                    KArg::I32(d as i32),
                    KArg::I32(splits as i32),
                    KArg::Ptr(sinks_ptr),
                ];
                self.launch(
                    "paged_decode_reduce",
                    (h as u32, step.n_dec as u32, 1),
                    128,
                    0,
                    &args,
                )?;
            }
        }
        if step.n_tiles > 0 {
            let (name, threads, smem) = match self.prefill_attention {
                PrefillAttention::Scalar => (
                    prefill_kernel_name(d)
                        .ok_or_else(|| anyhow!("no prefill kernel for head_dim {d}"))?,
                    kernels::PREFILL_THREADS,
                    prefill_smem_bytes(d),
                ),
                PrefillAttention::Mma => {
                    let (name, threads) = kernels::prefill_fa_kernel(d, layout.group_size())?;
                    (name, threads, kernels::prefill_fa_smem_bytes(d))
                }
            };
            // The tensor-core kernel's block holds its heads' query rows (two heads of a group).
            let heads_per_block = match self.prefill_attention {
                PrefillAttention::Mma => threads as usize / 64,
                PrefillAttention::Scalar => 1,
            };
            let mut args = Vec::with_capacity(18);
            common(&mut args);
            args.extend([
                at(step.off.tile_seq),
                at(step.off.tile_q0),
                at(step.off.row_start),
                at(step.off.n_tokens),
                at(step.off.start_pos),
            ]);
            args.extend([
                KArg::Ptr(o),
                KArg::I32(layout.q_width() as i32),
                KArg::I32(h as i32),
                KArg::I32(kvh as i32),
                KArg::I32(d as i32),
            ]);
            args.extend([KArg::I32(step.block_size as i32), KArg::F32(scale)]);
            window_arg(&mut args);
            let grid = (
                int(step.n_tiles, "prefill tiles")? as u32,
                (h / heads_per_block) as u32,
                1,
            );
            self.launch(&kernel(name), grid, threads, smem as u32, &args)?;
        }
        Ok(())
    }
}
