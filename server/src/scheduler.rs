//! The engine thread: continuous batching over ONE [`Engine`]. ggml work
//! stays on this thread (the model and engine are not `Send`); the HTTP side
//! submits [`Job`]s through a bounded queue and receives [`Event`]s.
//!
//! Each iteration admits waiting jobs into free slots (one sequence each),
//! drops the sequences whose client left, runs ONE macro step over every
//! active sequence (prompt chunks of new requests mixed with the merged
//! inputs of running ones, then their micro steps, batched), and sends each
//! sequence the text of its step. Sequences join and leave between macro steps.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use hamburger::chat::ChatTemplate;
use hamburger::generate::{self, DecodeConfig, SeqGen};
use hamburger::kv_cache::SeqId;
use hamburger::tokenizer::{TextStream, Tokenizer};
use hamburger::{Engine, EngineParams, LoadOptions, Model, Sampler, SamplerParams, StepParams, StepRule, Timings};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::{self, Metrics};

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
    /// Render the model's chat template in child processes (see `hamburger::chat::Isolation`).
    pub template_isolation: Option<hamburger::chat::Isolation>,
}

/// What the HTTP side needs to know of the model.
pub struct ModelInfo {
    /// The model's name (`general.name`, else the file stem).
    pub name: String,
    /// KV cells each slot may use: the longest prompt plus completion (at one token per step).
    pub n_ctx_slot: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// The most tokens a macro step can emit.
    pub max_steps: usize,
    /// The server's stop rule, whose `confidence` and `max_steps` a request may override.
    pub step: StepParams,
    /// The embedded tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, if the model has one.
    pub chat_template: Option<ChatTemplate>,
    /// The end-of-generation tokens (never part of a response's text).
    pub eog: Vec<u32>,
}

/// A request's generation settings.
#[derive(Debug, Clone)]
pub struct JobParams {
    /// Tokens to generate at most.
    pub n_predict: usize,
    /// Sampling.
    pub sampler: SamplerParams,
    /// When its macro steps end: the server's rule with the request's `confidence` and `max_steps`.
    pub rule: StepRule,
    /// Texts that end the generation (not included in it).
    pub stop: Vec<String>,
    /// Generate past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Send the text of every macro step as it comes; otherwise only the
    /// whole text at the end (no wake-up of the HTTP side per step).
    pub stream: bool,
}

/// One request for the engine thread.
pub struct Job {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Its settings.
    pub params: JobParams,
    /// Where its events go; a closed channel means the client left.
    pub events: UnboundedSender<Event>,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token budget.
    Length,
}

/// What the engine thread tells a request.
#[derive(Debug, Clone)]
pub enum Event {
    /// One macro step's new text.
    Text(String),
    /// The end, with the statistics.
    Done {
        /// Why it ended.
        reason: FinishReason,
        /// The statistics.
        timings: Timings,
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

/// Queues jobs for the engine thread (one per HTTP handler, cloned).
#[derive(Clone)]
pub struct Submitter {
    jobs: SyncSender<Job>,
    metrics: Arc<Metrics>,
}

impl Submitter {
    /// Queues `job`.
    ///
    /// # Errors
    /// When the queue is full or the engine has stopped.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        metrics::add(&self.metrics.queue_depth, 1);
        let r = self.jobs.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => SubmitError::Full,
            TrySendError::Disconnected(_) => SubmitError::Closed,
        });
        match r {
            Ok(()) => metrics::add(&self.metrics.requests, 1),
            Err(_) => {
                self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                if r == Err(SubmitError::Full) {
                    metrics::add(&self.metrics.rejected, 1);
                }
            }
        }
        r
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
    thread: JoinHandle<()>,
}

