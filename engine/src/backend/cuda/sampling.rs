//! Sampling on the device (`kernels/sampling.cu`): the logits rows gathered, penalties and
//! the sampling specs packed, and each row's token and logprobs read back.

use anyhow::{anyhow, ensure, Context};

use crate::backend::RowSample;
use crate::sampler::{SampleSpec, Sampled, TopLogprobs};

use super::step::{CudaStep, StepBuffers};
use super::{ensure_len, int, kernels, CudaAct, CudaBackend, KArg};

/// Words of `sample_rows`' output per row (`SAMPLE_OUT_WORDS` in sampling.cu).
pub(super) const SAMPLE_OUT_WORDS: usize = 3 + 2 * SAMPLE_MAX_TOP;

/// Most top logprobs the device sampler returns (`SAMPLE_MAX_TOP`).
pub(super) const SAMPLE_MAX_TOP: usize = 20;

/// The sparse penalty entries `(row, token, output count, flags)` of the sampled rows:
/// flag 1 = seen in prompt or output (repetition penalty), 2 = masked.
pub(super) fn push_penalties(
    m: &mut Vec<i32>,
    samples: &[SampleSpec<'_>],
) -> anyhow::Result<(usize, usize)> {
    let at = m.len();
    for (row, spec) in samples.iter().enumerate() {
        let row = int(row, "sampled row")?;
        // A grammar's disallowed ids are masked like the others (one entry each; this is
        // the host path of structured output, see docs/guide/engine.md).
        let disallowed = |t: u32| {
            spec.allowed
                .is_some_and(|a| t as usize >= a.len() || !a.is_allowed(t))
        };
        if let Some(allowed) = spec.allowed {
            let mut entries = Vec::new();
            allowed.iter_unset_entries(|t| entries.push(t));
            for t in entries {
                m.extend([row, int(t, "token")?, 0, 2]);
            }
        }
        // Mask lists are a few EOS and stop ids: linear checks, no per-step set.
        let masked = spec.masked;
        for (i, &t) in masked.iter().enumerate() {
            if !masked[..i].contains(&t) && !disallowed(t) {
                m.extend([row, int(t as usize, "token")?, 0, 2]);
            }
        }
        let Some(counts) = spec.counts.filter(|_| spec.has_penalties()) else {
            continue;
        };
        let rep = spec.repetition_penalty != 1.0;
        let tokens: &[u32] = if rep {
            counts.seen()
        } else {
            counts.output_tokens()
        };
        for &t in tokens
            .iter()
            .filter(|&&t| !masked.contains(&t) && !disallowed(t))
        {
            let n = int(counts.output_count(t) as usize, "token count")?;
            m.extend([row, int(t as usize, "token")?, n, rep as i32]);
        }
    }
    Ok((at, (m.len() - at) / 4))
}

/// Decodes one row of `sample_rows`' output.
pub(super) fn read_sampled(
    w: &[i32],
    spec: &SampleSpec<'_>,
    vocab: usize,
) -> anyhow::Result<Sampled> {
    let token = w[0] as u32;
    ensure!(
        (token as usize) < vocab,
        "the device sampler returned token {token} (vocabulary {vocab})"
    );
    let logprobs = spec.logprobs.map(|_| {
        let found = (w[2].max(0) as usize).min(SAMPLE_MAX_TOP);
        TopLogprobs {
            logprob: f32::from_bits(w[1] as u32),
            top: (0..found)
                .map(|k| {
                    let lp = f32::from_bits(w[3 + SAMPLE_MAX_TOP + k] as u32);
                    (w[3 + k] as u32, lp)
                })
                .collect(),
        }
    });
    Ok(Sampled { token, logprobs })
}

impl CudaBackend {
    pub(super) fn run_gather_logit_rows(
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

    pub(super) fn run_sample(
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
