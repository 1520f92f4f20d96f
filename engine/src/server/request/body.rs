//! Reads a JSON request body into typed structs. A route reads its body as one or more
//! structs (fields shared by both generation routes, the route's own, the structured-output
//! ones); a struct's fields are the fields it accepts, so the accepted list and the parser
//! cannot drift. A field of the wrong type is refused naming its path (`messages[2].role`);
//! a field that none of the structs took is refused by name, as OpenAI's API refuses an
//! unrecognised argument (a field set to `null` counts as absent).

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::server::error::ApiError;

/// One step of a path into the body.
#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// A request body being read.
pub struct Body {
    value: Value,
    /// Per struct read, the paths it did not take.
    ignored: Vec<Vec<Vec<Segment>>>,
}

impl Body {
    /// Parses the bytes; the body must be a JSON object.
    pub fn parse(bytes: &[u8]) -> Result<Body, ApiError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::malformed(format!("The request body is not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(ApiError::malformed(
                "The request body must be a JSON object.",
            ));
        }
        Ok(Body {
            value,
            ignored: Vec::new(),
        })
    }

    /// Reads the body as `T`, refusing a wrong-typed field by its path.
    pub fn read<T: DeserializeOwned>(&mut self) -> Result<T, ApiError> {
        let mut ignored = Vec::new();
        let mut note = |path: serde_ignored::Path| ignored.push(segments(&path));
        let deserializer = serde_ignored::Deserializer::new(&self.value, &mut note);
        let parsed = serde_path_to_error::deserialize(deserializer)
            .map_err(|e| type_error(&e.path().to_string(), &e.inner().to_string()))?;
        self.ignored.push(ignored);
        Ok(parsed)
    }

    /// Refuses the first field no read took: one every read left out (itself, or a field
    /// that holds it). A `null` one counts as absent.
    pub fn finish(self) -> Result<(), ApiError> {
        let taken_by_none = |path: &[Segment]| {
            self.ignored
                .iter()
                .all(|read| read.iter().any(|left| path.starts_with(left)))
        };
        let unknown =
            self.ignored.iter().flatten().find(|path| {
                taken_by_none(path) && !at(&self.value, path).is_none_or(Value::is_null)
            });
        match unknown {
            None => Ok(()),
            Some(path) => {
                let param = display(path);
                Err(ApiError::invalid(
                    &param,
                    format!("Unrecognized request argument supplied: {param}"),
                ))
            }
        }
    }
}

fn segments(path: &serde_ignored::Path) -> Vec<Segment> {
    use serde_ignored::Path;
    match path {
        Path::Root => Vec::new(),
        Path::Seq { parent, index } => {
            let mut out = segments(parent);
            out.push(Segment::Index(*index));
            out
        }
        Path::Map { parent, key } => {
            let mut out = segments(parent);
            out.push(Segment::Key(key.clone()));
            out
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => segments(parent),
    }
}

/// The value at `path`, if there is one.
fn at<'a>(value: &'a Value, path: &[Segment]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, segment| match segment {
        Segment::Key(key) => v.get(key),
        Segment::Index(i) => v.get(i),
    })
}

/// `messages[2].role`, as the refusals name fields.
fn display(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Key(key) if out.is_empty() => out.push_str(key),
            Segment::Key(key) => {
                out.push('.');
                out.push_str(key);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// serde's message about the field at `path`, in the API's words: a wrong JSON type is
/// `invalid_type` ("`temperature` must be a number, got string \"hot\""), a value out of
/// the type's range (`-3` for a count) `invalid_value`, in the same form.
fn type_error(path: &str, message: &str) -> ApiError {
    let split = |prefix: &str| {
        message
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once(", expected "))
    };
    let reworded =
        |got: &str, expected: &str| format!("`{path}` must be {}, got {got}", json_type(expected));
    if let Some((got, expected)) = split("invalid type: ") {
        ApiError {
            code: Some("invalid_type"),
            ..ApiError::invalid(path, reworded(got, expected))
        }
    } else if let Some((got, expected)) = split("invalid value: ") {
        ApiError::invalid(path, reworded(got, expected))
    } else {
        ApiError::invalid(path, format!("`{path}`: {message}"))
    }
}

/// A Rust type as serde names it, as a JSON type.
fn json_type(expected: &str) -> &str {
    match expected {
        "f32" | "f64" | "a JSON number" => "a number",
        "u8" | "u16" | "u32" => "a non-negative integer below 2^32",
        "u64" | "usize" => "a non-negative integer",
        "i32" | "i64" => "an integer",
        "a sequence" => "a list",
        "a map" => "an object",
        s if s.starts_with("struct ") => "an object",
        s => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Outer {
        n: Option<u64>,
        items: Option<Vec<Inner>>,
    }

    #[derive(serde::Deserialize)]
    struct Inner {
        role: Option<String>,
    }

    #[derive(serde::Deserialize)]
    struct Other {
        temperature: Option<f64>,
    }

    fn read_both(body: &str) -> Result<(Outer, Other), ApiError> {
        let mut body = Body::parse(body.as_bytes())?;
        let outer = body.read::<Outer>()?;
        let other = body.read::<Other>()?;
        body.finish()?;
        Ok((outer, other))
    }

    fn refusal(body: &str) -> (String, &'static str, String) {
        let e = read_both(body).map(|_| ()).unwrap_err();
        (e.param.unwrap_or_default(), e.code.unwrap(), e.message)
    }

    #[test]
    fn fields_of_either_struct_are_taken_and_nulls_count_as_absent() {
        let (outer, other) = read_both(
            r#"{"n": 3, "items": [{"role": "user"}], "temperature": 0.5, "x": null, "items2": null}"#,
        )
        .unwrap();
        assert_eq!(outer.n, Some(3));
        assert_eq!(outer.items.unwrap()[0].role.as_deref(), Some("user"));
        assert_eq!(other.temperature, Some(0.5));
    }

    #[test]
    fn unknown_fields_are_named_by_path_at_any_depth() {
        let (param, code, message) = refusal(r#"{"n": 1, "frobnicate": 3}"#);
        assert_eq!((param.as_str(), code), ("frobnicate", "invalid_value"));
        assert_eq!(
            message,
            "Unrecognized request argument supplied: frobnicate"
        );
        let (param, _, _) = refusal(r#"{"items": [{"role": "a"}, {"role": "b", "mood": 1}]}"#);
        assert_eq!(param, "items[1].mood");
    }

    #[test]
    fn wrong_types_and_values_are_named_by_path_in_json_words() {
        let (param, code, message) = refusal(r#"{"temperature": "hot"}"#);
        assert_eq!((param.as_str(), code), ("temperature", "invalid_type"));
        assert_eq!(
            message,
            "`temperature` must be a number, got string \"hot\""
        );
        let (param, code, message) = refusal(r#"{"items": [{"role": 7}]}"#);
        assert_eq!((param.as_str(), code), ("items[0].role", "invalid_type"));
        assert!(message.contains("must be a string"), "{message}");
        let (param, code, _) = refusal(r#"{"n": -1}"#);
        assert_eq!((param.as_str(), code), ("n", "invalid_value"));
        let (param, _, message) = refusal(r#"{"items": ["x"]}"#);
        assert_eq!(param, "items[0]");
        assert!(message.contains("must be an object"), "{message}");
    }

    #[test]
    fn a_body_that_is_not_a_json_object_is_malformed() {
        for body in ["[1]", "{\"n\": ", "3"] {
            let e = Body::parse(body.as_bytes()).err().unwrap();
            assert_eq!(e.code, Some("invalid_json"), "{body}");
        }
    }
}
