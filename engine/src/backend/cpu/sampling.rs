//! The logits' last steps on the CPU: the sampled rows gathered, then sampled on the host.

use anyhow::ensure;

use super::backend::CpuBackend;
use super::tensors::{CpuAct, CpuStep};
use crate::backend::{RowSample, SamplingOps};
use crate::sampler::{sample_row, SampleSpec};

impl SamplingOps for CpuBackend {
    fn gather_logit_rows(
        &self,
        x: &CpuAct,
        step: &CpuStep,
        out: &mut CpuAct,
    ) -> anyhow::Result<()> {
        let rows = &step.logit_rows;
        let cols = x.cols;
        let data = out.reshape(rows.len(), cols);
        for (&r, dst) in rows.iter().zip(data.chunks_exact_mut(cols.max(1))) {
            ensure!(r < x.rows, "gather_rows: row {r} of {}", x.rows);
            dst.copy_from_slice(&x.data[r * cols..(r + 1) * cols]);
        }
        Ok(())
    }

    fn sample(
        &self,
        logits: &mut CpuAct,
        samples: &[SampleSpec<'_>],
        _step: &CpuStep,
    ) -> anyhow::Result<Vec<RowSample>> {
        ensure!(
            samples.len() == logits.rows,
            "sample: {} specs for {} logits rows",
            samples.len(),
            logits.rows
        );
        let cols = logits.cols.max(1);
        Ok(logits
            .data
            .chunks_exact_mut(cols)
            .zip(samples)
            .map(|(row, spec)| Ok(sample_row(row, spec)))
            .collect())
    }
}
