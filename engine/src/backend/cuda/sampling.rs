//! Sampling on the device (`kernels/sampling.cu`): the logits rows gathered, the sampling
//! specs packed, and the sampled rows read back (their words: `sample_words.rs`).

use anyhow::{anyhow, ensure, Context};

use crate::backend::{RowSample, SamplingOps};
use crate::sampler::SampleSpec;

use super::sample_words::{read_sampled, SAMPLE_OUT_WORDS};
use super::step::{CudaStep, StepBuffers};
use super::{ensure_len, int, kernels, CudaAct, CudaBackend, KArg};

impl SamplingOps for CudaBackend {
    fn gather_logit_rows(
        &self,
        x: &CudaAct,
        step: &CudaStep,
        out: &mut CudaAct,
    ) -> anyhow::Result<()> {
        self.flush()?;
        ensure!(x.rows == step.rows, "gather_logit_rows: {} rows", x.rows);
        let o = self.shape(out, step.n_logits, x.cols)?;
        if step.n_logits == 0 {
            return Ok(());
        }
        let args = [
            KArg::Ptr(self.ptr(x.slice()?)),
            KArg::Ptr(step.at(step.off.logit_rows)),
            KArg::Ptr(o),
            KArg::I32(int(x.cols, "cols")?),
        ];
        self.launch(
            "gather_rows",
            (int(step.n_logits, "rows")? as u32, 1, 1),
            256,
            0,
            &args,
        )
    }

    fn sample(
        &self,
        logits: &mut CudaAct,
        samples: &[SampleSpec<'_>],
        step: &CudaStep,
    ) -> anyhow::Result<Vec<RowSample>> {
        self.flush()?;
        // A graph-replayed step leaves `logits` as the graph wrote it: `n_logits` rows (the
        // real ones first, then padding), whatever the host-side shape says.
        let (rows, vocab) = (samples.len(), logits.cols);
        ensure!(
            step.n_logits >= rows && logits.slice()?.len() >= step.n_logits * vocab,
            "sample: {rows} specs for {} step rows",
            step.n_logits
        );
        if rows == 0 {
            return Ok(Vec::new());
        }
        let mut st = self.state()?;
        let b = &mut st.step;
        ensure_len(
            &self.stream,
            &mut b.logits,
            rows * vocab,
            "the f32 logits buffer",
        )?;
        ensure_len(
            &self.stream,
            &mut b.sampled,
            rows * SAMPLE_OUT_WORDS,
            "the sampling output buffer",
        )?;
        let wide = b.logits.as_ref().map(|l| self.ptr(l)).unwrap_or(0);
        let out = b.sampled.as_ref().map(|l| self.ptr(l)).unwrap_or(0);
        let n = rows * vocab;
        self.launch(
            "bf16_to_f32_kernel",
            (n.div_ceil(256) as u32, 1, 1),
            256,
            0,
            &[
                KArg::Ptr(self.ptr(logits.slice()?)),
                KArg::Ptr(wide),
                KArg::I64(n as i64),
            ],
        )?;
        let vocab_arg = int(vocab, "vocab")?;
        if step.n_penalties > 0 {
            self.launch(
                "apply_penalties",
                (step.n_penalties.div_ceil(256) as u32, 1, 1),
                256,
                0,
                &[
                    KArg::Ptr(wide),
                    KArg::I32(vocab_arg),
                    KArg::Ptr(step.at(step.off.penalties)),
                    KArg::I32(int(step.n_penalties, "penalty entries")?),
                    KArg::Ptr(step.at(step.off.repetition)),
                    KArg::Ptr(step.at(step.off.presence)),
                    KArg::Ptr(step.at(step.off.frequency)),
                ],
            )?;
        }
        self.launch(
            "sample_rows",
            (int(rows, "rows")? as u32, 1, 1),
            kernels::SAMPLE_THREADS,
            0,
            &[
                KArg::Ptr(wide),
                KArg::I32(vocab_arg),
                KArg::Ptr(step.at(step.off.temperature)),
                KArg::Ptr(step.at(step.off.top_k)),
                KArg::Ptr(step.at(step.off.top_p)),
                KArg::Ptr(step.at(step.off.min_p)),
                KArg::Ptr(step.at(step.off.seeds)),
                KArg::Ptr(step.at(step.off.draws)),
                KArg::Ptr(step.at(step.off.n_top)),
                KArg::Ptr(out),
            ],
        )?;
        let words = rows * SAMPLE_OUT_WORDS;
        let StepBuffers {
            sampled,
            sampled_host,
            ..
        } = b;
        sampled_host.resize(words, 0);
        let dev = sampled
            .as_ref()
            .ok_or_else(|| anyhow!("sampling output buffer missing"))?;
        self.stream
            .memcpy_dtoh(&dev.slice(..words), sampled_host.as_mut_slice())
            .context("copying sampled tokens to the host")?;
        self.stream.synchronize().context("waiting for the GPU")?;
        Ok(sampled_host
            .chunks_exact(SAMPLE_OUT_WORDS)
            .zip(samples)
            .map(|(w, spec)| read_sampled(w, spec, vocab))
            .collect())
    }
}
