//! The error every route answers with: OpenAI's body `{"error": {"message", "type",
//! "param", "code"}}`, its status, and `Retry-After` where there is one.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// An error answered with OpenAI's body `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400 about one request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: Some("invalid_value"),
            retry_after: None,
        }
    }

    /// 400 for a field of the wrong JSON type.
    pub fn wrong_type(param: &str, expected: &str) -> ApiError {
        ApiError {
            code: Some("invalid_type"),
            ..ApiError::invalid(param, format!("`{param}` must be {expected}"))
        }
    }

    /// 400 for a body that is not a JSON object.
    pub fn malformed(message: impl Into<String>) -> ApiError {
        ApiError {
            param: None,
            code: Some("invalid_json"),
            ..ApiError::invalid("", message)
        }
    }

    /// 400 for prompt + completion beyond the context window.
    pub fn context_length(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(param, message)
        }
    }

    pub fn model_not_found(model: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("model_not_found"),
            ..ApiError::invalid("model", format!("The model `{model}` does not exist."))
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Missing or invalid bearer token in the Authorization header.".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: Some("request_too_large"),
            param: None,
            ..ApiError::invalid(
                "",
                format!("The request body exceeds the limit of {limit} bytes."),
            )
        }
    }

    pub fn overloaded(waiting: usize, retry_after: u64) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "The server is overloaded: {waiting} requests are already waiting. Retry later."
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "service_unavailable_error",
            param: None,
            code: None,
            retry_after: Some(1),
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn not_found_route(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("unknown_url"),
            param: None,
            ..ApiError::invalid("", format!("Unknown route `{path}`."))
        }
    }

    /// The JSON body, also used inside an SSE stream when generation fails mid-way.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
