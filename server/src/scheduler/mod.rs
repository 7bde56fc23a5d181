//! The engine thread: continuous batching over ONE [`hamburger::Engine`].
//! ggml work stays on this thread (the model and engine are not `Send`);
//! planned requests come as [`crate::job::Job`]s through a bounded queue and
//! are answered with [`crate::job::Event`]s. It knows jobs, not HTTP, request
//! fields or tool formats.
//!
//! * this module: the handles ([`Scheduler`], [`Submitter`]) that start,
//!   feed and stop the thread;
//! * `engine_loop`: the thread's loop (take jobs, drop the cancelled, admit,
//!   make room, step, cache the fed prompts, deliver);
//! * `admission`: who decodes and in which cells: admission, waiting for a
//!   shared prompt being fed, preemption and resumption;
//! * `pool`: the one pool of KV cells: free sequences, cells taken and given
//!   back; `prefix_cache`: the cached entries by the tokens they cover,
//!   shared by every sequence that starts with them, least recently used
//!   taken back first;
//! * `drafting`: the draft model (`-md`), which drafts for the running
//!   requests before each macro step;
//! * `request`: one running request, the single owner of its generation,
//!   its text (`answer_text`: cut at stop strings, searched incrementally)
//!   and its bounded event channel;
//! * [`slot_board`]: what each sequence is doing, published by the thread
//!   for `/slots` before any answer that ends a request goes out.

mod admission;
mod answer_text;
mod drafting;
mod engine_loop;
#[cfg(test)]
pub(crate) mod fault;
mod pool;
mod prefix_cache;
mod request;
pub mod slot_board;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use hamburger::{EngineParams, LoadOptions, StepParams};
use tokio::sync::watch;

pub use drafting::DraftModelConfig;

use crate::job::{Job, ModelInfo};
use crate::metrics::{self, Metrics};
use slot_board::SlotBoard;

/// How the server runs its model.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// The HAMburger GGUF.
    pub model: PathBuf,
    /// Device, offload and repacking.
    pub load: LoadOptions,
    /// The engine: `n_seq` sequences decoded together (`-np`), drawing on
    /// one pool of `n_ctx` KV cells.
    pub engine: EngineParams,
    /// The stop rule of requests that do not set theirs.
    pub step: StepParams,
    /// Requests that may wait for a slot; more are refused.
    pub queue: usize,
    /// Jinja source of the chat template to use instead of the model's
    /// (llama-server's `--chat-template-file`).
    pub chat_template: Option<String>,
    /// Render the chat template (the model's or `chat_template`) as the
    /// built-in template llama.cpp detects it as, as llama-server does
    /// with `--no-jinja` (the suite's default).
    pub no_jinja: bool,
    /// Render the model's chat template in child processes (see `hamburger::chat::Isolation`).
    pub template_isolation: Option<hamburger::chat::Isolation>,
    /// The name `/v1/models` and every answer report (llama-server's
    /// `--alias`); `None`: the model's own.
    pub alias: Option<String>,
    /// Tokens a request that sets no `max_tokens` may generate (llama-server's
    /// `--n-predict`); `None`: until its context fills the pool.
    pub n_predict: Option<usize>,
    /// What a request that sets nothing gets (sampling, seed, its context).
    pub defaults: crate::job::RequestDefaults,
    /// A draft model (llama-server's `-md`) that drafts for the requests
    /// that set no other `speculative.type`.
    pub draft: Option<DraftModelConfig>,
}

impl SchedulerConfig {
    /// The KV cells one request may take: its slot context
    /// (`defaults.n_ctx_seq`), at most the whole pool.
    pub fn n_ctx_seq(&self) -> usize {
        self.defaults.n_ctx_seq.map_or(self.engine.n_ctx, |n| n.min(self.engine.n_ctx))
    }
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

/// Queues jobs for the engine thread (one per HTTP handler, cloned).
#[derive(Clone)]
pub struct Submitter {
    jobs: Sender<Vec<Job>>,
    /// Jobs that may wait (`queue_depth` counts them).
    limit: u64,
    metrics: Arc<Metrics>,
}

impl Submitter {
    /// Queues the jobs of one request, all of them or none: each counts
    /// against the queue's limit.
    ///
    /// # Errors
    /// When the queue has no room for all of them, or the engine has stopped.
    pub fn submit(&self, jobs: Vec<Job>) -> Result<(), SubmitError> {
        let n = jobs.len() as u64;
        let r = if self.metrics.queue_depth.fetch_add(n, Ordering::Relaxed) + n > self.limit {
            Err(SubmitError::Full)
        } else {
            self.jobs.send(jobs).map_err(|_| SubmitError::Closed)
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
        let metrics = Arc::new(Metrics::new());
        let m = metrics.clone();
        let limit = cfg.queue as u64;
        let slots = Arc::new(SlotBoard::new(cfg.engine.n_seq, cfg.n_ctx_seq()));
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
