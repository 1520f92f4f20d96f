//! Tokenizer against HF transformers' reference data (SmolLM2 GGUF and the tiny
//! models' `tokenizer.json`) and llama.cpp's (Gemma 3's SentencePiece vocabulary in GGUF),
//! chat templates and streaming detokenisation.

mod common;

use std::sync::{Arc, OnceLock};

use engine::tokenizer::{ChatMessage, IncrementalDecoder, Tokenizer};

use common::{gemma3_gguf, golden, smollm2_gguf};

fn reference() -> &'static serde_json::Value {
    static REFERENCE: OnceLock<serde_json::Value> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let text = std::fs::read_to_string(golden("smollm2-135m/reference.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

fn gguf_tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Arc::new(Tokenizer::from_model_path(&smollm2_gguf()).unwrap()))
        .clone()
}

fn json_tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Arc::new(Tokenizer::from_model_path(&golden("llama-tiny")).unwrap()))
        .clone()
}

fn ids(value: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(value.clone()).unwrap()
}

fn prompts() -> &'static [serde_json::Value] {
    reference()["prompts"].as_array().unwrap()
}

fn prompt(name: &str) -> &'static serde_json::Value {
    prompts().iter().find(|p| p["name"] == name).unwrap()
}

fn check_prompts(tokenizer: &Tokenizer) {
    assert_eq!(prompts().len(), 11);
    for p in prompts() {
        let text = p["text"].as_str().unwrap();
        let name = p["name"].as_str().unwrap();
        assert_eq!(
            tokenizer.encode(text, true).unwrap(),
            ids(&p["input_ids_with_special"]),
            "{name}"
        );
        assert_eq!(
            tokenizer.encode(text, false).unwrap(),
            ids(&p["input_ids_no_special"]),
            "{name}"
        );
    }
}

fn check_decode(tokenizer: &Tokenizer) {
    for p in prompts() {
        let greedy = ids(&p["greedy_ids"]);
        let name = p["name"].as_str().unwrap();
        assert_eq!(
            tokenizer.decode(&greedy, false).unwrap(),
            p["greedy_text"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(
            tokenizer.decode(&greedy, true).unwrap(),
            p["greedy_text_skip_special"].as_str().unwrap(),
            "{name}"
        );
    }
}

fn check_chat_template(tokenizer: &Tokenizer) {
    let chat = &reference()["chat_template"];
    assert_eq!(tokenizer.chat_template(), chat["template"].as_str());
    for conversation in ["two_message", "user_only"] {
        let c = &chat[conversation];
        let messages: Vec<ChatMessage> = serde_json::from_value(c["messages"].clone()).unwrap();
        let rendered = tokenizer
            .apply_chat_template(&messages, true, &Default::default())
            .unwrap();
        assert_eq!(rendered, c["rendered"].as_str().unwrap(), "{conversation}");
        assert_eq!(
            tokenizer.encode(&rendered, true).unwrap(),
            ids(&c["token_ids"]),
            "{conversation}"
        );
    }
}

#[test]
fn gguf_tokenizes_every_prompt_like_transformers() {
    check_prompts(&gguf_tokenizer());
}

#[test]
fn gguf_decodes_greedy_ids_like_transformers() {
    check_decode(&gguf_tokenizer());
}

#[test]
fn gguf_chat_template_renders_like_transformers() {
    check_chat_template(&gguf_tokenizer());
}

#[test]
fn gguf_special_tokens() {
    let tokenizer = gguf_tokenizer();
    let tok = &reference()["tokenizer"];
    assert_eq!(tokenizer.vocab_size(), 49152);
    assert_eq!(tokenizer.bos_token_id(), Some(1));
    assert_eq!(tokenizer.eos_token_ids(), &[2, 0]);
    for (i, special) in tok["special_ids_0_16"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(
            tokenizer.token_to_id(special.as_str().unwrap()),
            Some(i as u32)
        );
        // Special tokens vanish when decoding with skip_special.
        assert_eq!(tokenizer.decode(&[i as u32], true).unwrap(), "");
    }
    for (text, probe) in tok["probe"].as_object().unwrap() {
        assert_eq!(
            tokenizer.encode(text, true).unwrap(),
            ids(&probe["with_special"]),
            "{text:?}"
        );
    }
}

#[test]
fn tokenizer_json_matches_gguf_results() {
    let tokenizer = json_tokenizer();
    check_prompts(&tokenizer);
    check_decode(&tokenizer);
    check_chat_template(&tokenizer);
    assert_eq!(tokenizer.eos_token_ids(), &[2, 0]);
    assert_eq!(tokenizer.bos_token_id(), Some(1));
}

fn check_incremental(tokenizer: &Arc<Tokenizer>, name: &str, skip_special: bool) {
    let greedy = ids(&prompt(name)["greedy_ids"]);
    let mut decoder = IncrementalDecoder::new(tokenizer.clone(), skip_special);
    let mut streamed = String::new();
    for &id in &greedy {
        let chunk = decoder.push(id).unwrap();
        assert!(
            !chunk.contains('\u{FFFD}'),
            "{name}: chunk {chunk:?} has a replacement char"
        );
        streamed.push_str(&chunk);
    }
    let full = tokenizer.decode(&greedy, skip_special).unwrap();
    assert_eq!(full.ends_with('\u{FFFD}'), name == "chinese", "{name}");
    // The 48 greedy tokens of `chinese` stop inside a character: the full decode
    // ends in U+FFFD, which only `flush` hands out.
    assert_eq!(streamed, full.trim_end_matches('\u{FFFD}'), "{name}");
    streamed.push_str(&decoder.flush().unwrap());
    assert_eq!(streamed, full, "{name}");
}

#[test]
fn incremental_decode_never_splits_characters() {
    let tokenizer = gguf_tokenizer();
    for name in ["unicode_emoji", "chinese", "en_capital", "chat_two_message"] {
        check_incremental(&tokenizer, name, false);
        check_incremental(&tokenizer, name, true);
    }
    // The prompts themselves hold multi-byte characters split across byte-level tokens.
    for name in ["unicode_emoji", "chinese"] {
        let input = ids(&prompt(name)["input_ids_with_special"]);
        let mut decoder = IncrementalDecoder::new(tokenizer.clone(), false);
        let mut held_back = 0;
        let mut text = String::new();
        for &id in &input {
            let chunk = decoder.push(id).unwrap();
            assert!(!chunk.contains('\u{FFFD}'), "{name}: {chunk:?}");
            held_back += usize::from(chunk.is_empty());
            text.push_str(&chunk);
        }
        assert!(
            held_back > 0,
            "{name}: expected some tokens to end inside a character"
        );
        assert_eq!(text, prompt(name)["text"].as_str().unwrap());
    }
}

#[test]
fn chat_template_raise_exception_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(golden("llama-tiny").join(file), dir.path().join(file)).unwrap();
    }
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}\
         {% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'].strip() }}\n{% endfor %}",
    )
    .unwrap();
    let tokenizer = Tokenizer::from_model_path(dir.path()).unwrap();
    let msg = |role: &str, content: &str| ChatMessage {
        role: role.to_string(),
        content: content.to_string(),
        reasoning_content: None,
        ..ChatMessage::default()
    };
    let err = tokenizer
        .apply_chat_template(&[msg("system", "x")], false, &Default::default())
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("first message must be user"),
        "{err:#}"
    );
    // pycompat gives Python's str.strip().
    let text = tokenizer
        .apply_chat_template(&[msg("user", "  hi  ")], false, &Default::default())
        .unwrap();
    assert_eq!(text, "[USER] hi\n");
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<IncrementalDecoder>();
}

