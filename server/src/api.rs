//! The OpenAI request bodies the server accepts, parsed with the path of any
//! field at fault, and checked into a prompt plus [`JobParams`]. HAMburger's
//! own knobs are extension fields: `confidence` and `max_steps`, and
//! llama-server's `speculative.*` ([`crate::speculative`]).

use hamburger::{Param, ParamError, SamplerParams, StepParams, Timings, MAX_TOP_LOGPROBS};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::fields;
use crate::messages::ChatMessage;
use crate::scheduler::{FinishReason, JobParams, ModelInfo};
use crate::speculative::{self, SpecFields};

/// Parses a JSON body into `T`, naming the field at fault.
///
/// # Errors
/// A 400 for malformed JSON or a field of the wrong type.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." {
            ApiError::field("body", format!("invalid JSON body: {inner}"))
        } else {
            ApiError::field(&path, format!("invalid field '{path}': {inner}"))
        }
    })
}

/// A completion endpoint's body: its own fields, beside the [`Common`] ones.
pub trait Request: DeserializeOwned {
    /// The top-level fields it honours besides [`crate::fields::COMMON`].
    const FIELDS: &'static [&'static str];
}

/// Parses a completion request: checks every field is known and asks for
/// nothing the server lacks, then parses its own fields into `T` and the
/// settings both endpoints share into [`Common`], each naming the field at
/// fault (serde's `flatten` would buffer the shared fields and lose their names).
///
/// # Errors
/// A 400 for malformed JSON, a field of the wrong type, an unknown field or a
/// refused one ([`fields::check`]).
pub fn parse_request<T: Request>(body: &[u8]) -> Result<(T, Common), ApiError> {
    fields::check(&parse::<Value>(body)?, T::FIELDS)?;
    Ok((parse(body)?, parse(body)?))
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
    /// Added to the logits of token ids (OpenAI's: ids as strings, biases -100..=100).
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Stop strings.
    pub stop: Option<OneOrMany>,
    /// Server-sent events, one chunk per macro step.
    pub stream: Option<bool>,
    /// What a stream ends with.
    pub stream_options: Option<StreamOptions>,
    /// Choices per prompt (each its own job; at most the server's slots).
    pub n: Option<u64>,
    /// HAMburger: stop a macro step when `1 - p_stop < confidence`.
    pub confidence: Option<f64>,
    /// HAMburger: most tokens per macro step (0: the model's).
    pub max_steps: Option<u64>,
    /// Generate past end-of-generation tokens (llama-server's extension, for benchmarks).
    pub ignore_eos: Option<bool>,
    /// Reuse the KV entries of a slot whose cells hold the prompt's start (llama-server's; default true).
    pub cache_prompt: Option<bool>,
    /// OpenAI's structured output: `{"type": "text" | "json_object" | "json_schema", ...}`.
    pub response_format: Option<Value>,
    /// llama-server's grammar field, in llguidance's Lark-like syntax (not GBNF).
    pub grammar: Option<String>,
    /// llama-server's JSON schema field.
    pub json_schema: Option<Value>,
    /// `none` (macro steps) or `draft-mtp` (self-verified), see [`crate::speculative`].
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

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Functions the model may call (see [`crate::tools`]).
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<Value>,
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

impl Request for ChatRequest {
    const FIELDS: &'static [&'static str] = &["messages", "tools", "tool_choice"];
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
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// The request field that sets the library's parameter `p` (the settings
/// a request cannot change named as the library does).
fn field(p: Param) -> &'static str {
    match p {
        Param::NPredict => "max_tokens",
        Param::Temp => "temperature",
        Param::SpecType => "speculative.type",
        Param::DraftNMax => "speculative.n_max",
        Param::DraftNMin => "speculative.n_min",
        Param::DraftPMin => "speculative.p_min",
        p => p.name(),
    }
}

/// A 400 about the request fields of the parameters `e` refuses.
fn refused(e: &ParamError) -> ApiError {
    let main = e.params.first().map_or("body", |&p| field(p));
    ApiError::field(main, e.naming(|p| format!("'{}'", field(p))))
}

/// A float field as the runtime takes it.
fn as_f32(v: Option<f64>) -> Option<f32> {
    v.map(|x| x as f32)
}

