//! The reasoning split (`--reasoning-parser`): a reasoning model thinks between two marker
//! tokens (`<think>` … `</think>`) before it answers. The markers are found by token id as
//! each token is sampled, never by scanning text, so a marker spelled inside the text is
//! text. The markers themselves are neither reasoning nor answer text; a marker that opens
//! or closes a block counts as a reasoning token, a stray `</think>` in the answer does not.

use anyhow::Context;

use crate::tokenizer::Tokenizer;

/// The reasoning format of a model family (vLLM's parser names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParser {
    /// Qwen3: reasoning only between `<think>` and `</think>`; with thinking switched off the
    /// template closes the block in the prompt and the output is all answer.
    Qwen3,
    /// DeepSeek-R1: its template opens the block in the prompt (older ones let the model
    /// write `<think>`); everything before `</think>` is reasoning.
    #[value(name = "deepseek-r1")]
    DeepseekR1,
    /// gpt-oss: harmony's `analysis` channel (vLLM's `openai_gptoss`), read from the
    /// answer's text by the server's harmony reader, not by markers.
    #[value(name = "harmony", alias = "openai_gptoss")]
    Harmony,
}

/// The marker token ids of one model and parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkMarkers {
    pub start: u32,
    pub end: u32,
    /// Output begins inside a think block when the prompt holds no marker (DeepSeek-R1).
    open_without_markers: bool,
}

impl ThinkMarkers {
    /// The markers of `parser` in `tokenizer`'s vocabulary; an error when either is not one
    /// token of it.
    pub fn resolve(parser: ReasoningParser, tokenizer: &Tokenizer) -> anyhow::Result<ThinkMarkers> {
        anyhow::ensure!(
            parser != ReasoningParser::Harmony,
            "--reasoning-parser harmony reads channels, not think markers"
        );
        let id = |marker: &str| {
            tokenizer.token_to_id(marker).with_context(|| {
                format!("--reasoning-parser {parser:?}: the tokenizer has no `{marker}` token")
            })
        };
        Ok(ThinkMarkers {
            start: id("<think>")?,
            end: id("</think>")?,
            open_without_markers: parser == ReasoningParser::DeepseekR1,
        })
    }

    /// Whether generation after `prompt` starts inside a think block: the prompt's last
    /// marker opens one, or it has none and the parser starts inside.
    pub fn opens_after(&self, prompt: &[u32]) -> bool {
        match prompt
            .iter()
            .rev()
            .find(|&&t| t == self.start || t == self.end)
        {
            Some(&t) => t == self.start,
            None => self.open_without_markers,
        }
    }
}

/// What one sampled token is to the split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRole {
    /// A marker: no text; the block opens or closes after it.
    Marker,
    Reasoning,
    Answer,
}

/// One sequence's place in its output: inside a think block or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningState {
    markers: ThinkMarkers,
    inside: bool,
    /// The answer has begun: a think block closed (in the prompt or the output), or the
    /// output began with answer text.
    closed: bool,
    reasoning_tokens: usize,
}

impl ReasoningState {
    pub fn new(markers: ThinkMarkers, prompt: &[u32]) -> ReasoningState {
        let last_marker = prompt
            .iter()
            .rev()
            .find(|&&t| t == markers.start || t == markers.end);
        ReasoningState {
            inside: markers.opens_after(prompt),
            closed: last_marker == Some(&markers.end),
            markers,
            reasoning_tokens: 0,
        }
    }

    /// Whether text decoded now belongs to the reasoning.
    pub fn inside(&self) -> bool {
        self.inside
    }

    /// Whether the next token may open a think block: no block is open and the answer has
    /// not begun. (A grammar constrains the answer only, as vLLM's reasoning parsers do, so
    /// there it allows the start marker besides its own tokens.)
    pub fn may_open(&self) -> bool {
        !self.closed && !self.inside
    }

    /// The marker ids.
    pub fn markers(&self) -> ThinkMarkers {
        self.markers
    }

    /// Reasoning tokens so far, the block's markers included.
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// Takes the next sampled token.
    pub fn on_token(&mut self, token: u32) -> TokenRole {
        if token == self.markers.start || token == self.markers.end {
            let opens = token == self.markers.start;
            self.reasoning_tokens += usize::from(opens || self.inside);
            self.inside = opens;
            self.closed |= !opens;
            TokenRole::Marker
        } else if self.inside {
            self.reasoning_tokens += 1;
            TokenRole::Reasoning
        } else {
            self.closed = true;
            TokenRole::Answer
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: ThinkMarkers = ThinkMarkers {
        start: 7,
        end: 8,
        open_without_markers: false,
    };
    const R1: ThinkMarkers = ThinkMarkers {
        open_without_markers: true,
        ..QWEN3
    };

    #[test]
    fn the_prompt_decides_where_output_starts() {
        assert!(!QWEN3.opens_after(&[1, 2]));
        assert!(R1.opens_after(&[1, 2]));
        assert!(
            QWEN3.opens_after(&[1, 7, 3]),
            "the prompt ends inside a block"
        );
        // Thinking switched off: the template closes the block in the prompt.
        assert!(!QWEN3.opens_after(&[1, 7, 3, 8, 4]));
        assert!(!R1.opens_after(&[1, 7, 8]));
    }

    #[test]
    fn tokens_between_the_markers_are_reasoning() {
        let mut st = ReasoningState::new(QWEN3, &[1]);
        let roles: Vec<TokenRole> = [7, 5, 5, 8, 6, 6].iter().map(|&t| st.on_token(t)).collect();
        use TokenRole::*;
        assert_eq!(
            roles,
            [Marker, Reasoning, Reasoning, Marker, Answer, Answer]
        );
        assert_eq!(st.reasoning_tokens(), 4);
        assert!(!st.inside());
        assert!(!st.may_open());
        let mut fresh = ReasoningState::new(QWEN3, &[1]);
        assert!(fresh.may_open());
        assert!(!ReasoningState::new(QWEN3, &[1, 7, 8]).may_open());
        assert!(!ReasoningState::new(R1, &[1]).may_open());
        // An answer that starts without thinking may not open a block later.
        assert_eq!(fresh.on_token(5), TokenRole::Answer);
        assert!(!fresh.may_open());
        let mut r1 = ReasoningState::new(R1, &[1]);
        assert_eq!(r1.on_token(5), Reasoning);
        assert_eq!(r1.on_token(8), Marker);
        assert_eq!(r1.on_token(6), Answer);
        // A stray end marker in the answer is no reasoning.
        assert_eq!(r1.on_token(8), Marker);
        assert_eq!(r1.reasoning_tokens(), 2);
    }
}
