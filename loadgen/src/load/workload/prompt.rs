//! Prompt text or token ids of an exact length.
//!
//! A prompt is a concatenation of words, each of which is exactly one token of the target
//! tokenizer *with its leading space* (e.g. `" the"`). Byte-level BPE and SentencePiece
//! pre-tokenisers split text at those spaces, so n such words encode to n tokens; this is
//! checked once on a sample when the tokenizer is loaded. Without a tokenizer a fixed list
//! of common English words is used (~1 token per word) and lengths are approximate.

use std::path::Path;

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokenizers::Tokenizer;

use super::Block;

/// Common English words, each a single token in most LLM vocabularies.
const WORDS: &str =
    "the of and to in is was for on that with as by at from his it an were are which \
this be or has had not but also its they first their one new after been who two time other more \
he all into she most there can during her over only when would than some these up out about may \
used made world where such through many part both later three well years state before people city \
while work then him between under since year however school most known same each several found \
group high name family second like life own house long back best game day team away last city \
united early off much set best play around great music form until against left main public show \
line area water court power based line four small next end final began local series top march \
among little just take small five must book even data went good need help make very case place \
system point point road land side hand head open field right light past story power early river";

/// Without a tokenizer, token-id prompts use ids from this offset (valid in any vocabulary
/// of at least ~1,300 entries).
const APPROX_ID_BASE: u32 = 1000;

/// What a salt is for: several runs of one seeded workload that must not share prompts.
#[derive(Debug, Clone, Copy)]
pub enum SaltFor {
    ProbeStep = 1,
    SweepLevel = 2,
    MatrixRow = 3,
    /// A matrix row's repeat (`--repeats`), from the row's own salt.
    MatrixRepeat = 4,
}

/// The `--prompt-salt` of the `index`-th of several runs of one workload (a sweep's probe
/// steps and levels, a matrix's rows), from `base`: each run's prompts get words no other
/// run sent, so that none finds another's prompts in the server's prefix cache (the seed
/// alone would give request i the same prompt in every run).
pub fn salt_for(base: u64, kind: SaltFor, index: usize) -> u64 {
    super::mix(super::mix(base, kind as u64), index as u64 + 1)
}

/// Builds prompts from [`Block`]s.
pub struct PromptBuilder {
    /// Words with a leading space, each one token.
    words: Vec<String>,
    /// Token id of each word.
    ids: Vec<u32>,
    tokenizer: Option<Tokenizer>,
    /// Mixed into every block's key (`--prompt-salt`); 0 leaves the keys as they are.
    salt: u64,
}

impl PromptBuilder {
    /// The fixed word list; one word counts as one token (approximate).
    pub fn approximate() -> PromptBuilder {
        let mut words: Vec<String> = WORDS.split_whitespace().map(|w| format!(" {w}")).collect();
        words.sort();
        words.dedup();
        let ids = (0..words.len() as u32)
            .map(|i| APPROX_ID_BASE + i)
            .collect();
        PromptBuilder {
            words,
            ids,
            tokenizer: None,
            salt: 0,
        }
    }