impl Scheduler {
    /// Starts the engine thread and loads the model on it.
    ///
    /// # Errors
    /// When the model cannot be opened, the settings do not fit it, or the
    /// engine cannot be allocated.
    pub fn start(cfg: SchedulerConfig) -> Result<Scheduler, StartError> {
        let (jobs, rx) = mpsc::sync_channel(cfg.queue);
        let (ready_tx, ready_rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        let m = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || engine_thread(&cfg, &rx, &ready_tx, &m))
            .map_err(StartError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(info)) => {
                Ok(Scheduler { submitter: Submitter { jobs, metrics: metrics.clone() }, info, metrics, thread })
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StartError::Stopped),
        }
    }

    /// Stops taking jobs (once every clone of the submitter is gone too),
    /// lets the running ones finish, and joins the thread.
    pub fn shutdown(self) {
        drop(self.submitter);
        let _ = self.thread.join();
    }
}

/// A running request: its events and what has been sent of its text.
struct Slot<'t> {
    events: UnboundedSender<Event>,
    stop: Vec<String>,
    n_predict: usize,
    stream: bool,
    /// Turns the generated ids into text, a step at a time.
    detok: TextStream<'t>,
    /// Output ids already given to `detok`.
    decoded_ids: usize,
    /// The text so far (cut at a stop string).
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
    stopped_by_string: bool,
}

fn engine_thread(
    cfg: &SchedulerConfig,
    rx: &Receiver<Job>,
    ready: &mpsc::Sender<Result<Arc<ModelInfo>, StartError>>,
    m: &Metrics,
) {
    let model = match Model::open(&cfg.model, &cfg.load) {
        Ok(model) => model,
        Err(e) => return drop(ready.send(Err(StartError::Open(e)))),
    };
    let setup = || -> hamburger::Result<(Arc<ModelInfo>, Engine, DecodeConfig)> {
        let decode = DecodeConfig::new(&model, &cfg.step, cfg.engine.n_batch)?;
        let engine = Engine::new(&model, &cfg.engine)?;
        let tokenizer = Tokenizer::from_model(&model)?;
        let chat_template = ChatTemplate::of_model(&model, &tokenizer)?.map(|t| match &cfg.template_isolation {
            Some(isolation) => t.isolated(isolation.clone()),
            None => t,
        });
        let stem = cfg.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let info = ModelInfo {
            name: if model.name.is_empty() { stem } else { model.name.clone() },
            n_ctx_slot: cfg.engine.n_ctx / cfg.engine.n_seq,
            n_vocab: model.hp.n_vocab,
            max_steps: model.hp.max_steps,
            step: cfg.step,
            tokenizer,
            chat_template,
            eog: model.vocab.eog.clone(),
        };
        Ok((Arc::new(info), engine, decode))
    };
    let (info, mut engine, decode) = match setup() {
        Ok(x) => x,
        Err(e) => return drop(ready.send(Err(StartError::Model(cfg.model.clone(), e)))),
    };
    let _ = ready.send(Ok(info.clone()));
    metrics::set(&m.kv_cells_total, engine.kv().n_cells() as u64);
    let mut gens: Vec<SeqGen<'static>> = Vec::new();
    let mut slots: Vec<Slot> = Vec::new();
    let mut free: Vec<SeqId> = (0..cfg.engine.n_seq).rev().collect();
    let mut open = true;
    while open || !gens.is_empty() {
        // Admit: block for a job only when nothing is running.
        while open && !free.is_empty() {
            let job = if gens.is_empty() { rx.recv().map_err(|_| TryRecvError::Disconnected) } else { rx.try_recv() };
            let job = match job {
                Ok(job) => job,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            };
            m.queue_depth.fetch_sub(1, Ordering::Relaxed);
            if job.events.is_closed() {
                metrics::add(&m.cancelled, 1);
                continue;
            }
            let seq = free.pop().expect("a free slot");
            engine.clear_seq(seq);
            let p = &job.params;
            let mut sg = SeqGen::new(seq, &job.prompt, p.n_predict, Sampler::new(p.sampler)).with_rule(p.rule);
            if p.ignore_eos {
                sg = sg.ignoring_eog();
            }
            metrics::add(&m.prompt_tokens, job.prompt.len() as u64);
            gens.push(sg);
            slots.push(Slot {
                events: job.events,
                stop: p.stop.clone(),
                n_predict: p.n_predict,
                stream: p.stream,
                detok: TextStream::new(&info.tokenizer),
                decoded_ids: 0,
                text: String::new(),
                sent: 0,
                stopped_by_string: false,
            });
        }
        // Leave: sequences whose client has gone.
        for i in (0..gens.len()).rev() {
            if slots[i].events.is_closed() {
                release(&mut engine, &mut free, gens.swap_remove(i).seq());
                slots.swap_remove(i);
                metrics::add(&m.cancelled, 1);
            }
        }
        set_gauges(m, &engine, gens.len());
        if gens.is_empty() {
            continue;
        }
        let forwards = engine.n_forwards();
        let steps_of = |gens: &[SeqGen]| gens.iter().map(|g| g.generation().macro_steps.len() as u64).sum::<u64>();
        let steps_before = steps_of(&gens);
        let t = Instant::now();
        let result = generate::macro_step(&mut engine, &decode, &mut gens);
        log::trace!("macro step over {} sequences: {:.1} ms", gens.len(), t.elapsed().as_secs_f64() * 1e3);
        metrics::add(&m.base_forwards, (engine.n_forwards() - forwards) as u64);
        metrics::add(&m.macro_steps, steps_of(&gens) - steps_before);
        if let Err(e) = result {
            log::error!("macro step failed: {e}");
            for (sg, slot) in gens.drain(..).zip(slots.drain(..)) {
                let _ = slot.events.send(Event::Failed(e.to_string()));
                release(&mut engine, &mut free, sg.seq());
            }
            continue;
        }
        for i in (0..gens.len()).rev() {
            send_text(&info, &mut gens[i], &mut slots[i], &engine);
            if gens[i].is_done() {
                let (sg, slot) = (gens.swap_remove(i), slots.swap_remove(i));
                let timings = sg.generation().timings.clone();
                metrics::add(&m.generated_tokens, timings.gen_tokens as u64);
                let reason = if !slot.stopped_by_string && timings.gen_tokens >= slot.n_predict {
                    FinishReason::Length
                } else {
                    FinishReason::Stop
                };
                let _ = slot.events.send(Event::Done { reason, timings });
                release(&mut engine, &mut free, sg.seq());
            }
        }
        set_gauges(m, &engine, gens.len());
    }
}

