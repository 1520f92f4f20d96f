//! End-to-end tests of `engine serve`: the real binary on a loopback port, an HTTP client.
//!
//! Most tests use the tiny random Llama from `../shared/golden/llama-tiny` (fast); one
//! checks real content with SmolLM2.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use common::server::{chunks, post, post_stream, run_openai_script, sse_payloads, Server};
use common::{gemma3_gguf, golden_dir_with, smollm2_gguf};

/// The tiny random Llama most tests serve.
fn tiny_model() -> PathBuf {
    golden_dir_with("llama-tiny", "model.safetensors")
}

async fn tiny_server(extra: &[&str]) -> Server {
    let mut server = Server::start(&tiny_model(), extra);
    server.wait_ready().await;
    server
}

fn greedy(prompt: Value, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_usage_prompts_and_n() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/completions");

    let (status, body) = post(&client, &url, &greedy(json!([5, 6, 7, 8, 9]), 7)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(body["choices"][0]["finish_reason"], "length");

    let (status, body) = post(
        &client,
        &url,
        &greedy(json!([[5, 6, 7], [10, 11, 12, 13]]), 3),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"].as_array().unwrap().len(), 2);
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": 6, "total_tokens": 13,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );

    let (status, body) = post(
        &client,
        &url,
        &greedy(json!(["Hello there", "Once upon a time"]), 4),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][1]["index"], 1);
    assert_eq!(body["usage"]["completion_tokens"], 8);

    let mut request = greedy(json!("The quick brown fox"), 5);
    request["n"] = json!(3);
    request["temperature"] = json!(1.0);
    request["seed"] = json!(1);
    request["logprobs"] = json!(2);
    let (status, body) = post(&client, &url, &request).await;
    assert_eq!(status, 200, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    assert_eq!(body["usage"]["completion_tokens"], 15);
    for c in choices {
        let lp = &c["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
        assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
        assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    }

    let (status, models) = (
        200,
        client
            .get(server.url("/v1/models"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap(),
    );
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], tiny_model().display().to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_completions_match_and_count_tokens() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/completions");
    let request = greedy(json!("Streaming is fun because"), 12);
    let (_, full) = post(&client, &url, &request).await;

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    let chunks = chunks(&post_stream(&client, &url, &streamed).await);
    let (last, content) = chunks.split_last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], full["usage"]);
    let text: String = content
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, full["choices"][0]["text"].as_str().unwrap());
    let counts: Vec<u64> = content
        .iter()
        .map(|c| c["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert!(
        counts.windows(2).all(|w| w[0] < w[1]),
        "usage must grow on every chunk: {counts:?}"
    );
    assert_eq!(*counts.last().unwrap(), 12);
    assert_eq!(
        content.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_role_first_and_matches_non_streaming() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/chat/completions");
    let request = json!({
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi!"}]}],
        "max_tokens": 9, "temperature": 0, "ignore_eos": true,
    });
    let (status, full) = post(&client, &url, &request).await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(full["object"], "chat.completion");
    assert_eq!(full["choices"][0]["message"]["role"], "assistant");
    assert_eq!(full["choices"][0]["finish_reason"], "length");
    assert_eq!(full["usage"]["completion_tokens"], 9);

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = chunks(&post_stream(&client, &url, &streamed).await);
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (last, content) = chunks.split_last().unwrap();
    // The same prompt again: its full 16-token blocks come from the prefix cache.
    let prompt_tokens = full["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(full["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let mut usage = last["usage"].clone();
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, (prompt_tokens - 1) / 16 * 16, "{usage}");
    assert!(cached > 0, "{usage}");
    usage["prompt_tokens_details"]["cached_tokens"] = json!(0);
    assert_eq!(usage, full["usage"]);
    assert!(content[1..]
        .iter()
        .all(|c| c["choices"][0]["delta"].get("role").is_none()));
    let text: String = content
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        text,
        full["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(
        content.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_string_across_token_boundary_and_seeds() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/completions");
    let mut request = greedy(json!([100, 200, 300, 400]), 24);
    request["logprobs"] = json!(0);
    let (_, full) = post(&client, &url, &request).await;
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let tokens: Vec<String> = full["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    // The last char of one token and the first of the next: a stop string no single token holds.
    let k = (3..tokens.len() - 1)
        .find(|&k| !tokens[k].is_empty() && !tokens[k + 1].is_empty())
        .expect("two adjacent non-empty tokens");
    let stop: String = tokens[k]
        .chars()
        .last()
        .into_iter()
        .chain(tokens[k + 1].chars().next())
        .collect();
    let cut = text
        .find(&stop)
        .expect("the stop string occurs in the text");
    request["stop"] = json!([stop]);
    let (status, stopped) = post(&client, &url, &request).await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(
        stopped["choices"][0]["text"].as_str().unwrap(),
        &text[..cut],
        "stop {stop:?}"
    );
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    let sampled = |seed: u64| json!({"prompt": "Random words:", "max_tokens": 16, "temperature": 1.0, "seed": seed, "ignore_eos": true});
    let (_, a) = post(&client, &url, &sampled(42)).await;
    let (_, b) = post(&client, &url, &sampled(42)).await;
    let (_, c) = post(&client, &url, &sampled(43)).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_ne!(a["choices"][0]["text"], c["choices"][0]["text"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_equal_sequential_outputs() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/completions");
    let requests: Vec<Value> = (0..64u32)
        .map(|i| {
            greedy(
                json!((0..3 + i % 7)
                    .map(|j| 1000 + 37 * i + j)
                    .collect::<Vec<_>>()),
                10,
            )
        })
        .collect();
    let mut sequential = Vec::new();
    for r in &requests {
        let (status, body) = post(&client, &url, r).await;
        assert_eq!(status, 200, "{body}");
        sequential.push(body["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let tasks = requests.iter().map(|r| {
        let mut r = r.clone();
        r["stream"] = json!(true);
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            let chunks = chunks(&post_stream(&client, &url, &r).await);
            chunks
                .iter()
                .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
                .collect::<String>()
        })
    });
    let concurrent: Vec<String> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(concurrent, sequential);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_openai_errors_naming_the_field() {
    let server = tiny_server(&["--max-model-len", "64"]).await;
    let client = reqwest::Client::new();
    let completions = server.url("/v1/completions");
    let chat = server.url("/v1/chat/completions");
    let cases: Vec<(&str, Value, u16, Value)> = vec![
        (
            &completions,
            json!({"prompt": "hi", "temperature": "hot"}),
            400,
            json!("temperature"),
        ),
        (
            &completions,
            json!({"prompt": "hi", "max_tokens": -3}),
            400,
            json!("max_tokens"),
        ),
        (
            &completions,
            json!({"prompt": "hi", "max_tokens": "many"}),
            400,
            json!("max_tokens"),
        ),
        (
            &completions,
            json!({"prompt": "hi", "n": 0}),
            400,
            json!("n"),
        ),
        (
            &completions,
            json!({"prompt": "hi", "top_p": 7}),
            400,
            json!("top_p"),
        ),
        (
            &completions,
            json!({"prompt": "hi", "logprobs": 1000}),
            400,
            json!("logprobs"),
        ),
        (
            &completions,
            json!({"prompt": "hi", "stop": [1, 2]}),
            400,
            json!("stop"),
        ),
        (&completions, json!({"prompt": ""}), 400, json!("prompt")),
        (&completions, json!({"prompt": []}), 400, json!("prompt")),
        (
            &completions,
            json!({"prompt": [1, 2, 99999999]}),
            400,
            json!("prompt"),
        ),
        (
            &completions,
            json!({"prompt": {"text": "hi"}}),
            400,
            json!("prompt"),
        ),
        (&completions, json!({}), 400, json!("prompt")),
        (
            &completions,
            json!({"prompt": [1, 2, 3], "max_tokens": 62}),
            400,
            json!("max_tokens"),
        ),
        // A count that overflows `prompt + max_tokens` is still past the context.
        (
            &completions,
            json!({"prompt": [1, 2, 3], "max_tokens": u64::MAX, "min_tokens": u64::MAX}),
            400,
            json!("max_tokens"),
        ),
        (
            &chat,
            json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}),
            400,
            json!("max_completion_tokens"),
        ),
        (
            &completions,
            json!({"prompt": vec![7; 64]}),
            400,
            json!("prompt"),
        ),
        (
            &completions,
            json!({"prompt": "hi", "stream_options": {"include_usage": true}}),
            400,
            json!("stream_options"),
        ),
        (
            &completions,
            json!({"prompt": "hi", "model": "gpt-5"}),
            404,
            json!("model"),
        ),
        (&chat, json!({"messages": "hi"}), 400, json!("messages")),
        (&chat, json!({"messages": []}), 400, json!("messages")),
        (
            &chat,
            json!({"messages": [{"role": "wizard", "content": "hi"}]}),
            400,
            json!("messages[0].role"),
        ),
        (
            &chat,
            json!({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
            400,
            json!("top_logprobs"),
        ),
        (
            &chat,
            json!({"messages": [{"role": "user", "content": "hi"}], "model": "nope"}),
            404,
            json!("model"),
        ),
    ];
    for (url, body, status, param) in cases {
        let (got, error) = post(&client, url, &body).await;
        assert_eq!(got, status, "{body} -> {error}");
        assert_eq!(error["error"]["param"], param, "{body} -> {error}");
        assert!(error["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert!(error["error"]["type"].is_string());
    }
    let r = client
        .post(&completions)
        .header("content-type", "application/json")
        .body("{\"prompt\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let error: Value = r.json().await.unwrap();
    assert!(
        error["error"]["message"].as_str().unwrap().contains("JSON"),
        "{error}"
    );
    // The server keeps serving.
    let (status, body) = post(&client, &completions, &greedy(json!([1, 2, 3]), 4)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 4);
}

/// No field is silently dropped: one the engine does not honour is a 400 naming it, at the
/// top level, inside a message and inside `stream_options`; tool calls and structured output
/// say they are not supported yet; the fields that change nothing here are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_refused_by_name_and_harmless_ones_accepted() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let completions = server.url("/v1/completions");
    let chat = server.url("/v1/chat/completions");
    let hi = json!([{"role": "user", "content": "hi"}]);
    let refused: Vec<(&str, Value, &str, &str)> = vec![
        (
            &chat,
            json!({"messages": hi, "frobnicate": 3}),
            "frobnicate",
            "Unrecognized request argument supplied: frobnicate",
        ),
        (
            &completions,
            json!({"prompt": "hi", "frobnicate": 3}),
            "frobnicate",
            "Unrecognized",
        ),
        (
            &chat,
            json!({"messages": [{"role": "user", "content": "hi", "mood": "happy"}]}),
            "messages[0].mood",
            "Unrecognized request argument supplied: messages[0].mood",
        ),
        (
            &chat,
            json!({"messages": hi, "stream": true, "stream_options": {"include_usage": true, "verbose": true}}),
            "stream_options.verbose",
            "Unrecognized",
        ),
        (
            &chat,
            json!({"messages": hi, "response_format": {"type": "xml"}}),
            "response_format.type",
            "must be \"text\", \"json_object\" or \"json_schema\"",
        ),
        (
            &chat,
            json!({"messages": hi, "functions": [{"name": "f"}]}),
            "functions",
            "use `tools`",
        ),
        (
            &chat,
            json!({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}),
            "messages[0].tool_calls",
            "only an assistant message",
        ),
        (
            &completions,
            json!({"prompt": "hi", "best_of": 3}),
            "best_of",
            "not supported",
        ),
        (
            &chat,
            json!({"messages": hi, "logit_bias": {"5": 100}}),
            "logit_bias",
            "not supported",
        ),
        (
            &chat,
            json!({"messages": hi, "chat_template_kwargs": {"messages": []}}),
            "chat_template_kwargs.messages",
            "set by the server",
        ),
        (
            &chat,
            json!({"messages": [{"role": "user", "content": "hi", "reasoning_content": "x"}]}),
            "messages[0].reasoning_content",
            "assistant",
        ),
    ];
    for (url, body, param, message) in refused {
        let (status, error) = post(&client, url, &body).await;
        assert_eq!(status, 400, "{body} -> {error}");
        assert_eq!(error["error"]["param"], param, "{body} -> {error}");
        let text = error["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{body} -> {text}");
    }
    // An empty `tools` list is refused, naming it.
    let (_, error) = post(&client, &chat, &json!({"messages": hi, "tools": []})).await;
    assert_eq!(error["error"]["param"], "tools");
    // Fields that change nothing, nulls, `best_of: 1` and an empty `logit_bias` pass.
    let harmless = json!({"messages": [{"role": "user", "content": "hi", "name": "ann"}],
        "user": "u1", "metadata": {"k": "v"}, "store": false, "service_tier": "auto",
        "parallel_tool_calls": true, "safety_identifier": "s", "prompt_cache_key": "c",
        "tools": null, "response_format": null, "best_of": 1, "logit_bias": {},
        "max_tokens": 3, "temperature": 0, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true, "include_obfuscation": false}});
    let chunks = chunks(&post_stream(&client, &chat, &harmless).await);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 3);
}

/// `/tokenize` and `/detokenize` in vLLM's shapes round-trip a prompt and chat messages;
/// `--chat-template` replaces the model's template and `chat_template_kwargs` (over
/// `--default-chat-template-kwargs`) reach it as variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize_and_template_variables() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{% if mode is defined %}[{{ mode }}]{% endif %}{% endif %}",
    )
    .unwrap();
    let server = tiny_server(&[
        "--chat-template",
        template.to_str().unwrap(),
        "--default-chat-template-kwargs",
        r#"{"mode": "terse"}"#,
    ])
    .await;
    let client = reqwest::Client::new();
    let (tokenize, detokenize) = (server.url("/tokenize"), server.url("/detokenize"));
    let text = "The quick brown fox";
    let (status, t) = post(
        &client,
        &tokenize,
        &json!({"prompt": text, "return_token_strs": true}),
    )
    .await;
    assert_eq!(status, 200, "{t}");
    let count = t["count"].as_u64().unwrap();
    assert_eq!(t["tokens"].as_array().unwrap().len() as u64, count);
    assert_eq!(t["token_strs"].as_array().unwrap().len() as u64, count);
    assert_eq!(t["max_model_len"], 2048);
    let (_, d) = post(&client, &detokenize, &json!({"tokens": t["tokens"]})).await;
    assert_eq!(d["prompt"], text);
    // Chat messages render with the replacing template and the default variable…
    let messages = json!([{"role": "user", "content": "Hello there"}]);
    let (_, t) = post(&client, &tokenize, &json!({"messages": messages})).await;
    let (_, d) = post(&client, &detokenize, &json!({"tokens": t["tokens"]})).await;
    assert_eq!(
        d["prompt"],
        "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n[terse]"
    );
    // …which a request overrides; the chat endpoint renders the same prompt.
    let kwargs = json!({"mode": "chatty"});
    let (_, t) = post(
        &client,
        &tokenize,
        &json!({"messages": messages, "chat_template_kwargs": kwargs}),
    )
    .await;
    let (_, d) = post(&client, &detokenize, &json!({"tokens": t["tokens"]})).await;
    assert_eq!(
        d["prompt"],
        "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n[chatty]"
    );
    let (status, c) = post(
        &client,
        &server.url("/v1/chat/completions"),
        &json!({"messages": messages,
        "chat_template_kwargs": kwargs, "max_tokens": 1, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], t["count"]);
    let (_, t) = post(
        &client,
        &tokenize,
        &json!({"messages": messages, "add_generation_prompt": false}),
    )
    .await;
    let (_, d) = post(&client, &detokenize, &json!({"tokens": t["tokens"]})).await;
    assert_eq!(d["prompt"], "<|im_start|>user\nHello there<|im_end|>\n");
    // A conversation with a tool call renders as a chat request renders it: this template
    // reads no `tools`, so the call and its result become Hermes turns in both.
    let history = json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]);
    let (_, t) = post(&client, &tokenize, &json!({"messages": history})).await;
    let (_, d) = post(&client, &detokenize, &json!({"tokens": t["tokens"]})).await;
    assert_eq!(
        d["prompt"],
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n\
         {\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n[terse]"
    );
    let (status, c) = post(
        &client,
        &server.url("/v1/chat/completions"),
        &json!({"messages": history, "max_tokens": 1, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], t["count"]);
    // Bad input names its field.
    for (url, body, param) in [
        (&tokenize, json!({}), "prompt"),
        (
            &tokenize,
            json!({"prompt": "a", "messages": messages}),
            "messages",
        ),
        (&tokenize, json!({"prompt": "a", "bogus": 1}), "bogus"),
        (&detokenize, json!({"tokens": [1, 99999999]}), "tokens"),
        (&detokenize, json!({"tokens": "abc"}), "tokens"),
    ] {
        let (status, e) = post(&client, url, &body).await;
        assert_eq!(
            (status, e["error"]["param"].clone()),
            (400, json!(param)),
            "{body} -> {e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_body_limit() {
    let server = tiny_server(&["--api-key", "sekret", "--max-body-bytes", "2048"]).await;
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(server.url("/health"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    for (route, key) in [
        ("/v1/models", None),
        ("/metrics", Some("wrong")),
        ("/v1/models", Some("sekret2")),
    ] {
        let mut r = client.get(server.url(route));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{route} {key:?}");
        let error: Value = r.json().await.unwrap();
        assert_eq!(error["error"]["type"], "authentication_error");
    }
    let r = client
        .post(server.url("/v1/completions"))
        .json(&greedy(json!([1, 2]), 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let ok = client
        .get(server.url("/v1/models"))
        .bearer_auth("sekret")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    let r = client
        .post(server.url("/v1/completions"))
        .bearer_auth("sekret")
        .json(&json!({"prompt": "x".repeat(4000)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let error: Value = r.json().await.unwrap();
    assert_eq!(error["error"]["code"], "request_too_large");
    let r = client
        .post(server.url("/v1/completions"))
        .bearer_auth("sekret")
        .json(&greedy(json!([1, 2]), 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

async fn first_chunk(response: &mut reqwest::Response) {
    let chunk = response
        .chunk()
        .await
        .expect("stream read")
        .expect("a first chunk");
    assert!(!chunk.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_answers_429_without_hurting_admitted_requests() {
    let server = tiny_server(&["--max-num-seqs", "1", "--max-waiting-requests", "1"]).await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/completions");
    let mut long = greedy(json!([1, 2, 3]), 1500);
    long["stream"] = json!(true);
    long["stream_options"] = json!({"include_usage": true});
    let mut running = client.post(&url).json(&long).send().await.unwrap();
    assert_eq!(running.status().as_u16(), 200);
    first_chunk(&mut running).await;
    let waiting = client.post(&url).json(&greedy(json!([4, 5, 6]), 5)).send();
    let waiting = tokio::spawn(waiting);
    // Wait until the second request is queued, then a third must be refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = metrics_text(&client, &server).await;
        if metric(&metrics, "vllm:num_requests_waiting") == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "second request never queued:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = client
        .post(&url)
        .json(&greedy(json!([7, 8]), 5))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["type"], "rate_limit_error");
    // More sequences than the queue can ever hold: retrying cannot help, so 400, not 429.
    let mut too_many = greedy(json!([7, 8]), 5);
    too_many["n"] = json!(2);
    let never = client.post(&url).json(&too_many).send().await.unwrap();
    assert_eq!(never.status().as_u16(), 400);
    let error: Value = never.json().await.unwrap();
    assert_eq!(error["error"]["param"], "n");

    let rest = running.text().await.unwrap();
    let usage: Value = sse_payloads(&rest)
        .iter()
        .rev()
        .find_map(|p| {
            serde_json::from_str::<Value>(p)
                .ok()
                .filter(|v| v["usage"].is_object())
        })
        .expect("a usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 1500);
    let waited: Value = waiting.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(waited["usage"]["completion_tokens"], 5);
}

/// The value of an unlabelled-but-for-model metric in Prometheus text.
/// The server's `/metrics` text.
async fn metrics_text(client: &reqwest::Client, server: &Server) -> String {
    client
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing:\n{text}"))
}

fn abort_count(text: &str) -> f64 {
    text.lines()
        .find(|l| {
            l.starts_with("vllm:request_success_total{") && l.contains("finished_reason=\"abort\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("abort counter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnected_clients_are_aborted_and_free_their_blocks() {
    const STREAMS: usize = 200;
    let server = tiny_server(&["--max-num-seqs", "64"]).await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/completions");
    let mut rng_state = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    let plans: Vec<(Vec<u64>, usize)> = (0..STREAMS)
        .map(|_| {
            (
                (0..4 + next() % 12).map(|_| next() % 40000).collect(),
                (next() % 12) as usize,
            )
        })
        .collect();
    for batch in plans.chunks(50) {
        let tasks = batch.iter().cloned().map(|(prompt, cut)| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let body = json!({"prompt": prompt, "max_tokens": 1900, "ignore_eos": true, "stream": true});
                let response = client.post(&url).json(&body).send().await.unwrap();
                assert_eq!(response.status().as_u16(), 200);
                let mut stream = response.bytes_stream();
                for _ in 0..cut {
                    if stream.next().await.is_none() {
                        break;
                    }
                }
            })
        });
        for t in futures::future::join_all(tasks).await {
            t.unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = metrics_text(&client, &server).await;
        let settled = metric(&text, "vllm:num_requests_running") == 0.0
            && metric(&text, "vllm:num_requests_waiting") == 0.0
            && abort_count(&text) == STREAMS as f64;
        if settled {
            assert_eq!(metric(&text, "vllm:kv_cache_usage_perc"), 0.0, "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "aborts did not settle:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = post(&client, &url, &greedy(json!([1, 2, 3]), 3)).await;
    assert_eq!(
        (status, body["usage"]["completion_tokens"].clone()),
        (200, json!(3))
    );
}

/// The step telemetry of one request, counted by hand: a 3-token prompt and 3 output tokens
/// are one prefill-only step of 3 tokens (which samples the first) and two decode-only steps
/// of 1 token each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_telemetry_counts_one_requests_steps() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        &server.url("/v1/completions"),
        &greedy(json!([1, 2, 3]), 3),
    )
    .await;
    assert_eq!(
        (status, body["usage"]["completion_tokens"].clone()),
        (200, json!(3))
    );
    let text = metrics_text(&client, &server).await;
    assert_eq!(
        metric(&text, "vllm:iteration_tokens_total_count"),
        3.0,
        "{text}"
    );
    assert_eq!(metric(&text, "vllm:iteration_tokens_total_sum"), 5.0);
    let steps = |kind: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("engine:step_duration_seconds_count{")
                    && l.contains(&format!("kind=\"{kind}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("no {kind} steps:\n{text}"))
            .to_string()
    };
    assert_eq!(
        [steps("prefill-only"), steps("decode-only"), steps("mixed")],
        ["1", "2", "0"]
    );
    assert_eq!(
        metric(&text, "vllm:request_inference_time_seconds_count"),
        1.0
    );
    assert!(metric(&text, "engine:busy_seconds_total") > 0.0);
}

/// Every response says the server's own timing, with no flag: the non-streamed body, the
/// stream's finishing chunk and its usage chunk, in llama.cpp's fields and ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_carry_the_servers_timings() {
    let server = tiny_server(&[]).await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/chat/completions");
    let request = json!({
        "model": tiny_model().display().to_string(),
        "messages": [{"role": "user", "content": "Count to three."}],
        "max_tokens": 5, "temperature": 0, "ignore_eos": true,
    });
    let (status, full) = post(&client, &url, &request).await;
    assert_eq!(status, 200, "{full}");
    let check = |t: &Value, what: &str| {
        let prompt = full["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(t["predicted_n"], 5, "{what}: {t}");
        assert_eq!(t["cache_n"], t["cached_tokens"], "{what}: {t}");
        assert_eq!(t["prompt_n"], t["computed_prompt_tokens"], "{what}: {t}");
        assert_eq!(
            t["prompt_n"].as_u64().unwrap() + t["cache_n"].as_u64().unwrap(),
            prompt,
            "{what}: {t}"
        );
        assert_eq!(t["prompt_ms"], t["prefill_ms"], "{what}: {t}");
        assert_eq!(t["predicted_ms"], t["decode_ms"], "{what}: {t}");
        let ms = |k: &str| {
            t[k].as_f64()
                .unwrap_or_else(|| panic!("{what}: {k} in {t}"))
        };
        assert!(ms("prefill_ms") > 0.0 && ms("decode_ms") > 0.0 && ms("queue_ms") >= 0.0);
        // Decode's rates count the 4 tokens after the first, as llama.cpp's do.
        assert!((ms("predicted_per_token_ms") - ms("decode_ms") / 4.0).abs() < 1e-9);
        assert!((ms("predicted_per_second") - 4000.0 / ms("decode_ms")).abs() < 1e-6);
    };
    check(&full["timings"], "the body");
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let stream = chunks(&post_stream(&client, &url, &streamed).await);
    let (last, before) = stream.split_last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    check(&last["timings"], "the finishing chunk");
    assert!(
        before.iter().all(|c| c.get("timings").is_none()),
        "only the last chunk carries timings"
    );
    streamed["stream_options"] = json!({"include_usage": true});
    let with_usage = chunks(&post_stream(&client, &url, &streamed).await);
    let (usage, rest) = with_usage.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    check(&usage["timings"], "the usage chunk");
    check(
        &rest.last().unwrap()["timings"],
        "the finishing chunk before it",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let mut server = tiny_server(&["--shutdown-grace", "30"]).await;
    let client = reqwest::Client::new();
    let mut request = greedy(json!([3, 1, 4, 1, 5]), 300);
    request["stream"] = json!(true);
    request["stream_options"] = json!({"include_usage": true});
    let mut response = client
        .post(server.url("/v1/completions"))
        .json(&request)
        .send()
        .await
        .unwrap();
    first_chunk(&mut response).await;
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(status.success());
    let rest = response
        .text()
        .await
        .expect("the stream finishes after SIGTERM");
    let payloads = sse_payloads(&rest);
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let usage: Value = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 300);
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "server did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        exit.success(),
        "exit status {exit:?}; log:\n{}",
        server.log_text()
    );
    assert!(
        client.get(server.url("/health")).send().await.is_err(),
        "still accepting after exit"
    );
}

/// The chat template and the serving path, on the arithmetic that reproduces transformers
/// (`--quantized-weights dequantize`). With llama.cpp's arithmetic (the default integer
/// kernels: activations rounded to 8 bits per block) this 135M model answers "L'Étoile,
/// la Marseillaise, …" to the same question, exactly as llama.cpp's own `llama-server`
/// does on the same file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_answers_a_chat_question() {
    let mut server = Server::start(
        &smollm2_gguf(),
        &[
            "--quantized-weights",
            "dequantize",
            "--served-model-name",
            "smollm2",
            "--max-model-len",
            "2048",
            "--kv-cache-memory",
            "128MiB",
        ],
    );
    let statuses = server.wait_ready().await;
    assert!(
        statuses.iter().all(|s| *s == 503 || *s == 200),
        "{statuses:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log_text().contains("ready in") {
        assert!(
            Instant::now() < deadline,
            "no ready line:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = server.log_text();
    let listening = log.find("listening on").expect("a listening line");
    let ready = log.find("ready in").expect("a ready line");
    assert!(
        listening < ready,
        "the port must be bound before the model loads:\n{log}"
    );
    assert!(log.contains("kv_capacity_tokens="), "{log}");
    let client = reqwest::Client::new();
    let request = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24, "temperature": 0,
    });
    let (status, body) = post(&client, &server.url("/v1/chat/completions"), &request).await;
    assert_eq!(status, 200, "{body}");
    let answer = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer.contains("Paris"), "{answer}");
    assert_eq!(body["model"], "smollm2");
    // The bandwidth bound's weight bytes, counted by hand: dequantised, every matrix is f16.
    // A layer's qkv 960 × 576, o 576 × 576, gate_up 3,072 × 576 and down 576 × 1,536 are
    // 3,538,944 values, × 30 layers; the tied head 49,152 × 576; and 61 f32 norms of 576.
    let info = version(&client, &server).await;
    assert_eq!(
        info["weight_bytes"],
        2 * (30 * 3_538_944 + 49_152 * 576) + 61 * 576 * 4,
        "{info}"
    );
    // SmolLM2-135M: 30 layers, 3 KV heads of 64, in the f16 KV cache.
    assert_eq!(info["kv_bytes_per_token"], 2 * 30 * 3 * 64 * 2, "{info}");
}

async fn version(client: &reqwest::Client, server: &Server) -> Value {
    client
        .get(server.url("/version"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The weight bytes of the default model on the integer kernels, counted by hand from the
/// file: its 210 Q4_1 matrices and 61 f32 norms stay as in the file (a Q4_1 panel keeps
/// the 16 nibble bytes and the f16 d and m of 32 values, GGUF's 20 bytes), 96,576,768 file
/// bytes in all; the Q8_0 embedding, read whole as the tied head, is repacked with a 4-byte
/// tail per 32 values (d and an unused m) instead of GGUF's 2: + 49,152 rows × 18 blocks
/// × 2 bytes. The embedding is not counted twice: a step only gathers its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_weight_bytes_are_the_integer_panels() {
    let mut server = Server::start(
        &smollm2_gguf(),
        &[
            "--quantized-weights",
            "integer",
            "--max-model-len",
            "512",
            "--kv-cache-memory",
            "32MiB",
        ],
    );
    server.wait_ready().await;
    let info = version(&reqwest::Client::new(), &server).await;
    assert_eq!(info["weight_bytes"], 96_576_768 + 49_152 * 18 * 2, "{info}");
    assert_eq!(
        info["parameters"],
        30 * 3_538_944 + 49_152 * 576 + 61 * 576,
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_says_who_is_serving() {
    let server = tiny_server(&["--max-num-seqs", "7"]).await;
    let info: Value = reqwest::get(server.url("/version"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        info["version"],
        format!("engine {}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(info["backend"], "cpu");
    assert!(
        info["device"].as_str().unwrap().contains("cores)"),
        "{info}"
    );
    assert_eq!(info["max_num_seqs"], 7);
    assert!(info["kv_capacity_tokens"].as_u64().unwrap() > 0, "{info}");
    assert!(info["dtype"].as_str().unwrap().contains("f32"), "{info}");
    // The bandwidth bound's inputs. The tiny Llama (hidden 64, 2 layers, 4 heads and 2 KV
    // heads of 16, MLP 128, vocabulary 49,152, untied head) keeps its bf16 matrices as they
    // are: a layer's qkv 128 × 64, o 64 × 64, gate_up 256 × 64 and down 64 × 128 are 36,864
    // values, 73,728 bytes, plus two f32 norms of 64 (512 bytes); the head 49,152 × 64 in
    // bf16 is 6,291,456 bytes and the final norm 256: 2 × 74,240 + 6,291,456 + 256.
    assert_eq!(info["weight_bytes"], 6_440_192, "{info}");
    // 2 × 36,864 matrix values + two 49,152 × 64 tables + 5 norms of 64.
    assert_eq!(info["parameters"], 73_728 + 2 * 3_145_728 + 320, "{info}");
    // K and V of 2 layers × 2 KV heads × 16, in the CPU's default f16 KV cache.
    assert_eq!(info["kv_bytes_per_token"], 2 * 2 * 2 * 16 * 2, "{info}");
    assert_eq!(info["architecture"]["family"], "Llama", "{info}");
    assert_eq!(info["architecture"]["layers"], 2, "{info}");
    assert_eq!(info["architecture"]["sliding_window_layers"], 0, "{info}");
    let bw = info["memory_bandwidth_bytes_per_s"].as_f64().unwrap();
    assert!((1e9..1e13).contains(&bw), "{info}");
    assert!(info["memory_bandwidth_source"]
        .as_str()
        .unwrap()
        .starts_with("measured at start-up"));
    // The roofline's compute side: 4 × 2 layers × 4 heads × 16 attention FLOPs per context
    // token, and an f32 GEMM measured at start-up.
    assert_eq!(info["attention_flops_per_context_token"], 512, "{info}");
    let flops = info["compute_flops_per_s"].as_f64().unwrap();
    assert!((1e9..1e14).contains(&flops), "{info}");
    assert!(info["compute_flops_source"]
        .as_str()
        .unwrap()
        .starts_with("measured at start-up"));
}

/// `loadgen run` against `engine serve`: the run folder records who was measured (the
/// engine's `/version`: version and device) and the server's own view (its `/metrics`
/// scraped during the run), and the report shows both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_report_shows_the_engines_version_device_and_metrics() {
    use clap::Parser;
    let server = tiny_server(&[]).await;
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("run");
    let cli = loadgen::cli::Cli::try_parse_from([
        "loadgen",
        "run",
        "--url",
        &server.base,
        "--workload",
        "random",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--prompt-ids",
        "--rate",
        "20",
        "--num-prompts",
        "30",
        "--scrape-interval",
        "200ms",
        "--no-progress",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    loadgen::cli::main(cli).await.unwrap();

    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    let version = format!("engine {}", env!("CARGO_PKG_VERSION"));
    assert_eq!(meta["server_version"], version.as_str());
    assert_eq!(meta["extra"]["server_info"]["backend"], "cpu");
    let device = meta["extra"]["server_hardware"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(device.ends_with("cores)"), "{device}");
    let scrapes = std::fs::read_to_string(out.join("server_metrics.jsonl")).unwrap();
    assert!(scrapes.lines().count() >= 2, "{scrapes}");
    assert!(scrapes.contains("vllm:num_requests_running"));

    let cli =
        loadgen::cli::Cli::try_parse_from(["loadgen", "report", out.to_str().unwrap()]).unwrap();
    loadgen::cli::main(cli).await.unwrap();
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for expected in [
        "Server&#39;s view",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        version.as_str(),
    ] {
        assert!(
            html.contains(expected) || html.contains(&expected.replace("&#39;", "'")),
            "report lacks {expected}"
        );
    }
    assert!(html.contains(&device), "report lacks the device {device}");
}

/// A reasoning model made from llama-tiny. Ids 3 and 4 are renamed `<think>` and `</think>`
/// (plain added tokens, as in Qwen3), the template is Qwen3's in miniature (`enable_thinking:
/// false` closes an empty think block in the prompt; the fixture's own `open_think` ends the
/// prompt inside one, as DeepSeek-R1's template does), and, so that greedy decoding passes
/// through `</think>`, the embedding and LM-head rows of a token the model greedily emits
/// once are swapped with id 4's: the model then emits `</think>` where it emitted that
/// token, and everything else stays as it was.
struct ReasoningFixture {
    dir: tempfile::TempDir,
    /// The chat messages of the forced answer.
    messages: Value,
    /// Greedy output of `messages` with `open_think`: reasoning, then `</think>`, then answer.
    reasoning: String,
    answer: String,
    /// The reasoning's tokens, the closing marker included.
    reasoning_tokens: usize,
}

const MAX_TOKENS: usize = 12;
const THINK: u32 = 3;
const END_THINK: u32 = 4;

impl ReasoningFixture {
    fn template(&self) -> PathBuf {
        self.dir.path().join("qwen3-style.jinja")
    }

    fn new() -> ReasoningFixture {
        use engine::backend::cpu::QuantizedWeights;
        use engine::backend::Device;
        use engine::loader::{load_engine, DeviceArgs, EngineArgs};

        let golden = tiny_model();
        let dir = tempfile::tempdir().unwrap();
        for file in [
            "config.json",
            "generation_config.json",
            "tokenizer_config.json",
            "model.safetensors",
        ] {
            std::fs::copy(golden.join(file), dir.path().join(file)).unwrap();
        }
        let mut tokenizer: Value =
            serde_json::from_str(&std::fs::read_to_string(golden.join("tokenizer.json")).unwrap())
                .unwrap();
        for (id, marker) in [(THINK, "<think>"), (END_THINK, "</think>")] {
            let added = tokenizer["added_tokens"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .find(|t| t["id"] == id)
                .unwrap();
            let old = added["content"].as_str().unwrap().to_string();
            added["content"] = json!(marker);
            added["special"] = json!(false);
            let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
            vocab.remove(&old).unwrap();
            vocab.insert(marker.to_string(), json!(id));
        }
        std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let template = dir.path().join("qwen3-style.jinja");
        std::fs::write(
            &template,
            "{% for m in messages %}<|im_start|>{{ m.role }}\n\
             {% if m.reasoning_content is defined and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}\
             {{ m.content }}<|im_end|>\n{% endfor %}\
             {% if add_generation_prompt %}<|im_start|>assistant\n\
             {% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n\
             {% elif open_think is defined and open_think %}<think>\n{% endif %}{% endif %}",
        )
        .unwrap();
        let messages = json!([{"role": "user", "content": "Why is the sky blue?"}]);

        // The greedy answer of the unswapped model, from a prompt that ends inside a block.
        let args = EngineArgs {
            model: dir.path().to_path_buf(),
            max_num_seqs: 4,
            max_num_batched_tokens: 256,
            max_model_len: Some(256),
            kv_cache_memory: "16MiB".into(),
            block_size: 16,
            enable_prefix_caching: false,
            no_enable_prefix_caching: false,
            state_checkpoint_every: 0,
            chat_template: Some(template.clone()),
            device: DeviceArgs {
                device: Some(Device::Cpu),
                threads: 1,
                gpu_memory_utilization: 0.9,
                enforce_eager: false,
                quantized_weights: QuantizedWeights::Auto,
                kv_cache_dtype: None,
                prefill_attention: None,
                decode_attention: None,
                cuda_unverified_kernels: false,
            },
        };
        let mut loaded = load_engine(&args).unwrap();
        let tokenizer = loaded.tokenizer.clone();
        let chat: Vec<engine::tokenizer::ChatMessage> =
            serde_json::from_value(messages.clone()).unwrap();
        let open = serde_json::Map::from_iter([("open_think".to_string(), json!(true))]);
        let text = tokenizer.apply_chat_template(&chat, true, &open).unwrap();
        assert!(text.ends_with("<think>\n"), "{text}");
        let prompt = tokenizer.encode(&text, false).unwrap();
        assert!(
            prompt.contains(&THINK),
            "`<think>` is one token of the prompt"
        );
        let params = engine::sampler::SamplingParams {
            max_tokens: MAX_TOKENS,
            temperature: 0.0,
            ignore_eos: true,
            ..Default::default()
        };
        let ids = loaded
            .engine
            .generate(vec![prompt.clone()], &params)
            .unwrap()[0]
            .token_ids
            .clone();
        assert!(
            !ids.contains(&THINK) && !ids.contains(&END_THINK),
            "{ids:?}"
        );
        let k = (2..8)
            .find(|&i| {
                let x = ids[i];
                ids.iter().filter(|&&t| t == x).count() == 1 && !prompt.contains(&x)
            })
            .expect("a token emitted once, not in the prompt");
        swap_rows(&dir.path().join("model.safetensors"), ids[k], END_THINK);
        let decode = |ids: &[u32]| tokenizer.decode(ids, true).unwrap();
        ReasoningFixture {
            messages,
            reasoning: decode(&ids[..k]),
            answer: decode(&ids[k + 1..]),
            reasoning_tokens: k + 1,
            dir,
        }
    }
}

/// Swaps the embedding and LM-head rows of tokens `a` and `b` in a safetensors file.
fn swap_rows(path: &std::path::Path, a: u32, b: u32) {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, t)| (name, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    for (name, _, shape, data) in &mut tensors {
        if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
            let row = data.len() / shape[0];
            let (a, b) = (a as usize * row, b as usize * row);
            for i in 0..row {
                data.swap(a + i, b + i);
            }
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// `--reasoning-parser qwen3` splits an answer at the think markers (found by token id):
/// the reasoning under both `reasoning` and `reasoning_content`, the answer under `content`,
/// streamed and not, the reasoning tokens counted; with thinking switched off the prompt
/// closes the block, as Qwen3's template does, and there is no reasoning; without the
/// parser nothing is split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_split_at_the_think_markers() {
    let fixture = ReasoningFixture::new();
    assert!(!fixture.reasoning.is_empty() && !fixture.answer.is_empty());
    let model = fixture.dir.path().to_path_buf();
    let template = fixture.template();
    let mut server = Server::start(
        &model,
        &[
            "--chat-template",
            template.to_str().unwrap(),
            "--reasoning-parser",
            "qwen3",
        ],
    );
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let chat = server.url("/v1/chat/completions");
    let request = json!({"messages": fixture.messages, "chat_template_kwargs": {"open_think": true},
        "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": true});
    let (status, full) = post(&client, &chat, &request).await;
    assert_eq!(status, 200, "{full}");
    let message = &full["choices"][0]["message"];
    assert_eq!(message["reasoning"], fixture.reasoning.as_str(), "{full}");
    assert_eq!(message["reasoning_content"], fixture.reasoning.as_str());
    assert_eq!(message["content"], fixture.answer.as_str());
    assert_eq!(full["usage"]["completion_tokens"], MAX_TOKENS);
    assert_eq!(
        full["usage"]["completion_tokens_details"]["reasoning_tokens"],
        fixture.reasoning_tokens
    );

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    let chunks = chunks(&post_stream(&client, &chat, &streamed).await);
    let field = |name: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"][name].as_str())
            .collect()
    };
    assert_eq!(field("reasoning"), fixture.reasoning);
    assert_eq!(field("reasoning_content"), fixture.reasoning);
    assert_eq!(field("content"), fixture.answer);
    for c in &chunks {
        let delta = &c["choices"][0]["delta"];
        assert_eq!(delta["reasoning"], delta["reasoning_content"], "{c}");
    }
    // No chunk carries reasoning after the first answer text.
    let first_answer = chunks
        .iter()
        .position(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .unwrap();
    assert!(chunks[first_answer + 1..]
        .iter()
        .all(|c| c["choices"][0]["delta"].get("reasoning").is_none()));
    let last = chunks.last().unwrap();
    assert_eq!(
        last["usage"]["completion_tokens_details"]["reasoning_tokens"],
        fixture.reasoning_tokens
    );

    // Thinking switched off: the template closes an empty block in the prompt.
    let off =
        json!({"messages": fixture.messages, "chat_template_kwargs": {"enable_thinking": false}});
    let (_, t) = post(&client, &server.url("/tokenize"), &off).await;
    let tokens: Vec<u64> = serde_json::from_value(t["tokens"].clone()).unwrap();
    assert_eq!(tokens.iter().filter(|&&t| t == u64::from(THINK)).count(), 1);
    assert_eq!(
        tokens
            .iter()
            .filter(|&&t| t == u64::from(END_THINK))
            .count(),
        1
    );
    let (_, d) = post(
        &client,
        &server.url("/detokenize"),
        &json!({"tokens": tokens}),
    )
    .await;
    assert!(
        d["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{d}"
    );
    let mut request_off = off.clone();
    request_off["max_tokens"] = json!(MAX_TOKENS);
    request_off["temperature"] = json!(0);
    let (status, full) = post(&client, &chat, &request_off).await;
    assert_eq!(status, 200, "{full}");
    assert!(
        full["choices"][0]["message"].get("reasoning").is_none(),
        "{full}"
    );
    assert_eq!(
        full["usage"]["completion_tokens_details"]["reasoning_tokens"],
        0
    );

    // The official `openai` client (PyPI; scripts/test.sh installs it and sets
    // OPENAI_PYTHONPATH) reads both reasoning fields, streamed and not.
    let read = openai_client_reads(&server.url("/v1"), &fixture.messages);
    assert_eq!(read["reasoning"], fixture.reasoning.as_str(), "{read}");
    assert_eq!(
        read["reasoning_content"],
        fixture.reasoning.as_str(),
        "{read}"
    );
    assert_eq!(read["content"], fixture.answer.as_str(), "{read}");
    assert_eq!(read["reasoning_tokens"], fixture.reasoning_tokens, "{read}");
    assert_eq!(
        read["stream_reasoning"],
        fixture.reasoning.as_str(),
        "{read}"
    );
    assert_eq!(
        read["stream_reasoning_content"],
        fixture.reasoning.as_str(),
        "{read}"
    );
    assert_eq!(read["stream_content"], fixture.answer.as_str(), "{read}");
    drop(server);

    // Without --reasoning-parser the markers' text stays in the answer, unsplit.
    let mut plain = Server::start(&model, &["--chat-template", template.to_str().unwrap()]);
    plain.wait_ready().await;
    let (status, full) = post(&client, &plain.url("/v1/chat/completions"), &request).await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(
        full["choices"][0]["message"]["content"],
        format!("{}</think>{}", fixture.reasoning, fixture.answer)
    );
    assert!(full["usage"].get("completion_tokens_details").is_none());
}

/// What the `openai` Python client reads of the forced reasoning answer to `messages`
/// (`open_think`), as JSON: the non-streamed message's fields and the streamed deltas joined.
fn openai_client_reads(base_url: &str, messages: &Value) -> Value {
    const SCRIPT: &str = r#"
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
ask = dict(model=client.models.list().data[0].id, messages=json.loads(sys.argv[2]),
           max_tokens=int(sys.argv[3]), temperature=0,
           extra_body={"chat_template_kwargs": {"open_think": True}, "ignore_eos": True})
full = client.chat.completions.create(**ask)
message = full.choices[0].message
out = {"reasoning": getattr(message, "reasoning", None),
       "reasoning_content": getattr(message, "reasoning_content", None),
       "content": message.content,
       "reasoning_tokens": full.usage.completion_tokens_details.reasoning_tokens}
joined = {"stream_reasoning": "", "stream_reasoning_content": "", "stream_content": ""}
for chunk in client.chat.completions.create(stream=True, **ask):
    for choice in chunk.choices:
        delta = choice.delta
        joined["stream_reasoning"] += getattr(delta, "reasoning", None) or ""
        joined["stream_reasoning_content"] += getattr(delta, "reasoning_content", None) or ""
        joined["stream_content"] += delta.content or ""
out.update(joined)
print(json.dumps(out))
"#;
    run_openai_script(
        SCRIPT,
        &[base_url, &messages.to_string(), &MAX_TOKENS.to_string()],
    )
}

/// The default CPU path follows a rule, not a timing race at load: `engine generate` and
/// `engine serve`, two processes given the same flags, answer a prompt with the same greedy
/// tokens and the same log-probabilities, on the default model and on Gemma 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_and_serve_give_the_same_greedy_answer() {
    let prompt = "import numpy as np\n\ndef mean_squared_error(";
    let client = reqwest::Client::new();
    for model in [smollm2_gguf(), gemma3_gguf()] {
        let out = Command::new(env!("CARGO_BIN_EXE_engine"))
            .arg("generate")
            .arg("--model")
            .arg(&model)
            .args(["--prompt", prompt, "--max-tokens", "8", "--ignore-eos"])
            .args(["--logprobs", "--threads", "1", "--kv-cache-memory", "64MiB"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let generated: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(generated["token_ids"].as_array().unwrap().len(), 8);
        let mut server = Server::start(&model, &[]);
        server.wait_ready().await;
        let (status, c) = post(
            &client,
            &server.url("/v1/completions"),
            &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true,
                    "logprobs": 0}),
        )
        .await;
        assert_eq!(status, 200, "{c}");
        let choice = &c["choices"][0];
        assert_eq!(choice["text"], generated["text"], "{}", model.display());
        // Both report f32 values (in JSON's shortest forms of an f32 and of an f64).
        let f32s = |v: &Value| -> Vec<f32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        };
        assert_eq!(
            f32s(&choice["logprobs"]["token_logprobs"]),
            f32s(&generated["logprobs"]),
            "{}",
            model.display()
        );
    }
}

/// A hybrid model (Qwen3.5's Gated DeltaNet beside attention) reports its state and what
/// a checkpoint of it costs; a request sharing a 2,000-token prefix with a finished one
/// takes all of it from the cache (the checkpoint at the first prompt's last block
/// boundary, 2,000), and answers as a cold server does, logprobs included. A chat's second
/// turn takes its history from the checkpoint at the first turn's history end (Qwen3.5's
/// template opens the answer with `<think>`, which the history does not repeat, so the
/// first prompt's end is not shared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hybrid_model_serves_a_shared_prefix_from_its_state_checkpoints() {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/families/qwen35-tiny/model.gguf");
    let client = reqwest::Client::new();
    let template = common::workspace().join("templates/qwen3_5.jinja");
    let template = template.to_str().unwrap();
    let mut warm = Server::start(
        &model,
        &["--max-model-len", "2048", "--chat-template", template],
    );
    warm.wait_ready().await;
    let info = version(&client, &warm).await;
    assert_eq!(info["prefix_caching"]["enabled"], true, "{info}");
    // Three DeltaNet layers of 4 value heads of 16 × 16 and a 4-wide convolution over
    // 128 channels, in f32: 3 × (1,024 + 3 × 128) × 4 bytes.
    assert_eq!(info["recurrent_state_bytes_per_sequence"], 16_896, "{info}");
    // K and V of the one attention layer's 2 KV heads of 16, in f16.
    assert_eq!(info["kv_bytes_per_token"], 2 * 2 * 16 * 2, "{info}");
    assert_eq!(info["kv_read_bytes_per_token"], 2 * 2 * 16 * 2, "{info}");
    assert_eq!(
        info["attention_flops_per_context_token"],
        4 * 4 * 16,
        "{info}"
    );
    // A checkpoint takes each DeltaNet group's blocks: a block is 16 tokens of 128 bytes
    // of K/V, 2,048 bytes that hold 512 f32 values of state, and a layer's 5,632-byte
    // state takes 3 blocks; 3 groups.
    assert_eq!(info["kv_block_bytes"], 2048, "{info}");
    assert_eq!(info["state_checkpoint_bytes"], 3 * 3 * 2048, "{info}");
    assert_eq!(info["state_checkpoint_every_blocks"], 0, "{info}");
    let prefix: Vec<u32> = (0..2000).map(|i| (i * 37 + 5) % 250).collect();
    let request = |tail: &[u32]| {
        let prompt: Vec<u32> = prefix.iter().chain(tail).copied().collect();
        json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true,
               "logprobs": 0})
    };
    let url = warm.url("/v1/completions");
    let (status, first) = post(&client, &url, &request(&[1, 2, 3])).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, second) = post(&client, &url, &request(&[7, 8, 9, 10])).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, 2000, "{second}");
    let metrics = client
        .get(warm.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("vllm:prefix_cache_hits_total"), cached as f64);
    assert!(value("engine:state_checkpoints_total") >= 1.0, "{metrics}");
    assert!(value("engine:state_checkpoint_blocks") >= 1.0, "{metrics}");
    // Two turns of a chat: the second re-sends the first's history and answer.
    let question: String = (0..40).map(|i| format!("word{i} ")).collect();
    let first_turn = json!([{"role": "user", "content": question}]);
    let chat = |messages: &serde_json::Value| json!({"messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": true});
    let (status, answer) = post(
        &client,
        &warm.url("/v1/chat/completions"),
        &chat(&first_turn),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (_, history) = post(
        &client,
        &warm.url("/tokenize"),
        &json!({"messages": first_turn, "add_generation_prompt": false}),
    )
    .await;
    let history_len = history["count"].as_u64().unwrap();
    // The first prompt's own last block boundary lies past its history's (its answer opens
    // with `<think>`), so only the history-end checkpoint can serve the second turn.
    let first_len = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_ne!((first_len - 1) / 16, history_len / 16, "{answer}");
    let second_turn = json!([
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
        {"role": "user", "content": "and then?"},
    ]);
    let (status, next) = post(
        &client,
        &warm.url("/v1/chat/completions"),
        &chat(&second_turn),
    )
    .await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(
        next["usage"]["prompt_tokens_details"]["cached_tokens"],
        history_len / 16 * 16,
        "history of {history_len} tokens: {next}"
    );
    let mut cold = Server::start(&model, &["--max-model-len", "2048"]);
    cold.wait_ready().await;
    let (_, want) = post(
        &client,
        &cold.url("/v1/completions"),
        &request(&[7, 8, 9, 10]),
    )
    .await;
    assert_eq!(want["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(second["choices"][0]["text"], want["choices"][0]["text"]);
    let logprobs = |body: &serde_json::Value| -> Vec<f64> {
        body["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    let (got, expected) = (logprobs(&second), logprobs(&want));
    assert_eq!(got.len(), 8);
    for (a, b) in got.iter().zip(&expected) {
        assert!((a - b).abs() < 1e-4, "logprob {a} against {b} cold");
    }
}
