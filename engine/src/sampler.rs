//! Per-request sampling: logits processors (min_tokens, penalties), greedy or seeded
//! random sampling with temperature, top-k, top-p and min-p, and logprobs.

use llguidance::toktrie::SimpleVob;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Most top logprobs a request may ask for (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;
/// Highest temperature accepted (OpenAI's API takes 0 to 2; vLLM more).
const MAX_TEMPERATURE: f32 = 100.0;
const MAX_REPETITION_PENALTY: f32 = 10.0;
/// Most stop strings, and the longest one, in bytes.
const MAX_STOP_STRINGS: usize = 16;
const MAX_STOP_LEN: usize = 256;

/// A sampling parameter outside its range: which one (by its `SamplingParams` name, which
/// is also the API's) and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidParam {
    pub param: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// EOS and stop ids are masked until this many tokens are generated.
    pub min_tokens: usize,
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    /// Same seed + same prompt => same tokens; `None` draws a random seed.
    pub seed: Option<u64>,
    /// 1.0 = off (HF/vLLM semantics, over prompt + output).
    pub repetition_penalty: f32,
    /// 0.0 = off (OpenAI semantics, over output).
    pub presence_penalty: f32,
    /// 0.0 = off (OpenAI semantics, over output).
    pub frequency_penalty: f32,
    /// Stop strings: the output text is cut before the match.
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Top logprobs of the sampled position (0..=20).
    pub logprobs: Option<usize>,
    pub skip_special_tokens: bool,
    /// Split the output at the engine's think markers into reasoning and answer text (chat
    /// requests of a server started with `--reasoning-parser`).
    pub split_reasoning: bool,
    /// Leading prompt tokens a later request is expected to share: a chat's history before
    /// its generation prompt, which the next turn re-sends (the prefix cache keeps a
    /// checkpoint of a recurrent model's state there).
    pub history_tokens: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            max_tokens: 16,
            min_tokens: 0,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            skip_special_tokens: true,
            split_reasoning: false,
            history_tokens: None,
        }
    }
}

impl SamplingParams {
    /// Rejects values outside their documented ranges, naming the field: the one check of
    /// these ranges, for the server's requests and the command line's alike.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        let check = |ok: bool, param: &'static str, message: String| {
            if ok {
                Ok(())
            } else {
                Err(InvalidParam { param, message })
            }
        };
        check(
            self.max_tokens >= 1,
            "max_tokens",
            "`max_tokens` must be at least 1".into(),
        )?;
        check(
            self.min_tokens <= self.max_tokens,
            "min_tokens",
            format!(
                "`min_tokens` ({}) exceeds `max_tokens` ({})",
                self.min_tokens, self.max_tokens
            ),
        )?;
        let in_range = |x: f32, lo: f32, hi: f32| x.is_finite() && (lo..=hi).contains(&x);
        check(
            in_range(self.temperature, 0.0, MAX_TEMPERATURE),
            "temperature",
            format!(
                "`temperature` must be between 0 and {MAX_TEMPERATURE}, got {}",
                self.temperature
            ),
        )?;
        check(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p",
            format!("`top_p` must be in (0, 1], got {}", self.top_p),
        )?;
        check(
            in_range(self.min_p, 0.0, 1.0),
            "min_p",
            format!("`min_p` must be in [0, 1], got {}", self.min_p),
        )?;
        check(
            in_range(self.repetition_penalty, 0.0, MAX_REPETITION_PENALTY)
                && self.repetition_penalty > 0.0,
            "repetition_penalty",
            format!(
                "`repetition_penalty` must be in (0, {MAX_REPETITION_PENALTY}], got {}",
                self.repetition_penalty
            ),
        )?;
        check(
            in_range(self.presence_penalty, -2.0, 2.0),
            "presence_penalty",
            format!(
                "`presence_penalty` must be in [-2, 2], got {}",
                self.presence_penalty
            ),
        )?;
        check(
            in_range(self.frequency_penalty, -2.0, 2.0),
            "frequency_penalty",
            format!(
                "`frequency_penalty` must be in [-2, 2], got {}",
                self.frequency_penalty
            ),
        )?;
        if let Some(n) = self.logprobs {
            check(
                n <= MAX_LOGPROBS,
                "logprobs",
                format!("`logprobs` must be at most {MAX_LOGPROBS}, got {n}"),
            )?;
        }
        check(
            self.stop.len() <= MAX_STOP_STRINGS,
            "stop",
            format!("at most {MAX_STOP_STRINGS} stop strings are allowed"),
        )?;
        check(
            self.stop
                .iter()
                .all(|s| !s.is_empty() && s.len() <= MAX_STOP_LEN),
            "stop",
            format!("stop strings must be 1 to {MAX_STOP_LEN} bytes long"),
        )
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether any penalty changes the logits (the request then keeps `TokenCounts`).
    pub fn has_penalties(&self) -> bool {
        penalties_active(
            self.repetition_penalty,
            self.presence_penalty,
            self.frequency_penalty,
        )
    }
}

