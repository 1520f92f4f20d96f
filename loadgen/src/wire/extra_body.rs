//! `--extra-body`: the user's own JSON fields, merged into every request body (vLLM's
//! `--extra-body`, SGLang's `--extra-request-body`). Parsed and checked once at start-up:
//! a field that would break the measurement is refused there, with what to use instead,
//! before any request is sent.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

use crate::wire::backend::Backend;

/// A JSON object of request fields, checked against the backend it is sent to.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtraBody(Map<String, Value>);

/// A field loadgen sets itself, and why the user may not.
struct Refused {
    key: &'static str,
    why: &'static str,
}

/// Refused in the body of every OpenAI request (for TGI, inside `parameters`, where the
/// extra body goes; see [`TGI_REFUSED`]).
const REFUSED: &[Refused] = &[
    Refused {
        key: "stream",
        why: "loadgen streams every request: that is how it times tokens",
    },
    Refused {
        key: "stream_options",
        why: "loadgen asks for usage on the stream itself; --no-continuous-usage turns off \
              continuous_usage_stats",
    },
    Refused {
        key: "n",
        why: "loadgen times one answer per request; several choices would interleave in one stream",
    },
    Refused {
        key: "best_of",
        why: "loadgen times one answer per request",
    },
    Refused {
        key: "model",
        why: "use --model",
    },
    Refused {
        key: "messages",
        why: "the workload builds the prompt (--workload, --profile, --trace)",
    },
    Refused {
        key: "prompt",
        why: "the workload builds the prompt (--workload, --profile, --trace)",
    },
    Refused {
        key: "max_tokens",
        why: "the workload sets output lengths (--max-output-len, --random-output-len, a trace's lengths)",
    },
    Refused {
        key: "max_completion_tokens",
        why: "the workload sets output lengths (--max-output-len, --random-output-len, a trace's lengths)",
    },
    Refused {
        key: "ignore_eos",
        why: "loadgen sends ignore_eos itself; --no-ignore-eos turns it off",
    },
    Refused {
        key: "min_tokens",
        why: "use --min-tokens (min_tokens = max_tokens)",
    },
    Refused {
        key: "echo",
        why: "an echoed prompt streams before the answer, so TTFT would time the echo",
    },
];

/// Refused in a Responses API body, besides [`REFUSED`].
const RESPONSES_REFUSED: &[Refused] = &[
    Refused {
        key: "input",
        why: "the workload builds the prompt (--workload, --profile, --trace)",
    },
    Refused {
        key: "instructions",
        why: "the workload builds the prompt (an agent's system prompt is its instructions)",
    },
    Refused {
        key: "max_output_tokens",
        why: "the workload sets output lengths (--max-output-len, --random-output-len, a trace's lengths)",
    },
    Refused {
        key: "store",
        why: "loadgen sends `store: false`: a benchmark's responses are not kept",
    },
    Refused {
        key: "previous_response_id",
        why: "a session sends its whole history in `input`",
    },
];

/// Refused in the body of an agent session's turns: the agent's own.
pub const AGENTIC_REFUSED: &[&str] = &["tools", "tool_choice", "parallel_tool_calls"];

/// Refused inside TGI's `parameters`, besides [`REFUSED`].
const TGI_REFUSED: &[Refused] = &[
    Refused {
        key: "max_new_tokens",
        why: "the workload sets output lengths (--max-output-len, --random-output-len, a trace's lengths)",
    },
    Refused {
        key: "details",
        why: "loadgen asks for details to read the finish reason",
    },
    Refused {
        key: "parameters",
        why: "with --backend tgi the extra body is merged into `parameters` already: give its \
              fields at the top level",
    },
    Refused {
        key: "inputs",
        why: "the workload builds the prompt (--workload, --profile, --trace)",
    },
];

