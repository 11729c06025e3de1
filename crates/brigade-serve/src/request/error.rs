//! An error as OpenAI's API returns it: the status, the message, its type and the field it
//! names. Request shaping reports in it whatever the transport; the HTTP layer sends it as
//! the response, a program puts its message in the node's result.

use serde_json::Value;

/// An error as OpenAI's API returns it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// 404 for a request naming another model than the one this route serves.
    pub fn model_not_found(asked: &str, what: &str, served: &str) -> ApiError {
        ApiError {
            status: 404,
            message: format!("the model '{asked}' does not exist; this server {what} '{served}'"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    pub fn body(&self) -> Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// What a JSON value is, for an error message ("a string", "an array", …).
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