impl Common {
    /// The `speculative.*` fields.
    fn speculative(&self) -> SpecFields<'_> {
        SpecFields {
            spec_type: self.spec_type.as_deref(),
            n_max: self.spec_n_max,
            n_min: self.spec_n_min,
            p_min: self.spec_p_min,
        }
    }

    /// Whether the answer is streamed.
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a stream ends with a usage chunk (`stream_options.include_usage`).
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }

    /// How many choices each prompt gets (`n`, default 1).
    ///
    /// # Errors
    /// A 400 naming `n` when it is 0 or more than the server's `n_slots`
    /// (a prompt's choices decode together, one slot each).
    pub fn n_choices(&self, n_slots: usize) -> Result<usize, ApiError> {
        match self.n.map_or(Ok(1), usize::try_from) {
            Ok(n) if (1..=n_slots).contains(&n) => Ok(n),
            _ => Err(ApiError::field("n", format!("'n' must be 1 to {n_slots} (the server's slots)"))),
        }
    }

    /// The sampling seed of a prompt's choice `j`: `seed + j` when the
    /// request gives a seed (so the choices differ and the request
    /// reproduces), else a random one each.
    pub fn seed_of_choice(&self, j: usize) -> u64 {
        self.seed.map_or_else(random_seed, |s| s.wrapping_add(j as u64))
    }

    /// The job settings for a prompt of `n_prompt` tokens (its first
    /// choice's seed: [`Common::seed_of_choice`]), echoed in the answer when
    /// `echo` (then `max_tokens` may be 0, as vLLM takes it: the prompt
    /// alone, and `logprobs` covers the prompt's tokens too).
    ///
    /// # Errors
    /// A 400 naming the field: values out of range, or a prompt that leaves
    /// no room in a slot's context.
    pub fn job_params(&self, info: &ModelInfo, n_prompt: usize, echo: bool) -> Result<JobParams, ApiError> {
        if n_prompt == 0 {
            return Err(ApiError::field("prompt", "the prompt is empty"));
        }
        if n_prompt >= info.n_ctx_slot {
            return Err(ApiError::field(
                "prompt",
                format!(
                    "the prompt ({n_prompt} tokens) does not fit the context of {} tokens per slot",
                    info.n_ctx_slot
                ),
            ));
        }
        // The slot's cells bound the answer (one per macro step, the engine
        // ends it "length" when they are full), not its tokens: at k tokens a
        // step it may be k times longer than the cells it takes. This is the
        // most that could ever fit, every step at the model's most tokens.
        let fits = ((info.n_ctx_slot - n_prompt + 1) * info.max_steps) as u64;
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(0) if !echo => {
                return Err(ApiError::field("max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo')"))
            }
            Some(n) => n.min(fits),
            None => info.n_predict.map_or(fits, |n| (n as u64).min(fits)),
        };
        let d = SamplerParams::default();
        let top_k = match self.top_k {
            Some(k) if k > info.n_vocab as u64 => {
                return Err(ApiError::field("top_k", format!("'top_k' must be at most {}", info.n_vocab)))
            }
            k => k.map_or(d.top_k, |k| k as usize),
        };
        let repeat_last_n = match self.repeat_last_n {
            None => d.repeat_last_n,
            Some(-1) => info.n_ctx_slot,
            Some(n) => usize::try_from(n).map_err(|_| {
                ApiError::field("repeat_last_n", "'repeat_last_n' must be -1 (the whole context) or at least 0")
            })?,
        };
        let sampler = SamplerParams {
            temp: as_f32(self.temperature).unwrap_or(d.temp),
            top_p: as_f32(self.top_p).unwrap_or(d.top_p),
            min_p: as_f32(self.min_p).unwrap_or(d.min_p),
            frequency_penalty: as_f32(self.frequency_penalty).unwrap_or(d.frequency_penalty),
            presence_penalty: as_f32(self.presence_penalty).unwrap_or(d.presence_penalty),
            repeat_penalty: as_f32(self.repeat_penalty).unwrap_or(d.repeat_penalty),
            repeat_last_n,
            top_k,
            seed: self.seed_of_choice(0),
        };
        sampler.validate().map_err(|e| refused(&e))?;
        let logit_bias = self.logit_bias(info.n_vocab)?;
        let logprobs = self.logprobs()?;
        let step = StepParams {
            confidence: as_f32(self.confidence).unwrap_or(info.step.confidence),
            max_steps: self.max_steps.map_or(info.step.max_steps, |s| usize::try_from(s).unwrap_or(usize::MAX)),
            draft: speculative::draft(self.speculative(), info.step.draft)?,
            ..info.step
        };
        let rule = step.rule(info.max_steps).map_err(|e| refused(&e))?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::field("stop", "stop strings must not be empty"));
        }
        let prompt_logprobs = if echo { logprobs } else { None };
        if prompt_logprobs.is_some() && self.stream() {
            return Err(ApiError::field(
                "logprobs",
                "an echoed prompt's log-probabilities are not streamed: drop 'stream', 'echo' or 'logprobs'",
            ));
        }
        Ok(JobParams {
            n_predict: max_tokens as usize,
            sampler,
            logit_bias,
            logprobs,
            prompt_logprobs,
            rule,
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stream: self.stream(),
            // Scoring the prompt needs every one of its rows' logits: none is reused.
            cache_prompt: self.cache_prompt.unwrap_or(true) && prompt_logprobs.is_none(),
            constraint: None,
        })
    }
}

