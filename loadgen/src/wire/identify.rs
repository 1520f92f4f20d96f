//! What a server says about itself: `/v1/models`, and `/version`, `/props` or `/info`.

use std::time::Duration;

use serde_json::Value;

/// What a server says about itself: its `/v1/models` list and its `/version`, if it has one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerIdentity {
    pub models: Option<Value>,
    pub version: Option<String>,
    /// What the server says about itself, as it says it: `/version` (our engine, vLLM),
    /// `/props` (llama.cpp) or `/info` (TGI), the first that answers with JSON.
    pub info: Option<Value>,
    /// The device it runs on, when `info` names one (our engine's `device`).
    pub hardware: Option<String>,
}

impl ServerIdentity {
    /// The context of `model` (the first listed when `None`) in tokens: its `max_model_len`
    /// in /v1/models (vLLM, SGLang, `engine`), else llama.cpp's `n_ctx` in /props.
    pub fn context_len(&self, model: Option<&str>) -> Option<u32> {
        let listed = self
            .models
            .as_ref()
            .and_then(|m| m["data"].as_array())
            .and_then(|models| match model {
                Some(name) => models.iter().find(|m| m["id"].as_str() == Some(name)),
                None => models.first(),
            })
            .and_then(|m| m["max_model_len"].as_u64());
        let props = self
            .info
            .as_ref()
            .and_then(|i| i["default_generation_settings"]["n_ctx"].as_u64());
        listed.or(props).and_then(|n| u32::try_from(n).ok())
    }
}

/// Asks `url` for `/v1/models`, `/version`, `/props` and `/info`; a missing route leaves
/// its field empty.
pub async fn identify(
    url: &str,
    headers: &[(String, String)],
    api_key: Option<&str>,
    tls: Option<&crate::wire::tls::TlsSettings>,
) -> ServerIdentity {
    let Ok(client) = crate::wire::tls::reqwest_client(tls, Duration::from_secs(10)) else {
        return ServerIdentity::default();
    };
    let get = |path: &str| {
        let mut request = client.get(format!("{url}{path}"));
        for (name, value) in headers {
            request = request.header(name, value);
        }
        if let Some(key) = api_key {
            request = request.bearer_auth(key);
        }
        async move {
            let response = request.send().await.ok()?;
            if !response.status().is_success() {
                return None;
            }
            response.text().await.ok()
        }
    };
    let models = get("/v1/models")
        .await
        .and_then(|t| serde_json::from_str(&t).ok());
    let mut info: Option<Value> = None;
    let mut version = None;
    for path in ["/version", "/props", "/info"] {
        let Some(text) = get(path).await else {
            continue;
        };
        match serde_json::from_str::<Value>(&text) {
            Ok(value @ Value::Object(_)) => {
                version = Some(version_text(path, &value, models.as_ref()));
                info = Some(value);
                break;
            }
            _ if path == "/version" => version = Some(text.trim().chars().take(200).collect()),
            _ => {}
        }
    }
    let hardware = info
        .as_ref()
        .and_then(|i| i["device"].as_str())
        .map(str::to_string);
    ServerIdentity {
        models,
        version,
        info,
        hardware,
    }
}

/// A one-line version from a server's self-description at `path`; a bare `/version`
/// number is prefixed by the server `/v1/models` names as its models' owner (vLLM's
/// `owned_by: vllm`, SGLang's `sglang`).
fn version_text(path: &str, info: &Value, models: Option<&Value>) -> String {
    let field = |key: &str| info[key].as_str().map(str::to_string);
    let owner = models
        .and_then(|m| m["data"][0]["owned_by"].as_str())
        .and_then(|o| match o {
            "vllm" => Some("vLLM"),
            "sglang" => Some("SGLang"),
            _ => None,
        });
    match path {
        // llama.cpp: `build_info` ("b1234-abcdef"), else the model it serves.
        "/props" => field("build_info")
            .map(|b| format!("llama.cpp {b}"))
            .unwrap_or_else(|| "llama.cpp (build unknown)".to_string()),
        // TGI: `version` and `sha`.
        "/info" => match (field("version"), field("sha")) {
            (Some(v), Some(sha)) => format!("TGI {v} ({sha})"),
            (Some(v), None) => format!("TGI {v}"),
            _ => info.to_string().chars().take(200).collect(),
        },
        _ => match (field("version"), owner) {
            (Some(v), Some(owner)) if v.starts_with(|c: char| c.is_ascii_digit()) => {
                format!("{owner} {v}")
            }
            (Some(v), _) => v,
            (None, _) => info.to_string().chars().take(200).collect(),
        },
    }
}
