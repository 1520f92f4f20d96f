//! One sequence's generation: the state kept beside it in the scheduler, its limits and
//! sampling parameters, its random stream, its detokeniser and held-back stop text, where
//! its output is relative to the think markers, and its grammar. It takes each sampled
//! token and decides, in one place, whether the sequence ends there and why.

use std::sync::Arc;

use anyhow::Context;
use llguidance::toktrie::SimpleVob;

use crate::grammar::TokenMatcher;
use crate::reasoning::{ReasoningState, ThinkMarkers, TokenRole};
use crate::sampler::{min_tokens_mask, SampleSpec, Sampler, SamplingParams, TokenCounts};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

/// Stop = EOS / stop id / stop string / a complete grammar; Length = max_tokens; Abort =
/// the client went away; Error = this sequence failed alone (the others of its step went
/// on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    Error,
}

pub struct Generation {
    params: SamplingParams,
    sampler: Sampler,
    /// EOS ids that end the answer (none with `ignore_eos`) and the stop ids; masked while
    /// fewer than `min_tokens` tokens are generated.
    stop_ids: Vec<u32>,
    /// Token history for the penalties (only when its parameters have penalties).
    counts: Option<TokenCounts>,
    decoder: IncrementalDecoder,
    /// Decoded text not emitted yet because it could be the start of a stop string.
    held: String,
    /// Where the output is relative to the think markers (with `split_reasoning`).
    reasoning: Option<ReasoningState>,
    /// Structured output: where the answer is in its grammar.
    grammar: Option<TokenMatcher>,
    /// The grammar's mask for the token being sampled this step.
    allowed: Option<SimpleVob>,
    /// Why the grammar could not give this step's mask: the sequence fails with it.
    grammar_failure: Option<anyhow::Error>,
}

/// What one sampled token gave its generation.
#[derive(Debug, Default, PartialEq)]
pub struct TokenOutcome {
    /// New answer text that is final (stop strings cut); may be empty.
    pub text: String,
    /// New reasoning text (with `split_reasoning`); may be empty.
    pub reasoning_text: String,
    /// Why the sequence ends with this token, when it does.
    pub finish: Option<FinishReason>,
    /// Seconds spent advancing the grammar past the token.
    pub grammar_accept_secs: f64,
}

/// What a token is to the stop conditions, found before any text is released.
struct TokenFacts {
    /// The token sits past `min_tokens`, so stop ids and stop strings may end the answer.
    may_stop: bool,
    /// An EOS or stop id that ends the answer.
    stop_token: bool,
    /// The grammar became complete with this token.
    grammar_done: bool,
    /// The answer reached `max_tokens`. The context limit needs no check of its own: the
    /// limits admitted the sequence only with prompt + `max_tokens` within it.
    at_length: bool,
}

impl TokenFacts {
    fn ends(&self) -> bool {
        (self.stop_token && self.may_stop) || self.grammar_done || self.at_length
    }
}

/// Why a sequence ends with a token, if it does: the one place that decides.
fn finish_reason(facts: &TokenFacts, stop_string: bool) -> Option<FinishReason> {
    if (facts.stop_token && facts.may_stop) || stop_string || facts.grammar_done {
        Some(FinishReason::Stop)
    } else if facts.at_length {
        Some(FinishReason::Length)
    } else {
        None
    }
}

impl Generation {
    /// The generation after `prompt`; `think_markers` split its output when `params` asks for it.
    pub fn new(
        prompt: &[u32],
        params: SamplingParams,
        grammar: Option<TokenMatcher>,
        tokenizer: Arc<Tokenizer>,
        think_markers: Option<ThinkMarkers>,
    ) -> Generation {
        Generation {
            sampler: Sampler::new(&params),
            stop_ids: min_tokens_mask(&params, tokenizer.eos_token_ids()),
            counts: params.has_penalties().then(|| TokenCounts::new(prompt)),
            decoder: IncrementalDecoder::new(tokenizer, params.skip_special_tokens),
            reasoning: think_markers
                .filter(|_| params.split_reasoning)
                .map(|markers| ReasoningState::new(markers, prompt)),
            params,
            held: String::new(),
            grammar,
            allowed: None,
            grammar_failure: None,
        }
    }

    /// Whether the grammar constrains the next token: it has one, and no think block is
    /// open (a reasoning model's thinking is never constrained).
    pub fn constrained(&self) -> bool {
        self.grammar.is_some() && self.reasoning.as_ref().is_none_or(|r| !r.inside())
    }

