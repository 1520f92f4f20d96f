//! A running `engine serve` for the end-to-end tests, and the HTTP helpers they share.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running `engine serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub base: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(model: &PathBuf, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_engine"))
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0", "--threads", "1"])
            .args(if extra.contains(&"--kv-cache-memory") {
                &[][..]
            } else {
                &["--kv-cache-memory", "64MiB"][..]
            })
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the engine binary");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut port_tx = Some(port_tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let port: String = rest
                        .split(':')
                        .nth(1)
                        .unwrap_or("")
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    if let (Some(tx), Ok(port)) = (port_tx.take(), port.parse::<u16>()) {
                        let _ = tx.send(port);
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let port = port_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!(
                    "the server never said where it listens; log: {:?}",
                    log.lock().unwrap()
                )
            });
        Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Polls /health until 200; returns the statuses seen.
    pub async fn wait_ready(&mut self) -> Vec<u16> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = Vec::new();
        loop {
            if let Ok(r) = client.get(self.url("/health")).send().await {
                let status = r.status().as_u16();
                if seen.last() != Some(&status) {
                    seen.push(status);
                }
                if status == 200 {
                    return seen;
                }
            }
            if let Ok(Some(exit)) = self.child.try_wait() {
                panic!(
                    "the server exited ({exit}) before it was ready; log:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "server not ready; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POSTs `body`; the status and the JSON (or text) answer.
pub async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = client
        .post(url)
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body read");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The `data:` payloads of a complete SSE response.
pub async fn post_stream(client: &reqwest::Client, url: &str, body: &Value) -> Vec<String> {
    let r = client
        .post(url)
        .json(body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(
        r.status().as_u16(),
        200,
        "stream request failed: {:?}",
        r.text().await
    );
    let text = r.text().await.expect("stream read");
    sse_payloads(&text)
}

/// The `data:` payloads of an SSE body.
pub fn sse_payloads(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .map(str::to_string)
        })
        .collect()
}

/// The JSON chunks of a stream that ends with `[DONE]`.
pub fn chunks(payloads: &[String]) -> Vec<Value> {
    assert_eq!(
        payloads.last().map(String::as_str),
        Some("[DONE]"),
        "stream must end with [DONE]"
    );
    payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).expect("chunk is JSON"))
        .collect()
}

/// Runs a Python `script` with the official `openai` client importable (scripts/test.sh
/// installs it and sets OPENAI_PYTHONPATH) and `args` as its `sys.argv[1..]`; the JSON it
/// prints.
pub fn run_openai_script(script: &str, args: &[&str]) -> Value {
    let path = std::env::var("OPENAI_PYTHONPATH").expect(
        "OPENAI_PYTHONPATH: run the tests through scripts/test.sh, which installs PyPI's openai",
    );
    let output = Command::new("python3")
        .env("PYTHONPATH", path)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("running python3");
    assert!(
        output.status.success(),
        "the openai client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the script prints JSON")
}

/// Two tools: `get_weather` of a city of 1 to `max_city` characters, `get_time` of a time
/// zone, `UTC` or `CET`.
pub fn weather_tools(max_city: usize) -> Value {
    serde_json::json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object",
                           "properties": {"city": {"type": "string", "minLength": 1, "maxLength": max_city}},
                           "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "get_time", "description": "The time in a time zone",
            "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
                           "required": ["tz"], "additionalProperties": false}}},
    ])
}

/// Checks one call's arguments against its tool's schema in [`weather_tools`].
pub fn assert_weather_call(name: &str, arguments: &str, max_city: usize) {
    let args: Value =
        serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{arguments:?}: {e}"));
    let obj = args.as_object().expect("arguments are an object");
    assert_eq!(obj.len(), 1, "{arguments}");
    match name {
        "get_weather" => {
            let city = obj["city"].as_str().expect("city is a string");
            assert!(
                (1..=max_city).contains(&city.chars().count()),
                "{arguments}"
            );
        }
        "get_time" => assert!(
            ["UTC", "CET"].contains(&obj["tz"].as_str().unwrap()),
            "{arguments}"
        ),
        other => panic!("a call to `{other}`, which is not a tool"),
    }
}
