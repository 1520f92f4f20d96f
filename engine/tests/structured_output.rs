//! Structured output and tool calls end to end: `engine serve` with grammars from
//! `response_format`, `structured_outputs` and `tool_choice`, checked on what comes back
//! (the tiny random Llama: whatever it would say, the grammar decides the shape), and the
//! default SmolLM2 model through the official `openai` Python client.

mod common;

use serde_json::{json, Value};

use common::server::{
    assert_weather_call, chunks, post, post_stream, run_openai_script, weather_tools, Server,
};
use common::{golden_dir_with, smollm2_gguf};

async fn tiny_server(extra: &[&str]) -> Server {
    let mut server = Server::start(&golden_dir_with("llama-tiny", "model.safetensors"), extra);
    server.wait_ready().await;
    server
}

/// A person: a name of at most 8 characters and an age in 0..=120, nothing else.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": false,
    })
}

/// Checks `text` against [`person_schema`].
fn assert_person(text: &str) {
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let obj = value.as_object().expect("an object");
    assert_eq!(obj.len(), 2, "{text}");
    let name = obj["name"].as_str().expect("name is a string");
    assert!((1..=8).contains(&name.chars().count()), "{text}");
    let age = obj["age"].as_i64().expect("age is an integer");
    assert!((0..=120).contains(&age), "{text}");
}