/// The one rule for "this request is penalised", shared by its parameters and its specs.
fn penalties_active(repetition: f32, presence: f32, frequency: f32) -> bool {
    repetition != 1.0 || presence != 0.0 || frequency != 0.0
}

/// A sampled token, with logprobs when the request asked for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprobs: Option<TopLogprobs>,
}

/// Log-probabilities under the processed distribution (after penalties, temperature and
/// truncation: the distribution the token was drawn from).
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprobs {
    /// Of the sampled token.
    pub logprob: f32,
    /// The `logprobs` most likely tokens, most likely first (ties by lower id).
    pub top: Vec<(u32, f32)>,
}

/// One sequence's token history for the penalties, kept incrementally: O(1) per new token,
/// and a step reads only the distinct tokens (never the whole sequence).
#[derive(Debug, Clone, Default)]
pub struct TokenCounts {
    /// Distinct tokens of prompt and output, in first-seen order (repetition penalty).
    seen: Vec<u32>,
    seen_set: std::collections::HashSet<u32>,
    /// Distinct output tokens in first-seen order, and their counts (presence, frequency).
    output: Vec<u32>,
    output_counts: std::collections::HashMap<u32, u32>,
}

impl TokenCounts {
    pub fn new(prompt: &[u32]) -> TokenCounts {
        let mut counts = TokenCounts::default();
        for &t in prompt {
            counts.see(t);
        }
        counts
    }

    fn see(&mut self, token: u32) {
        if self.seen_set.insert(token) {
            self.seen.push(token);
        }
    }

    /// Records a generated token.
    pub fn push_output(&mut self, token: u32) {
        self.see(token);
        let c = self.output_counts.entry(token).or_insert(0);
        if *c == 0 {
            self.output.push(token);
        }
        *c += 1;
    }

    /// Distinct tokens of prompt and output.
    pub fn seen(&self) -> &[u32] {
        &self.seen
    }

    /// Distinct output tokens, first-seen order.
    pub fn output_tokens(&self) -> &[u32] {
        &self.output
    }

    /// How often `token` was generated.
    pub fn output_count(&self, token: u32) -> u32 {
        self.output_counts.get(&token).copied().unwrap_or(0)
    }
}

/// What a runner needs to sample one sequence's next token in a step.
#[derive(Debug, Clone, Copy)]
pub struct SampleSpec<'a> {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Top logprobs wanted (0..=20), `None` for none.
    pub logprobs: Option<usize>,
    /// The request's seed (drawn once when the request gave none): the device sampler's key.
    pub seed: u64,
    /// Tokens generated before this one: the device sampler's counter.
    pub draw: u64,
    /// A uniform draw in [0, 1) from the request's own stream: the CPU sampler's inverse CDF.
    pub uniform: f64,
    /// Token ids that may not be drawn this step (EOS and stop ids before `min_tokens`).
    pub masked: &'a [u32],
    /// The history for the penalties; `None` when the request has none.
    pub counts: Option<&'a TokenCounts>,
    /// The only ids a grammar allows this step (structured output); `None` allows all.
    pub allowed: Option<&'a SimpleVob>,
}

impl SampleSpec<'static> {
    /// Greedy, no penalties, no logprobs.
    pub const GREEDY: SampleSpec<'static> = SampleSpec {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        logprobs: None,
        seed: 0,
        draw: 0,
        uniform: 0.0,
        masked: &[],
        counts: None,
        allowed: None,
    };
}

