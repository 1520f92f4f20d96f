//! Tokenizer (from `tokenizer.json` or GGUF metadata), chat templates and
//! streaming detokenisation.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::NormalizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::weights::gguf::GgufFile;

/// One chat message as the OpenAI API carries it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An earlier assistant turn's reasoning, for templates that render it (Qwen3's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An earlier assistant turn's tool calls, `arguments` as JSON objects (as templates
    /// read them, and as vLLM hands them over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// Special-token strings that end a turn in common chat formats; each one that
/// the vocabulary holds as a special token is added to the EOS ids.
const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<end_of_turn>",
    // gpt-oss's harmony: an answer or a tool call ends the turn (`<|end|>` ends a message
    // within it).
    "<|return|>",
    "<|call|>",
];

/// GPT-2's pre-tokenizer regex (also what transformers uses for SmolLM2's GGUF).
const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's pre-tokenizer regex (numbers in groups of up to three digits).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k's split (gpt-oss, GPT-4o; llama.cpp's `gpt-4o` pre-tokenizer), as its
/// tokenizer.json writes it.
const O200K_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2/Qwen3's pre-tokenizer regex (single digits).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF `token_type` of ordinary tokens.
const TOKEN_TYPE_NORMAL: i64 = 1;
/// GGUF `token_type` of control tokens.
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF `token_type` of user-defined tokens (matched whole, but not special).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// SentencePiece's word-boundary marker, which stands for a space in its pieces.
const SPM_SPACE: &str = "\u{2581}";

/// A model's tokenizer with its special tokens and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token: Option<String>,
    bos_token_id: Option<u32>,
    eos_token: Option<String>,
    eos_token_ids: Vec<u32>,
    /// Prepend BOS on `encode(.., true)` (when the tokenizer's own post-processor does not).
    add_bos: bool,
    /// Append EOS on `encode(.., true)` (idem).
    add_eos: bool,
    chat_template: Option<ChatTemplate>,
    /// `inner.get_vocab_size(true)`, which rebuilds the vocabulary map on every call (about
    /// 17 ms for 151k tokens): computed once.
    vocab_size: usize,
}

/// A compiled chat template.
struct ChatTemplate {
    source: String,
    env: minijinja::Environment<'static>,
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    fn new(source: String, origin: &Path) -> anyhow::Result<ChatTemplate> {
        let mut env = minijinja::Environment::new();
        // transformers renders chat templates with these two Jinja options.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| anyhow!("invalid chat template in {}: {e:#}", origin.display()))?;
        Ok(ChatTemplate { source, env })
    }
}

fn tok_err(e: tokenizers::Error) -> anyhow::Error {
    anyhow!("{e}")
}

/// Reads a token string from `tokenizer_config.json`: a plain string or an
/// added-token object with `content`.
fn config_token(config: &serde_json::Value, key: &str) -> Option<String> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The chat template of `tokenizer_config.json`: a string, or a list of named
/// templates from which `default` is taken.
fn config_chat_template(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

/// BPE merges that reproduce SentencePiece's greedy merging by score: every split of an
/// ordinary piece into two pieces, ranked by the piece's score (highest first), then by the
/// left part's length and the right's (longest first), as transformers' converter ranks
/// them. Only ordinary pieces are merge results: no merge produces a control or byte piece.
fn sentencepiece_merges(
    tokens: &[&str],
    scores: &[f64],
    token_types: &[i64],
    vocab: &Vocab,
) -> Vec<(String, String)> {
    let mut ranked: Vec<(f64, usize, usize, u32, u32)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if token_types[id] != TOKEN_TYPE_NORMAL {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                ranked.push((
                    scores[id],
                    left.chars().count(),
                    right.chars().count(),
                    l,
                    r,
                ));
            }
        }
    }
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(b.1.cmp(&a.1))
            .then(b.2.cmp(&a.2))
            .then(a.3.cmp(&b.3))
            .then(a.4.cmp(&b.4))
    });
    ranked
        .into_iter()
        .map(|(_, _, _, l, r)| {
            (
                tokens[l as usize].to_string(),
                tokens[r as usize].to_string(),
            )
        })
        .collect()
}

