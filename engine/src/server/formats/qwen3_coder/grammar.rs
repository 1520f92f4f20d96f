//! The grammar that forces a `required` or named tool choice in Qwen3-Coder's XML, as the
//! model's template writes a call: `<tool_call>\n<function=NAME>\n`, then each parameter of
//! the function's `properties` in their order (the `required` ones always, the others
//! optionally) as `<parameter=KEY>\nVALUE\n</parameter>\n`, then
//! `</function>\n</tool_call>`. A text value is any text without `</parameter>` (of the
//! property's `minLength` to `maxLength` characters), or one of its `enum` / `const`
//! strings; any other value is JSON of the property's schema.

use serde_json::Value;

use super::values::{kind_of, Kind};
use crate::grammar::{compact, GrammarSpec};
use crate::server::tools::{Tool, ToolChoice, Tools};

/// The grammar of a `required` choice (one call to any tool, or several with
/// `parallel_tool_calls`) or a named one (one call to it); `None` for `auto` and `none`.
pub fn tool_grammar(tools: &Tools) -> Option<GrammarSpec> {
    let chosen: Vec<&Tool> = match &tools.choice {
        ToolChoice::None | ToolChoice::Auto => return None,
        ToolChoice::Required => tools.tools.iter().collect(),
        ToolChoice::Named(name) => tools.tools.iter().filter(|t| &t.name == name).collect(),
    };
    let more = if tools.parallel && tools.choice == ToolChoice::Required {
        " (\"\\n\" call)*"
    } else {
        ""
    };
    let mut rules = Vec::new();
    let functions: Vec<String> = chosen
        .iter()
        .enumerate()
        .map(|(i, tool)| function_rules(i, tool, &mut rules))
        .collect();
    let head = [
        format!("start: call{more}"),
        format!(
            "call: \"<tool_call>\\n\" ({}) \"</tool_call>\"",
            functions.join(" | ")
        ),
        format!("TEXT_VALUE: {TEXT} {CLOSE}"),
    ];
    Some(GrammarSpec::Lark(
        head.into_iter().chain(rules).collect::<Vec<_>>().join("\n"),
    ))
}

/// Text without `</parameter>` (`\x2F` is `/`, which would end a Lark regex).
const TEXT: &str = r"(/(?s:.*)/ & ~/(?s:.*)<\x2Fparameter>(?s:.*)/)";
/// What closes a value (the value's terminal includes it: text could otherwise go on
/// over its first characters).
const CLOSE: &str = r#""\n</parameter>\n""#;

/// The rules of tool `i`'s call (added to `rules`); its rule's name.
fn function_rules(i: usize, tool: &Tool, rules: &mut Vec<String>) -> String {
    let schema = &tool.parameters;
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let no_properties = serde_json::Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&no_properties);
    let text_schema = Value::Object(serde_json::Map::new());
    // The properties in order, then any required key that no property describes.
    let parameters = properties
        .iter()
        .map(|(key, property)| (key.as_str(), property))
        .chain(
            required
                .iter()
                .filter(|key| !properties.contains_key(**key))
                .map(|key| (*key, &text_schema)),
        );
    let mut body = vec![literal(&format!("<function={}>\n", tool.name))];
    for (j, (key, property)) in parameters.enumerate() {
        let name = format!("fn_{i}_{j}");
        let value = value_rule(&format!("{name}_value"), property, schema, rules);
        rules.push(format!(
            "{name}: {} {value}",
            literal(&format!("<parameter={key}>\n"))
        ));
        let optional = if required.contains(&key) { "" } else { "?" };
        body.push(format!("{name}{optional}"));
    }
    body.push(literal("</function>\n"));
    let name = format!("fn_{i}");
    rules.push(format!("{name}: {}", body.join(" ")));
    name
}

/// The grammar of one value and its close (the terminal it needs, named after `name`,
/// added to `rules`).
fn value_rule(name: &str, property: &Value, root: &Value, rules: &mut Vec<String>) -> String {
    if kind_of(property).0 != Kind::Text {
        return format!("%json {} {CLOSE}", with_definitions(property, root));
    }
    let strings: Option<Vec<String>> = match (property.get("const"), property.get("enum")) {
        (Some(Value::String(s)), _) => Some(vec![literal(s)]),
        (_, Some(Value::Array(options))) => options
            .iter()
            .map(|o| o.as_str().map(literal))
            .collect::<Option<Vec<_>>>()
            .filter(|o| !o.is_empty()),
        _ => None,
    };
    if let Some(strings) = strings {
        return format!("({}) {CLOSE}", strings.join(" | "));
    }
    let bound = |key| property.get(key).and_then(Value::as_u64);
    if bound("minLength").is_none() && bound("maxLength").is_none() {
        return "TEXT_VALUE".to_string();
    }
    let terminal = name.to_uppercase();
    let max = bound("maxLength")
        .map(|m| m.to_string())
        .unwrap_or_default();
    rules.push(format!(
        "{terminal}: (/(?s:.{{{},{max}}})/ & {TEXT}) {CLOSE}",
        bound("minLength").unwrap_or(0)
    ));
    terminal
}