impl Common {
    /// How many alternatives to return beside each token's log-probability;
    /// `None`: no log-probabilities.
    ///
    /// # Errors
    /// A 400 naming the field: more than [`MAX_TOP_LOGPROBS`] alternatives,
    /// or `top_logprobs` without `logprobs: true`.
    fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let top = self.top_logprobs.filter(|&n| n > 0);
        let (field, n) = match (self.logprobs, top) {
            (None | Some(Logprobs::Flag(false)), None) => return Ok(None),
            (None | Some(Logprobs::Flag(false)), Some(_)) => {
                return Err(ApiError::field("top_logprobs", "'top_logprobs' needs 'logprobs': true"))
            }
            (Some(Logprobs::Flag(true)), n) => ("top_logprobs", n.unwrap_or(0)),
            (Some(Logprobs::Count(n)), _) => ("logprobs", n),
        };
        if n > MAX_TOP_LOGPROBS as u64 {
            return Err(ApiError::field(field, format!("'{field}' must be at most {MAX_TOP_LOGPROBS}")));
        }
        Ok(Some(n as usize))
    }

    /// `logit_bias` as the sampler takes it.
    ///
    /// # Errors
    /// A 400 naming `logit_bias` for a key that is not a token id below
    /// `n_vocab`, or a bias outside -100..=100.
    fn logit_bias(&self, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else { return Ok(Vec::new()) };
        map.iter()
            .map(|(k, &b)| {
                let token = k.parse::<u32>().ok().filter(|&t| (t as usize) < n_vocab).ok_or_else(|| {
                    ApiError::field("logit_bias", format!("'logit_bias' key '{k}' is not a token id below {n_vocab}"))
                })?;
                if !(-100.0..=100.0).contains(&b) {
                    return Err(ApiError::field(
                        "logit_bias",
                        format!("'logit_bias' of '{k}' is {b}: expected -100 to 100"),
                    ));
                }
                Ok((token, b as f32))
            })
            .collect()
    }
}

/// A seed for a request that gives none, different each time (as OpenAI and
/// llama-server do): std's per-map random keys, hashed with the clock.
pub(crate) fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// `finish_reason` as OpenAI spells it.
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// The `usage` object of `prompt` and `completion` tokens.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// The `timings` object: llama-server's fields (`prompt_n` the prompt tokens
/// processed, `cache_n` those reused from the slot's cells; `draft_n` the
/// drafted tokens checked, `draft_n_accepted` those accepted) plus
/// HAMburger's macro steps (base forwards) and, self-verified, the forwards
/// that checked drafts and the drafted tokens accepted per such forward.
pub fn timings(t: &Timings) -> Value {
    let per_second = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    json!({
        "cache_n": t.cached_tokens,
        "prompt_n": t.prompt_tokens,
        "prompt_ms": t.prompt_ms,
        "prompt_per_second": per_second(t.prompt_tokens, t.prompt_ms),
        "predicted_n": t.gen_tokens,
        "predicted_ms": t.gen_ms,
        "predicted_per_second": per_second(t.gen_tokens, t.gen_ms),
        "macro_steps": t.macro_steps,
        "tokens_per_step": t.tokens_per_step(),
        "kv_entries": t.kv_entries,
        "kv_bytes_per_entry": t.kv_bytes_per_entry,
        "draft_n": t.drafted,
        "draft_n_accepted": t.draft_accepted,
        "verify_forwards": t.verify_forwards,
        "accepted_per_verify": t.accepted_per_verify(),
    })
}
