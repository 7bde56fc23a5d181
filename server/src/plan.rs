//! A request planned into jobs: each prompt's settings checked into
//! [`JobParams`] (every error a 400 naming its field), its constraint chosen
//! (`tools`, else structured output), and `n` choices of each prompt fanned
//! out into one [`Job`] each (the choices after a prompt's first adopt its
//! prompt's entries as soon as they are written). Choices are
//! numbered prompt-major, as OpenAI numbers them: `index = prompt_i * n + j`;
//! choice `j` samples with `seed + j`.

use std::time::Instant;

use hamburger::constraint::Constraint;
use hamburger::{Param, ParamError, SamplerParams, StepParams, StepRule, MAX_TOP_LOGPROBS};
use serde_json::Value;
use tokio::sync::mpsc::Receiver;

use crate::error::ApiError;
use crate::job::{event_channel, Event, Job, JobParams, ModelInfo, RequestDefaults};
use crate::protocol::{Common, Logprobs, OneOrMany};
use crate::speculative::{self, Decoding, SpecFields};
use crate::tools::ToolRequest;

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
        Param::NgramSizeN => "speculative.ngram_size_n",
        p => p.name(),
    }
}

/// A 400 about the request fields of the parameters `e` refuses.
fn refused(e: &ParamError) -> ApiError {
    let main = e.params.first().map_or("body", |&p| field(p));
    ApiError::field(main, e.naming(|p| format!("'{}'", field(p))))
}

/// A request's `speculative.*` fields.
fn spec_fields(common: &Common) -> SpecFields<'_> {
    SpecFields {
        spec_type: common.spec_type.as_deref(),
        n_max: common.spec_n_max,
        n_min: common.spec_n_min,
        p_min: common.spec_p_min,
        ngram_size_n: common.spec_ngram_size_n,
    }
}

/// A float field as the runtime takes it.
fn as_f32(v: Option<f64>) -> Option<f32> {
    v.map(|x| x as f32)
}

/// A 400 naming `field` when one of `ids` is outside the vocabulary.
///
/// # Errors
/// As said.
pub fn check_vocab(info: &ModelInfo, field: &str, ids: &[u32]) -> Result<(), ApiError> {
    match ids.iter().find(|&&t| t as usize >= info.n_vocab) {
        Some(t) => Err(ApiError::field(field, format!("token id {t} is outside the vocabulary of {}", info.n_vocab))),
        None => Ok(()),
    }
}

/// How many choices each prompt gets (`n`, default 1).
///
/// # Errors
/// A 400 naming `n` when it is 0 or more than the server's `n_slots`
/// (a prompt's choices decode together, one sequence each).
pub fn n_choices(common: &Common, n_slots: usize) -> Result<usize, ApiError> {
    match common.n.map_or(Ok(1), usize::try_from) {
        Ok(n) if (1..=n_slots).contains(&n) => Ok(n),
        _ => Err(ApiError::field("n", format!("'n' must be 1 to {n_slots} (the server's slots)"))),
    }
}

/// The sampling seed of a prompt's choice `j`: `seed + j` when the request
/// or the server gives a seed (so the choices differ and the request
/// reproduces), else a random one each.
pub fn seed_of_choice(common: &Common, defaults: &RequestDefaults, j: usize) -> u64 {
    common.seed.or(defaults.seed).map_or_else(crate::ids::random_u64, |s| s.wrapping_add(j as u64))
}

