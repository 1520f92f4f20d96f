//! Models whose prompt is rendered by their own chat template: [`TemplateFormat`], the one
//! format of every template model, over the [`CallSyntax`] its `auto` calls are written in
//! (`hermes`, `llama3_json`, `qwen3_coder`, or [`NoParser`] without `--tool-call-parser`);
//! the prompt ([`TemplatePrompt`]: template variables, the tools passed to the template
//! or, for templates that do not read them, the Hermes prompt ([`hermes_messages`]) that
//! lists the tools and the turns that carry earlier calls and results).

use serde_json::{json, Map, Value};

use super::{json_calls, ChatFormat, Conversation, Reading, ReasoningEffort, ReasoningSplit};
use crate::grammar::GrammarSpec;
use crate::reasoning::ReasoningParser;
use crate::server::error::ApiError;
use crate::server::tools::{ToolChoice, Tools};
use crate::tokenizer::{ChatMessage, Tokenizer};

/// Template variables the server sets itself, which `chat_template_kwargs` may not replace.
pub const SERVER_TEMPLATE_VARIABLES: [&str; 4] = [
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// How a template model's prompt is rendered.
#[derive(Debug, Clone, Default)]
pub struct TemplatePrompt {
    /// `--default-chat-template-kwargs`: template variables of every chat request, which a
    /// request's own `chat_template_kwargs` override key by key.
    pub default_kwargs: Map<String, Value>,
    /// The chat template renders `tools` itself (else the Hermes prompt carries them):
    /// decided once, when the template is loaded.
    pub reads_tools: bool,
}

impl TemplatePrompt {
    /// The prompt of `tokenizer`'s template: `reads_tools` from its source.
    pub fn of(tokenizer: &Tokenizer, default_kwargs: Map<String, Value>) -> TemplatePrompt {
        TemplatePrompt {
            default_kwargs,
            reads_tools: tokenizer
                .chat_template()
                .is_some_and(|source| source.contains("tools")),
        }
    }

    /// The conversation rendered by the chat template, with the server's template
    /// variables, the request's `chat_template_kwargs` over them, its `reasoning_effort`
    /// as the variable of that name, and its tools as `tools` (or, for a template that
    /// does not read them, in the Hermes prompt).
    pub fn render(
        &self,
        conversation: Conversation<'_>,
        tokenizer: &Tokenizer,
    ) -> Result<String, ApiError> {
        let mut kwargs = self.kwargs(conversation.template_kwargs)?;
        if let Some(effort) = conversation.reasoning_effort {
            if conversation
                .template_kwargs
                .is_some_and(|k| k.contains_key("reasoning_effort"))
            {
                return Err(ApiError::invalid(
                    "chat_template_kwargs.reasoning_effort",
                    "`reasoning_effort` reaches the template as `reasoning_effort`; give it once",
                ));
            }
            ReasoningEffort::parse(effort)?;
            // The request's value wins over a server default.
            kwargs.insert("reasoning_effort".into(), Value::String(effort.to_string()));
        }
        let hermes;
        let messages = if self.reads_tools {
            if let Some(tools) = conversation.tools {
                if kwargs.contains_key("tools") {
                    return Err(ApiError::invalid(
                        "chat_template_kwargs.tools",
                        "the request's `tools` reach the template as `tools`; give them once",
                    ));
                }
                kwargs.insert("tools".into(), tools.template_value());
            }
            conversation.messages
        } else {
            hermes = hermes_messages(conversation.messages, conversation.tools);
            &hermes
        };
        tokenizer
            .apply_chat_template(messages, conversation.add_generation_prompt, &kwargs)
            .map_err(|e| {
                ApiError::invalid("messages", format!("cannot apply the chat template: {e:#}"))
            })
    }

    /// The template variables of a request: the server's defaults, overridden key by key
    /// by the request's `chat_template_kwargs`.
    fn kwargs(&self, own: Option<&Map<String, Value>>) -> Result<Map<String, Value>, ApiError> {
        let mut kwargs = self.default_kwargs.clone();
        if let Some(own) = own {
            if let Some(key) = SERVER_TEMPLATE_VARIABLES
                .iter()
                .find(|k| own.contains_key(**k))
            {
                return Err(ApiError::invalid(
                    &format!("chat_template_kwargs.{key}"),
                    format!("`{key}` is set by the server, not by chat_template_kwargs"),
                ));
            }
            kwargs.extend(own.clone());
        }
        Ok(kwargs)
    }
}

/// How a template model writes the calls of `tool_choice: "auto"` (`--tool-call-parser`),
/// and, where its syntax has its own grammar, those of `required` and a named function.
pub trait CallSyntax: Send + Sync + std::fmt::Debug {
    /// The syntax's name, as `--tool-call-parser` names it.
    fn name(&self) -> &'static str;
    /// The reading of `auto` answers to `tools` (with `parallel_tool_calls`); an error
    /// where this syntax cannot read them.
    fn auto_reading(&self, tools: &Tools) -> Result<Reading, ApiError>;
    /// The grammar that enforces a `required` or named tool choice: by default the JSON
    /// of `json_calls`.
    fn tool_grammar(&self, tools: &Tools) -> Option<GrammarSpec> {
        json_calls::grammar(tools)
    }
    /// The reading of what [`tool_grammar`](Self::tool_grammar) enforces.
    fn forced_reading(&self, tools: &Tools) -> Reading {
        match &tools.choice {
            ToolChoice::Named(name) => json_calls::arguments_reading(name.clone()),
            _ => json_calls::array_reading(),
        }
    }
}

/// A template model's format: its chat template renders the prompt, `required` and named
/// tool choices are what `calls`' grammar enforces (JSON unless the syntax has its own),
/// `auto` calls are read by `calls`, and `--reasoning-parser` splits the answers at its
/// think markers.
#[derive(Debug)]
pub struct TemplateFormat<C: CallSyntax> {
    pub template: TemplatePrompt,
    pub think: Option<ReasoningParser>,
    pub calls: C,
}

impl<C: CallSyntax> ChatFormat for TemplateFormat<C> {
    fn name(&self) -> &'static str {
        self.calls.name()
    }

    fn render(
        &self,
        conversation: Conversation<'_>,
        tokenizer: &Tokenizer,
    ) -> Result<String, ApiError> {
        self.template.render(conversation, tokenizer)
    }

    fn tool_grammar(&self, tools: &Tools) -> Option<GrammarSpec> {
        self.calls.tool_grammar(tools)
    }

    fn answer_grammar(&self, spec: GrammarSpec) -> Result<GrammarSpec, String> {
        Ok(spec)
    }

    fn reading(&self, tools: Option<&Tools>) -> Result<Option<Reading>, ApiError> {
        let Some(tools) = tools else {
            return Ok(None);
        };
        Ok(match &tools.choice {
            ToolChoice::None => None,
            ToolChoice::Required | ToolChoice::Named(_) => Some(self.calls.forced_reading(tools)),
            ToolChoice::Auto => Some(self.calls.auto_reading(tools)?),
        })
    }

    fn reasoning_split(&self) -> ReasoningSplit {
        self.think
            .map_or(ReasoningSplit::None, ReasoningSplit::ThinkMarkers)
    }

    fn reads_markers(&self) -> bool {
        false
    }
}

