//! What the engine thread works on and answers, the contract between the
//! planning of a request ([`crate::plan`]) and the engine loop
//! ([`crate::scheduler`]): a [`Job`] (one choice of one prompt: its token
//! ids and [`JobParams`]), the [`Event`]s it answers, and the facts of the
//! loaded model ([`ModelInfo`]). Nothing here knows HTTP or tool formats.

use std::collections::HashSet;
use std::time::Instant;

use hamburger::chat::ChatTemplate;
use hamburger::constraint::{Constraint, Grammars};
use hamburger::tokenizer::Tokenizer;
use hamburger::{SamplerParams, StepParams, StepRule, Timings, TokenLogprob};
use tokio::sync::mpsc;

/// Events one job's channel holds before the engine holds text back: a
/// reader slower than the engine gets the text of several macro steps in
/// one event (the stream is paced, never an unbounded queue), and the last
/// place is kept for the end.
pub const EVENTS_PER_JOB: usize = 8;

/// What the HTTP side needs to know of the model.
pub struct ModelInfo {
    /// The model's name (the alias, else `general.name`, else the file stem).
    pub name: String,
    /// Tokens a request that sets no `max_tokens` may generate (`None`: as
    /// many as its context may hold).
    pub n_predict: Option<usize>,
    /// KV cells of the pool every request draws from: one per prompt token
    /// and one per macro step of the answer (shared prompt prefixes once).
    pub n_ctx: usize,
    /// The engine's slots (sequences decoded together, `-np`): also the most
    /// choices one prompt's `n` may ask for.
    pub n_slots: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// The most tokens a macro step can emit.
    pub max_steps: usize,
    /// The server's stop rule, whose `confidence` and `max_steps` a request may override.
    pub step: StepParams,
    /// The embedded tokenizer.
    pub tokenizer: Tokenizer,
    /// The compiler of requests' constraints (None: the tokenizer cannot serve them).
    pub grammars: Option<Grammars>,
    /// The chat template, if the model has one.
    pub chat_template: Option<ChatTemplate>,
    /// The end-of-generation tokens.
    pub eog: Vec<u32>,
    /// The end-of-generation and special tokens: never part of a response's text.
    pub hidden: HashSet<u32>,
}

/// A request's generation settings.
#[derive(Debug, Clone)]
pub struct JobParams {
    /// Tokens to generate at most (0: none, the prompt alone is answered).
    pub n_predict: usize,
    /// Sampling.
    pub sampler: SamplerParams,
    /// Added to the logits of these tokens (`logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// Return each token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
    /// Score the prompt's tokens too, with this many alternatives (`echo`
    /// with `logprobs`): the base's log-probability of each prompt token
    /// after the first, from the logits of every prompt row
    /// ([`hamburger::Engine::score`]), computed only when asked.
    pub prompt_logprobs: Option<usize>,
    /// When its macro steps end: the server's rule with the request's `confidence` and `max_steps`.
    pub rule: StepRule,
    /// Texts that end the generation (not included in it).
    pub stop: Vec<String>,
    /// Generate past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Adopt the cached KV entries of the longest start of the prompt (llama-server's
    /// `cache_prompt`); otherwise the whole prompt is processed.
    pub cache_prompt: bool,
    /// Send the text of every macro step as it comes; otherwise only the
    /// whole text at the end (no wake-up of the HTTP side per step).
    pub stream: bool,
    /// The structured-output constraint (`response_format`, `grammar`, `json_schema`, `tools`).
    pub constraint: Option<Constraint>,
}

/// One request for the engine thread.
pub struct Job {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Its settings.
    pub params: JobParams,
    /// Where its events go ([`EVENTS_PER_JOB`] at most waiting); a closed
    /// channel means the client left.
    pub events: mpsc::Sender<Event>,
    /// When the generation stops and answers what it has, `finish_reason`
    /// "length" (llama-server's `t_max_predict_ms`), waiting time included.
    pub deadline: Instant,
}

/// A job's event channel: the sender for the [`Job`], the receiver for whoever answers it.
pub fn event_channel() -> (mpsc::Sender<Event>, mpsc::Receiver<Event>) {
    mpsc::channel(EVENTS_PER_JOB)
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token budget, or the deadline.
    Length,
}

/// What the engine thread tells a request.
#[derive(Debug, Clone)]
pub enum Event {
    /// New text of a streaming request: one macro step's, unless text was
    /// held back (a tail that may become a stop string, an incomplete UTF-8
    /// character, a reader that had not taken the earlier events) and now
    /// goes out with a later step's.
    Text {
        /// The text.
        text: String,
        /// Generated tokens since the previous `Text`.
        tokens: usize,
        /// Macro steps since the previous `Text`.
        steps: usize,
        /// The log-probabilities of those tokens, when the request asked
        /// (a stop string's cut tokens never among them).
        logprobs: Vec<TokenLogprob>,
    },
    /// The end, with the statistics.
    Done {
        /// Why it ended.
        reason: FinishReason,
        /// The statistics.
        timings: Timings,
        /// The log-probabilities of the counted tokens that no `Text` carried
        /// (those whose text was empty, an end-of-generation token), when the
        /// request asked: the `Text`s' and these together are every counted token's.
        logprobs: Vec<TokenLogprob>,
        /// The log-probability of each prompt token after the first, when
        /// the request asked ([`JobParams::prompt_logprobs`]).
        prompt_logprobs: Vec<TokenLogprob>,
    },
    /// The generation failed.
    Failed(String),
}
