//! A parameter's value typed by its property's schema, as vLLM's `qwen3_coder` parser types
//! it: the model writes every value as text, which stays a string for a string property
//! and is read as the integer, number, boolean or JSON the schema declares otherwise,
//! falling back to the text when it is not one.

use serde_json::{Number, Value};

/// How a property's values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Raw text (a string, or a property whose schema declares no type).
    Text,
    Integer,
    Number,
    Boolean,
    /// JSON (an object, an array, or a type the other kinds do not name).
    Json,
}

/// The kind of a property's values, and whether its schema admits null: its `type` (a
/// name, or a list whose first name other than `null` counts), else the first such type
/// among `anyOf`'s options; text when it declares none.
pub fn kind_of(schema: &Value) -> (Kind, bool) {
    let names: Vec<&str> = match schema.get("type") {
        Some(Value::String(name)) => vec![name.as_str()],
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
        _ => schema
            .get("anyOf")
            .and_then(Value::as_array)
            .map(|options| {
                options
                    .iter()
                    .filter_map(|o| o.get("type")?.as_str())
                    .collect()
            })
            .unwrap_or_default(),
    };
    let is_null = |name: &&str| name.eq_ignore_ascii_case("null");
    let nullable = names.iter().any(is_null);
    let kind = match names.iter().find(|n| !is_null(n)) {
        Some(name) => kind_named(&name.to_ascii_lowercase()),
        None if nullable => Kind::Json,
        None => Kind::Text,
    };
    (kind, nullable)
}

/// The kind of a type name, with the aliases vLLM accepts.
fn kind_named(name: &str) -> Kind {
    match name {
        "string" | "str" | "text" | "varchar" | "char" | "enum" => Kind::Text,
        "boolean" | "bool" | "binary" => Kind::Boolean,
        _ if ["int", "uint", "long", "short", "unsigned"]
            .iter()
            .any(|p| name.starts_with(p)) =>
        {
            Kind::Integer
        }
        _ if name.starts_with("num") || name.starts_with("float") => Kind::Number,
        _ => Kind::Json,
    }
}

/// The value of a parameter written as `text`, typed by its property's `schema` (text when
/// the tool has no such property). `null` (or Python's `None`, which Qwen3.5's template
/// writes for a null argument) is null unless the property is a string that cannot be null.
pub fn typed(text: &str, schema: Option<&Value>) -> Value {
    let (kind, nullable) = schema.map_or((Kind::Text, false), kind_of);
    let is_null = text.eq_ignore_ascii_case("null") || text.eq_ignore_ascii_case("none");
    let as_text = || Value::String(text.to_string());
    match kind {
        _ if is_null && (nullable || kind != Kind::Text) => Value::Null,
        Kind::Text => as_text(),
        Kind::Integer => integer(text.trim()).unwrap_or_else(as_text),
        Kind::Number => number(text.trim()).unwrap_or_else(as_text),
        Kind::Boolean if text.eq_ignore_ascii_case("true") => Value::Bool(true),
        Kind::Boolean if text.eq_ignore_ascii_case("false") => Value::Bool(false),
        Kind::Boolean => as_text(),
        Kind::Json => serde_json::from_str(text).unwrap_or_else(|_| as_text()),
    }
}

fn integer(text: &str) -> Option<Value> {
    match text.parse::<i64>() {
        Ok(i) => Some(i.into()),
        Err(_) => text.parse::<u64>().ok().map(Value::from),
    }
}

/// A finite number; one with no fraction is an integer (as vLLM writes `5.0` as `5`).
fn number(text: &str) -> Option<Value> {
    let x = text.parse::<f64>().ok().filter(|x| x.is_finite())?;
    if x.fract() == 0.0 && x.abs() < 9.0e18 {
        return Some((x as i64).into());
    }
    Number::from_f64(x).map(Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_take_their_propertys_type() {
        let cases = [
            (json!({"type": "string"}), "42", json!("42")),
            (json!({"type": "string"}), "null", json!("null")),
            (json!({"type": ["string", "null"]}), "None", Value::Null),
            (json!({"type": "integer"}), " 42 ", json!(42)),
            (json!({"type": "integer"}), "4.5", json!("4.5")),
            (json!({"type": "number"}), "2.50", json!(2.5)),
            (json!({"type": "number"}), "3.0", json!(3)),
            (json!({"type": "number"}), "inf", json!("inf")),
            (json!({"type": "boolean"}), "True", json!(true)),
            (json!({"type": "boolean"}), "false", json!(false)),
            (json!({"type": "boolean"}), "yes", json!("yes")),
            (
                json!({"type": "object"}),
                r#"{"a": [1]}"#,
                json!({"a": [1]}),
            ),
            (json!({"type": "array"}), "[1, 2", json!("[1, 2")),
            (json!({"type": "array"}), "null", Value::Null),
            (
                json!({"anyOf": [{"type": "null"}, {"type": "integer"}]}),
                "7",
                json!(7),
            ),
            (json!({"enum": ["a", "b"]}), "7", json!("7")),
        ];
        for (schema, text, want) in cases {
            assert_eq!(typed(text, Some(&schema)), want, "{text:?} as {schema}");
        }
        assert_eq!(typed("7", None), json!("7"));
    }
}