/// A template model served without `--tool-call-parser`: `required` and named tool choices
/// work (a grammar enforces them), `auto` is refused.
#[derive(Debug)]
pub struct NoParser;

impl CallSyntax for NoParser {
    fn name(&self) -> &'static str {
        "template"
    }

    fn auto_reading(&self, _tools: &Tools) -> Result<Reading, ApiError> {
        Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice: \"auto\"` needs a server started with `--tool-call-parser`; \
             \"required\" or a named function work without one",
        ))
    }
}

/// The Hermes tool prompt (NousResearch's format, which Qwen2.5 also uses), for templates
/// that do not read `tools`: the tools in `<tools>`, and how to call them.
fn hermes_tool_prompt(tools: &Tools) -> String {
    let mut text = String::from(
        "You are a function calling AI model. You are provided with function signatures within \
         <tools></tools> XML tags. You may call one or more functions to assist with the user \
         query. Don't make assumptions about what values to plug into functions. Here are the \
         available tools:\n<tools>\n",
    );
    for tool in &tools.tools {
        text.push_str(&tool.raw.to_string());
        text.push('\n');
    }
    text.push_str(
        "</tools>\nFor each function call, return a JSON object with the function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
         <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}

/// The conversation for a template that does not read `tools`: the Hermes tool prompt
/// joins (or becomes) the system message, earlier calls become `<tool_call>` text and tool
/// results `<tool_response>` user turns.
pub fn hermes_messages(messages: &[ChatMessage], tools: Option<&Tools>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(calls) = m.tool_calls.take() {
                for call in calls {
                    let function = &call["function"];
                    let body =
                        json!({"name": function["name"], "arguments": function["arguments"]});
                    if !m.content.is_empty() {
                        m.content.push('\n');
                    }
                    m.content
                        .push_str(&format!("<tool_call>\n{body}\n</tool_call>"));
                }
            }
            if m.role == "tool" {
                m.role = "user".into();
                m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
                m.tool_call_id = None;
            }
            m
        })
        .collect();
    if let Some(tools) = tools {
        let prompt = hermes_tool_prompt(tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{prompt}", first.content);
            }
            _ => out.insert(
                0,
                ChatMessage {
                    role: "system".into(),
                    content: prompt,
                    ..ChatMessage::default()
                },
            ),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tools::parse_tools;

    #[test]
    fn templates_without_tools_get_the_hermes_prompt_and_turns() {
        let tools = parse_tools(
            Some(&json!([{"type": "function", "function": {"name": "f"}}])),
            None,
            None,
        )
        .unwrap()
        .unwrap();
        let messages = vec![
            ChatMessage {
                role: "user".into(),
                content: "hi".into(),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "assistant".into(),
                tool_calls: Some(vec![
                    json!({"function": {"name": "f", "arguments": {"a": 1}}}),
                ]),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: "42".into(),
                tool_call_id: Some("c".into()),
                ..ChatMessage::default()
            },
        ];
        let out = hermes_messages(&messages, Some(&tools));
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].role, "system");
        assert!(
            out[0].content.contains(
                r#"<tools>
{"type":"function","function":{"name":"f"}}
</tools>"#
            ),
            "{}",
            out[0].content
        );
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</tool_call>"
        );
        assert_eq!(
            (out[3].role.as_str(), out[3].content.as_str()),
            ("user", "<tool_response>\n42\n</tool_response>")
        );
    }
}