/// The gauges of what is running: sequences and KV cells in use.
fn set_gauges(m: &Metrics, engine: &Engine, running: usize) {
    metrics::set(&m.processing, running as u64);
    metrics::set(&m.kv_cells_used, engine.kv().n_used() as u64);
}

/// Frees sequence `seq`'s cells and its slot.
fn release(engine: &mut Engine, free: &mut Vec<SeqId>, seq: SeqId) {
    engine.clear_seq(seq);
    free.push(seq);
}

/// Sends the text generated since the last call (a streaming request's, or
/// at the end): end-of-generation tokens are left out, a stop string ends the
/// sequence (and is cut with what follows it), and a tail that may still
/// become a stop string is held back (the [`TextStream`] holds back an
/// incomplete UTF-8 character).
fn send_text(info: &ModelInfo, sg: &mut SeqGen, slot: &mut Slot, engine: &Engine) {
    if !slot.stream && slot.stop.is_empty() && !sg.is_done() {
        return;
    }
    let out = &sg.generation().output_ids;
    let new: Vec<u32> = out[slot.decoded_ids..].iter().copied().filter(|t| !info.eog.contains(t)).collect();
    slot.decoded_ids = out.len();
    slot.text.push_str(&slot.detok.push(&new));
    let text = &mut slot.text;
    if let Some(at) = slot.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
        text.truncate(at);
        slot.stopped_by_string = true;
        sg.stop(engine);
    }
    let mut end = text.len();
    if !sg.is_done() {
        let held = slot
            .stop
            .iter()
            .flat_map(|s| (1..s.len()).filter(move |&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|prefix| text.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        end -= held;
    }
    if (slot.stream || sg.is_done()) && end > slot.sent && text.is_char_boundary(slot.sent) {
        let _ = slot.events.send(Event::Text(text[slot.sent..end].to_string()));
        slot.sent = end;
    }
}