/// The stream's tool calls joined: (id, name, arguments) by index.
fn joined_stream_calls(chunks: &[Value]) -> Vec<(String, String, String)> {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for chunk in chunks {
        for choice in chunk["choices"].as_array().unwrap() {
            let Some(deltas) = choice["delta"]["tool_calls"].as_array() else {
                continue;
            };
            for d in deltas {
                let index = d["index"].as_u64().unwrap() as usize;
                if index == calls.len() {
                    assert!(d["id"].is_string(), "a call's first delta has its id: {d}");
                    assert!(d["function"]["name"].is_string(), "and its name: {d}");
                    calls.push(Default::default());
                }
                let call = &mut calls[index];
                if let Some(id) = d["id"].as_str() {
                    call.0 = id.to_string();
                }
                if let Some(name) = d["function"]["name"].as_str() {
                    call.1 = name.to_string();
                }
                call.2 += d["function"]["arguments"].as_str().unwrap_or("");
            }
        }
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grammars_decide_the_shape_of_the_answer() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let completions = server.url("/v1/completions");
    let chat = server.url("/v1/chat/completions");

    // A regex the whole answer matches; the sequence stops once nothing more may follow.
    let body = json!({"prompt": "hello", "max_tokens": 20, "temperature": 0,
                      "structured_outputs": {"regex": "[0-9]{3}"}});
    let (status, out) = post(&client, &completions, &body).await;
    assert_eq!(status, 200, "{out}");
    let text = out["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.len() == 3 && text.bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
    assert_eq!(out["choices"][0]["finish_reason"], "stop");
    // Streamed, the same greedy answer.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let joined: String = chunks(&post_stream(&client, &completions, &streamed).await)
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(joined, text);

    // A choice, for every one of n sampled choices (each has its own matcher).
    let choices = ["alpha", "beta", "gamma delta"];
    let body = json!({"prompt": "pick", "max_tokens": 20, "temperature": 1.0, "seed": 3, "n": 4,
                      "guided_choice": choices});
    let (status, out) = post(&client, &completions, &body).await;
    assert_eq!(status, 200, "{out}");
    for choice in out["choices"].as_array().unwrap() {
        let text = choice["text"].as_str().unwrap();
        assert!(choices.contains(&text), "{text:?}");
        assert_eq!(choice["finish_reason"], "stop");
    }

    // A JSON schema through OpenAI's response_format, greedy and sampled.
    for (temperature, seed) in [(0.0, 0), (1.0, 11), (1.0, 12)] {
        let body = json!({"messages": [{"role": "user", "content": "Who are you?"}],
            "max_tokens": 200, "temperature": temperature, "seed": seed,
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "person", "strict": true, "schema": person_schema()}}});
        let (status, out) = post(&client, &chat, &body).await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["choices"][0]["finish_reason"], "stop", "{out}");
        assert_person(out["choices"][0]["message"]["content"].as_str().unwrap());
    }

    // Cut by max_tokens: finish_reason says so (the text is then not valid JSON).
    let body = json!({"messages": [{"role": "user", "content": "Who are you?"}],
        "max_tokens": 3, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person_schema()}}});
    let (_, out) = post(&client, &chat, &body).await;
    assert_eq!(out["choices"][0]["finish_reason"], "length", "{out}");
    assert_eq!(out["usage"]["completion_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_grammars_and_tool_requests_are_refused_by_field() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let chat = server.url("/v1/chat/completions");
    let hi = json!([{"role": "user", "content": "hi"}]);
    let tool = weather_tools(12);
    let refused: Vec<(Value, &str, &str)> = vec![
        (
            json!({"messages": hi, "response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}}),
            "response_format.json_schema.schema",
            "cannot be compiled",
        ),
        (
            json!({"messages": hi, "structured_outputs": {"regex": "(unclosed"}}),
            "structured_outputs.regex",
            "cannot be compiled",
        ),
        (
            json!({"messages": hi, "structured_outputs": {"grammar": "start: undefined_rule"}}),
            "structured_outputs.grammar",
            "cannot be compiled",
        ),
        (
            json!({"messages": hi, "structured_outputs": {"whitespace_pattern": " "}}),
            "structured_outputs.whitespace_pattern",
            "not supported",
        ),
        (
            json!({"messages": hi, "response_format": {"type": "json_object"},
                   "structured_outputs": {"regex": "a"}}),
            "structured_outputs.regex",
            "both constrain the output",
        ),
        (
            json!({"messages": hi, "tools": tool}),
            "tool_choice",
            "--tool-call-parser",
        ),
        (
            json!({"messages": hi, "tools": tool, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
            "not among `tools`",
        ),
        (
            json!({"messages": hi, "tools": tool, "tool_choice": "required",
                   "response_format": {"type": "json_object"}}),
            "tool_choice",
            "give one",
        ),
        (
            json!({"messages": hi, "tool_choice": "required"}),
            "tool_choice",
            "needs `tools`",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "get_time", "arguments": "{not json"}}]}]}),
            "messages[1].tool_calls[0].function.arguments",
            "not valid JSON",
        ),
        (
            json!({"messages": hi, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}, "colour": 1}}]}),
            "tools[0].function.colour",
            "Unrecognized",
        ),
    ];
    for (body, param, message) in refused {
        let (status, error) = post(&client, &chat, &body).await;
        assert_eq!(status, 400, "{body} -> {error}");
        assert_eq!(error["error"]["param"], param, "{body} -> {error}");
        let text = error["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{body} -> {text}");
    }
    // The server keeps serving.
    let (status, _) = post(
        &client,
        &chat,
        &json!({"messages": hi, "max_tokens": 2, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choices_are_enforced_and_stream_like_the_whole() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let chat = server.url("/v1/chat/completions");
    let messages = json!([{"role": "user", "content": "What is the weather in Paris?"}]);

    // `required` without parallel calls: exactly one call, whose arguments fit its tool.
    let required = json!({"messages": messages, "tools": weather_tools(12), "tool_choice": "required",
        "parallel_tool_calls": false, "max_tokens": 200, "temperature": 0});
    let (status, out) = post(&client, &chat, &required).await;
    assert_eq!(status, 200, "{out}");
    let choice = &out["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{out}");
    assert!(choice["message"]["content"].is_null(), "{out}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{out}");
    let (name, arguments) = (
        calls[0]["function"]["name"].as_str().unwrap(),
        calls[0]["function"]["arguments"].as_str().unwrap(),
    );
    assert_weather_call(name, arguments, 12);
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["type"], "function");

    // Streamed: id and name first, the arguments in deltas, joined equal to the whole.
    let mut streamed = required.clone();
    streamed["stream"] = json!(true);
    let chunks = chunks(&post_stream(&client, &chat, &streamed).await);
    let joined = joined_stream_calls(&chunks);
    assert_eq!(joined.len(), 1);
    assert_eq!(
        (joined[0].1.as_str(), joined[0].2.as_str()),
        (name, arguments)
    );
    let argument_deltas = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .is_some_and(|a| !a.is_empty())
        })
        .count();
    assert!(argument_deltas > 1, "arguments arrive in pieces");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );

    // Sampled `required` calls with parallel calls allowed: every call fits its tool.
    let mut checked = 0;
    for seed in 0..4 {
        let mut body = required.clone();
        body["parallel_tool_calls"] = json!(true);
        body["temperature"] = json!(1.0);
        body["seed"] = json!(seed);
        body["max_tokens"] = json!(400);
        let (_, out) = post(&client, &chat, &body).await;
        let choice = &out["choices"][0];
        if choice["finish_reason"] == "length" {
            continue;
        }
        assert_eq!(choice["finish_reason"], "tool_calls", "{out}");
        for call in choice["message"]["tool_calls"].as_array().unwrap() {
            assert_weather_call(
                call["function"]["name"].as_str().unwrap(),
                call["function"]["arguments"].as_str().unwrap(),
                12,
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "every sampled answer was cut by max_tokens");

    // A named function: its arguments, whatever the model would rather say.
    let named = json!({"messages": messages, "tools": weather_tools(12),
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "max_tokens": 50, "temperature": 0});
    let (status, out) = post(&client, &chat, &named).await;
    assert_eq!(status, 200, "{out}");
    let call = &out["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_time");
    assert_weather_call(
        "get_time",
        call["function"]["arguments"].as_str().unwrap(),
        12,
    );
    assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");

    // A second turn carrying the call and its result is accepted.
    let second = json!({"messages": [
            messages[0],
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "{\"time\": \"12:00\"}"},
        ],
        "tools": weather_tools(12), "tool_choice": "none", "max_tokens": 5, "temperature": 0});
    let (status, out) = post(&client, &chat, &second).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["usage"]["completion_tokens"], 5);
}