    /// Output tokens spent reasoning so far (markers included).
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning
            .as_ref()
            .map_or(0, ReasoningState::reasoning_tokens)
    }

    /// The uniform draw of the next sample, advancing the sequence's own random stream.
    pub fn next_uniform(&mut self) -> f64 {
        self.sampler.next_uniform(&self.params)
    }

    /// How to sample the next token, the `generated`-th output token, with draw `uniform`.
    pub fn sample_spec(&self, generated: usize, uniform: f64) -> SampleSpec<'_> {
        let masked: &[u32] = if generated < self.params.min_tokens {
            &self.stop_ids
        } else {
            &[]
        };
        SampleSpec::new(
            &self.params,
            self.sampler.seed(),
            generated as u64,
            uniform,
            masked,
            self.counts.as_ref(),
        )
        .with_allowed(self.allowed.as_ref())
    }

    /// Computes this step's grammar mask (when [`constrained`](Self::constrained)); a
    /// failure is kept and fails the sequence when its token arrives. Returns the seconds
    /// it took.
    pub fn compute_mask(&mut self) -> f64 {
        let Some(grammar) = self.grammar.as_mut() else {
            return 0.0;
        };
        match grammar.allowed() {
            Ok((mut mask, secs)) => {
                // The markers are the reasoning split's, never grammar text; the start
                // marker may still open a block before the answer begins.
                if let Some(reasoning) = &self.reasoning {
                    let markers = reasoning.markers();
                    mask.disallow_token(markers.end);
                    mask.set(markers.start as usize, reasoning.may_open());
                }
                self.allowed = Some(mask);
                secs
            }
            Err(e) => {
                self.grammar_failure = Some(e);
                0.0
            }
        }
    }

    /// Takes the token sampled as the `num_output`-th output token: advances the penalty
    /// counts, the reasoning split and the grammar, releases the text the token completes
    /// (stop strings cut), and says whether the sequence ends here and why.
    pub fn on_token(&mut self, token: u32, num_output: usize) -> anyhow::Result<TokenOutcome> {
        if let Some(e) = self.grammar_failure.take() {
            return Err(e);
        }
        if let Some(counts) = self.counts.as_mut() {
            counts.push_output(token);
        }
        // Text released by this token belongs to the side of the markers it was decoded on.
        let in_reasoning = self.reasoning.as_ref().is_some_and(ReasoningState::inside);
        let marker = self
            .reasoning
            .as_mut()
            .is_some_and(|r| r.on_token(token) == TokenRole::Marker);
        let stop_token = self.stop_ids.contains(&token);
        // A token drawn from a grammar's mask advances it; a complete grammar ends the answer.
        let mut grammar_accept_secs = 0.0;
        let grammar_done = match (self.allowed.take(), self.grammar.as_mut()) {
            (Some(_), Some(grammar)) if !stop_token && !marker => {
                grammar_accept_secs = grammar.accept(token)?;
                grammar.is_finished()
            }
            _ => false,
        };
        let facts = TokenFacts {
            may_stop: num_output >= self.params.min_tokens,
            stop_token,
            grammar_done,
            at_length: num_output >= self.params.max_tokens,
        };
        let (text, stop_string) = self.release(token, marker, &facts)?;
        let (text, reasoning_text) = if in_reasoning {
            (String::new(), text)
        } else {
            (text, String::new())
        };
        Ok(TokenOutcome {
            text,
            reasoning_text,
            finish: finish_reason(&facts, stop_string),
            grammar_accept_secs,
        })
    }

    /// The text `token` releases, and whether a stop string cut it. A stop token and a
    /// marker have no text of their own but flush the bytes of an unfinished character
    /// before them; a marker's text is released on its own side, unchecked; at the end
    /// everything still held is released.
    fn release(
        &mut self,
        token: u32,
        marker: bool,
        facts: &TokenFacts,
    ) -> anyhow::Result<(String, bool)> {
        let ends = facts.ends();
        let new_text = if (facts.stop_token && facts.may_stop) || marker {
            self.decoder.flush().context("detokenising the end")?
        } else {
            let text = self
                .decoder
                .push(token)
                .with_context(|| format!("detokenising token {token}"))?;
            if ends {
                text + &self.decoder.flush().context("detokenising the end")?
            } else {
                text
            }
        };
        self.held.push_str(&new_text);
        if marker && !ends {
            return Ok((std::mem::take(&mut self.held), false));
        }
        let stops: &[String] = if facts.may_stop {
            &self.params.stop
        } else {
            &[]
        };
        let (mut text, stopped) = release_text(&mut self.held, stops);
        if ends {
            text.push_str(&std::mem::take(&mut self.held));
        }
        Ok((text, stopped))
    }
}

