//! The engine thread: continuous batching over ONE [`hamburger::Engine`].
//! ggml work stays on this thread (the model and engine are not `Send`); the
//! HTTP side submits [`Job`]s through a bounded queue and receives
//! [`Event`]s.
//!
//! * this module: the jobs, their events, and the handles ([`Scheduler`],
//!   [`Submitter`]) that start, feed and stop the thread;
//! * `engine_loop`: the thread's loop (take jobs, drop the cancelled, admit,
//!   step, deliver);
//! * `request`: one running request, the single owner of its generation,
//!   stop state, text and event channel;
//! * `slots`: the free slots and the tokens their KV cells hold, for
//!   prompt-prefix reuse;
//! * [`slot_board`]: what each slot is doing, published by the thread once
//!   per loop iteration for `/slots`.

mod engine_loop;
mod request;
pub mod slot_board;
mod slots;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use hamburger::chat::ChatTemplate;
use hamburger::constraint::{Constraint, Grammars};
use hamburger::tokenizer::Tokenizer;
use hamburger::{EngineParams, LoadOptions, SamplerParams, StepParams, StepRule, Timings, TokenLogprob};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use crate::metrics::{self, Metrics};
use slot_board::SlotBoard;

/// How the server runs its model.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// The HAMburger GGUF.
    pub model: PathBuf,
    /// Device, offload and repacking.
    pub load: LoadOptions,
    /// The engine: one sequence per slot (`n_seq`), `n_ctx` the KV cells of all slots together.
    pub engine: EngineParams,
    /// The stop rule of requests that do not set theirs.
    pub step: StepParams,
    /// Requests that may wait for a slot; more are refused.
    pub queue: usize,
    /// Jinja source of the chat template to use instead of the model's
    /// (llama-server's `--chat-template-file`).
    pub chat_template: Option<String>,
    /// Render the model's chat template in child processes (see `hamburger::chat::Isolation`).
    pub template_isolation: Option<hamburger::chat::Isolation>,
    /// The name `/v1/models` and every answer report (llama-server's
    /// `--alias`); `None`: the model's own.
    pub alias: Option<String>,
    /// Tokens a request that sets no `max_tokens` may generate (llama-server's
    /// `--n-predict`); `None`: until its slot's context is full.
    pub n_predict: Option<usize>,
}

/// What the HTTP side needs to know of the model.
pub struct ModelInfo {
    /// The model's name (the alias, else `general.name`, else the file stem).
    pub name: String,
    /// Tokens a request that sets no `max_tokens` may generate (`None`: the slot's room).
    pub n_predict: Option<usize>,
    /// KV cells each slot may use (its share of the cache): one per prompt
    /// token and one per macro step of the answer.
    pub n_ctx_slot: usize,
    /// The engine's slots (sequences): the most choices one prompt's `n` may ask for,
    /// since a prompt's choices are admitted together.
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
    /// How the template's model writes a tool call (None: it renders no tools).
    pub tool_format: Option<crate::tools::CallFormat>,
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
    /// Reuse the KV entries of the free slot whose cells hold the longest
    /// start of the prompt (llama-server's `cache_prompt`); otherwise the
    /// whole prompt is processed.
    pub cache_prompt: bool,
    /// Send the text of every macro step as it comes; otherwise only the
    /// whole text at the end (no wake-up of the HTTP side per step).
    pub stream: bool,
    /// The structured-output constraint (`response_format`, `grammar`, `json_schema`).
    pub constraint: Option<Constraint>,
}

