//! gpt-oss's harmony end to end: `engine serve` on the tiny gpt-oss (its GGUF: MXFP4
//! experts, a byte-level vocabulary with the harmony tokens) renders chats in harmony and
//! reads the answers' channels back; the official `openai` client gets parsed tool calls for
//! `tool_choice: "required"` and a named function, streamed and not (a random model calls
//! no tool unless the grammar makes it), and the server refuses parsers of other formats.

mod common;

use std::path::PathBuf;

use serde_json::{json, Value};

use common::server::{assert_weather_call, post, run_openai_script, weather_tools, Server};

fn gpt_oss_gguf() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/families/gpt-oss-tiny/model.gguf")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_gets_tool_calls_from_a_harmony_model() {
    let mut server = Server::start(
        &gpt_oss_gguf(),
        &[
            "--reasoning-parser",
            "harmony",
            "--tool-call-parser",
            "harmony",
            // Every compared request prefills its whole prompt the same way: a prefix-cache
            // hit would prefill only a tail, through other kernels than the first request's.
            "--no-enable-prefix-caching",
        ],
    );
    server.wait_ready().await;
    const SCRIPT: &str = r#"
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
tools = json.loads(sys.argv[2])
model = client.models.list().data[0].id
weather = [{"role": "system", "content": "Answer briefly."},
           {"role": "user", "content": "What is the weather in Paris?"}]
def ask(max_tokens=120, **kw):
    return client.chat.completions.create(model=model, messages=weather, tools=tools,
                                          max_tokens=max_tokens, **kw)
def calls(message):
    return [[c.function.name, c.function.arguments] for c in message.tool_calls or []]
def streamed(**kw):
    joined, finish = {}, None
    for chunk in ask(stream=True, **kw):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                entry = joined.setdefault(d.index, ["", ""])
                if d.function.name:
                    entry[0] = d.function.name
                entry[1] += d.function.arguments or ""
    return [joined[i] for i in sorted(joined)], finish
# The whole, streamed and cut answers are asked alike, only max_tokens differing, so that
# greedy decoding makes each a prefix of the whole answer on any CPU.
greedy_required = dict(tool_choice="required", temperature=0, seed=1, reasoning_effort="low")
out = {}
r = ask(**greedy_required)
out["required"], out["required_finish"] = calls(r.choices[0].message), r.choices[0].finish_reason
out["required_content"] = r.choices[0].message.content
# A cut three tokens before the whole answer's end (<|call|>, the closing quote and brace)
# lands inside the call's arguments, whichever tool and city the random model chose.
cut_at = r.usage.completion_tokens - 3
r = ask(tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0.9, seed=5)
out["named"], out["named_finish"] = calls(r.choices[0].message), r.choices[0].finish_reason
out["streamed_required"], out["streamed_finish"] = streamed(**greedy_required)
call = client.chat.completions.create(model=model, messages=weather, tools=tools, max_tokens=120,
    tool_choice="required", temperature=0, seed=1).choices[0].message.tool_calls[0]
second = client.chat.completions.create(model=model, temperature=0, max_tokens=20, tools=tools,
    extra_body={"min_tokens": 20},
    messages=weather + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                        {"role": "tool", "tool_call_id": call.id, "content": "{\"sky\": \"sunny\"}"}])
