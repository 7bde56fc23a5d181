//! Every top-level field a completion request may carry, and what the server
//! does with it: honoured, accepted as a no-op, or refused with a 400 naming
//! it. No field is accepted and silently ignored unless it is listed in
//! [`NO_OP`]; an unknown field is refused by name. docs/server.md's table of
//! request fields mirrors these lists.

use serde_json::Value;

use crate::error::ApiError;

/// Fields both completion endpoints honour (parsed into [`crate::protocol::Common`]).
pub const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "stop",
    "stream",
    "stream_options",
    "n",
    "confidence",
    "max_steps",
    "ignore_eos",
    "verbose",
    "timings_per_token",
    "return_progress",
    "post_sampling_probs",
    "cache_prompt",
    "response_format",
    "grammar",
    "json_schema",
    "speculative.type",
    "speculative.n_max",
    "speculative.n_min",
    "speculative.p_min",
    "speculative.ngram_size_n",
];

/// Fields real clients send that change nothing here: end-user ids, stored
/// metadata and service tiers have no meaning for one local model without
/// storage, and `parallel_tool_calls` only allows several calls (an answer
/// here makes one, see [`crate::tools`]).
///
/// `id_slot` (llama-server's) asks for a slot by number, for its prompt
/// cache: here every slot adopts cached prefixes from the one pool.
/// `backend_sampling` (llama-server's) samples on the GPU backend: here
/// sampling always runs on the CPU, from the same distribution.
pub const NO_OP: &[&str] =
    &["user", "metadata", "store", "parallel_tool_calls", "service_tier", "id_slot", "backend_sampling"];

/// A field refused unless it holds its neutral value (what a client sends when
/// it does not use the feature).
pub(crate) struct Refused {
    /// The field's name.
    pub(crate) name: &'static str,
    /// Whether a value asks for nothing.
    neutral: fn(&Value) -> bool,
    /// Why the feature is missing, for the error message.
    why: &'static str,
}

fn null_or_one(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(1.0)
}

fn null_or_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

fn null_or_none(v: &Value) -> bool {
    v.is_null() || v == "none"
}

/// Why the legacy completions endpoint refuses tools (chat honours them).
const TOOLS: &str = "tools are called through /v1/chat/completions";

/// Why the deprecated function-calling fields are refused.
const FUNCTIONS: &str = "the deprecated functions API is not supported: use 'tools' and 'tool_choice'";

/// The refused fields, with their neutral values (an endpoint's own fields,
/// such as chat's `tools`, are honoured there before this list is asked).
pub(crate) const REFUSED: &[Refused] = &[
    Refused { name: "tools", neutral: null_or_empty, why: TOOLS },
    Refused { name: "tool_choice", neutral: null_or_none, why: TOOLS },
    Refused { name: "functions", neutral: null_or_empty, why: FUNCTIONS },
    Refused { name: "function_call", neutral: null_or_none, why: FUNCTIONS },
    Refused { name: "best_of", neutral: null_or_one, why: "only one candidate is generated" },
    Refused { name: "suffix", neutral: null_or_empty, why: "insertion (a suffix) is not supported" },
];

/// Checks every top-level field of `body` against the endpoint's own fields
/// `own`, [`COMMON`], [`NO_OP`] and the refused ones.
///
/// # Errors
/// A 400 naming the first field that is unknown or asks for a feature the
/// server lacks.
pub fn check(body: &Value, own: &[&str]) -> Result<(), ApiError> {
    let Value::Object(fields) = body else {
        return Err(ApiError::field("body", "the body must be a JSON object"));
    };
    for (name, value) in fields {
        let name = name.as_str();
        if own.contains(&name) || COMMON.contains(&name) || NO_OP.contains(&name) {
            continue;
        }
        match REFUSED.iter().find(|r| r.name == name) {
            Some(r) if (r.neutral)(value) => {}
            Some(r) => return Err(ApiError::field(name, format!("'{name}' is not supported: {}", r.why))),
            None => return Err(ApiError::field(name, format!("unknown field '{name}'"))),
        }
    }
    Ok(())
}