impl<'a> SampleSpec<'a> {
    /// The spec of a request's next draw.
    pub fn new(
        params: &SamplingParams,
        seed: u64,
        draw: u64,
        uniform: f64,
        masked: &'a [u32],
        counts: Option<&'a TokenCounts>,
    ) -> SampleSpec<'a> {
        SampleSpec {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            repetition_penalty: params.repetition_penalty,
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            logprobs: params.logprobs,
            seed,
            draw,
            uniform,
            masked,
            counts,
            allowed: None,
        }
    }

    /// The same spec drawing only from `allowed`.
    pub fn with_allowed(self, allowed: Option<&'a SimpleVob>) -> SampleSpec<'a> {
        SampleSpec { allowed, ..self }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether any penalty changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.counts.is_some()
            && penalties_active(
                self.repetition_penalty,
                self.presence_penalty,
                self.frequency_penalty,
            )
    }
}

/// The ids masked while fewer than `min_tokens` tokens are generated: EOS (unless
/// `ignore_eos`) and the stop ids.
pub fn min_tokens_mask(params: &SamplingParams, eos_ids: &[u32]) -> Vec<u32> {
    let eos = if params.ignore_eos { &[][..] } else { eos_ids };
    eos.iter().chain(&params.stop_token_ids).copied().collect()
}

/// One request's random stream: the uniform draws of the CPU sampler.
pub struct Sampler {
    rng: StdRng,
    seed: u64,
}

impl Sampler {
    /// Seeds from `params.seed`, or from a fresh random seed.
    pub fn new(params: &SamplingParams) -> Sampler {
        let seed = params.seed.unwrap_or_else(|| rand::rng().random());
        Sampler {
            rng: StdRng::seed_from_u64(seed),
            seed,
        }
    }

    /// The seed in use (the request's, or the one drawn for it).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next uniform draw; greedy requests draw nothing (0.0).
    pub fn next_uniform(&mut self, params: &SamplingParams) -> f64 {
        if params.is_greedy() {
            0.0
        } else {
            self.rng.random::<f64>()
        }
    }
}

/// Samples the next token from one row of logits (modified in place): the CPU backend's
/// sampler. Ids outside the grammar's set and masked ids, then penalties, then greedy argmax or temperature, top-k, top-p,
/// min-p and an inverse-CDF draw with `spec.uniform`.
pub fn sample_row(logits: &mut [f32], spec: &SampleSpec<'_>) -> Sampled {
    if let Some(allowed) = spec.allowed {
        mask_disallowed(logits, allowed);
    }
    mask_tokens(logits, spec.masked.iter());
    apply_penalties(logits, spec);
    let token = if spec.is_greedy() {
        argmax(logits)
    } else {
        let inv_t = 1.0 / spec.temperature;
        logits.iter_mut().for_each(|l| *l *= inv_t);
        truncate(logits, spec);
        sample_from_logits(logits, spec.uniform)
    };
    let logprobs = spec.logprobs.map(|n| {
        let log_z = log_sum_exp(logits);
        TopLogprobs {
            logprob: logits[token as usize] - log_z,
            top: top_n(logits, n, log_z),
        }
    });
    Sampled { token, logprobs }
}

/// Sets every id outside `allowed` (and beyond its length) to -inf.
fn mask_disallowed(logits: &mut [f32], allowed: &SimpleVob) {
    let covered = allowed.len().min(logits.len());
    allowed.iter_unset_entries(|id| {
        if id < covered {
            logits[id] = f32::NEG_INFINITY;
        }
    });
    logits[covered..].fill(f32::NEG_INFINITY);
}

