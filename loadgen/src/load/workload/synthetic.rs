//! Synthetic workloads: the ShareGPT-like log-normal generator (parameters in
//! `traces/sharegpt-like.json`) and vLLM's uniform "random" dataset.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

use super::{prefixed_blocks, PromptSource, RequestSpec};

/// The committed generator parameters, compiled in.
const PARAMETERS_JSON: &str = include_str!("../../../../traces/sharegpt-like.json");

/// A clipped log-normal length distribution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LengthDist {
    pub mu: f64,
    pub sigma: f64,
    pub min: u32,
    pub max: u32,
}

/// Input and output length distributions of one profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub source: String,
    pub input: LengthDist,
    pub output: LengthDist,
}

#[derive(Deserialize)]
struct Parameters {
    profiles: BTreeMap<String, Profile>,
}

/// Looks up a profile (`chat`, `code`, `summarization`, `long-context`).
pub fn profile(name: &str) -> Result<Profile> {
    let params: Parameters =
        serde_json::from_str(PARAMETERS_JSON).context("traces/sharegpt-like.json is invalid")?;
    let names: Vec<String> = params.profiles.keys().cloned().collect();
    params
        .profiles
        .get(name)
        .cloned()
        .with_context(|| format!("unknown profile `{name}` (one of {})", names.join(", ")))
}

/// Shared-prefix groups: each request joins one of `groups` groups (uniformly at random)
/// whose first `len` tokens are common.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrefixGroups {
    pub len: u32,
    pub groups: u64,
}

/// How the synthetic lengths are drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LengthModel {
    /// Log-normal lengths of a ShareGPT-like profile; the caps lower the profile's clip
    /// limits (e.g. to fit a small model's context or a CPU's speed).
    ShareGptLike {
        profile: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_input_len: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_output_len: Option<u32>,
    },
    /// vLLM `random`: uniform integers in
    /// [floor(len · (1 − ratio)), ceil(len · (1 + ratio))] for input and output.
    Random {
        input_len: u32,
        output_len: u32,
        range_ratio: f64,
    },
}

/// A seeded generator of synthetic requests.
pub struct SyntheticWorkload {
    model: LengthModel,
    profile: Option<Profile>,
    prefix: Option<PrefixGroups>,
}

fn uniform_range(len: u32, ratio: f64) -> (u32, u32) {
    let lo = (f64::from(len) * (1.0 - ratio)).floor().max(1.0) as u32;
    let hi = (f64::from(len) * (1.0 + ratio)).ceil() as u32;
    (lo, hi.max(lo))
}

pub(super) fn sample_clipped(dist: &LengthDist, rng: &mut StdRng) -> Result<u32> {
    let ln = LogNormal::new(dist.mu, dist.sigma)
        .with_context(|| format!("invalid log-normal mu={} sigma={}", dist.mu, dist.sigma))?;
    let v = ln.sample(rng).round();
    Ok(v.clamp(f64::from(dist.min), f64::from(dist.max)) as u32)
}

/// Lowers a distribution's upper clip to `cap`; a cap below the lower clip is an error.
pub(super) fn cap_clip(dist: &mut LengthDist, cap: Option<u32>, flag: &str) -> Result<()> {
    if let Some(cap) = cap {
        if cap < dist.min {
            bail!(
                "{flag} {cap} is below the profile's minimum length {}",
                dist.min
            );
        }
        dist.max = dist.max.min(cap);
    }
    Ok(())
}

impl SyntheticWorkload {
    pub fn new(model: LengthModel, prefix: Option<PrefixGroups>) -> Result<Self> {
        let profile = match &model {
            LengthModel::ShareGptLike {
                profile: name,
                max_input_len,
                max_output_len,
            } => {
                let mut p = profile(name)?;
                cap_clip(&mut p.input, *max_input_len, "--max-input-len")?;
                cap_clip(&mut p.output, *max_output_len, "--max-output-len")?;
                Some(p)
            }
            LengthModel::Random { range_ratio, .. } => {
                if !(0.0..1.0).contains(range_ratio) {
                    bail!("--random-range-ratio must be in [0, 1)");
                }
                None
            }
        };
        if let Some(p) = prefix {
            if p.groups == 0 {
                bail!("--prefix-groups must be at least 1 with --prefix-len");
            }
        }
        Ok(SyntheticWorkload {
            model,
            profile,
            prefix,
        })
    }

