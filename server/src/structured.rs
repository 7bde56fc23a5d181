//! Structured output of a request: OpenAI's `response_format`
//! (`json_object`, `json_schema`), llama-server's `grammar` (GBNF, as
//! llama.cpp takes it, or llguidance's Lark-like syntax) and `json_schema`, compiled into
//! the [`Constraint`] its sequence obeys.

use hamburger::constraint::{Constraint, ConstraintSpec, Grammars, MicroPolicy};

use crate::error::ApiError;
use crate::protocol::{Common, JsonSchemaFormat, ResponseFormat};

/// The constraint `common` asks for and the field that asks, or None.
///
/// # Errors
/// A 400 naming the field: a `response_format` schema that is not an
/// object, or several of the three fields at once.
pub fn spec(common: &Common) -> Result<Option<(ConstraintSpec, &'static str)>, ApiError> {
    let format = match &common.response_format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject { schema })
        | Some(ResponseFormat::JsonSchema { json_schema: JsonSchemaFormat { schema, .. } }) => match schema {
            Some(s) if s.is_object() => Some(ConstraintSpec::JsonSchema(s.clone())),
            None => Some(ConstraintSpec::JsonObject),
            Some(_) => return Err(ApiError::field("response_format", "'response_format''s schema must be an object")),
        },
    };
    let given = [
        format.map(|s| (s, "response_format")),
        common
            .grammar
            .as_deref()
            .map(|g| {
                ConstraintSpec::of_grammar(g).map_err(|e| ApiError::field("grammar", format!("invalid 'grammar': {e}")))
            })
            .transpose()?
            .map(|spec| (spec, "grammar")),
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

/// Compiles `spec` (asked by request field `field`) with `grammars` (CPU
/// work: call it off the async workers), as the server does every
/// constraint: the best allowed micro token, forced tokens fast-forwarded.
///
/// # Errors
/// A 400 naming `field` when the spec does not compile, or when the model's
/// tokenizer cannot serve constraints (`grammars` is None).
pub fn compile(grammars: Option<&Grammars>, spec: &ConstraintSpec, field: &str) -> Result<Constraint, ApiError> {
    let grammars = grammars.ok_or_else(|| {
        ApiError::field(field, format!("'{field}' is not supported: the model's tokenizer cannot serve constraints"))
    })?;
    grammars
        .compile(spec, MicroPolicy::BestAllowed, true)
        .map_err(|e| ApiError::field(field, format!("invalid '{field}': {e}")))
}