/// One request for the engine thread.
pub struct Job {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Its settings.
    pub params: JobParams,
    /// Where its events go; a closed channel means the client left.
    pub events: UnboundedSender<Event>,
    /// When the generation stops and answers what it has, `finish_reason`
    /// "length" (llama-server's `t_max_predict_ms`), waiting time included.
    pub deadline: Instant,
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
    /// character) and now goes out with a later step's.
    Text {
        /// The text.
        text: String,
        /// Generated tokens since the previous `Text` (a step's tokens).
        tokens: usize,
        /// Macro steps since the previous `Text` (1 unless text was held).
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

/// Why the engine thread did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The model file could not be opened (the error names it).
    #[error(transparent)]
    Open(hamburger::Error),
    /// The settings do not fit the model or the machine, or its tokenizer or template fails.
    #[error("{}", .0.display())]
    Model(PathBuf, #[source] hamburger::Error),
    /// The thread could not be created.
    #[error("cannot start the engine thread")]
    Thread(#[source] std::io::Error),
    /// The thread ended before it said whether the model loaded.
    #[error("the engine thread stopped while loading the model")]
    Stopped,
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue is full.
    Full,
    /// The engine thread has stopped.
    Closed,
}

/// Jobs the engine thread admits together, each into its own slot, once
/// slots for all of them are free, so they decode in the same macro steps:
/// the `n` choices of one prompt.
pub type JobGroup = Vec<Job>;

/// Queues jobs for the engine thread (one per HTTP handler, cloned).
#[derive(Clone)]
pub struct Submitter {
    jobs: Sender<JobGroup>,
    /// Jobs that may wait (`queue_depth` counts them).
    limit: u64,
    metrics: Arc<Metrics>,
}

impl Submitter {
    /// Queues the groups of one request, all of them or none: a request's
    /// jobs count one each against the queue's limit.
    ///
    /// # Errors
    /// When the queue has no room for all of them, or the engine has stopped.
    pub fn submit(&self, groups: Vec<JobGroup>) -> Result<(), SubmitError> {
        let n = groups.iter().map(Vec::len).sum::<usize>() as u64;
        let r = if self.metrics.queue_depth.fetch_add(n, Ordering::Relaxed) + n > self.limit {
            Err(SubmitError::Full)
        } else {
            groups.into_iter().try_for_each(|g| self.jobs.send(g)).map_err(|_| SubmitError::Closed)
        };
        match r {
            Ok(()) => metrics::add(&self.metrics.requests, n),
            Err(_) => {
                self.metrics.queue_depth.fetch_sub(n, Ordering::Relaxed);
                if r == Err(SubmitError::Full) {
                    metrics::add(&self.metrics.rejected, 1);
                }
            }
        }
        r
    }

    /// The most jobs that may wait: a request of more choices can never be queued.
    pub fn limit(&self) -> usize {
        usize::try_from(self.limit).unwrap_or(usize::MAX)
    }
}

/// The handle of the engine thread.
pub struct Scheduler {
    /// Queues jobs.
    pub submitter: Submitter,
    /// What the HTTP side needs to know of the model.
    pub info: Arc<ModelInfo>,
    /// The counters.
    pub metrics: Arc<Metrics>,
    /// True while the engine thread runs; false once it has stopped (or died).
    pub alive: watch::Receiver<bool>,
    /// What each slot is doing, as the engine thread last published it.
    pub slots: Arc<SlotBoard>,
    thread: JoinHandle<()>,
}

/// Tells [`Scheduler::alive`] that the engine thread stopped, however it
/// stopped (a panic unwinds through it too).
struct AliveGuard(watch::Sender<bool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

impl Scheduler {
    /// Starts the engine thread and loads the model on it.
    ///
    /// # Errors
    /// When the model cannot be opened, the settings do not fit it, or the
    /// engine cannot be allocated.
    pub fn start(cfg: SchedulerConfig) -> Result<Scheduler, StartError> {
        let (jobs, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (alive_tx, alive) = watch::channel(true);
        let metrics = Arc::new(Metrics::default());
        let m = metrics.clone();
        let limit = cfg.queue as u64;
        let slots = Arc::new(SlotBoard::new(cfg.engine.n_seq, cfg.engine.n_ctx / cfg.engine.n_seq.max(1)));
        let board = slots.clone();
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                let _alive = AliveGuard(alive_tx);
                engine_loop::run(&cfg, &rx, &ready_tx, &m, &board);
            })
            .map_err(StartError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(info)) => Ok(Scheduler {
                submitter: Submitter { jobs, limit, metrics: metrics.clone() },
                info,
                metrics,
                alive,
                slots,
                thread,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StartError::Stopped),
        }
    }

    /// Stops taking jobs (once every clone of the submitter is gone too),
    /// lets the running ones finish, and joins the thread.
    ///
    /// # Errors
    /// When the engine thread panicked.
    pub fn shutdown(self) -> Result<(), String> {
        drop(self.submitter);
        self.thread.join().map_err(|_| "the engine thread panicked".to_string())
    }
}