    /// Uses the target model's `tokenizer.json` so prompts have exact token lengths.
    pub fn from_tokenizer(path: &Path) -> Result<PromptBuilder> {
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            bail!(
                "{}: GGUF tokenizers are not supported by loadgen; pass the model's tokenizer.json",
                path.display()
            );
        }
        let tokenizer = Tokenizer::from_file(path)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("loading tokenizer {}", path.display()))?;
        let mut vocab: Vec<(String, u32)> = tokenizer.get_vocab(false).into_iter().collect();
        vocab.sort_by_key(|&(_, id)| id);
        let mut words = Vec::new();
        let mut ids = Vec::new();
        for (_, id) in vocab {
            let Ok(text) = tokenizer.decode(&[id], false) else {
                continue;
            };
            let Some(rest) = text.strip_prefix(' ') else {
                continue;
            };
            if !(2..=10).contains(&rest.len()) || !rest.bytes().all(|b| b.is_ascii_lowercase()) {
                continue;
            }
            let single = tokenizer
                .encode(text.as_str(), false)
                .is_ok_and(|e| e.get_ids() == [id]);
            if single {
                words.push(text);
                ids.push(id);
            }
            if words.len() == 4096 {
                break;
            }
        }
        if words.len() < 64 {
            bail!(
                "{}: found only {} single-token words; cannot build exact-length prompts",
                path.display(),
                words.len()
            );
        }
        let builder = PromptBuilder {
            words,
            ids,
            tokenizer: Some(tokenizer),
            salt: 0,
        };
        builder.check_additive(path)?;
        Ok(builder)
    }

    fn check_additive(&self, path: &Path) -> Result<()> {
        for (key, len) in [(1u64, 1u32), (2, 7), (3, 500)] {
            let text = self.text(&[Block { key, len }]);
            let n = self.count_tokens(&text);
            if n != len as usize {
                bail!(
                    "{}: a {len}-word sample encodes to {n} tokens; this tokenizer does not split at spaces",
                    path.display()
                );
            }
        }
        Ok(())
    }

    /// True when lengths are approximate (no tokenizer).
    pub fn is_approximate(&self) -> bool {
        self.tokenizer.is_none()
    }

    /// The same builder with every block's words drawn from its key mixed with `salt`: equal
    /// keys still give equal words, so shared prefixes stay shared.
    pub fn with_salt(self, salt: u64) -> PromptBuilder {
        PromptBuilder { salt, ..self }
    }

    fn word_indices<'a>(&'a self, blocks: &'a [Block]) -> impl Iterator<Item = usize> + 'a {
        let n = self.words.len();
        blocks.iter().flat_map(move |b| {
            let key = if self.salt == 0 {
                b.key
            } else {
                super::mix(b.key, self.salt)
            };
            let mut rng = StdRng::seed_from_u64(key);
            (0..b.len).map(move |_| rng.random_range(0..n))
        })
    }

    /// The prompt text of `blocks` (one token per word).
    pub fn text(&self, blocks: &[Block]) -> String {
        let mut out = String::new();
        for i in self.word_indices(blocks) {
            out.push_str(&self.words[i]);
        }
        out
    }

    /// The prompt token ids of `blocks`.
    pub fn ids(&self, blocks: &[Block]) -> Vec<u32> {
        self.word_indices(blocks).map(|i| self.ids[i]).collect()
    }

    /// Tokens in `text`: exact with a tokenizer, whitespace-separated words otherwise.
    pub fn count_tokens(&self, text: &str) -> usize {
        match &self.tokenizer {
            Some(t) => t
                .encode(text, false)
                .map_or_else(|_| text.split_whitespace().count(), |e| e.len()),
            None => text.split_whitespace().count(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared_tokenizer() -> std::path::PathBuf {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/golden/llama-tiny/tokenizer.json");
        assert!(
            path.exists(),
            "{} is missing: the shared data folder ../shared must sit beside the repository",
            path.display()
        );
        path
    }

    #[test]
    fn approximate_prompts_have_one_word_per_token() {
        let b = PromptBuilder::approximate();
        let blocks = [Block { key: 5, len: 100 }, Block { key: 6, len: 23 }];
        let text = b.text(&blocks);
        assert_eq!(text.split_whitespace().count(), 123);
        assert_eq!(b.ids(&blocks).len(), 123);
        assert_eq!(text, b.text(&blocks), "deterministic");
        assert!(text.starts_with(&b.text(&blocks[..1])), "shared prefix");
        assert!(b.is_approximate());
    }

    #[test]
    fn a_salt_changes_the_words_but_keeps_lengths_and_shared_prefixes() {
        let plain = PromptBuilder::approximate();
        let salted = PromptBuilder::approximate().with_salt(7);
        let blocks = [Block { key: 5, len: 50 }, Block { key: 6, len: 10 }];
        let other = [Block { key: 5, len: 50 }, Block { key: 9, len: 10 }];
        assert_ne!(plain.text(&blocks), salted.text(&blocks));
        assert_eq!(salted.ids(&blocks).len(), 60);
        assert_eq!(
            salted.text(&blocks[..1]),
            salted.text(&other[..1]),
            "equal keys, equal words"
        );
        assert!(salted.text(&blocks).starts_with(&salted.text(&other[..1])));
        assert_eq!(
            PromptBuilder::approximate().with_salt(0).text(&blocks),
            plain.text(&blocks),
            "0 is no salt"
        );
    }

    #[test]
    fn tokenizer_prompts_have_exact_token_length() {
        let b = PromptBuilder::from_tokenizer(&shared_tokenizer()).unwrap();
        assert!(!b.is_approximate());
        for (key, len) in [(11, 1), (12, 64), (13, 1000)] {
            let blocks = [Block { key, len: 17 }, Block { key: key + 1, len }];
            let text = b.text(&blocks);
            assert_eq!(b.count_tokens(&text), 17 + len as usize, "len {len}");
            let ids = b.ids(&blocks);
            assert_eq!(ids.len(), 17 + len as usize);
        }
        let err = PromptBuilder::from_tokenizer(Path::new("model.gguf"))
            .err()
            .unwrap();
        assert!(format!("{err:#}").contains("tokenizer.json"));
    }
}
