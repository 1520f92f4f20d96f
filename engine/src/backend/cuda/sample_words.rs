//! The words `kernels/sampling.cu` reads and writes: the sparse penalty entries packed
//! into a step's metadata, and each sampled row's token and logprobs decoded.

use anyhow::ensure;

use crate::sampler::{SampleSpec, Sampled, TopLogprobs};

use super::int;

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
