//! llama-server's native completion API (`POST /completion`): its request
//! fields beside the OpenAI ones (`n_predict`, `n_probs`, `return_tokens`,
//! `response_fields`, prompts mixing text and token ids), and its answer's
//! shape (`content`, `tokens`, `stop`, `stop_type`, `truncated`,
//! `generation_settings`, `completion_probabilities`, `timings`), with
//! HAMburger's macro steps and KV entries in `timings` beside llama-server's
//! fields. No HTTP here.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::job::{End, FinishReason, JobParams, ModelInfo};
use crate::protocol::Request;
use crate::scheduler::slot_board::SlotParams;

/// The fields `/completion` takes besides [`crate::fields::COMMON`].
#[derive(Debug, Clone, Deserialize)]
pub struct NativeRequest {
    /// Text, token ids, a list mixing both (one prompt), or a list of prompts
    /// (texts, id lists, `{"prompt_string": ...}` objects).
    pub prompt: Value,
    /// Each token's log-probability and this many alternatives
    /// (`completion_probabilities`).
    pub n_probs: Option<u64>,
    /// Answer the generated token ids in `tokens`.
    pub return_tokens: Option<bool>,
    /// Answer only these fields, a `/` descending into objects
    /// (`generation_settings/n_predict`).
    pub response_fields: Option<Vec<String>>,
}

impl Request for NativeRequest {
    const FIELDS: &'static [&'static str] = &["prompt", "n_probs", "return_tokens", "response_fields"];
}

impl NativeRequest {
    /// The prompts, in order, as llama-server reads them: a list holding
    /// numbers, or texts and numbers both, is one prompt (its texts
    /// tokenized in place, see [`Piece`]); any other list is one prompt per
    /// element.
    ///
    /// # Errors
    /// A 400 naming `prompt`: another type, an empty list, multimodal data.
    pub fn prompts(&self) -> Result<Vec<Vec<Piece>>, ApiError> {
        match &self.prompt {
            Value::Array(items) if items.is_empty() => Err(ApiError::field("prompt", "'prompt' lists no prompt")),
            Value::Array(items)
                if items.iter().any(Value::is_number) && items.iter().all(|v| v.is_number() || v.is_string()) =>
            {
                items.iter().map(piece).collect::<Result<_, _>>().map(|p| vec![p])
            }
            Value::Array(items) => items.iter().map(one_prompt).collect(),
            other => one_prompt(other).map(|p| vec![p]),
        }
    }
}

/// A piece of a prompt: text to tokenize, or token ids.
#[derive(Debug, Clone)]
pub enum Piece {
    /// Text (tokenized with the model's BOS when it opens the prompt).
    Text(String),
    /// One token id.
    Id(u32),
}

fn piece(v: &Value) -> Result<Piece, ApiError> {
    match v {
        Value::String(s) => Ok(Piece::Text(s.clone())),
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Piece::Id)
            .ok_or_else(|| ApiError::field("prompt", format!("'prompt' holds {n}, which is not a token id"))),
        _ => Err(ApiError::field("prompt", "'prompt' must be text, token ids or a list of prompts")),
    }
}

fn one_prompt(v: &Value) -> Result<Vec<Piece>, ApiError> {
    match v {
        Value::String(s) => Ok(vec![Piece::Text(s.clone())]),
        Value::Array(items) if items.iter().all(Value::is_number) => items.iter().map(piece).collect(),
        Value::Object(o) => {
            if o.get("multimodal_data").is_some_and(|m| !m.is_null()) {
                return Err(ApiError::field(
                    "prompt",
                    "'prompt.multimodal_data' is not supported: HAMburger models take text only",
                ));
            }
            match o.get("prompt_string") {
                Some(Value::String(s)) => Ok(vec![Piece::Text(s.clone())]),
                _ => Err(ApiError::field("prompt", "a prompt object needs 'prompt_string' (text)")),
            }
        }
        _ => Err(ApiError::field("prompt", "'prompt' must be text, token ids or a list of prompts")),
    }
}