impl Tokenizer {
    /// From a model path: an HF directory (`tokenizer.json`, `tokenizer_config.json`,
    /// `chat_template.jinja`) or a `.gguf` file (vocab, merges, template in its metadata).
    pub fn from_model_path(path: &Path) -> anyhow::Result<Tokenizer> {
        if path.is_dir() {
            Self::from_hf_dir(path)
        } else {
            let file = GgufFile::open(path)?;
            Self::from_gguf(&file)
        }
    }

    /// From an HF model directory.
    pub fn from_hf_dir(dir: &Path) -> anyhow::Result<Tokenizer> {
        let json_file = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&json_file)
            .map_err(|e| anyhow!("cannot load {}: {e}", json_file.display()))?;

        let config_file = dir.join("tokenizer_config.json");
        let config: serde_json::Value = if config_file.is_file() {
            let text = std::fs::read_to_string(&config_file)
                .with_context(|| format!("cannot read {}", config_file.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("invalid JSON in {}", config_file.display()))?
        } else {
            serde_json::Value::Null
        };

        let bos_token = config_token(&config, "bos_token");
        let eos_token = config_token(&config, "eos_token");
        let bos_token_id = bos_token.as_deref().and_then(|t| inner.token_to_id(t));
        let has_post_processor = inner.get_post_processor().is_some();
        let flag = |key: &str| config.get(key).and_then(|v| v.as_bool()).unwrap_or(false);
        let add_bos = !has_post_processor && flag("add_bos_token");
        let add_eos = !has_post_processor && flag("add_eos_token");

        let mut eos_ids: Vec<u32> = eos_token
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
            .into_iter()
            .collect();
        let generation_file = dir.join("generation_config.json");
        if generation_file.is_file() {
            let text = std::fs::read_to_string(&generation_file)
                .with_context(|| format!("cannot read {}", generation_file.display()))?;
            let generation: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("invalid JSON in {}", generation_file.display()))?;
            match generation.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => eos_ids.extend(n.as_u64().map(|n| n as u32)),
                Some(serde_json::Value::Array(list)) => {
                    eos_ids.extend(list.iter().filter_map(|n| n.as_u64()).map(|n| n as u32))
                }
                _ => {}
            }
        }

        let template_file = dir.join("chat_template.jinja");
        let template = if template_file.is_file() {
            let source = std::fs::read_to_string(&template_file)
                .with_context(|| format!("cannot read {}", template_file.display()))?;
            Some(ChatTemplate::new(source, &template_file)?)
        } else {
            config_chat_template(&config)
                .map(|source| ChatTemplate::new(source, &config_file))
                .transpose()?
        };

        Ok(Self::finish(
            inner,
            bos_token,
            bos_token_id,
            eos_token,
            eos_ids,
            add_bos,
            add_eos,
            template,
        ))
    }

    /// From the vocabulary and special tokens of a GGUF file: byte-level BPE with its
    /// merges (`tokenizer.ggml.model = gpt2`) or SentencePiece's pieces with their scores
    /// (`llama`: Llama 2, Gemma, Phi-3).
    pub fn from_gguf(file: &GgufFile) -> anyhow::Result<Tokenizer> {
        let path = file.path();
        let tokens = file.get_str_array("tokenizer.ggml.tokens")?;
        let token_types = match file.metadata.contains_key("tokenizer.ggml.token_type") {
            true => file.get_int_array("tokenizer.ggml.token_type")?,
            false => Vec::new(),
        };
        let model = file.get_str("tokenizer.ggml.model")?;
        let inner = match model {
            "gpt2" => Self::gguf_byte_level_bpe(file, &tokens)?,
            "llama" => Self::gguf_sentencepiece(file, &tokens, &token_types)?,
            other => bail!(
                "unsupported tokenizer.ggml.model `{other}` in {} (byte-level BPE `gpt2` and \
                 SentencePiece `llama` are supported)",
                path.display()
            ),
        };
        Self::from_gguf_vocab(file, inner, &tokens, &token_types)
    }

    /// A SentencePiece vocabulary as llama.cpp's tokenizer runs it: spaces written as `▁`
    /// (a leading one added when `tokenizer.ggml.add_space_prefix` says so), then adjacent
    /// pieces merged while their concatenation is a piece, the highest-scoring first, and
    /// characters no piece covers written as their UTF-8 bytes (`<0xXX>` pieces). That is
    /// BPE with the merges ranked by the merged piece's score, which is how transformers
    /// reads these files too.
    fn gguf_sentencepiece(
        file: &GgufFile,
        tokens: &[&str],
        token_types: &[i64],
    ) -> anyhow::Result<tokenizers::Tokenizer> {
        let path = file.path();
        let scores = file.get_float_array("tokenizer.ggml.scores")?;
        if scores.len() != tokens.len() || token_types.len() != tokens.len() {
            bail!(
                "{} has {} tokens, {} scores and {} token types: a SentencePiece vocabulary needs one of each per token",
                path.display(),
                tokens.len(),
                scores.len(),
                token_types.len()
            );
        }
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.to_string(), id as u32))
            .collect();
        let merges = sentencepiece_merges(tokens, &scores, token_types, &vocab);
        let unk = match file.opt("tokenizer.ggml.unknown_token_id", GgufFile::get_usize)? {
            None => None,
            Some(id) => Some(tokens.get(id).map(|t| t.to_string()).with_context(|| {
                format!(
                    "tokenizer.ggml.unknown_token_id {id} in {} is outside its {} tokens",
                    path.display(),
                    tokens.len()
                )
            })?),
        };
        let mut bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .byte_fallback(true);
        if let Some(unk) = unk {
            bpe = bpe.unk_token(unk);
        }
        let bpe = bpe.build().map_err(|e| {
            anyhow!(
                "cannot build the SentencePiece model of {}: {e}",
                path.display()
            )
        })?;
        let space_prefix = match file.metadata.get("tokenizer.ggml.add_space_prefix") {
            None => true,
            Some(v) => {
                v.as_i64().with_context(|| {
                    format!(
                        "metadata key `tokenizer.ggml.add_space_prefix` in {} is not a bool",
                        path.display()
                    )
                })? != 0
            }
        };
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let escape: NormalizerWrapper = Replace::new(" ", SPM_SPACE).map_err(tok_err)?.into();
        let mut decoders: Vec<DecoderWrapper> = vec![
            Replace::new(SPM_SPACE, " ").map_err(tok_err)?.into(),
            ByteFallback::default().into(),
            Fuse::default().into(),
        ];
        if space_prefix {
            let prefix: NormalizerWrapper = Prepend::new(SPM_SPACE.to_string()).into();
            inner.with_normalizer(Some(tokenizers::normalizers::Sequence::new(vec![
                prefix, escape,
            ])));
            decoders.push(Strip::new(' ', 1, 0).into());
        } else {
            inner.with_normalizer(Some(escape));
        }
        inner.with_decoder(Some(DecoderSequence::new(decoders)));
        Ok(inner)
    }

    /// A byte-level BPE vocabulary with its merges (none where the file has none) and
    /// GGUF's pre-tokenizer choice.
    fn gguf_byte_level_bpe(
        file: &GgufFile,
        tokens: &[&str],
    ) -> anyhow::Result<tokenizers::Tokenizer> {
        let path = file.path();
        // llama.cpp's converter leaves the key out of a vocabulary without merges.
        let listed = match file.metadata.contains_key("tokenizer.ggml.merges") {
            true => file.get_str_array("tokenizer.ggml.merges")?,
            false => Vec::new(),
        };
        let merges = listed
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .with_context(|| {
                        format!(
                            "merge #{i} `{m}` in tokenizer.ggml.merges of {} has no space",
                            path.display()
                        )
                    })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.to_string(), id as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| anyhow!("cannot build the BPE model from {}: {e}", path.display()))?;

        let pre = match file.metadata.contains_key("tokenizer.ggml.pre") {
            true => file.get_str("tokenizer.ggml.pre")?,
            false => "default",
        };
        let mut pre_tokenizers = Vec::new();
        let split = |regex: &str| -> anyhow::Result<PreTokenizerWrapper> {
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(tok_err)?;
            Ok(split.into())
        };
        match pre {
            "default" | "gpt2" | "gpt-2" | "smollm" | "mpt" | "olmo" | "jais" => {
                pre_tokenizers.push(split(GPT2_REGEX)?)
            }
            "starcoder" | "refact" | "command-r" | "codeshell" => {
                pre_tokenizers.push(split(r"\p{N}")?);
                pre_tokenizers.push(split(GPT2_REGEX)?);
            }
            "llama3" | "llama-bpe" | "llama-v3" | "falcon3" | "smaug-bpe" | "dbrx" => {
                pre_tokenizers.push(split(LLAMA3_REGEX)?)
            }
            "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "hunyuan" => {
                pre_tokenizers.push(split(QWEN2_REGEX)?)
            }
            "gpt-4o" => pre_tokenizers.push(split(O200K_REGEX)?),
            other => bail!(
                "unsupported pre-tokenizer tokenizer.ggml.pre = `{other}` in {}",
                path.display()
            ),
        }
        pre_tokenizers.push(ByteLevel::new(false, false, false).into());

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(Sequence::new(pre_tokenizers)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        Ok(inner)
    }

    /// The special tokens, ids, flags and chat template of a GGUF file around `inner`.
    fn from_gguf_vocab(
        file: &GgufFile,
        mut inner: tokenizers::Tokenizer,
        tokens: &[&str],
        token_types: &[i64],
    ) -> anyhow::Result<Tokenizer> {
        let path = file.path();
        // Control tokens are special (skipped when decoding with `skip_special`);
        // user-defined ones are matched whole in the raw text, as llama.cpp matches them.
        let added: Vec<AddedToken> = token_types
            .iter()
            .zip(tokens)
            .filter_map(|(&kind, &token)| match kind {
                TOKEN_TYPE_CONTROL => Some(AddedToken::from(token, true)),
                TOKEN_TYPE_USER_DEFINED => Some(AddedToken::from(token, false).normalized(false)),
                _ => None,
            })
            .collect();
        inner.add_special_tokens(&added);

        let token_id = |key: &str| -> anyhow::Result<Option<u32>> {
            Ok(file.opt(key, GgufFile::get_usize)?.map(|id| id as u32))
        };
        let token_text =
            |id: Option<u32>| id.and_then(|id| tokens.get(id as usize).map(|t| t.to_string()));
        let bos_token_id = token_id("tokenizer.ggml.bos_token_id")?;
        let eos_token_id = token_id("tokenizer.ggml.eos_token_id")?;
        let flag = |key: &str| -> anyhow::Result<bool> {
            match file.metadata.get(key) {
                None => Ok(false),
                Some(v) => v.as_i64().map(|v| v != 0).with_context(|| {
                    format!("metadata key `{key}` in {} is not a bool", path.display())
                }),
            }
        };
        let template = match file.metadata.contains_key("tokenizer.chat_template") {
            true => Some(ChatTemplate::new(
                file.get_str("tokenizer.chat_template")?.to_string(),
                path,
            )?),
            false => None,
        };
        Ok(Self::finish(
            inner,
            token_text(bos_token_id),
            bos_token_id,
            token_text(eos_token_id),
            eos_token_id.into_iter().collect(),
            flag("tokenizer.ggml.add_bos_token")?,
            flag("tokenizer.ggml.add_eos_token")?,
            template,
        ))
    }

    /// Adds the end-of-turn special tokens the vocabulary has to the EOS ids.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        inner: tokenizers::Tokenizer,
        bos_token: Option<String>,
        bos_token_id: Option<u32>,
        eos_token: Option<String>,
        mut eos_token_ids: Vec<u32>,
        add_bos: bool,
        add_eos: bool,
        chat_template: Option<ChatTemplate>,
    ) -> Tokenizer {
        let special = inner.get_added_tokens_decoder();
        for token in END_OF_TURN_TOKENS {
            if let Some(id) = inner.token_to_id(token) {
                if special.get(&id).is_some_and(|t| t.special) {
                    eos_token_ids.push(id);
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        eos_token_ids.retain(|id| seen.insert(*id));
        Tokenizer {
            vocab_size: inner.get_vocab_size(true),
            inner,
            bos_token,
            bos_token_id,
            eos_token,
            eos_token_ids,
            add_bos,
            add_eos,
            chat_template,
        }
    }

    /// Encodes text; `add_special` adds BOS/EOS only where the model says so.
    /// Special-token strings in the text (e.g. `<|im_start|>`) always map to their ids.
    pub fn encode(&self, text: &str, add_special: bool) -> anyhow::Result<Vec<u32>> {
        let encoding = self.inner.encode(text, add_special).map_err(tok_err)?;
        let mut ids = encoding.get_ids().to_vec();
        if add_special {
            if let Some(bos) = self.bos_token_id.filter(|_| self.add_bos) {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
            if let Some(&eos) = self.eos_token_ids.first().filter(|_| self.add_eos) {
                if ids.last() != Some(&eos) {
                    ids.push(eos);
                }
            }
        }
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> anyhow::Result<String> {
        self.inner.decode(ids, skip_special).map_err(tok_err)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Token ids that end generation (EOS and e.g. `<|im_end|>`/`<|eot_id|>`).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The tokenizer in Hugging Face's `tokenizer.json` form (for the grammar engine's
    /// vocabulary of token bytes).
    pub fn hf_json(&self) -> anyhow::Result<serde_json::Value> {
        let text = self
            .inner
            .to_string(false)
            .map_err(|e| anyhow!("cannot serialise the tokenizer: {e}"))?;
        serde_json::from_str(&text).context("the serialised tokenizer is not JSON")
    }

    /// The Jinja source of the model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_ref().map(|t| t.source.as_str())
    }

    /// Replaces the model's chat template (`--chat-template FILE`).
    pub fn set_chat_template(&mut self, source: String, origin: &Path) -> anyhow::Result<()> {
        self.chat_template = Some(ChatTemplate::new(source, origin)?);
        Ok(())
    }

    /// Renders the chat template; `kwargs` are further template variables
    /// (`chat_template_kwargs`, e.g. Qwen3's `enable_thinking`), which never replace
    /// `messages`, `add_generation_prompt` or the BOS / EOS strings.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<String> {
        let template = self
            .chat_template
            .as_ref()
            .context("the model has no chat template")?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
            ..minijinja::Value::from_serialize(kwargs)
        };
        template
            .env
            .get_template(TEMPLATE_NAME)
            .and_then(|t| t.render(ctx))
            .map_err(|e| anyhow!("chat template error: {e:#}"))
    }
}

/// Streaming detokeniser: feed ids one by one, get the new text, never half a UTF-8 character.
///
/// It decodes a short window `tokens[prefix_offset..]` and compares it with the
/// decode of `tokens[prefix_offset..read_offset]` (text already emitted), as vLLM
/// and TGI do, so that decoders that depend on context (leading spaces, byte
/// pieces) give the same text as a full decode.
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special: bool,
    tokens: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special: bool) -> IncrementalDecoder {
        IncrementalDecoder {
            tokenizer,
            skip_special,
            tokens: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Returns the text that became final with this token (possibly empty).
    pub fn push(&mut self, id: u32) -> anyhow::Result<String> {
        self.tokens.push(id);
        let (prefix, text) = self.decode_window()?;
        if text.len() > prefix.len() && !text.ends_with('\u{FFFD}') {
            if let Some(new) = text.get(prefix.len()..) {
                let new = new.to_string();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.tokens.len();
                return Ok(new);
            }
        }
        Ok(String::new())
    }

    /// Decodes the tokens from `prefix_offset`: those up to `read_offset` (already
    /// returned) and all of them; the new text is what the second adds to the first.
    fn decode_window(&self) -> anyhow::Result<(String, String)> {
        let window = &self.tokens[self.prefix_offset..];
        let prefix = self.tokenizer.decode(
            &window[..self.read_offset - self.prefix_offset],
            self.skip_special,
        )?;
        let text = self.tokenizer.decode(window, self.skip_special)?;
        Ok((prefix, text))
    }

    /// Returns whatever text is still held back (e.g. an incomplete UTF-8
    /// sequence at the end of generation, rendered as U+FFFD).
    pub fn flush(&mut self) -> anyhow::Result<String> {
        let (prefix, text) = self.decode_window()?;
        self.prefix_offset = self.tokens.len();
        self.read_offset = self.tokens.len();
        Ok(text.get(prefix.len()..).unwrap_or_default().to_string())
    }
}
