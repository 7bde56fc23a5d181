//! The OpenAI request bodies the server accepts, typed: the settings both
//! completion endpoints share ([`Common`]), chat's and completions' own
//! fields, `tools`, `tool_choice` and `response_format`, and the small
//! endpoints' bodies. A body is parsed ONCE into JSON, its fields checked
//! against the lists of [`crate::fields`], then read into these types, an
//! error naming the field at fault. HAMburger's own knobs are extension
//! fields: `confidence` and `max_steps`.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fields;
use crate::messages::ChatMessage;

/// Reads `T` out of a parsed body, naming the field at fault.
fn read<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let mut path = e.path().to_string();
        // OpenAI names `response_format` for any fault inside it.
        if path.starts_with("response_format.") {
            path.truncate("response_format".len());
        }
        let inner = e.into_inner();
        if path == "." {
            ApiError::field("body", format!("invalid body: {inner}"))
        } else {
            ApiError::field(&path, format!("invalid field '{path}': {inner}"))
        }
    })
}

/// Parses a JSON body into `T`, naming the field at fault.
///
/// # Errors
/// A 400 for malformed JSON or a field of the wrong type.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    read(&json_of(body)?)
}

/// The body as JSON.
fn json_of(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::field("body", format!("invalid JSON body: {e}")))
}

/// A completion endpoint's body: its own fields, beside the [`Common`] ones.
pub trait Request: DeserializeOwned {
    /// The top-level fields it honours besides [`crate::fields::COMMON`].
    const FIELDS: &'static [&'static str];
}

/// Parses a completion request once: checks every field is known and asks
/// for nothing the server lacks, then reads its own fields into `T` and the
/// settings both endpoints share into [`Common`], each naming the field at
/// fault (serde's `flatten` would buffer the shared fields and lose their names).
///
/// # Errors
/// A 400 for malformed JSON, a field of the wrong type, an unknown field or a
/// refused one ([`fields::check`]).
pub fn parse_request<T: Request>(body: &[u8]) -> Result<(T, Common), ApiError> {
    let body = json_of(body)?;
    fields::check(&body, T::FIELDS)?;
    Ok((read(&body)?, read(&body)?))
}

/// One string or several (`stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// The settings shared by both completion endpoints.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    /// Ignored: the server has one model.
    pub model: Option<String>,
    /// Tokens to generate at most.
    pub max_tokens: Option<u64>,
    /// llama-server's name of `max_tokens` (-1: until the context is full).
    pub n_predict: Option<i64>,
    /// Alias of `max_tokens` (chat).
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature (0: greedy).
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Top-k sampling (llama-server's extension).
    pub top_k: Option<u64>,
    /// Min-p sampling (llama-server's extension).
    pub min_p: Option<f64>,
    /// Random seed.
    pub seed: Option<u64>,
    /// Lower the logits of tokens by their count among the recent tokens (OpenAI's, -2..=2).
    pub frequency_penalty: Option<f64>,
    /// Lower the logits of tokens among the recent tokens (OpenAI's, -2..=2).
    pub presence_penalty: Option<f64>,
    /// Divide the positive logits of recent tokens (llama-server's; 1: off).
    pub repeat_penalty: Option<f64>,
    /// How many recent tokens the penalties look at (llama-server's; -1: the whole context).
    pub repeat_last_n: Option<i64>,
    /// Return each token's log-probability.
    pub logprobs: Option<Logprobs>,
    /// Alternatives beside each token's log-probability (chat).
    pub top_logprobs: Option<u64>,
    /// Added to the logits of tokens: OpenAI's object of ids (as strings)
    /// to biases, or llama-server's `[[token, bias], ...]`, where a token
    /// may be text (each of its tokens biased) and a bias `false` (never).
    pub logit_bias: Option<Value>,
    /// Stop strings.
    pub stop: Option<OneOrMany>,
    /// Server-sent events, one chunk per macro step.
    pub stream: Option<bool>,
    /// What a stream ends with.
    pub stream_options: Option<StreamOptions>,
    /// Choices per prompt (each its own job; at most the server's `-np`).
    pub n: Option<u64>,
    /// llama-server's: answer the rendered prompt in `__verbose` (not streamed).
    pub verbose: Option<bool>,
    /// llama-server's: each streamed chunk carries the `timings` so far.
    pub timings_per_token: Option<bool>,
    /// llama-server's: a stream reports the prompt's progress (`prompt_progress` chunks).
    pub return_progress: Option<bool>,
    /// llama-server's: log-probabilities under the distribution each token
    /// was drawn from (after the sampler's truncation), answered as `prob`.
    pub post_sampling_probs: Option<bool>,
    /// HAMburger: stop a macro step when `1 - p_stop < confidence`.
    pub confidence: Option<f64>,
    /// HAMburger: most tokens per macro step (0: the model's).
    pub max_steps: Option<u64>,
    /// Generate past end-of-generation tokens (llama-server's extension, for benchmarks).
    pub ignore_eos: Option<bool>,
    /// Reuse the KV entries of cached prompt prefixes (llama-server's; default true).
    pub cache_prompt: Option<bool>,
    /// OpenAI's structured output.
    pub response_format: Option<ResponseFormat>,
    /// llama-server's grammar field, in llguidance's Lark-like syntax (not GBNF).
    pub grammar: Option<String>,
    /// llama-server's JSON schema field.
    pub json_schema: Option<Value>,
    /// `none` (macro steps), `draft-mtp` (self-verified) or
    /// `ngram-simple,draft-mtp`, see [`crate::speculative`].
    #[serde(rename = "speculative.type")]
    pub spec_type: Option<String>,
    /// llama-server's: the most tokens drafted after each verified one.
    #[serde(rename = "speculative.n_max")]
    pub spec_n_max: Option<u64>,
    /// llama-server's: tokens drafted at every step whatever the gate says.
    #[serde(rename = "speculative.n_min")]
    pub spec_n_min: Option<u64>,
    /// llama-server's: the least probability a drafted token needs.
    #[serde(rename = "speculative.p_min")]
    pub spec_p_min: Option<f64>,
    /// llama-server's: the n-gram the context drafts after (`ngram-simple`).
    #[serde(rename = "speculative.ngram_size_n")]
    pub spec_ngram_size_n: Option<u64>,
}

