//! Structured output of a request: OpenAI's `response_format`
//! (`json_object`, `json_schema`), llama-server's `grammar` (in llguidance's
//! Lark-like syntax; GBNF is not accepted) and `json_schema`, compiled into
//! the [`Constraint`] its sequence obeys.

use hamburger::constraint::{Constraint, ConstraintSpec, MicroPolicy};
use serde_json::Value;

use crate::api::Common;
use crate::error::ApiError;
use crate::scheduler::ModelInfo;

/// The constraint `common` asks for and the field that asks, or None.
///
/// # Errors
/// A 400 naming the field: a `response_format` of another type or without
/// an object schema, or several of the three fields at once.
pub fn spec(common: &Common) -> Result<Option<(ConstraintSpec, &'static str)>, ApiError> {
    let format = match &common.response_format {
        None => None,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(ConstraintSpec::JsonObject),
            Some("json_schema") => match f.pointer("/json_schema/schema") {
                Some(s) if s.is_object() => Some(ConstraintSpec::JsonSchema(s.clone())),
                None => Some(ConstraintSpec::JsonObject),
                Some(_) => {
                    return Err(ApiError::field(
                        "response_format",
                        "'response_format.json_schema.schema' must be an object",
                    ))
                }
            },
            _ => {
                return Err(ApiError::field(
                    "response_format",
                    "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                ))
            }
        },
    };
    let given = [
        format.map(|s| (s, "response_format")),
        common.grammar.as_ref().map(|g| (ConstraintSpec::Lark(g.clone()), "grammar")),
        common.json_schema.as_ref().map(|s| (ConstraintSpec::JsonSchema(s.clone()), "json_schema")),
    ];
    let mut given = given.into_iter().flatten();
    let first = given.next();
    if let Some((_, second)) = given.next() {
        return Err(ApiError::field(
            second,
            format!("'{second}' cannot be combined with '{}'", first.map_or("", |f| f.1)),
        ));
    }
    Ok(first)
}

/// Compiles what `common` asks for (CPU work: call it off the async workers).
///
/// # Errors
/// A 400 naming the field whose schema or grammar does not compile, or any
/// constraint when the model's tokenizer cannot serve one.
pub fn compile(info: &ModelInfo, common: &Common) -> Result<Option<Constraint>, ApiError> {
    let Some((spec, field)) = spec(common)? else { return Ok(None) };
    let grammars = info.grammars.as_ref().ok_or_else(|| {
        ApiError::field(field, format!("'{field}' is not supported: the model's tokenizer cannot serve constraints"))
    })?;
    let c = grammars
        .compile(&spec, MicroPolicy::BestAllowed, true)
        .map_err(|e| ApiError::field(field, format!("invalid '{field}': {e}")))?;
    Ok(Some(c))
}