/// A template that reads `tools` gets them, and earlier calls with their arguments as JSON
/// objects: the chat prompt has exactly the tokens of the expected rendering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_and_earlier_calls_reach_a_template_that_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("tools.jinja");
    std::fs::write(
        &template,
        "{% for t in tools %}[tool {{ t.function.name }}]{% endfor %}\
         {% for m in messages %}[{{ m.role }}]{{ m.content }}\
         {% for c in m.tool_calls or [] %}(call {{ c.id }} {{ c.function.name }} city={{ c.function.arguments.city }}){% endfor %}\
         {% if m.tool_call_id %}(for {{ m.tool_call_id }}){% endif %}{% endfor %}",
    )
    .unwrap();
    let server = tiny_server(&["--chat-template", template.to_str().unwrap()]).await;
    let client = reqwest::Client::new();
    let body = json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c7", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c7", "content": "rain"},
        ],
        "tools": weather_tools(12), "tool_choice": "none", "max_tokens": 1, "temperature": 0});
    let (status, out) = post(&client, &server.url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{out}");
    let expected = "[tool get_weather][tool get_time][user]weather?[assistant]\
                    (call c7 get_weather city=Oslo)[tool]rain(for c7)";
    let (_, tokens) = post(
        &client,
        &server.url("/tokenize"),
        &json!({"prompt": expected, "add_special_tokens": false}),
    )
    .await;
    assert_eq!(
        out["usage"]["prompt_tokens"], tokens["count"],
        "{out} vs {tokens}"
    );
    // The same `tools` twice (also through the template variables) is refused.
    let mut twice = body.clone();
    twice["chat_template_kwargs"] = json!({"tools": []});
    let (status, error) = post(&client, &server.url("/v1/chat/completions"), &twice).await;
    assert_eq!(status, 400);
    assert_eq!(error["error"]["param"], "chat_template_kwargs.tools");
}