impl ExtraBody {
    /// Parses `--extra-body`: JSON text, or `@FILE` for a file of JSON; checks it for
    /// `backend`. The error names the file, the line and column, or the refused field.
    pub fn parse(arg: &str, backend: Backend) -> Result<ExtraBody> {
        let (text, origin) = match arg.strip_prefix('@') {
            Some(path) => (
                std::fs::read_to_string(path)
                    .with_context(|| format!("--extra-body: reading {path}"))?,
                format!("--extra-body {}", Path::new(path).display()),
            ),
            None => (arg.to_string(), "--extra-body".to_string()),
        };
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("{origin}: not valid JSON (expected an object)"))?;
        let Value::Object(fields) = value else {
            bail!("{origin}: expected a JSON object of request fields, got {value}");
        };
        let tgi = backend == Backend::Tgi;
        let own: &[Refused] = match backend {
            Backend::Tgi => TGI_REFUSED,
            Backend::Responses => RESPONSES_REFUSED,
            Backend::Completions | Backend::Chat => &[],
        };
        let refused = REFUSED
            .iter()
            .chain(own)
            .find(|r| fields.contains_key(r.key));
        if let Some(r) = refused {
            let place = if tgi { " (TGI's `parameters`)" } else { "" };
            bail!("{origin}: field `{}`{place} is refused: {}", r.key, r.why);
        }
        Ok(ExtraBody(fields))
    }

    /// The first of `keys` it sets.
    pub fn first_of(&self, keys: &[&'static str]) -> Option<&'static str> {
        keys.iter().copied().find(|k| self.0.contains_key(*k))
    }

    /// The fields as JSON (for `meta.json` and the request digest).
    pub fn to_value(&self) -> Value {
        Value::Object(self.0.clone())
    }

    /// Merges the fields into `body`: objects merge key by key, at any depth; any other value
    /// replaces what `body` had.
    pub fn merge_into(&self, body: &mut Value) {
        merge(body, &self.0);
    }
}

fn merge(body: &mut Value, fields: &Map<String, Value>) {
    let Value::Object(target) = body else {
        *body = Value::Object(fields.clone());
        return;
    };
    for (key, value) in fields {
        match (target.get_mut(key), value) {
            (Some(existing @ Value::Object(_)), Value::Object(inner)) => merge(existing, inner),
            _ => {
                target.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_merge_at_any_depth_and_other_values_replace() {
        let extra = ExtraBody::parse(
            r#"{"chat_template_kwargs": {"enable_thinking": false}, "temperature": 0.6,
                "a": {"b": {"c": 1}}}"#,
            Backend::Chat,
        )
        .unwrap();
        let mut body = json!({"temperature": 1.0, "a": {"b": {"d": 2}, "e": 3}, "stream": true});
        extra.merge_into(&mut body);
        assert_eq!(
            body,
            json!({"temperature": 0.6, "a": {"b": {"c": 1, "d": 2}, "e": 3}, "stream": true,
                   "chat_template_kwargs": {"enable_thinking": false}})
        );
    }

    #[test]
    fn refused_fields_say_why_and_what_instead() {
        let err = |arg: &str, backend| format!("{:#}", ExtraBody::parse(arg, backend).unwrap_err());
        let e = err(r#"{"max_tokens": 5}"#, Backend::Chat);
        assert!(
            e.contains("field `max_tokens` is refused") && e.contains("--max-output-len"),
            "{e}"
        );
        let e = err(r#"{"stream": false}"#, Backend::Completions);
        assert!(e.contains("`stream`"), "{e}");
        let e = err(r#"{"ignore_eos": false}"#, Backend::Chat);
        assert!(e.contains("--no-ignore-eos"), "{e}");
        let e = err(r#"{"max_new_tokens": 5}"#, Backend::Tgi);
        assert!(e.contains("TGI's `parameters`"), "{e}");
        // `max_new_tokens` means nothing to an OpenAI server; loadgen leaves it to the server.
        assert!(ExtraBody::parse(r#"{"max_new_tokens": 5}"#, Backend::Chat).is_ok());
        let e = err(r#"[1, 2]"#, Backend::Chat);
        assert!(e.contains("expected a JSON object"), "{e}");
        let e = err("{\"a\": 1,\n \"b\": }", Backend::Chat);
        assert!(e.contains("not valid JSON") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn a_file_is_read_and_named_in_its_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("body.json");
        std::fs::write(&path, r#"{"top_k": 20}"#).unwrap();
        let extra = ExtraBody::parse(&format!("@{}", path.display()), Backend::Tgi).unwrap();
        assert_eq!(extra.to_value(), json!({"top_k": 20}));
        std::fs::write(&path, r#"{"n": 2}"#).unwrap();
        let e = format!(
            "{:#}",
            ExtraBody::parse(&format!("@{}", path.display()), Backend::Chat).unwrap_err()
        );
        assert!(e.contains("body.json") && e.contains("`n`"), "{e}");
        let missing = dir.path().join("missing.json");
        let e = format!(
            "{:#}",
            ExtraBody::parse(&format!("@{}", missing.display()), Backend::Chat).unwrap_err()
        );
        assert!(e.contains("missing.json"), "{e}");
    }
}