/// Moves the part of `held` that can no longer start a stop string into the returned
/// text. Returns true when a stop string matched: the text is then cut before the
/// earliest match and nothing is held any more.
fn release_text(held: &mut String, stops: &[String]) -> (String, bool) {
    let first_match = stops.iter().filter_map(|s| held.find(s.as_str())).min();
    if let Some(pos) = first_match {
        held.truncate(pos);
        return (std::mem::take(held), true);
    }
    let keep = stops
        .iter()
        .map(|s| longest_suffix_prefix(held, s))
        .max()
        .unwrap_or(0);
    let released = held[..held.len() - keep].to_string();
    held.drain(..held.len() - keep);
    (released, false)
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    (1..stop.len())
        .rev()
        .find(|&k| stop.is_char_boundary(k) && text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(pieces: &[&str], stops: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut held = String::new();
        let mut out = String::new();
        for piece in pieces {
            held.push_str(piece);
            let (text, stopped) = release_text(&mut held, &stops);
            out.push_str(&text);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&held);
        (out, false)
    }

    #[test]
    fn stop_string_across_token_boundaries_is_cut() {
        assert_eq!(
            feed(&["Hel", "lo ST", "O", "P more"], &["STOP"]),
            ("Hello ".into(), true)
        );
    }

    #[test]
    fn partial_stop_prefix_is_released_when_it_fails_to_match() {
        assert_eq!(feed(&["a S", "T", "x"], &["STOP"]), ("a STx".into(), false));
    }

    #[test]
    fn earliest_of_several_stop_strings_wins() {
        assert_eq!(
            feed(&["one two three"], &["three", "two"]),
            ("one ".into(), true)
        );
    }

    #[test]
    fn held_text_respects_utf8_boundaries() {
        assert_eq!(longest_suffix_prefix("ab\u{e9}", "\u{e9}x"), 2);
        assert_eq!(
            feed(&["caf\u{e9}", "!"], &["\u{e9}t\u{e9}"]),
            ("caf\u{e9}!".into(), false)
        );
    }

    /// Feeds `tokens` to a generation with `params` over the tiny golden Llama's tokenizer (EOS
    /// id 2); the answer text, how it finished and after how many tokens.
    fn run(params: SamplingParams, tokens: &[u32]) -> (String, Option<FinishReason>, usize) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/llama-tiny");
        let tokenizer = Arc::new(Tokenizer::from_model_path(&dir).unwrap());
        let mut generation = Generation::new(&[1], params, None, tokenizer, None);
        let mut text = String::new();
        for (i, &token) in tokens.iter().enumerate() {
            let out = generation.on_token(token, i + 1).unwrap();
            text.push_str(&out.text);
            if out.finish.is_some() {
                return (text, out.finish, i + 1);
            }
        }
        (text, None, tokens.len())
    }

    fn words() -> Vec<u32> {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/llama-tiny");
        let tokenizer = Tokenizer::from_model_path(&dir).unwrap();
        tokenizer.encode("Hello world STOP more", false).unwrap()
    }

    #[test]
    fn a_stop_string_cuts_the_text_and_ends_the_answer() {
        let params = SamplingParams {
            stop: vec!["STOP".into()],
            max_tokens: 100,
            ..SamplingParams::default()
        };
        let (text, finish, _) = run(params, &words());
        assert_eq!(
            (text.as_str(), finish),
            ("Hello world ", Some(FinishReason::Stop))
        );
    }

    #[test]
    fn max_tokens_ends_the_answer_with_all_its_text() {
        let ids = words();
        let params = SamplingParams {
            max_tokens: 2,
            ..SamplingParams::default()
        };
        let (text, finish, n) = run(params, &ids);
        assert_eq!((finish, n), (Some(FinishReason::Length), 2));
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/llama-tiny");
        let tokenizer = Tokenizer::from_model_path(&dir).unwrap();
        assert_eq!(text, tokenizer.decode(&ids[..2], true).unwrap());
    }

    #[test]
    fn eos_ends_the_answer_only_past_min_tokens() {
        let first = words()[0];
        let stop_at_eos = SamplingParams {
            max_tokens: 10,
            ..SamplingParams::default()
        };
        let (_, finish, n) = run(stop_at_eos.clone(), &[first, 2, first]);
        assert_eq!((finish, n), (Some(FinishReason::Stop), 2));
        let held = SamplingParams {
            min_tokens: 3,
            ..stop_at_eos
        };
        let (_, finish, n) = run(held, &[first, 2, first, 2]);
        assert_eq!((finish, n), (Some(FinishReason::Stop), 4));
    }

    fn facts(may_stop: bool, stop_token: bool, grammar_done: bool, at_length: bool) -> TokenFacts {
        TokenFacts {
            may_stop,
            stop_token,
            grammar_done,
            at_length,
        }
    }

    #[test]
    fn a_stop_outranks_the_length_limit_and_min_tokens_holds_stop_ids_back() {
        use FinishReason::{Length, Stop};
        assert_eq!(
            finish_reason(&facts(true, true, false, true), false),
            Some(Stop)
        );
        assert_eq!(
            finish_reason(&facts(true, false, false, true), true),
            Some(Stop)
        );
        assert_eq!(
            finish_reason(&facts(true, false, true, true), false),
            Some(Stop)
        );
        assert_eq!(
            finish_reason(&facts(true, false, false, true), false),
            Some(Length)
        );
        assert_eq!(
            finish_reason(&facts(false, true, false, false), false),
            None
        );
        assert_eq!(
            finish_reason(&facts(false, true, false, true), false),
            Some(Length)
        );
        assert_eq!(
            finish_reason(&facts(true, false, false, false), false),
            None
        );
        assert!(!facts(false, true, false, false).ends());
    }
}