/// The job settings for a prompt of `n_prompt` tokens (its first choice's
/// seed: [`seed_of_choice`]), echoed in the answer when `echo` (then
/// `max_tokens` may be 0, as vLLM takes it: the prompt alone, and `logprobs`
/// covers the prompt's tokens too); the constraint is set apart
/// ([`constraint`]).
///
/// # Errors
/// A 400 naming the field: values out of range, or a prompt the pool cannot hold.
pub fn job_params(common: &Common, info: &ModelInfo, n_prompt: usize, echo: bool) -> Result<JobParams, ApiError> {
    let n_predict = max_tokens(common, info, n_prompt, echo)?;
    let sampler = sampler(common, info)?;
    let logit_bias = logit_bias(common, info)?;
    let logprobs = logprobs(common)?;
    let prompt_logprobs = if echo { logprobs } else { None };
    if prompt_logprobs.is_some() && common.stream() {
        return Err(ApiError::field(
            "logprobs",
            "an echoed prompt's log-probabilities are not streamed: drop 'stream', 'echo' or 'logprobs'",
        ));
    }
    Ok(JobParams {
        n_predict,
        sampler,
        logit_bias,
        logprobs,
        post_sampling: common.post_sampling_probs.unwrap_or(false),
        prompt_logprobs,
        rule: rule(common, info)?,
        stop: stop_strings(common)?,
        ignore_eos: common.ignore_eos.unwrap_or(false),
        stream: common.stream(),
        timings_per_token: common.timings_per_token.unwrap_or(false),
        return_progress: common.return_progress.unwrap_or(false) && common.stream(),
        // Scoring the prompt needs every one of its rows' logits: none is reused.
        cache_prompt: common.cache_prompt.unwrap_or(true) && prompt_logprobs.is_none(),
        constraint: None,
    })
}

/// The most tokens to generate after a prompt of `n_prompt` tokens.
///
/// The pool's cells bound the answer (one per macro step; the engine ends it
/// "length" when its context fills the pool), not its tokens: at k tokens a
/// step it may be k times longer than the cells it takes, so `max_tokens` is
/// clamped to the most that could ever fit, every step at the model's most
/// tokens.
fn max_tokens(common: &Common, info: &ModelInfo, n_prompt: usize, echo: bool) -> Result<usize, ApiError> {
    if n_prompt == 0 {
        return Err(ApiError::field("prompt", "the prompt is empty"));
    }
    if n_prompt >= info.n_ctx_seq {
        return Err(ApiError::exceeds_context(n_prompt, info.n_ctx_seq));
    }
    let fits = ((info.n_ctx_seq - n_prompt + 1) * info.max_steps) as u64;
    let n = match common.max_tokens()? {
        Some(0) if !echo => {
            return Err(ApiError::field("max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo')"))
        }
        Some(n) => n.min(fits),
        None => info.n_predict.map_or(fits, |n| (n as u64).min(fits)),
    };
    Ok(n as usize)
}

/// The sampler's settings (its seed: choice 0's).
fn sampler(common: &Common, info: &ModelInfo) -> Result<SamplerParams, ApiError> {
    let d = &info.defaults.sampler;
    let top_k = match common.top_k {
        Some(k) if k > info.n_vocab as u64 => {
            return Err(ApiError::field("top_k", format!("'top_k' must be at most {}", info.n_vocab)))
        }
        k => k.map_or(d.top_k, |k| k as usize),
    };
    let repeat_last_n = match common.repeat_last_n {
        None => d.repeat_last_n,
        Some(-1) => info.n_ctx,
        Some(n) => usize::try_from(n).map_err(|_| {
            ApiError::field("repeat_last_n", "'repeat_last_n' must be -1 (the whole context) or at least 0")
        })?,
    };
    let sampler = SamplerParams {
        temp: as_f32(common.temperature).unwrap_or(d.temp),
        top_p: as_f32(common.top_p).unwrap_or(d.top_p),
        min_p: as_f32(common.min_p).unwrap_or(d.min_p),
        frequency_penalty: as_f32(common.frequency_penalty).unwrap_or(d.frequency_penalty),
        presence_penalty: as_f32(common.presence_penalty).unwrap_or(d.presence_penalty),
        repeat_penalty: as_f32(common.repeat_penalty).unwrap_or(d.repeat_penalty),
        repeat_last_n,
        top_k,
        seed: seed_of_choice(common, &info.defaults, 0),
    };
    sampler.validate().map_err(|e| refused(&e))?;
    Ok(sampler)
}

