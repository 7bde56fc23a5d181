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
    /// An endpoint the server's flags turned off (llama-server's `/slots`
    /// without `--slots`, `/metrics` without `--metrics`).
    pub const NOT_IMPLEMENTED: u16 = 501;
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
    /// A prompt past the context: its tokens and the cells a request may
    /// take (llama-server's `exceed_context_size_error`).
    pub context: Option<(usize, usize)>,
}

impl ApiError {
    /// A 400 about request field `param`.
    pub fn field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { status: status::BAD_REQUEST, message: message.into(), param: Some(param.to_string()), context: None }
    }

    /// A 400 about a prompt of `n_prompt` tokens that leaves no cell to
    /// answer in the `n_ctx` cells one request may take, in llama-server's
    /// words and type.
    pub fn exceeds_context(n_prompt: usize, n_ctx: usize) -> ApiError {
        let message = format!("the request exceeds the available context size: the prompt is {n_prompt} tokens and a request's context holds {n_ctx} KV cells (-c, divided among -np slots unless --kv-unified), one of which the answer needs; shorten the prompt or raise -c");
        ApiError { context: Some((n_prompt, n_ctx)), ..ApiError::field("prompt", message) }
    }

    /// An error of `status` about no field in particular.
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None, context: None }
    }

    /// OpenAI's error type for this status.
    fn kind(&self) -> &'static str {
        if self.context.is_some() {
            return "exceed_context_size_error";
        }
        match self.status {
            status::NOT_IMPLEMENTED => "not_supported_error",
            status::UNAUTHORIZED => "authentication_error",
            status::UNAVAILABLE => "unavailable_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let mut error = serde_json::json!({
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.status,
        });
        if let Some((n_prompt, n_ctx)) = self.context {
            error["n_prompt_tokens"] = n_prompt.into();
            error["n_ctx"] = n_ctx.into();
        }
        serde_json::json!({ "error": error })
    }
}
