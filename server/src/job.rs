//! What the engine thread works on and answers, the contract between the
//! planning of a request ([`crate::plan`]) and the engine loop
//! ([`crate::scheduler`]): a [`Job`] (one choice of one prompt: its token
//! ids and [`JobParams`]), the [`Event`]s it answers, and the facts of the
//! loaded model ([`ModelInfo`]). Nothing here knows HTTP or tool formats.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Instant;

use hamburger::chat::ChatTemplate;
use hamburger::constraint::{Constraint, Grammars};
use hamburger::draft_model::DraftModelParams;
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
    /// The cells one request's context may take: the whole pool, or
    /// llama-server's slot context (`-c` / `-np` without `--kv-unified`).
    pub n_ctx_seq: usize,
    /// What a request that sets nothing gets.
    pub defaults: RequestDefaults,
    /// Inputs per forward, all sequences together (`-b`): a verify forward
    /// takes a request's drafts and one more.
    pub n_batch: usize,
    /// The engine's slots (sequences decoded together, `-np`): also the most
    /// choices one prompt's `n` may ask for.
    pub n_slots: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// The most tokens a macro step can emit.
    pub max_steps: usize,
    /// Whether the engine fuses attention (`-fa`, or what auto chose).
    pub flash_attn: bool,
    /// The server's stop rule, whose `confidence` and `max_steps` a request may override.
    pub step: StepParams,
    /// The drafts of the server's draft model (`-md`), when it has one: a
    /// request's `speculative.*` fields may change them.
    pub draft_model: Option<DraftModelParams>,
    /// Benchmarks: its drafts accepted at these rates, not checked (`--spec-synth-rates`).
    pub synthetic_rates: Option<Vec<f64>>,
    /// The embedded tokenizer.
    pub tokenizer: Tokenizer,
    /// The compiler of requests' constraints, built by the first request
    /// that needs one ([`ModelInfo::grammars`]).
    pub grammars: OnceLock<Option<Grammars>>,
    /// The chat template, if the model has one.
    pub chat_template: Option<ChatTemplate>,
    /// The end-of-generation tokens.
    pub eog: Vec<u32>,
    /// The end-of-generation and special tokens: never part of a response's text.
    pub hidden: HashSet<u32>,
}

impl ModelInfo {
    /// The compiler of requests' constraints (None: the tokenizer cannot
    /// serve them). It is built on first use, as llama-server builds its
    /// llguidance tokenizer only for a grammar request: the vocabulary trie
    /// and llguidance's token slices take ~0.4 s for a 49k vocabulary, which
    /// a server that never sees a grammar, schema or tool should not pay at
    /// every start.
    pub fn grammars(&self) -> Option<&Grammars> {
        self.grammars
            .get_or_init(|| {
                let start = std::time::Instant::now();
                let grammars = Grammars::new(&self.tokenizer, &self.eog)
                    .inspect_err(|e| log::warn!("structured output is off: {e}"))
                    .ok()?;
                log::info!("built the structured-output compiler in {} ms", start.elapsed().as_millis());
                Some(grammars)
            })
            .as_ref()
    }
}

/// The server's settings for what a request leaves out (llama-server's
/// sampling flags, `--seed`, and the slot context).
#[derive(Debug, Clone, Default)]
pub struct RequestDefaults {
    /// Sampling (`--temp`, `--top-k`, ...; the seed is `seed`).
    pub sampler: SamplerParams,
    /// The seed of requests that set none (`None`: a random one each, llama-server's -1).
    pub seed: Option<u64>,
    /// The most cells one request's context may take (`None`: the whole
    /// pool, llama-server's `--kv-unified`).
    pub n_ctx_seq: Option<usize>,
    /// Answer every request's prompt in `__verbose` (llama-server's `--verbose`).
    pub verbose: bool,
    /// Variables every chat template render gets (`enable_thinking`, from
    /// `--reasoning`), which a request's `chat_template_kwargs` override.
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
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
    /// Those log-probabilities under the distribution each token was drawn
    /// from, after the sampler's truncation (`post_sampling_probs`).
    pub post_sampling: bool,
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
    /// Send the statistics so far with every text (`timings_per_token`).
    pub timings_per_token: bool,
    /// Report the prompt's progress: once before it is read, then after
    /// each forward that reads some of it (`return_progress`, streamed only).
    pub return_progress: bool,
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

/// How a generation ended.
#[derive(Debug, Clone)]
pub struct End {
    /// Why.
    pub reason: FinishReason,
    /// The stop string that ended it, if one did.
    pub stop_word: Option<String>,
    /// Whether its context filled the cells a request may take (llama-server's `truncated`).
    pub truncated: bool,
    /// The answer's token ids (those of its text; a stop string's cut tokens not among them).
    pub ids: Vec<u32>,
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
        /// Those tokens' ids.
        ids: Vec<u32>,
        /// The statistics so far, when the request asked (`timings_per_token`).
        timings: Option<Timings>,
    },
    /// How much of the prompt has been read (`return_progress`).
    Progress {
        /// The prompt's tokens.
        total: usize,
        /// Those whose KV entries were reused.
        cache: usize,
        /// Those reused or read so far.
        processed: usize,
        /// The statistics so far.
        timings: Timings,
    },
    /// The end, with the statistics.
    Done {
        /// Why it ended, and the answer's tokens.
        end: End,
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
