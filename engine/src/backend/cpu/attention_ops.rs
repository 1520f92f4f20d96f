//! Paged attention on the CPU behind [`AttentionOps`]: shapes checked, then `attention`'s
//! kernel over the step's sequences.

use anyhow::ensure;

use super::attention::{self, CpuKvCache};
use super::backend::CpuBackend;
use super::simd::Isa;
use super::tensors::{CpuAct, CpuStep};
use crate::backend::{AttentionOps, KvCacheShape, QkvLayout, ScoreSpec};
use crate::config::AttentionSpan;

impl AttentionOps for CpuBackend {
    fn kv_value_bytes(&self) -> usize {
        self.kv_cache_dtype.bytes()
    }

    fn keeps_windows(&self) -> bool {
        true
    }

    fn new_kv_cache(&self, shape: KvCacheShape) -> anyhow::Result<CpuKvCache> {
        CpuKvCache::new(self.kv_cache_dtype, shape)
    }

    fn attention(
        &self,
        qkv: &CpuAct,
        layout: QkvLayout,
        span: AttentionSpan,
        scores: ScoreSpec,
        sinks: Option<&Vec<f32>>,
        cache: &mut CpuKvCache,
        step: &CpuStep,
        group: usize,
        out: &mut CpuAct,
    ) -> anyhow::Result<()> {
        let slots = step.slots(group)?;
        ensure!(
            qkv.cols == layout.qkv_width() && qkv.rows == slots.len(),
            "attention: qkv shape"
        );
        let seqs = step.attn_seqs(group)?;
        let out_data = out.reshape(qkv.rows, layout.q_width());
        let window = match span {
            AttentionSpan::Full => None,
            AttentionSpan::Sliding { window } => Some(window),
        };
        let softmax = attention::Softmax {
            window,
            scores,
            sinks: sinks.map(Vec::as_slice),
        };
        attention::attention(
            &qkv.data,
            layout,
            softmax,
            cache,
            &seqs,
            slots,
            out_data,
            self.threads(),
            Isa::detect(),
        )
    }
}