/// `llama-server /tokenize` (llama.cpp from the llama-cpp-python 0.3.36 sdist,
/// `add_special: false`, `parse_special: true`) on Gemma 3 270M's GGUF: spaces and their
/// runs (user-defined pieces), digits one by one, accents, CJK, emoji, control characters
/// and unmapped letters through byte fallback, and the chat markers as control tokens.
const LLAMA_CPP_GEMMA3_IDS: &[(&str, &[u32])] = &[
    ("Hello world", &[9259, 1902]),
    (" Hello  world ", &[26352, 138, 12392, 236743]),
    ("   leading spaces", &[139, 26016, 9952]),
    ("trailing\n\n", &[136697, 108]),
    (
        "1234567890 3.14159",
        &[
            236770, 236778, 236800, 236812, 236810, 236825, 236832, 236828, 236819, 236771, 236743,
            236800, 236761, 236770, 236812, 236770, 236810, 236819,
        ],
    ),
    (
        "naïve café — déjà vu",
        &[1789, 238527, 560, 33443, 2192, 29234, 11042],
    ),
    ("日本語のテキスト", &[94951, 236945, 95830]),
    ("emoji 🤖🚀 done", &[67906, 236743, 246143, 242015, 3028]),
    (
        "tabs\tand\nnewlines\r\n",
        &[39218, 255968, 624, 107, 208697, 251, 107],
    ),
    (
        "<start_of_turn>user\nHi<end_of_turn>\n",
        &[105, 2364, 107, 10979, 106, 107],
    ),
    (
        "a\u{0}b \u{7} 🧬",
        &[236746, 238, 236763, 236743, 245, 236743, 253633],
    ),
    ("ǅ ǈ ǋ", &[437, 371, 236743, 437, 374, 236743, 437, 377]),
    (
        "don't won't y'all",
        &[
            13246, 236789, 236745, 2810, 236789, 236745, 570, 236789, 712,
        ],
    ),
];

fn gemma3_tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Arc::new(Tokenizer::from_model_path(&gemma3_gguf()).unwrap()))
        .clone()
}

/// The SentencePiece vocabulary of a GGUF file (`tokenizer.ggml.model = llama`) encodes as
/// llama.cpp encodes, and decodes back to the text (llama.cpp's `/detokenize` gives the
/// same strings).
#[test]
fn gemma3_sentencepiece_gguf_encodes_and_decodes_like_llama_cpp() {
    let tokenizer = gemma3_tokenizer();
    for &(text, want) in LLAMA_CPP_GEMMA3_IDS {
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(ids, want, "{text:?}");
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text, "{ids:?}");
    }
    // BOS as the file asks (`add_bos_token`), never doubled; EOS and Gemma's end of turn
    // stop generation; the control tokens vanish with skip_special.
    assert_eq!(tokenizer.encode("Hi", true).unwrap(), [2, 10979]);
    assert_eq!(tokenizer.encode("<bos>Hi", true).unwrap(), [2, 10979]);
    assert_eq!(tokenizer.eos_token_ids(), &[1, 106]);
    assert_eq!(
        tokenizer.decode(&[2, 105, 2364, 106], true).unwrap(),
        "user"
    );
    assert_eq!(tokenizer.vocab_size(), 262_144);
}