/// The issue's acceptance run: the official `openai` client against the default model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_structured_output_and_tools_through_the_openai_client() {
    let mut server = Server::start(
        &smollm2_gguf(),
        &[
            "--tool-call-parser",
            "hermes",
            "--kv-cache-memory",
            "256MiB",
        ],
    );
    server.wait_ready().await;
    let read = openai_client_run(&server.url("/v1"));
    println!("what the openai client read: {read}");

    let object: Value = serde_json::from_str(read["json_object"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("json_object answer is not JSON: {e}: {read}"));
    assert!(object.is_object(), "{read}");
    assert_person(read["json_schema"].as_str().unwrap());
    for key in ["required", "named"] {
        let calls = read[key].as_array().unwrap();
        assert!(!calls.is_empty(), "{key}: {read}");
        for call in calls {
            assert_weather_call(call[0].as_str().unwrap(), call[1].as_str().unwrap(), 12);
        }
        assert_eq!(read[format!("{key}_finish")], "tool_calls", "{read}");
    }
    assert_eq!(read["named"][0][0], "get_weather");
    assert!(read["second_turn"].is_string(), "{read}");
    assert_eq!(read["streamed_required"], read["required"], "{read}");
}

/// What the `openai` client reads (scripts/test.sh installs it and sets OPENAI_PYTHONPATH).
fn openai_client_run(base_url: &str) -> Value {
    const SCRIPT: &str = r#"
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
tools, person = json.loads(sys.argv[2]), json.loads(sys.argv[3])
model = client.models.list().data[0].id
def ask(content, **kw):
    return client.chat.completions.create(model=model, temperature=0, seed=1,
        messages=[{"role": "user", "content": content}], **kw)
def calls(message):
    return [[c.function.name, c.function.arguments] for c in message.tool_calls]
out = {}
out["json_object"] = ask("Describe a cat as a JSON object with a name and a colour.",
    response_format={"type": "json_object"}, max_tokens=200).choices[0].message.content
out["json_schema"] = ask("Describe a person as JSON.", max_tokens=100,
    response_format={"type": "json_schema",
                     "json_schema": {"name": "person", "strict": True, "schema": person}}).choices[0].message.content
weather = "What is the weather in Paris?"
r = ask(weather, tools=tools, tool_choice="required", max_tokens=300)
out["required"], out["required_finish"] = calls(r.choices[0].message), r.choices[0].finish_reason
r = ask(weather, tools=tools, max_tokens=100,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
out["named"], out["named_finish"] = calls(r.choices[0].message), r.choices[0].finish_reason
call = r.choices[0].message.tool_calls[0]
second = client.chat.completions.create(model=model, temperature=0, max_tokens=30, tools=tools,
    messages=[{"role": "user", "content": weather},
              {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": "{\"sky\": \"sunny\", \"celsius\": 21}"}])
out["second_turn"] = second.choices[0].message.content
joined = {}
for chunk in ask(weather, tools=tools, tool_choice="required", max_tokens=300, stream=True):
    for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
        entry = joined.setdefault(d.index, ["", ""])
        if d.function.name:
            entry[0] = d.function.name
        entry[1] += d.function.arguments or ""
out["streamed_required"] = [joined[i] for i in sorted(joined)]
print(json.dumps(out))
"#;
    run_openai_script(
        SCRIPT,
        &[
            base_url,
            &weather_tools(12).to_string(),
            &person_schema().to_string(),
        ],
    )
}

/// `--tool-call-parser qwen3_coder` over Qwen3.5's template, through the official `openai`
/// client: `required` and a named function are forced in the XML call syntax, so even the
/// tiny random Llama's calls parse into arguments that fit their tools, streamed as whole;
/// a second turn carrying a call (its arguments a JSON string) and the result renders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_coder_tool_choices_through_the_openai_client() {
    let template = common::workspace().join("templates/qwen3_5.jinja");
    let server = tiny_server(&[
        "--tool-call-parser",
        "qwen3_coder",
        "--chat-template",
        template.to_str().unwrap(),
    ])
    .await;
    const SCRIPT: &str = r#"
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
tools = json.loads(sys.argv[2])
model = client.models.list().data[0].id
weather = [{"role": "user", "content": "What is the weather in Paris?"}]
def ask(messages=weather, max_tokens=300, temperature=0, **kw):
    return client.chat.completions.create(model=model, messages=messages, tools=tools,
        temperature=temperature, max_tokens=max_tokens, **kw)
def calls(message):
    return [[c.function.name, c.function.arguments] for c in message.tool_calls or []]
out = {}
r = ask(tool_choice="required", parallel_tool_calls=False)
out["required"], out["required_finish"] = calls(r.choices[0].message), r.choices[0].finish_reason
out["required_content"] = r.choices[0].message.content
joined = {}
for chunk in ask(tool_choice="required", parallel_tool_calls=False, stream=True):
    for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
        entry = joined.setdefault(d.index, ["", ""])
        if d.function.name:
            entry[0] = d.function.name
        entry[1] += d.function.arguments or ""
out["streamed_required"] = [joined[i] for i in sorted(joined)]
r = ask(tool_choice={"type": "function", "function": {"name": "get_time"}})
out["named"], out["named_finish"] = calls(r.choices[0].message), r.choices[0].finish_reason
call = r.choices[0].message.tool_calls[0]
r = ask(tool_choice={"type": "function", "function": {"name": "get_weather"}})
out["named_weather"] = calls(r.choices[0].message)
out["sampled"] = []
for seed in range(4):
    r = ask(tool_choice="required", temperature=1.0, seed=seed, max_tokens=400)
    if r.choices[0].finish_reason == "tool_calls":
        out["sampled"] += calls(r.choices[0].message)
second = ask(weather + [
    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
    {"role": "tool", "tool_call_id": call.id, "content": "12:00"}], tool_choice="none", max_tokens=2)
out["prompt_tokens"] = [r.usage.prompt_tokens, second.usage.prompt_tokens]
print(json.dumps(out))
"#;
    let read = run_openai_script(
        SCRIPT,
        &[&server.url("/v1"), &weather_tools(12).to_string()],
    );
    println!("what the openai client read: {read}");
    for key in ["required", "named"] {
        let calls = read[key].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{key}: {read}");
        assert_weather_call(
            calls[0][0].as_str().unwrap(),
            calls[0][1].as_str().unwrap(),
            12,
        );
        assert_eq!(read[format!("{key}_finish")], "tool_calls", "{read}");
    }
    assert!(read["required_content"].is_null(), "{read}");
    assert_eq!(read["named"][0][0], "get_time", "{read}");
    // A text value within its length, and sampled parallel calls, fit their tools too.
    let sampled = read["sampled"].as_array().unwrap();
    assert!(!sampled.is_empty(), "every sampled answer was cut: {read}");
    for call in read["named_weather"]
        .as_array()
        .unwrap()
        .iter()
        .chain(sampled)
    {
        assert_weather_call(call[0].as_str().unwrap(), call[1].as_str().unwrap(), 12);
    }
    assert_eq!(read["named_weather"][0][0], "get_weather", "{read}");
    assert_eq!(read["streamed_required"], read["required"], "{read}");
    let tokens = &read["prompt_tokens"];
    assert!(tokens[1].as_u64() > tokens[0].as_u64(), "{read}");
}