out["second_finish"] = second.choices[0].finish_reason
schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
r = client.chat.completions.create(model=model, messages=weather, max_tokens=60, temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "ok", "schema": schema}})
out["structured"], out["structured_finish"] = r.choices[0].message.content, r.choices[0].finish_reason
# Cut inside the call's arguments: what arrived.
r = ask(max_tokens=cut_at, **greedy_required)
out["cut"], out["cut_finish"] = calls(r.choices[0].message), r.choices[0].finish_reason
out["streamed_cut"], out["streamed_cut_finish"] = streamed(max_tokens=cut_at, **greedy_required)
print(json.dumps(out))
"#;
    let read = run_openai_script(SCRIPT, &[&server.url("/v1"), &weather_tools(8).to_string()]);
    println!("what the openai client read: {read}");
    for key in ["required", "named", "streamed_required"] {
        let calls = read[key].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{key}: one call per harmony turn: {read}");
        assert_weather_call(
            calls[0][0].as_str().unwrap(),
            calls[0][1].as_str().unwrap(),
            8,
        );
    }
    assert_eq!(read["named"][0][0], "get_time", "{read}");
    for key in ["required_finish", "named_finish", "streamed_finish"] {
        assert_eq!(read[key], "tool_calls", "{key}: {read}");
    }
    assert_eq!(read["required_content"], Value::Null, "{read}");
    // Greedy with the same prompt: the stream's call is the whole answer's, piece by piece.
    assert_eq!(read["streamed_required"], read["required"], "{read}");
    // The second turn (the call and its result in the prompt) runs to its length: min_tokens
    // holds back the tokens that end a turn.
    assert_eq!(read["second_finish"], "length", "{read}");
    // Structured output lands in the final channel, so in `content`.
    let answer: Value = serde_json::from_str(read["structured"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {read}"));
    assert!(
        answer["ok"].is_boolean() && answer.as_object().unwrap().len() == 1,
        "{read}"
    );
    assert_eq!(read["structured_finish"], "stop", "{read}");
    // A stream cut inside a call's arguments ends with what arrived: the call, its arguments
    // so far (a prefix of the whole answer's), and `length`.
    for (key, finish) in [
        ("cut", "cut_finish"),
        ("streamed_cut", "streamed_cut_finish"),
    ] {
        assert_eq!(read[finish], "length", "{key}: {read}");
        let cut = &read[key][0];
        assert_eq!(cut[0], read["required"][0][0], "{key}: {read}");
        let (part, whole) = (
            cut[1].as_str().unwrap(),
            read["required"][0][1].as_str().unwrap(),
        );
        // A cut inside a character's bytes ends with U+FFFD in place of them (the prompt
        // holds today's date, so where the random model's cut lands changes by the day).
        let complete = part.strip_suffix('\u{FFFD}').unwrap_or(part);
        assert!(
            complete.len() < whole.len() && whole.starts_with(complete) && part.starts_with('{'),
            "{key}: {read}"
        );
    }

    // Bad input is refused by field: an effort harmony does not have, template variables
    // that no template reads.
    let client = reqwest::Client::new();
    let url = server.url("/v1/chat/completions");
    let hi = json!([{"role": "user", "content": "hi"}]);
    for (body, param) in [
        (
            json!({"messages": hi, "reasoning_effort": "extreme"}),
            "reasoning_effort",
        ),
        (
            json!({"messages": hi, "chat_template_kwargs": {"x": 1}}),
            "chat_template_kwargs",
        ),
        (
            json!({"messages": hi, "skip_special_tokens": false}),
            "skip_special_tokens",
        ),
        (
            json!({"messages": hi, "guided_regex": "a+"}),
            "guided_regex",
        ),
    ] {
        let (status, reply) = post(&client, &url, &body).await;
        assert_eq!(status, 400, "{reply}");
        assert_eq!(reply["error"]["param"], param, "{reply}");
    }
    // /tokenize renders the same prompt: the system message, the user's turn, and the
    // assistant's turn opened (the token strings are the vocabulary's byte-level pieces,
    // `Ġ` a space).
    let rendered = |messages: Value| {
        let (client, url) = (client.clone(), server.url("/tokenize"));
        async move {
            let body = json!({"messages": messages, "return_token_strs": true});
            let (status, reply) = post(&client, &url, &body).await;
            assert_eq!(status, 200, "{reply}");
            reply["token_strs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().replace('Ġ', " "))
                .collect::<String>()
        }
    };
    let text = rendered(hi.clone()).await;
    assert!(
        text.starts_with("<|start|>system<|message|>You are ChatGPT"),
        "{text}"
    );
    assert!(
        text.ends_with("<|start|>user<|message|>hi<|end|><|start|>assistant"),
        "{text}"
    );
    // A call and its result render as the format writes them (the second turn's prompt).
    let turn = json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_7", "type": "function",
         "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "noon"},
    ]);
    let text = rendered(turn).await;
    assert!(
        text.ends_with(
            "<|start|>assistant to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>{\"tz\": \"UTC\"}<|call|>\
             <|start|>functions.get_time to=assistant<|channel|>commentary<|message|>noon<|end|><|start|>assistant"
        ),
        "{text}"
    );
}

/// A harmony model refuses the parsers of other formats at start-up, naming the flag; a
/// model without harmony refuses `harmony`.
#[test]
fn parsers_of_other_formats_are_refused_at_start_up() {
    let engine = env!("CARGO_BIN_EXE_engine");
    let llama = common::golden_dir_with("llama-tiny", "model.safetensors");
    for (model, flag, value, want) in [
        (
            gpt_oss_gguf(),
            "--reasoning-parser",
            "qwen3",
            "give `--reasoning-parser harmony`",
        ),
        (
            gpt_oss_gguf(),
            "--tool-call-parser",
            "hermes",
            "give `--tool-call-parser harmony`",
        ),
        (
            llama,
            "--tool-call-parser",
            "harmony",
            "does not write harmony",
        ),
    ] {
        let out = std::process::Command::new(engine)
            .args(["serve", "--model"])
            .arg(&model)
            .args(["--port", "0", "--kv-cache-memory", "16MiB", flag, value])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{log}");
        assert!(log.contains(flag) && log.contains(want), "{log}");
    }
}