    /// `n` requests drawn from `seed`; the prefix (if any) is added on top of the drawn input length.
    pub fn generate(&self, n: usize, seed: u64) -> Result<Vec<RequestSpec>> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut out = Vec::with_capacity(n);
        for index in 0..n as u64 {
            let (input, output) = match (&self.model, &self.profile) {
                (LengthModel::ShareGptLike { .. }, Some(p)) => (
                    sample_clipped(&p.input, &mut rng)?,
                    sample_clipped(&p.output, &mut rng)?,
                ),
                (
                    LengthModel::Random {
                        input_len,
                        output_len,
                        range_ratio,
                    },
                    _,
                ) => {
                    let (ilo, ihi) = uniform_range(*input_len, *range_ratio);
                    let (olo, ohi) = uniform_range(*output_len, *range_ratio);
                    (rng.random_range(ilo..=ihi), rng.random_range(olo..=ohi))
                }
                (LengthModel::ShareGptLike { profile, .. }, None) => {
                    bail!("profile `{profile}` was not loaded")
                }
            };
            let prefix = self.prefix.map(|p| (rng.random_range(0..p.groups), p.len));
            let input_len = input + prefix.map_or(0, |(_, len)| len);
            out.push(RequestSpec {
                input_len,
                output_len: output,
                prefix_group: prefix.map(|(g, _)| g),
                prompt: PromptSource::Blocks(prefixed_blocks(seed, index, input_len, prefix)),
                model: None,
                class: None,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_follow_their_lognormal_fit_and_clip() {
        for name in ["chat", "code", "summarization", "long-context"] {
            let p = profile(name).unwrap();
            let w = SyntheticWorkload::new(
                LengthModel::ShareGptLike {
                    profile: name.into(),
                    max_input_len: None,
                    max_output_len: None,
                },
                None,
            )
            .unwrap();
            let reqs = w.generate(4000, 1).unwrap();
            assert_eq!(reqs, w.generate(4000, 1).unwrap(), "seeded");
            assert!(reqs
                .iter()
                .all(|r| (p.input.min..=p.input.max).contains(&r.input_len)));
            assert!(reqs
                .iter()
                .all(|r| (p.output.min..=p.output.max).contains(&r.output_len)));
            // The median of a log-normal is exp(mu) (when the clip range contains it).
            let mut outs: Vec<u32> = reqs.iter().map(|r| r.output_len).collect();
            outs.sort_unstable();
            let median = f64::from(outs[outs.len() / 2]);
            let expected = p
                .output
                .mu
                .exp()
                .clamp(f64::from(p.output.min), f64::from(p.output.max));
            assert!(
                (median / expected - 1.0).abs() < 0.1,
                "{name}: {median} vs {expected}"
            );
        }
        assert!(profile("poetry").is_err());
    }

    #[test]
    fn caps_lower_the_clip_limits() {
        let chat = |max_input_len, max_output_len| {
            SyntheticWorkload::new(
                LengthModel::ShareGptLike {
                    profile: "chat".into(),
                    max_input_len,
                    max_output_len,
                },
                None,
            )
        };
        let reqs = chat(Some(256), Some(64))
            .unwrap()
            .generate(2000, 3)
            .unwrap();
        assert!(reqs
            .iter()
            .all(|r| r.input_len <= 256 && r.output_len <= 64));
        // exp(5.69) ≈ 296 > 64: most outputs sit at the cap, none above it.
        assert!(reqs.iter().filter(|r| r.output_len == 64).count() > 1000);
        let err = chat(None, Some(2)).err().unwrap().to_string();
        assert!(err.contains("--max-output-len 2"), "{err}");
    }

    #[test]
    fn random_lengths_use_vllm_ranges_and_prefix_groups_share_blocks() {
        let w = SyntheticWorkload::new(
            LengthModel::Random {
                input_len: 100,
                output_len: 10,
                range_ratio: 0.5,
            },
            Some(PrefixGroups { len: 32, groups: 3 }),
        )
        .unwrap();
        let reqs = w.generate(2000, 9).unwrap();
        let inputs: Vec<u32> = reqs.iter().map(|r| r.input_len - 32).collect();
        assert_eq!(inputs.iter().min(), Some(&50));
        assert_eq!(inputs.iter().max(), Some(&150));
        assert_eq!(reqs.iter().map(|r| r.output_len).min(), Some(5));
        assert_eq!(reqs.iter().map(|r| r.output_len).max(), Some(15));
        let first_block = |r: &RequestSpec| match &r.prompt {
            PromptSource::Blocks(b) => b[0],
            PromptSource::Text(_) => panic!("synthetic prompts are blocks"),
        };
        for a in &reqs[..50] {
            for b in &reqs[..50] {
                assert_eq!(
                    a.prefix_group == b.prefix_group,
                    first_block(a) == first_block(b)
                );
            }
        }
        let total: u32 = match &reqs[0].prompt {
            PromptSource::Blocks(b) => b.iter().map(|b| b.len).sum(),
            PromptSource::Text(_) => 0,
        };
        assert_eq!(total, reqs[0].input_len);
    }
}
