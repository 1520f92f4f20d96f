//! A request's constraint: OpenAI's `response_format`, vLLM's `structured_outputs` and its
//! older `guided_*` fields, read into one [`GrammarSpec`] (or an error naming the field);
//! a tool choice's grammar beside it; and the grammar compiled into the matcher the engine
//! masks with. (The engine applies it: `LlmEngine` computes the masks, `Generation` accepts
//! each token.)

use std::sync::Arc;

use serde_json::Value;

use crate::grammar::{GrammarCompiler, GrammarSpec, TokenMatcher};
use crate::server::error::ApiError;

/// A request's constraint and the field it came from (named in compile errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    pub spec: GrammarSpec,
    pub param: String,
}

/// The structured-output fields of a generation request (both routes, as vLLM's).
#[derive(Debug, serde::Deserialize)]
pub struct ConstraintFields {
    pub response_format: Option<Value>,
    pub structured_outputs: Option<Value>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<Value>,
    pub guided_choice: Option<Value>,
    pub guided_grammar: Option<Value>,
}

/// The constraint of a tool choice's grammar `spec`, refused beside the request's own
/// structured output (`other`).
pub fn with_tool_choice(
    spec: GrammarSpec,
    other: Option<&Constraint>,
) -> Result<Constraint, ApiError> {
    if let Some(other) = other {
        return Err(ApiError::invalid(
            "tool_choice",
            format!(
                "`tool_choice` \"required\" or a named function constrains the answer, and so does `{}`: give one",
                other.param
            ),
        ));
    }
    Ok(Constraint {
        spec,
        param: "tools".into(),
    })
}

/// `constraint` compiled (a grammar llguidance cannot compile is the client's error, named
/// by the field it came from).
pub fn compile(
    constraint: Option<&Constraint>,
    compiler: &Result<Arc<GrammarCompiler>, String>,
) -> Result<Option<TokenMatcher>, ApiError> {
    let Some(constraint) = constraint else {
        return Ok(None);
    };
    let compiler = compiler.as_ref().map_err(|why| {
        ApiError::invalid(
            &constraint.param,
            format!("structured output is unavailable with this model's tokenizer: {why}"),
        )
    })?;
    compiler.compile(&constraint.spec).map(Some).map_err(|e| {
        ApiError::invalid(
            &constraint.param,
            format!(
                "`{}` cannot be compiled to a grammar: {e:#}",
                constraint.param
            ),
        )
    })
}

/// The constraint the fields ask for, if any; two constraints at once are refused.
pub fn request_constraint(fields: &ConstraintFields) -> Result<Option<Constraint>, ApiError> {
    let mut found: Vec<Constraint> = Vec::new();
    if let Some(format) = &fields.response_format {
        found.extend(response_format(format)?);
    }
    if let Some(outputs) = &fields.structured_outputs {
        found.extend(structured_outputs(outputs)?);
    }
    let guided = [
        (&fields.guided_json, "guided_json", "json"),
        (&fields.guided_regex, "guided_regex", "regex"),
        (&fields.guided_choice, "guided_choice", "choice"),
        (&fields.guided_grammar, "guided_grammar", "grammar"),
    ];
    for (value, field, key) in guided {
        if let Some(value) = value {
            found.push(structured_key(key, value, field)?);
        }
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            &found[1].param,
            format!(
                "`{}` and `{}` both constrain the output; give one",
                found[0].param, found[1].param
            ),
        ));
    }
    Ok(found.pop())
}

/// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
fn response_format(format: &Value) -> Result<Option<Constraint>, ApiError> {
    let Value::Object(obj) = format else {
        return Err(ApiError::wrong_type("response_format", "an object"));
    };
    let kind = obj.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            "response_format.type",
            "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\"",
        )
    })?;
    let allowed: &[&str] = match kind {
        "text" | "json_object" => &["type"],
        "json_schema" => &["type", "json_schema"],
        other => {
            return Err(ApiError::invalid(
                "response_format.type",
                format!("`response_format.type` must be \"text\", \"json_object\" or \"json_schema\", got \"{other}\""),
            ))
        }
    };
    if let Some(key) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            &format!("response_format.{key}"),
            format!("Unrecognized request argument supplied: response_format.{key}"),
        ));
    }
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Constraint {
            spec: GrammarSpec::JsonObject,
            param: "response_format".into(),
        })),
        _ => {
            let param = "response_format.json_schema";
            let Some(Value::Object(js)) = obj.get("json_schema") else {
                return Err(ApiError::invalid(
                    param,
                    "`response_format.json_schema` must be an object with `name` and `schema`",
                ));
            };
            if let Some(key) = js
                .keys()
                .find(|k| !["name", "schema", "strict", "description"].contains(&k.as_str()))
            {
                return Err(ApiError::invalid(
                    &format!("{param}.{key}"),
                    format!("Unrecognized request argument supplied: {param}.{key}"),
                ));
            }
            if js
                .get("strict")
                .is_some_and(|s| !s.is_boolean() && !s.is_null())
            {
                return Err(ApiError::wrong_type(
                    &format!("{param}.strict"),
                    "a boolean",
                ));
            }
            let schema = match js.get("schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                // OpenAI's default when no schema is given: any JSON object.
                None | Some(Value::Null) => serde_json::json!({"type": "object"}),
                Some(_) => {
                    return Err(ApiError::wrong_type(
                        &format!("{param}.schema"),
                        "a JSON schema object",
                    ))
                }
            };
            Ok(Some(Constraint {
                spec: GrammarSpec::JsonSchema(schema),
                param: format!("{param}.schema"),
            }))
        }
    }
}

/// vLLM's `structured_outputs`: exactly one of `json`, `regex`, `choice`, `grammar`,
/// `json_object`.
fn structured_outputs(outputs: &Value) -> Result<Option<Constraint>, ApiError> {
    let Value::Object(obj) = outputs else {
        return Err(ApiError::wrong_type("structured_outputs", "an object"));
    };
    let mut found = Vec::new();
    for (key, value) in obj {
        if value.is_null() {
            continue;
        }
        let param = format!("structured_outputs.{key}");
        match key.as_str() {
            "json" | "regex" | "choice" | "grammar" => {
                found.push(structured_key(key, value, &param)?)
            }
            "json_object" => match value {
                Value::Bool(true) => found.push(Constraint {
                    spec: GrammarSpec::JsonObject,
                    param,
                }),
                Value::Bool(false) => {}
                _ => return Err(ApiError::wrong_type(&param, "a boolean")),
            },
            _ => {
                return Err(ApiError::invalid(
                    &param,
                    format!("`{param}` is not supported: give one of `json`, `regex`, `choice`, `grammar` (llguidance's Lark syntax) or `json_object`"),
                ))
            }
        }
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            "structured_outputs",
            "`structured_outputs` takes exactly one of `json`, `regex`, `choice`, `grammar`, `json_object`",
        ));
    }
    Ok(found.pop())
}

/// One constraint kind's value: a schema (object or JSON text), a regex, a choice list or a
/// Lark grammar.
fn structured_key(key: &str, value: &Value, param: &str) -> Result<Constraint, ApiError> {
    let spec = match (key, value) {
        ("json", Value::Object(_)) => GrammarSpec::JsonSchema(value.clone()),
        ("json", Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(schema @ Value::Object(_)) => GrammarSpec::JsonSchema(schema),
            _ => {
                return Err(ApiError::invalid(
                    param,
                    format!("`{param}` is not a JSON schema object"),
                ))
            }
        },
        ("json", _) => return Err(ApiError::wrong_type(param, "a JSON schema object")),
        ("regex", Value::String(rx)) => GrammarSpec::Regex(rx.clone()),
        ("regex", _) => return Err(ApiError::wrong_type(param, "a string")),
        ("choice", Value::Array(items)) if !items.is_empty() => GrammarSpec::Choice(
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ApiError::wrong_type(param, "a non-empty list of strings"))?,
        ),
        ("choice", _) => return Err(ApiError::wrong_type(param, "a non-empty list of strings")),
        ("grammar", Value::String(g)) => GrammarSpec::Lark(g.clone()),
        _ => {
            return Err(ApiError::wrong_type(
                param,
                "a string (a grammar in llguidance's Lark syntax)",
            ))
        }
    };
    Ok(Constraint {
        spec,
        param: param.to_string(),
    })
}