fn mask_tokens<'a>(logits: &mut [f32], ids: impl Iterator<Item = &'a u32>) {
    for &id in ids {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Repetition penalty over prompt + output (divide positive logits, multiply negative
/// ones, once per distinct token); presence and frequency penalties over the output.
fn apply_penalties(logits: &mut [f32], spec: &SampleSpec<'_>) {
    let Some(counts) = spec.counts else {
        return;
    };
    let rep = spec.repetition_penalty;
    if rep != 1.0 {
        for &id in counts.seen() {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = if *l > 0.0 { *l / rep } else { *l * rep };
            }
        }
    }
    if spec.presence_penalty != 0.0 || spec.frequency_penalty != 0.0 {
        for &id in counts.output_tokens() {
            if let Some(l) = logits.get_mut(id as usize) {
                let count = counts.output_count(id);
                *l -= spec.frequency_penalty * count as f32 + spec.presence_penalty;
            }
        }
    }
}

/// Index of the largest logit, lowest id on ties.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Token ids with a logit of at least `floor`, sorted by logit (highest first, lower id on
/// ties), at most `keep` of them.
fn sorted_ids(logits: &[f32], keep: usize, floor: f32) -> Vec<u32> {
    let order = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    // Candidates are only finite logits; -inf ones are never kept.
    let mut ids: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| logits[i as usize] > f32::NEG_INFINITY && logits[i as usize] >= floor)
        .collect();
    if keep < ids.len() {
        ids.select_nth_unstable_by(keep, order);
        ids.truncate(keep);
    }
    ids.sort_unstable_by(order);
    ids
}

/// Masks everything outside top-k, then top-p (smallest set reaching the mass), then
/// min-p (probability below `min_p` times the top probability). Always keeps the top token.
fn truncate(logits: &mut [f32], params: &SampleSpec<'_>) {
    if params.top_k == 0 && params.top_p >= 1.0 && params.min_p <= 0.0 {
        return;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return;
    }
    // Top-p and min-p renormalise within the top-k set when there is one.
    let (ids, total) = if params.top_k > 0 {
        let ids = sorted_ids(logits, params.top_k, f32::NEG_INFINITY);
        let total: f64 = ids
            .iter()
            .map(|&i| f64::from(logits[i as usize] - max).exp())
            .sum();
        (ids, total)
    } else {
        // Only tokens above the larger of two cut-offs can be kept, so only those are sorted:
        // tokens below (1 − top_p) / V hold less than 1 − top_p together, so the nucleus lies
        // above that line, and min-p drops everything below min_p times the top probability
        // (1 / total). The small margin only adds candidates; the walk below decides exactly.
        let total: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        let nucleus_floor = f64::from(1.0 - params.top_p.min(1.0)) / logits.len() as f64;
        let floor_p = nucleus_floor.max(f64::from(params.min_p) / total);
        let floor = max + (floor_p * total).ln() as f32 - 1e-3;
        (sorted_ids(logits, logits.len(), floor), total)
    };
    let Some(&first) = ids.first() else {
        return;
    };
    let top = f64::from(logits[first as usize] - max).exp();
    let min_p = f64::from(params.min_p) * top / total;
    let mut kept = 0;
    let mut mass = 0.0;
    for &i in &ids {
        let p = f64::from(logits[i as usize] - max).exp() / total;
        if kept > 0 && (mass >= f64::from(params.top_p) || p < min_p) {
            break;
        }
        mass += p;
        kept += 1;
    }
    let kept_logits: Vec<(u32, f32)> = ids[..kept]
        .iter()
        .map(|&i| (i, logits[i as usize]))
        .collect();
    logits.fill(f32::NEG_INFINITY);
    for (i, l) in kept_logits {
        logits[i as usize] = l;
    }
}

/// Inverse-CDF sample over softmax(logits) with `u` uniform in [0, 1).
fn sample_from_logits(logits: &[f32], u: f64) -> u32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    let target = u * total;
    let mut acc = 0.0;
    let mut last_positive = argmax(logits);
    for (i, &w) in weights.iter().enumerate() {
        if w == 0.0 {
            continue;
        }
        acc += f64::from(w);
        last_positive = i as u32;
        if acc > target {
            return i as u32;
        }
    }
    last_positive
}

fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    max + sum.ln() as f32
}