/// The stop rule: the server's with the request's `confidence` and
/// `max_steps`, or its drafts' ([`speculative::decoding`]).
fn rule(common: &Common, info: &ModelInfo) -> Result<StepRule, ApiError> {
    let draft = match speculative::decoding(spec_fields(common), info.step.draft, info.draft_model)? {
        Decoding::DraftModel(d) => return d.rule(info.n_batch).map_err(|e| refused(&e)),
        Decoding::SelfVerified(d) => Some(d),
        Decoding::Macro => None,
    };
    let step = StepParams {
        confidence: as_f32(common.confidence).unwrap_or(info.step.confidence),
        max_steps: common.max_steps.map_or(info.step.max_steps, |s| usize::try_from(s).unwrap_or(usize::MAX)),
        draft,
        ..info.step
    };
    step.rule(info.max_steps).map_err(|e| refused(&e))
}

/// The stop strings (none empty).
fn stop_strings(common: &Common) -> Result<Vec<String>, ApiError> {
    let stop = match &common.stop {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::field("stop", "stop strings must not be empty"));
    }
    Ok(stop)
}

/// How many alternatives to return beside each token's log-probability;
/// `None`: no log-probabilities.
///
/// # Errors
/// A 400 naming the field: more than [`MAX_TOP_LOGPROBS`] alternatives,
/// or `top_logprobs` without `logprobs: true`.
fn logprobs(common: &Common) -> Result<Option<usize>, ApiError> {
    let top = common.top_logprobs.filter(|&n| n > 0);
    let (field, n) = match (common.logprobs, top) {
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

/// `logit_bias` as the sampler takes it: OpenAI's object (`{"id": bias}`)
/// or llama-server's list of `[token, bias]` pairs, where a key that is not
/// a token id is text (each of its tokens biased) and a bias of `false`
/// bans the token.
///
/// # Errors
/// A 400 naming `logit_bias`: another shape, a token id outside the
/// vocabulary, a bias outside -100..=100.
fn logit_bias(common: &Common, info: &ModelInfo) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |why: String| ApiError::field("logit_bias", why);
    let pairs: Vec<(Value, &Value)> = match &common.logit_bias {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(map)) => map.iter().map(|(k, b)| (Value::String(k.clone()), b)).collect(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([k, b]) => Ok((k.clone(), b)),
                _ => Err(bad("'logit_bias' lists [token, bias] pairs".into())),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(bad("'logit_bias' must be an object of token ids or a list of [token, bias] pairs".into()))
        }
    };
    let mut out = Vec::new();
    for (key, bias) in pairs {
        let bias = match bias {
            Value::Bool(false) => f32::NEG_INFINITY,
            b => match b.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => b as f32,
                _ => return Err(bad(format!("'logit_bias' of {key} is {b}: expected -100 to 100, or false"))),
            },
        };
        let ids = match &key {
            Value::Number(n) => vec![n.as_u64().and_then(|t| u32::try_from(t).ok()).unwrap_or(u32::MAX)],
            Value::String(s) => match s.parse::<u32>() {
                Ok(id) => vec![id],
                Err(_) => info.tokenizer.encode(s, false).map_err(|e| bad(e.to_string()))?,
            },
            _ => return Err(bad(format!("'logit_bias' key {key} is neither a token id nor text"))),
        };
        for id in ids {
            if id as usize >= info.n_vocab {
                return Err(bad(format!("'logit_bias' key {key} is not a token id below {}", info.n_vocab)));
            }
            out.push((id, bias));
        }
    }
    Ok(out)
}

/// The constraint every answer of the request obeys: its tools' call, else
/// the structured output it asks (CPU work: call it off the async workers).
///
/// # Errors
/// A 400 naming the field whose schema or grammar does not compile.
pub fn constraint(
    common: &Common,
    tools: Option<&ToolRequest>,
    info: &ModelInfo,
) -> Result<Option<Constraint>, ApiError> {
    if let Some(t) = tools {
        return t.constraint(info.grammars()).map(Some);
    }
    crate::structured::spec(common)?
        .map(|(spec, field)| crate::structured::compile(info.grammars(), &spec, field))
        .transpose()
}