/// A prompt's pieces tokenized: the first text with the model's special
/// tokens (BOS), later texts without, ids as they are.
///
/// # Errors
/// A 400 naming `prompt` when the tokenizer fails.
pub fn tokenize(info: &ModelInfo, pieces: Vec<Piece>) -> Result<Vec<u32>, ApiError> {
    let mut ids = Vec::new();
    for (i, p) in pieces.into_iter().enumerate() {
        match p {
            Piece::Id(id) => ids.push(id),
            Piece::Text(t) => {
                ids.extend(info.tokenizer.encode(&t, i == 0).map_err(|e| ApiError::field("prompt", e.to_string()))?)
            }
        }
    }
    Ok(ids)
}

/// `generation_settings`: the job's settings as `/slots` shows them, with
/// llama-server's `logit_bias` list (`ignore_eos` adds each end-of-generation
/// token with a null, minus infinity, bias) and the fields of samplers this
/// server lacks at their off values.
pub fn generation_settings(p: &JobParams, info: &ModelInfo) -> Value {
    let mut v = serde_json::to_value(SlotParams::from(p)).unwrap_or_default();
    let mut bias: Vec<Value> = p.logit_bias.iter().map(|&(t, b)| json!({"token": t, "bias": b})).collect();
    if p.ignore_eos {
        bias.extend(info.eog.iter().map(|&t| json!({"token": t, "bias": null})));
    }
    v["logit_bias"] = Value::Array(bias);
    v["n_probs"] = json!(p.logprobs.unwrap_or(0));
    v["adaptive_target"] = json!(-1.0);
    v["adaptive_decay"] = json!(0.9);
    v
}

/// `stop_type`: eos, word (a stop string) or limit.
fn stop_type(end: &End) -> &'static str {
    match (end.reason, &end.stop_word) {
        (FinishReason::Length, _) => "limit",
        (FinishReason::Stop, Some(_)) => "word",
        (FinishReason::Stop, None) => "eos",
    }
}

/// What one finished choice answers.
pub struct Finished<'a> {
    /// Its text.
    pub text: &'a str,
    /// How it ended, its tokens.
    pub end: &'a End,
    /// Its prompt's ids.
    pub prompt: &'a [u32],
    /// Its statistics (`timings`).
    pub timings: Value,
    /// Prompt tokens whose KV entries were reused.
    pub cached: usize,
}

/// The object that ends a choice: all of it (not streamed: `text` is the
/// whole answer), or a stream's last (`text` empty).
pub fn finished(f: &Finished, info: &ModelInfo, settings: &Value, return_tokens: bool) -> Value {
    let tokens = if return_tokens { json!(f.end.ids) } else { json!([]) };
    json!({
        "index": 0,
        "content": f.text,
        "tokens": tokens,
        "stop": true,
        "model": info.name,
        "tokens_predicted": f.end.ids.len(),
        "tokens_evaluated": f.prompt.len(),
        "generation_settings": settings,
        "prompt": info.tokenizer.decode(f.prompt),
        "has_new_line": f.text.contains('\n'),
        "truncated": f.end.truncated,
        "stop_type": stop_type(f.end),
        "stopping_word": f.end.stop_word.as_deref().unwrap_or(""),
        "tokens_cached": f.cached,
        "timings": f.timings,
    })
}

/// A stream's chunk of `text` and its token `ids`.
pub fn partial(text: &str, ids: &[u32], predicted: usize, evaluated: usize) -> Value {
    json!({
        "index": 0,
        "content": text,
        "tokens": ids,
        "stop": false,
        "tokens_predicted": predicted,
        "tokens_evaluated": evaluated,
    })
}

/// Keeps only `fields` of `v` (`a/b` reads `v["a"]["b"]`, answered under the
/// name `a/b`), as `response_fields` asks; no list keeps everything.
pub fn only_fields(v: Value, fields: Option<&[String]>) -> Value {
    let Some(fields) = fields.filter(|f| !f.is_empty()) else { return v };
    let mut out = Map::new();
    for f in fields {
        let found = f.split('/').try_fold(&v, |at, key| at.get(key));
        if let Some(found) = found {
            out.insert(f.clone(), found.clone());
        }
    }
    Value::Object(out)
}
