//! A chat request's `tools`, `tool_choice` and `parallel_tool_calls`, checked. What a
//! model does with them (the prompt, the grammar of a choice, reading the calls back) is
//! its chat format's (`formats`).

use serde_json::{json, Value};

use super::error::ApiError;

/// One function of `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of its arguments (`{"type": "object"}` when absent).
    pub parameters: Value,
    /// The tool object as the request sent it (what chat templates read).
    pub raw: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The tools of a chat request and what the model may do with them.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): more than one call per answer.
    pub parallel: bool,
}

const TOOLS_HELP: &str =
    "a list of `{\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}`";

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no tools were sent.
pub fn parse_tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<Tools>, ApiError> {
    let parallel = parallel.unwrap_or(true);
    let Some(tools) = tools else {
        return match choice.map(Value::as_str) {
            None | Some(Some("none")) | Some(Some("auto")) => Ok(None),
            _ => Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` other than \"none\" or \"auto\" needs `tools`",
            )),
        };
    };
    let Value::Array(items) = tools else {
        return Err(ApiError::wrong_type("tools", TOOLS_HELP));
    };
    let mut parsed: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let tool = parse_tool(item, &format!("tools[{i}]"))?;
        if parsed.iter().any(|t| t.name == tool.name) {
            return Err(ApiError::invalid(
                &format!("tools[{i}].function.name"),
                format!("two tools are named `{}`", tool.name),
            ));
        }
        parsed.push(tool);
    }
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` must be \"none\", \"auto\", \"required\" or a named function, got \"{other}\""),
                ))
            }
        },
        Some(Value::Object(obj)) => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| obj.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "a named `tool_choice` is `{\"type\": \"function\", \"function\": {\"name\": ...}}`",
                    )
                })?;
            if !parsed.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice.function.name",
                    format!("`tool_choice` names `{name}`, which is not among `tools`"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(_) => {
            return Err(ApiError::wrong_type(
                "tool_choice",
                "\"none\", \"auto\", \"required\" or a named function",
            ))
        }
    };
    if parsed.is_empty() && choice != ToolChoice::None {
        return Err(ApiError::invalid("tools", "`tools` must not be empty"));
    }
    Ok(Some(Tools {
        tools: parsed,
        choice,
        parallel,
    }))
}

fn parse_tool(item: &Value, path: &str) -> Result<Tool, ApiError> {
    let function = match (
        item.get("type").and_then(Value::as_str),
        item.get("function"),
    ) {
        (Some("function"), Some(Value::Object(f))) => f,
        _ => {
            return Err(ApiError::invalid(
                path,
                format!("`{path}` must be {TOOLS_HELP}"),
            ))
        }
    };
    for key in function.keys() {
        if !["name", "description", "parameters", "strict"].contains(&key.as_str()) {
            return Err(ApiError::invalid(
                &format!("{path}.function.{key}"),
                format!("Unrecognized request argument supplied: {path}.function.{key}"),
            ));
        }
    }
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                &format!("{path}.function.name"),
                "every function needs a non-empty `name`",
            )
        })?;
    let param = format!("{path}.function.parameters");
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(Value::Object(p)) => match p.get("type") {
            // The arguments are an object: a schema that says nothing of its type gets it.
            None => {
                let mut p = p.clone();
                p.insert("type".into(), json!("object"));
                Value::Object(p)
            }
            Some(t) if t == "object" => Value::Object(p.clone()),
            Some(t) => {
                return Err(ApiError::invalid(
                    &param,
                    format!("`{param}` must describe an object (the arguments), not type {t}"),
                ))
            }
        },
        Some(_) => return Err(ApiError::wrong_type(&param, "a JSON schema object")),
    };
    Ok(Tool {
        name: name.to_string(),
        parameters,
        raw: item.clone(),
    })
}

impl Tools {
    /// The template variable `tools`: the tool objects as sent.
    pub fn template_value(&self) -> Value {
        Value::Array(self.tools.iter().map(|t| t.raw.clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_describe_an_object() {
        let tool = |parameters: Value| {
            parse_tool(
                &json!({"type": "function", "function": {"name": "f", "parameters": parameters}}),
                "tools[0]",
            )
        };
        assert_eq!(
            tool(json!({})).unwrap().parameters,
            json!({"type": "object"})
        );
        let e = tool(json!({"type": "string"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].function.parameters"));
    }
}
