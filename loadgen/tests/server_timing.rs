//! The server's own timing of a request, read from recorded responses (`tests/data/`): a
//! llama.cpp stream's `timings` (captured from `llama-server`) and a vLLM stream's `metrics`
//! (`--enable-per-request-metrics`, in the shape its docs give), each on the final usage
//! chunk; the events before carry none.

use loadgen::wire::api;
use loadgen::wire::backend::Backend;
use reports::records::ServerTiming;

/// Each event's server timing, in order (`[DONE]` included, as `None`).
fn timings(file: &str) -> Vec<Option<ServerTiming>> {
    let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    text.split("\n\n")
        .filter_map(|event| event.trim().strip_prefix("data: "))
        .map(|data| {
            api::of(Backend::Chat)
                .event(data)
                .unwrap_or_else(|e| panic!("{file}: {e}: {data}"))
                .server_timing
        })
        .collect()
}

#[test]
fn llama_cpp_timings_on_the_usage_chunk() {
    let got = timings("llamacpp-chat-stream-tail.sse");
    assert_eq!(got.len(), 4);
    assert_eq!(got[..2], [None, None]);
    // prompt_ms 8.994, predicted_ms 60.112; llama.cpp says no queue time.
    assert_eq!(
        got[2],
        Some(ServerTiming {
            queue_ms: None,
            prefill_ms: 8.994,
            decode_ms: 60.112,
        })
    );
    assert_eq!(got[3], None, "[DONE]");
}

#[test]
fn vllm_metrics_on_the_usage_chunk() {
    let got = timings("vllm-chat-stream-tail.sse");
    assert_eq!(got.len(), 4);
    assert_eq!(got[..2], [None, None]);
    // queue_time_ms 12.3, time_to_first_token_ms (from first scheduled) 85.2,
    // generation_time_ms 1240.5.
    let t = got[2].unwrap();
    assert_eq!(
        t,
        ServerTiming {
            queue_ms: Some(12.3),
            prefill_ms: 85.2,
            decode_ms: 1240.5,
        }
    );
    assert!((t.total_ms() - 1338.0).abs() < 1e-9);
}

#[test]
fn a_metrics_object_without_its_numbers_is_no_timing() {
    // vLLM's fields are null without their data; a `metrics` of another shape is not ours
    // to read, and neither stops the parse.
    for data in [
        r#"{"choices":[],"metrics":{"time_to_first_token_ms":null,"generation_time_ms":null}}"#,
        r#"{"choices":[],"metrics":"opaque"}"#,
        r#"{"choices":[],"timings":{"prompt_n":3}}"#,
    ] {
        let event = api::of(Backend::Chat).event(data).unwrap();
        assert_eq!(event.server_timing, None, "{data}");
    }
}
