//! Structured output: a grammar (JSON schema, regex, a list of choices, or a Lark grammar)
//! compiled by llguidance into one matcher per sequence. Before each sampled token the
//! matcher gives the set of allowed token ids (its mask), the sampler draws only from that
//! set, and the drawn token advances the matcher.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Context};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenizer::Tokenizer;

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON schema.
    JsonSchema(Value),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
}

impl GrammarSpec {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Choice(choices) => {
                // Lark string literals take JSON's escapes.
                let alternatives: Vec<String> = choices
                    .iter()
                    .map(|c| Value::String(c.clone()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
            GrammarSpec::Lark(source) => TopLevelGrammar::from_lark(source.clone()),
        }
    }
}

/// The schema with compact JSON (no whitespace between tokens: `{"a":1,"b":2}`) unless it
/// sets llguidance's own options (`x-guidance`). llguidance would otherwise allow any
/// whitespace, which small models fill with runs of newlines and spaces.
pub fn compact(mut schema: Value) -> Value {
    if let Value::Object(obj) = &mut schema {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// The model's vocabulary as byte strings, for llguidance.
struct VocabEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer.encode(text, false).unwrap_or_default()
        })
    }
}

/// Compiles grammars against one model's vocabulary (built once at start-up).
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl GrammarCompiler {
    /// `model_vocab` is the logits' width: ids the tokenizer does not know (padding rows)
    /// are never allowed.
    pub fn new(tokenizer: Arc<Tokenizer>, model_vocab: usize) -> anyhow::Result<GrammarCompiler> {
        let json = tokenizer.hf_json()?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .context("reading the vocabulary's token bytes for structured output")?;
        let vocab = model_vocab.max(words.len());
        while words.len() < vocab {
            // A special-token marker that no text can produce: padding ids stay masked.
            let mut name = format!(".<[{}]>", words.len()).into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(name);
        }
        let eos = tokenizer.eos_token_ids();
        let first_eos = *eos
            .first()
            .context("structured output needs an EOS token, and the tokenizer has none")?;
        let trie =
            TokTrie::from(&TokRxInfo::new(vocab as u32, first_eos), &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(VocabEnv { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| anyhow!("building the grammar engine: {e}"))?;
        factory.quiet();
        Ok(GrammarCompiler { factory })
    }

    /// A matcher at the start of the output; the error is llguidance's, saying what in the
    /// grammar it could not compile.
    pub fn compile(&self, spec: &GrammarSpec) -> anyhow::Result<TokenMatcher> {
        let parser = self
            .factory
            .create_parser(spec.top_level())
            .map_err(|e| anyhow!("{e}"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(anyhow!("{error}"));
        }
        Ok(TokenMatcher { matcher })
    }
}

/// One sequence's place in its grammar.
pub struct TokenMatcher {
    matcher: Matcher,
}

impl std::fmt::Debug for TokenMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMatcher")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Clone for TokenMatcher {
    /// An independent copy (for the other choices of an `n > 1` request).
    fn clone(&self) -> TokenMatcher {
        TokenMatcher {
            matcher: self.matcher.deep_clone(),
        }
    }
}

impl TokenMatcher {
    /// The ids that may come next (EOS among them once the grammar may end), and the
    /// seconds it took.
    pub fn allowed(&mut self) -> anyhow::Result<(SimpleVob, f64)> {
        let started = Instant::now();
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| anyhow!("the grammar failed: {e}"))?;
        Ok((mask, started.elapsed().as_secs_f64()))
    }

    /// Advances past a sampled token; returns the seconds it took.
    pub fn accept(&mut self, token: u32) -> anyhow::Result<f64> {
        let started = Instant::now();
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow!("token {token} does not fit the grammar: {e}"))?;
        Ok(started.elapsed().as_secs_f64())
    }

    /// The grammar is complete and nothing may follow but EOS.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_literals_are_escaped_for_lark() {
        let spec = GrammarSpec::Choice(vec!["a \"b\"".into(), "c\\d".into()]);
        let TopLevelGrammar { grammars, .. } = spec.top_level();
        assert_eq!(
            grammars[0].lark_grammar.as_deref(),
            Some(r#"start: "a \"b\"" | "c\\d""#)
        );
    }
}