fn top_n(logits: &[f32], n: usize, log_z: f32) -> Vec<(u32, f32)> {
    sorted_ids(logits, n, f32::NEG_INFINITY)
        .into_iter()
        .map(|i| (i, logits[i as usize] - log_z))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: Some(7),
            ..SamplingParams::default()
        }
    }

    fn draw(logits: &[f32], p: &SamplingParams, sampler: &mut Sampler) -> u32 {
        let u = sampler.next_uniform(p);
        let spec = SampleSpec::new(p, sampler.seed(), 0, u, &[], None);
        sample_row(&mut logits.to_vec(), &spec).token
    }

    fn penalised(p: &SamplingParams, logits: &mut [f32], prompt: &[u32], output: &[u32]) {
        let mut counts = TokenCounts::new(prompt);
        output.iter().for_each(|&t| counts.push_output(t));
        apply_penalties(logits, &SampleSpec::new(p, 0, 0, 0.0, &[], Some(&counts)));
    }

    #[test]
    fn greedy_takes_argmax_with_ties_to_lowest_id() {
        let p = params(0.0);
        let mut s = Sampler::new(&p);
        assert_eq!(draw(&[0.1, 2.0, 2.0, -1.0], &p, &mut s), 1);
        assert_eq!(draw(&[3.0, 3.0], &p, &mut s), 0);
    }

    #[test]
    fn top_k_one_equals_greedy() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        let expected = argmax(&logits);
        let p = SamplingParams {
            top_k: 1,
            ..params(1.5)
        };
        let mut s = Sampler::new(&p);
        for _ in 0..200 {
            assert_eq!(draw(&logits, &p, &mut s), expected);
        }
    }

    fn frequencies(logits: &[f32], p: &SamplingParams, n: usize) -> Vec<f64> {
        let mut s = Sampler::new(p);
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            counts[draw(logits, p, &mut s) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    #[test]
    fn top_p_keeps_smallest_set_reaching_the_mass() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 (ids 2, 0, 3, 1).
        let probs = [0.25f32, 0.125, 0.5, 0.125];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let p = SamplingParams {
            top_p: 0.7,
            ..params(1.0)
        };
        let f = frequencies(&logits, &p, 10_000);
        // Kept set {2, 0}, renormalised to 2/3 and 1/3.
        assert_eq!(f[1], 0.0);
        assert_eq!(f[3], 0.0);
        assert!((f[2] - 2.0 / 3.0).abs() < 0.02, "{f:?}");
        assert!((f[0] - 1.0 / 3.0).abs() < 0.02, "{f:?}");
    }

    #[test]
    fn plain_temperature_sampling_follows_softmax() {
        let probs = [0.1f32, 0.2, 0.3, 0.4];
        let logits: Vec<f32> = probs.iter().map(|p| (p.ln()) * 2.0).collect();
        // Temperature 2 undoes the doubling.
        let f = frequencies(&logits, &params(2.0), 10_000);
        for (fi, pi) in f.iter().zip(probs) {
            assert!((fi - f64::from(pi)).abs() < 0.02, "{f:?}");
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let probs = [0.6f32, 0.3, 0.08, 0.02];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let p = SamplingParams {
            min_p: 0.2,
            ..params(1.0)
        };
        // Threshold 0.12: keeps ids 0 and 1 only.
        let f = frequencies(&logits, &p, 10_000);
        assert_eq!(f[2] + f[3], 0.0);
        assert!((f[0] - 2.0 / 3.0).abs() < 0.02, "{f:?}");
    }

    #[test]
    fn seeded_sampling_repeats_and_seeds_differ() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let p = SamplingParams {
                seed: Some(seed),
                ..params(1.0)
            };
            let mut s = Sampler::new(&p);
            (0..64)
                .map(|_| draw(&logits, &p, &mut s))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..params(0.0)
        };
        let mut logits = vec![4.0, -1.0, 3.0];
        penalised(&p, &mut logits, &[0, 0], &[1]);
        assert_eq!(logits, vec![2.0, -2.0, 3.0]);
    }

    #[test]
    fn presence_and_frequency_penalties_count_output_only() {
        let p = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..params(0.0)
        };
        let mut logits = vec![1.0, 1.0, 1.0];
        penalised(&p, &mut logits, &[2, 2], &[0, 0, 1]);
        assert_eq!(logits, vec![1.0 - 0.5 - 0.5, 1.0 - 0.25 - 0.5, 1.0]);
    }

    #[test]
    fn min_tokens_mask_holds_eos_and_stop_ids_unless_eos_is_ignored() {
        let p = SamplingParams {
            min_tokens: 2,
            stop_token_ids: vec![1],
            ..params(0.0)
        };
        let eos = [2];
        let mask = min_tokens_mask(&p, &eos);
        assert_eq!(mask, vec![2, 1]);
        let logits = [1.0, 5.0, 4.0, 0.0];
        let spec = SampleSpec {
            masked: &mask,
            ..SampleSpec::GREEDY
        };
        assert_eq!(sample_row(&mut logits.to_vec(), &spec).token, 0);
        assert_eq!(
            sample_row(&mut logits.to_vec(), &SampleSpec::GREEDY).token,
            1
        );
        let ignore = SamplingParams {
            ignore_eos: true,
            ..p
        };
        assert_eq!(min_tokens_mask(&ignore, &eos), vec![1]);
    }

    /// The penalties visit each distinct token once per step, so the work of a step stays
    /// flat however long the output grows: 10,000 generated tokens over 5 distinct ids cost
    /// what 5 do.
    #[test]
    fn penalty_work_per_step_counts_distinct_tokens_not_length() {
        let mut c = TokenCounts::new(&[1, 2, 3, 1]);
        let work = |c: &TokenCounts| c.seen().len() + c.output_tokens().len();
        for t in 0..5u32 {
            c.push_output(10 + t);
        }
        let after_five = work(&c);
        for i in 0..10_000u32 {
            c.push_output(10 + i % 5);
        }
        assert_eq!(work(&c), after_five);
        assert_eq!(after_five, 3 + 5 + 5);
        assert_eq!(c.output_count(12), 2001);
    }

    #[test]
    fn token_counts_grow_by_distinct_tokens_only() {
        let mut c = TokenCounts::new(&[5, 5, 7]);
        assert_eq!(c.seen(), &[5, 7]);
        for t in [7, 9, 7] {
            c.push_output(t);
        }
        assert_eq!(c.seen(), &[5, 7, 9]);
        assert_eq!(c.output_tokens(), &[7, 9]);
        assert_eq!(
            (c.output_count(7), c.output_count(9), c.output_count(5)),
            (2, 1, 0)
        );
    }

    #[test]
    fn logprobs_are_log_softmax_with_sorted_top() {
        let p = SamplingParams {
            logprobs: Some(2),
            ..params(0.0)
        };
        let probs = [0.2f32, 0.5, 0.2, 0.1];
        let mut logits: Vec<f32> = probs.iter().map(|p| p.ln() + 3.0).collect();
        let sampled = sample_row(&mut logits, &SampleSpec::new(&p, 7, 0, 0.0, &[], None));
        assert_eq!(sampled.token, 1);
        let out = sampled.logprobs.unwrap();
        assert!((out.logprob - 0.5f32.ln()).abs() < 1e-5);
        assert_eq!(out.top.len(), 2);
        assert_eq!(out.top[0].0, 1);
        assert_eq!(out.top[1].0, 0, "tie between ids 0 and 2 goes to 0");
        assert!((out.top[1].1 - 0.2f32.ln()).abs() < 1e-5);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        };
        let e = bad.validate().unwrap_err();
        assert_eq!(e.param, "top_p");
        assert!(e.to_string().contains("top_p"));
        assert!(SamplingParams::default().validate().is_ok());
    }

    /// The candidate cut-off of `truncate` must not change the kept set: compare it with a
    /// plain walk over the whole sorted vocabulary.
    #[test]
    fn truncation_keeps_exactly_the_brute_force_set() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for case in 0..40 {
            let logits: Vec<f32> = (0..2000).map(|_| rng.random_range(-8.0f32..8.0)).collect();
            let (top_p, min_p) = [
                (0.9, 0.0),
                (0.5, 0.0),
                (0.99, 0.0),
                (1.0, 0.05),
                (0.8, 0.01),
            ][case % 5];
            let p = SampleSpec {
                top_p,
                min_p,
                ..SampleSpec::GREEDY
            };
            let mut got = logits.clone();
            truncate(&mut got, &p);
            let kept: Vec<usize> = (0..got.len()).filter(|&i| got[i].is_finite()).collect();

            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            let max = logits[order[0]];
            let total: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
            let mut want = Vec::new();
            let mut mass = 0.0;
            for &i in &order {
                let prob = f64::from(logits[i] - max).exp() / total;
                if !want.is_empty() && (mass >= f64::from(top_p) || prob < f64::from(min_p) / total)
                {
                    break;
                }
                mass += prob;
                want.push(i);
            }
            want.sort_unstable();
            assert_eq!(kept, want, "case {case}: top_p {top_p}, min_p {min_p}");
        }
    }
}