/// The jobs of `n` choices of each of `prompts` (with its settings), all
/// ending at `deadline`, in index order, and the event channel of each
/// choice; at most `queue` jobs.
///
/// # Errors
/// A 400 naming `n` (or `prompt` for a list) when the request has more
/// choices than the queue holds.
fn fan_out(
    prompts: Vec<(Vec<u32>, JobParams)>,
    n: usize,
    common: &Common,
    defaults: &RequestDefaults,
    deadline: Instant,
    queue: usize,
) -> Result<(Vec<Job>, Vec<Receiver<Event>>), ApiError> {
    let total = prompts.len() * n;
    if total > queue {
        let field = if prompts.len() > 1 { "prompt" } else { "n" };
        return Err(ApiError::field(
            field,
            format!("{total} choices ({} prompts, n = {n}) exceed the server's queue of {queue}", prompts.len()),
        ));
    }
    let mut events = Vec::with_capacity(total);
    let jobs = prompts
        .into_iter()
        .flat_map(|(prompt, params)| (0..n).map(move |j| (prompt.clone(), params.clone(), j)))
        .map(|(prompt, mut params, j)| {
            let (tx, rx) = event_channel();
            events.push(rx);
            params.sampler.seed = seed_of_choice(common, defaults, j);
            Job { prompt, params, events: tx, deadline }
        })
        .collect();
    Ok((jobs, events))
}

/// One prompt of a request: its ids, and the text its answer starts with:
/// the prompt itself (`echo`), or the assistant message a chat continues.
pub struct Prompted {
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    /// The prompt's text (as sent, or its ids decoded), when echoed.
    pub echo: Option<String>,
    /// The final assistant message a chat's prompt continues (a prefill),
    /// which the answer starts with, as llama-server's does.
    pub prefill: Option<String>,
}

/// The text at the start of a prompt's choices' answers: the prompt echoed
/// (`echo`) or a chat's prefill.
pub struct Echo {
    /// The prompt's text (as sent, or its ids decoded), or the prefill.
    pub text: String,
    /// An echoed prompt's first token, which `logprobs` lists with no
    /// log-probability (`None` for a prefill, not the prompt's text).
    pub first: Option<u32>,
}

/// A request planned into jobs.
pub struct Planned {
    /// The jobs, by choice index.
    pub jobs: Vec<Job>,
    /// Each choice's event channel, by index.
    pub events: Vec<Receiver<Event>>,
    /// Choices per prompt.
    pub n: usize,
    /// Each prompt's echo, when the answers start with it (empty otherwise).
    pub echoes: Vec<Echo>,
    /// Whether the answers carry log-probabilities.
    pub logprobs: bool,
}

impl Planned {
    /// Makes every job obey `constraint`.
    pub fn constrain(&mut self, constraint: Option<&Constraint>) {
        for job in &mut self.jobs {
            job.params.constraint = constraint.cloned();
        }
    }
}

/// Plans `prompts` with the settings of `common`: every prompt's settings
/// checked, `n` choices each, ending at `deadline`, at most `queue` jobs
/// (the constraint is set apart: [`Planned::constrain`]).
///
/// # Errors
/// A 400 naming the field at fault.
pub fn plan(
    info: &ModelInfo,
    prompts: Vec<Prompted>,
    common: &Common,
    deadline: Instant,
    queue: usize,
) -> Result<Planned, ApiError> {
    let n = n_choices(common, info.n_slots)?;
    let mut jobs = Vec::with_capacity(prompts.len());
    let mut echoes = Vec::new();
    for Prompted { ids, echo, prefill } in prompts {
        check_vocab(info, "prompt", &ids)?;
        let params = job_params(common, info, ids.len(), echo.is_some())?;
        if let Some(text) = echo {
            echoes.push(Echo { text, first: Some(ids[0]) });
        } else if let Some(text) = prefill {
            echoes.push(Echo { text, first: None });
        }
        jobs.push((ids, params));
    }
    let logprobs = jobs.first().is_some_and(|(_, p)| p.logprobs.is_some());
    let (jobs, events) = fan_out(jobs, n, common, &info.defaults, deadline, queue)?;
    Ok(Planned { jobs, events, n, echoes, logprobs })
}
