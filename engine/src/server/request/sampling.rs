//! The sampling parameters of the fields both generation routes share, and the values the
//! server refuses because they would change the answer.

use serde_json::Value;

use super::count;
use super::fields::SharedFields;
use crate::sampler::SamplingParams;
use crate::server::error::ApiError;

/// `best_of` other than 1 and a non-empty `logit_bias` would change the answer: refused.
pub fn check_unsupported_values(shared: &SharedFields) -> Result<(), ApiError> {
    if shared.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid(
            "best_of",
            "`best_of` other than 1 is not supported",
        ));
    }
    if shared.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::invalid(
            "logit_bias",
            "`logit_bias` is not supported",
        ));
    }
    Ok(())
}

/// `stop`: a string or a list of strings (their number and lengths are the engine's to check).
fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    const EXPECTED: &str = "a string or a list of strings";
    match stop {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::wrong_type("stop", EXPECTED)),
        Some(_) => Err(ApiError::wrong_type("stop", EXPECTED)),
    }
}

/// The sampling parameters of the fields shared by both routes (`max_tokens`, `min_tokens`
/// and logprobs are set by the route). Their ranges are the engine's to check.
pub fn sampling_params(shared: &SharedFields) -> Result<SamplingParams, ApiError> {
    let defaults = SamplingParams::default();
    let float = |v: Option<f64>, default: f32| v.map_or(default, |x| x as f32);
    let top_k = match shared.top_k {
        None | Some(-1) => 0,
        Some(k) => usize::try_from(k).map_err(|_| {
            ApiError::invalid(
                "top_k",
                format!("`top_k` must be -1 (off) or at least 0, got {k}"),
            )
        })?,
    };
    let seed = shared.seed.as_ref().map(|n| {
        n.as_u64()
            .or_else(|| n.as_i64().map(|i| i as u64))
            .ok_or_else(|| ApiError::wrong_type("seed", "an integer"))
    });
    Ok(SamplingParams {
        temperature: float(shared.temperature, defaults.temperature),
        top_p: float(shared.top_p, defaults.top_p),
        top_k,
        min_p: float(shared.min_p, defaults.min_p),
        presence_penalty: float(shared.presence_penalty, defaults.presence_penalty),
        frequency_penalty: float(shared.frequency_penalty, defaults.frequency_penalty),
        repetition_penalty: float(shared.repetition_penalty, defaults.repetition_penalty),
        seed: seed.transpose()?,
        stop: stop_strings(shared.stop.as_ref())?,
        stop_token_ids: shared.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: shared.ignore_eos.unwrap_or(false),
        skip_special_tokens: shared.skip_special_tokens.unwrap_or(true),
        min_tokens: count(shared.min_tokens),
        ..defaults
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::request::body::Body;
    use crate::server::request::{choices, MAX_N};

    fn shared(body: serde_json::Value) -> Result<SharedFields, ApiError> {
        Body::parse(body.to_string().as_bytes())?.read()
    }

    #[test]
    fn wrong_types_and_values_name_the_field() {
        let e = shared(serde_json::json!({"temperature": "hot"})).unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code),
            (Some("temperature"), Some("invalid_type"))
        );
        assert_eq!(choices(Some(0)).unwrap_err().param.as_deref(), Some("n"));
        assert_eq!(choices(Some(MAX_N)).unwrap(), MAX_N as usize);
        let p = sampling_params(&shared(serde_json::json!({"seed": -1, "top_k": -1})).unwrap())
            .unwrap();
        assert_eq!((p.seed, p.top_k), (Some(u64::MAX), 0));
        let e = sampling_params(&shared(serde_json::json!({"top_k": -2})).unwrap()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_k"));
        let e =
            sampling_params(&shared(serde_json::json!({"stop": ["a", 3]})).unwrap()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        let p = sampling_params(&shared(serde_json::json!({"stop": "x", "top_p": 0.5})).unwrap())
            .unwrap();
        assert_eq!((p.stop, p.top_p), (vec!["x".to_string()], 0.5));
    }
}
