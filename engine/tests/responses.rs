//! `POST /v1/responses` end to end: the official `openai` client's `responses.create`,
//! streamed and not, gets a function call from SmolLM2 (`--tool-call-parser hermes`) and,
//! with the call and its result sent back as items, a final answer in text; the raw event
//! stream has vLLM's shape; what this stateless server does not serve is refused by field.

mod common;

use serde_json::{json, Value};

use common::server::{assert_weather_call, post, run_openai_script, Server};
use common::{golden_dir_with, smollm2_gguf};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_gets_a_function_call_and_a_final_answer() {
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
    const SCRIPT: &str = r#"
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="none")
model = client.models.list().data[0].id
tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12}},
                         "required": ["city"], "additionalProperties": False}}]
question = [{"role": "user", "content": "What is the weather in Paris?"}]
ask = dict(model=model, tools=tools, temperature=0, max_output_tokens=60)
out = {}
r = client.responses.create(input=question, tool_choice="required", parallel_tool_calls=False, **ask)
calls = [o for o in r.output if o.type == "function_call"]
out["calls"] = [[c.name, c.arguments] for c in calls]
out["status"] = r.status
call = calls[0]
events = list(client.responses.create(input=question, tool_choice="required",
    parallel_tool_calls=False, stream=True, **ask))
out["first"], out["last"] = events[0].type, events[-1].type
out["sequence"] = [e.sequence_number for e in events]
out["streamed_calls"] = [[e.item.name, e.item.arguments] for e in events
                         if e.type == "response.output_item.done" and e.item.type == "function_call"]
out["streamed_arguments"] = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
follow = question + [
    {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
    {"type": "function_call_output", "call_id": call.call_id, "output": "{\"sky\": \"sunny\", \"celsius\": 21}"}]
r = client.responses.create(input=follow, **ask)
out["final_types"] = [o.type for o in r.output]
out["final_text"] = r.output_text
out["final_usage"] = [r.usage.input_tokens, r.usage.output_tokens, r.usage.input_tokens_details.cached_tokens]
events = list(client.responses.create(input=follow, stream=True, **ask))
out["streamed_text"] = "".join(e.delta for e in events if e.type == "response.output_text.delta")
out["final_last"] = events[-1].type
print(json.dumps(out))
"#;
    let read = run_openai_script(SCRIPT, &[&server.url("/v1")]);
    println!("what the openai client read: {read}");
    let calls = read["calls"].as_array().unwrap();
    assert_eq!(
        calls.len(),
        1,
        "parallel_tool_calls false: one call: {read}"
    );
    assert_eq!(calls[0][0], "get_weather");
    assert_weather_call("get_weather", calls[0][1].as_str().unwrap(), 12);
    assert_eq!(read["status"], "completed", "{read}");
    // Greedy: the stream's call is the whole answer's, and its argument deltas join to it.
    assert_eq!(read["streamed_calls"], read["calls"], "{read}");
    assert_eq!(read["streamed_arguments"], calls[0][1], "{read}");
    assert_eq!(read["first"], "response.created");
    assert_eq!(read["last"], "response.completed");
    let sequence: Vec<u64> = read["sequence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(sequence, (0..sequence.len() as u64).collect::<Vec<_>>());
    // The call and its result sent back: an answer in text, the same streamed.
    assert_eq!(read["final_types"], json!(["message"]), "{read}");
    let text = read["final_text"].as_str().unwrap();
    assert!(!text.trim().is_empty(), "{read}");
    assert_eq!(read["streamed_text"], read["final_text"], "{read}");
    assert!(
        ["response.completed", "response.incomplete"]
            .contains(&read["final_last"].as_str().unwrap()),
        "{read}"
    );
    // The second request re-sends the first's prompt: its prefix is cached.
    let usage = read["final_usage"].as_array().unwrap();
    assert!(usage[2].as_u64().unwrap() > 0, "no cached tokens: {read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_has_vllms_shape_and_refusals_name_the_field() {
    let mut server = Server::start(&golden_dir_with("llama-tiny", "model.safetensors"), &[]);
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/responses");

    // A text answer cut at max_output_tokens: `event:` lines naming each data's type, an
    // item opened, 5 deltas, closed, and `response.incomplete` with its usage.
    let body = json!({"input": "Hello there", "max_output_tokens": 5, "temperature": 0,
        "ignore_eos": true, "stream": true});
    let text = client
        .post(&url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let kind = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap()
                .to_string();
            let data: Value =
                serde_json::from_str(e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap())
                    .unwrap();
            assert_eq!(data["type"], kind.as_str());
            (kind, data)
        })
        .collect();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        &kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "response.output_text.delta")
            .count(),
        5
    );
    assert_eq!(
        &kinds[kinds.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete"
        ]
    );
    let last = &events.last().unwrap().1["response"];
    assert_eq!(last["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(last["usage"]["output_tokens"], 5);
    assert!(last["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(last["timings"]["prefill_ms"].is_number(), "{last}");
    let joined: String = events
        .iter()
        .filter(|(k, _)| k == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    // Not streamed: the same answer as one response (greedy).
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    let (status, response) = post(&client, &url, &whole).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["object"], "response");
    assert_eq!(response["output"][0]["content"][0]["text"], joined.as_str());
    assert_eq!(response["status"], "incomplete");

    for (body, param, words) in [
        (json!({"input": "hi", "store": true}), "store", "stateless"),
        (
            json!({"input": "hi", "previous_response_id": "resp_1"}),
            "previous_response_id",
            "stateless",
        ),
        (
            json!({"input": "hi", "tools": [{"type": "web_search_preview"}]}),
            "tools[0].type",
            "hosted tool",
        ),
        (
            json!({"input": "hi", "background": true}),
            "background",
            "Unrecognized",
        ),
        (
            json!({"input": "hi", "max_output_tokens": 0}),
            "max_output_tokens",
            "",
        ),
        (json!({"input": "hi", "temperature": -1}), "temperature", ""),
        (
            json!({"input": "hi", "tools": [{"type": "function", "name": "f", "colour": 1}]}),
            "tools[0].colour",
            "Unrecognized",
        ),
        (
            json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "x", "extra": 1}]}),
            "input[0].extra",
            "Unrecognized",
        ),
        (json!({"model": "other", "input": "hi"}), "model", ""),
    ] {
        let (status, error) = post(&client, &url, &body).await;
        assert!(status == 400 || status == 404, "{body} -> {status} {error}");
        assert_eq!(error["error"]["param"], param, "{body} -> {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{body} -> {message}");
    }
    // The server keeps serving.
    let (status, _) = post(
        &client,
        &url,
        &json!({"input": "hi", "max_output_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200);
}