/// A property's schema for `%json`: compact, with the root's `$defs` / `definitions`
/// (which its `$ref`s may name) copied in.
fn with_definitions(property: &Value, root: &Value) -> Value {
    let mut schema = property.clone();
    if let Value::Object(own) = &mut schema {
        for key in ["$defs", "definitions"] {
            if let Some(definitions) = root.get(key) {
                own.entry(key).or_insert_with(|| definitions.clone());
            }
        }
    }
    compact(schema)
}

/// A Lark string literal (Lark strings take JSON's escapes).
fn literal(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, OnceLock};

    use serde_json::json;

    use super::*;
    use crate::grammar::GrammarCompiler;
    use crate::server::formats::qwen3_coder::reading;
    use crate::server::formats::tests::{call, read};
    use crate::server::tools::parse_tools;
    use crate::tokenizer::Tokenizer;

    fn tools(choice: Value, parallel: bool) -> Tools {
        let weather = json!({"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "days": {"type": "integer", "minimum": 1},
            "unit": {"type": "object", "properties": {"c": {"$ref": "#/$defs/flag"}}}},
            "$defs": {"flag": {"type": "boolean"}}});
        let time = json!({"type": "object", "required": ["tz"],
            "properties": {"tz": {"enum": ["UTC", "CET"]}, "note": {"type": "string"}}});
        parse_tools(
            Some(&json!([
                {"type": "function", "function": {"name": "get_weather", "parameters": weather}},
                {"type": "function", "function": {"name": "get_time", "parameters": time}},
            ])),
            Some(&choice),
            Some(parallel),
        )
        .unwrap()
        .unwrap()
    }

    /// Whether `text` is a whole answer of `tools`' grammar, token by token over the tiny
    /// golden Llama's vocabulary (EOS id 2).
    fn fits(tools: &Tools, text: &str) -> bool {
        static VOCAB: OnceLock<(Arc<Tokenizer>, GrammarCompiler)> = OnceLock::new();
        let (tokenizer, compiler) = VOCAB.get_or_init(|| {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../shared/golden/llama-tiny");
            let tokenizer = Arc::new(Tokenizer::from_model_path(&dir).unwrap());
            let compiler = GrammarCompiler::new(tokenizer.clone(), 49152).unwrap();
            (tokenizer, compiler)
        });
        let ids = tokenizer.encode(text, false).unwrap();
        let mut matcher = compiler.compile(&tool_grammar(tools).unwrap()).unwrap();
        ids.iter().all(|&id| matcher.accept(id).is_ok())
            && matcher.allowed().unwrap().0.is_allowed(2)
    }

    const WEATHER: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n\
                           <parameter=days>\n3\n</parameter>\n<parameter=unit>\n{\"c\":true}\n</parameter>\n\
                           </function>\n</tool_call>";
    const TIME: &str =
        "<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>";

    /// The grammar takes the calls the template writes, typed and in order, and the reader
    /// reads them back; it refuses a missing required parameter, a value out of its
    /// schema, and more calls than the choice allows.
    #[test]
    fn the_grammar_takes_calls_as_the_template_writes_them() {
        let required = tools(json!("required"), false);
        assert!(fits(&required, WEATHER));
        assert!(fits(&required, TIME));
        let (_, calls) = read(reading(&required).reader(), WEATHER, 5);
        assert_eq!(
            calls,
            [call(
                "get_weather",
                r#"{"city":"Oslo","days":3,"unit":{"c":true}}"#
            )]
        );
        for wrong in [
            TIME.replace("<parameter=tz>\nCET\n</parameter>\n", ""),
            TIME.replace("CET", "PST"),
            WEATHER.replace("Oslo", "Llanfairpwllgwyngyll"),
            WEATHER.replace("Oslo", "a</parameter>b"),
            WEATHER.replace("\n3\n", "\n0\n"),
            WEATHER.replace("{\"c\":true}", "{\"c\":1}"),
            format!("{WEATHER}\n{TIME}"),
            format!("Sure. {TIME}"),
        ] {
            assert!(!fits(&required, &wrong), "{wrong}");
        }
        let parallel = tools(json!("required"), true);
        assert!(fits(&parallel, &format!("{WEATHER}\n{TIME}")));
        let named = tools(
            json!({"type": "function", "function": {"name": "get_time"}}),
            true,
        );
        assert!(fits(&named, TIME));
        assert!(!fits(&named, WEATHER));
        assert!(!fits(&named, &format!("{TIME}\n{TIME}")));
        assert_eq!(tool_grammar(&tools(json!("auto"), true)), None);
    }

    /// Optional parameters may be left out, a string without bounds is any text without
    /// `</parameter>`, and a required key no property describes is text.
    #[test]
    fn optional_parameters_and_free_text() {
        let named = tools(
            json!({"type": "function", "function": {"name": "get_time"}}),
            false,
        );
        let note = TIME.replace(
            "</parameter>\n</function>",
            "</parameter>\n<parameter=note>\nany <b>text</b>\nover lines\n</parameter>\n</function>",
        );
        assert!(fits(&named, &note), "{note}");
        let mut loose = named.clone();
        loose.tools[1].parameters = json!({"type": "object", "required": ["q"]});
        assert!(fits(&loose, "<tool_call>\n<function=get_time>\n<parameter=q>\n1 < 2\n</parameter>\n</function>\n</tool_call>"));
        assert!(!fits(
            &loose,
            "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"
        ));
    }
}