impl Common {
    /// Tokens to generate at most, by whichever name the request gave
    /// (`max_completion_tokens`, `max_tokens`, llama-server's `n_predict`);
    /// `None`: the server's default.
    ///
    /// # Errors
    /// A 400 naming `n_predict` below -1.
    pub fn max_tokens(&self) -> Result<Option<u64>, ApiError> {
        let n_predict = match self.n_predict {
            None | Some(-1) => None,
            Some(n) => Some(u64::try_from(n).map_err(|_| {
                ApiError::field("n_predict", "'n_predict' must be -1 (until the context is full) or at least 0")
            })?),
        };
        Ok(self.max_completion_tokens.or(self.max_tokens).or(n_predict))
    }

    /// Whether the answer is streamed.
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a stream ends with a usage chunk (`stream_options.include_usage`).
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }
}

/// `logprobs`: chat's flag, or the legacy completions' count of alternatives.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Logprobs {
    /// Chat: return each token's log-probability (`top_logprobs` alternatives).
    Flag(bool),
    /// Completions: return each token's log-probability and this many alternatives.
    Count(u64),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// End the stream with a chunk of no choice carrying `usage`.
    pub include_usage: Option<bool>,
}

/// OpenAI's `response_format`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Any text (no constraint).
    Text,
    /// Any JSON object, or JSON following `schema` (llama-server's extension).
    JsonObject {
        /// The schema (none: any JSON object).
        #[serde(default)]
        schema: Option<Value>,
    },
    /// JSON following a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema's name (accepted, unused).
    pub name: Option<String>,
    /// What the schema is for (accepted, unused).
    pub description: Option<String>,
    /// The schema (none: any JSON object).
    pub schema: Option<Value>,
    /// OpenAI's strict mode (accepted: every answer follows the schema).
    pub strict: Option<bool>,
}

/// One entry of chat's `tools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// `function` (the only kind).
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: ToolFunction,
}

/// A tool's function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolFunction {
    /// Its name (required: checked by name, `tools[i]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of its arguments (none: no arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Anything else the client sent (`strict`, ...), given to the template as sent.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Chat's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `"none"`, `"auto"` or `"required"`.
    Mode(ToolMode),
    /// `{"type": "function", "function": {"name": ...}}`: call this one.
    Named(NamedTool),
}

/// `tool_choice`'s modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolMode {
    /// No tool reaches the template; no call is made.
    None,
    /// Text or a call.
    Auto,
    /// A call of one of the tools.
    Required,
}

/// `tool_choice` naming a function.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NamedTool {
    /// `function`.
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    /// The function to call.
    pub function: NamedFunction,
}

/// The one kind of tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    /// A function.
    Function,
}

/// The function a named `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NamedFunction {
    /// Its name.
    pub name: String,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Functions the model may call (see [`crate::tools`]).
    pub tools: Option<Vec<Tool>>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<ToolChoice>,
    /// Open the assistant's turn after the messages (default true; false
    /// with a final assistant message: continue it).
    pub add_generation_prompt: Option<bool>,
    /// vLLM's: continue the final assistant message (a prefill).
    pub continue_final_message: Option<bool>,
    /// More variables for the chat template (`enable_thinking`, ...).
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

