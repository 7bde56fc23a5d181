//! Errors as the OpenAI API shapes them: a status and
//! `{"error": {"message", "type", "param", "code"}}`. Protocol-level: no
//! HTTP framework here (the HTTP layer turns an [`ApiError`] into a response).

/// The HTTP statuses the server answers errors with.
pub mod status {
    /// A request field at fault.
    pub const BAD_REQUEST: u16 = 400;
    /// No or a wrong API key.
    pub const UNAUTHORIZED: u16 = 401;
    /// No such endpoint.
    pub const NOT_FOUND: u16 = 404;
    /// A body over the limit.
    pub const PAYLOAD_TOO_LARGE: u16 = 413;
    /// A generation failed.
    pub const INTERNAL: u16 = 500;
    /// The queue is full, or the engine has stopped.
    pub const UNAVAILABLE: u16 = 503;
}

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The HTTP status (see [`status`]).
    pub status: u16,
    /// What went wrong, in one line.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 about request field `param`.
    pub fn field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { status: status::BAD_REQUEST, message: message.into(), param: Some(param.to_string()) }
    }

    /// An error of `status` about no field in particular.
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None }
    }

    /// OpenAI's error type for this status.
    fn kind(&self) -> &'static str {
        match self.status {
            status::UNAUTHORIZED => "authentication_error",
            status::UNAVAILABLE => "unavailable_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status,
            }
        })
    }
}