impl Request for ChatRequest {
    const FIELDS: &'static [&'static str] = &[
        "messages",
        "tools",
        "tool_choice",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
    ];
}

/// A completion prompt: text or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// Texts in a list, one choice (times `n`) each.
    Texts(Vec<String>),
    /// Token id lists in a list, as lm-eval's `local-completions` sends, one choice (times `n`) each.
    IdLists(Vec<Vec<u32>>),
}

/// One of the prompts a completion runs.
#[derive(Debug, Clone)]
pub enum OnePrompt {
    /// Text, to tokenize.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

impl Prompt {
    /// The prompts, in order: each its text or its ids.
    ///
    /// # Errors
    /// A 400 naming `prompt` for an empty list.
    pub fn all(self) -> Result<Vec<OnePrompt>, ApiError> {
        let all = match self {
            Prompt::Text(t) => vec![OnePrompt::Text(t)],
            Prompt::Ids(ids) => vec![OnePrompt::Ids(ids)],
            Prompt::Texts(v) => v.into_iter().map(OnePrompt::Text).collect(),
            Prompt::IdLists(v) => v.into_iter().map(OnePrompt::Ids).collect(),
        };
        if all.is_empty() {
            return Err(ApiError::field("prompt", "'prompt' lists no prompt"));
        }
        Ok(all)
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Start the answer's text with the prompt's, and its `logprobs` with
    /// the prompt tokens' (the base's log-probabilities).
    pub echo: Option<bool>,
}

impl CompletionRequest {
    /// Whether the prompt is echoed.
    pub fn echo(&self) -> bool {
        self.echo.unwrap_or(false)
    }
}

impl Request for CompletionRequest {
    const FIELDS: &'static [&'static str] = &["prompt", "echo"];
}

/// `POST /tokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// The text.
    pub content: String,
    /// Whether to add BOS as the model wants.
    #[serde(default)]
    pub add_special: bool,
    /// Answer each token with its text (`{"id", "piece"}`).
    #[serde(default)]
    pub with_pieces: bool,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::{COMMON, NO_OP, REFUSED};

    /// docs/server.md's table of request fields names every field the server knows.
    #[test]
    fn the_readme_table_names_every_known_field() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/server.md")).unwrap();
        let server = readme.split("\n## Request fields\n").nth(1).and_then(|s| s.split("\n## ").next()).unwrap();
        let table: String = server.lines().filter(|l| l.starts_with("| `")).collect::<Vec<_>>().join("\n");
        let own = ChatRequest::FIELDS.iter().chain(CompletionRequest::FIELDS);
        for name in COMMON.iter().chain(NO_OP).chain(REFUSED.iter().map(|r| &r.name)).chain(own) {
            assert!(
                table.contains(&format!("`{name}`")) || table.contains(&format!("`{name}.")),
                "docs/server.md's table of request fields lacks `{name}`"
            );
        }
    }

    #[test]
    fn typed_tool_fields_name_the_field_at_fault() {
        let chat = |extra: &str| format!(r#"{{"messages": [{{"role": "user", "content": "hi"}}], {extra}}}"#);
        let (req, _) = parse_request::<ChatRequest>(
            chat(r#""tool_choice": {"type": "function", "function": {"name": "f"}}"#).as_bytes(),
        )
        .unwrap();
        assert_eq!(
            req.tool_choice,
            Some(ToolChoice::Named(NamedTool {
                kind: FunctionKind::Function,
                function: NamedFunction { name: "f".into() }
            }))
        );
        let (req, _) = parse_request::<ChatRequest>(chat(r#""tool_choice": "required""#).as_bytes()).unwrap();
        assert_eq!(req.tool_choice, Some(ToolChoice::Mode(ToolMode::Required)));
        for (extra, param) in [
            (r#""tool_choice": "sometimes""#, "tool_choice"),
            (r#""tools": [{"type": "function"}]"#, "tools[0]"),
            (r#""response_format": {"type": "xml"}"#, "response_format"),
            (r#""temperature": "hot""#, "temperature"),
        ] {
            let e = parse_request::<ChatRequest>(chat(extra).as_bytes()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e}");
        }
        let (_, common) = parse_request::<ChatRequest>(
            chat(r#""response_format": {"type": "json_schema", "json_schema": {"name": "x"}}"#).as_bytes(),
        )
        .unwrap();
        let want = JsonSchemaFormat { name: Some("x".into()), description: None, schema: None, strict: None };
        assert_eq!(common.response_format, Some(ResponseFormat::JsonSchema { json_schema: want }));
    }
}
