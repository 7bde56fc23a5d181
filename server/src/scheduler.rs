//! The engine thread: continuous batching over ONE [`Engine`]. ggml work
//! stays on this thread (the model and engine are not `Send`); the HTTP side
//! submits [`Job`]s through a bounded queue and receives [`Event`]s.
//!
//! Each iteration takes the newly queued jobs, drops the waiting and running
//! ones whose client left (so a client that leaves is noticed within one
//! macro step), ends the ones past their deadline, admits waiting jobs into
//! free slots (one sequence each), runs ONE macro step over every
//! active sequence (prompt chunks of new requests mixed with the merged
//! inputs of running ones, then their micro steps, batched), and sends each
//! sequence the text of its step. Sequences join and leave between macro steps.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use hamburger::chat::ChatTemplate;
use hamburger::constraint::{Constraint, Grammars};
use hamburger::generate::{self, DecodeConfig, SeqGen};
use hamburger::kv_cache::SeqId;
use hamburger::tokenizer::{TextStream, Tokenizer};
use hamburger::{Engine, EngineParams, LoadOptions, Model, Sampler, SamplerParams, StepParams, StepRule, Timings};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

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
    jobs: Sender<Job>,
    /// Jobs that may wait (`queue_depth` counts them).
    limit: u64,
    metrics: Arc<Metrics>,
}

impl Submitter {
    /// Queues `job`.
    ///
    /// # Errors
    /// When the queue is full or the engine has stopped.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        let r = if self.metrics.queue_depth.fetch_add(1, Ordering::Relaxed) >= self.limit {
            Err(SubmitError::Full)
        } else {
            self.jobs.send(job).map_err(|_| SubmitError::Closed)
        };
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
    /// True while the engine thread runs; false once it has stopped (or died).
    pub alive: watch::Receiver<bool>,
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
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                let _alive = AliveGuard(alive_tx);
                engine_thread(&cfg, &rx, &ready_tx, &m);
            })
            .map_err(StartError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(info)) => Ok(Scheduler {
                submitter: Submitter { jobs, limit, metrics: metrics.clone() },
                info,
                metrics,
                alive,
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

/// A running request: its events and what has been sent of its text.
struct Slot<'t> {
    /// The request's number since the server started (in its log line).
    task: u64,
    events: UnboundedSender<Event>,
    stop: Vec<String>,
    n_predict: usize,
    stream: bool,
    ignore_eos: bool,
    deadline: Instant,
    /// Turns the generated ids into text, a step at a time.
    detok: TextStream<'t>,
    /// Output ids already given to `detok`.
    decoded_ids: usize,
    /// The text so far (cut at a stop string).
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
    stopped_by_string: bool,
    /// The tokens up to the one that completed the stop string (those after
    /// it, in the same macro step, are not part of the answer).
    n_tokens_to_stop: Option<usize>,
    timed_out: bool,
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
        let hidden = model.vocab.eog.iter().copied().chain(tokenizer.special_ids()).collect();
        let info = ModelInfo {
            name: cfg.alias.clone().unwrap_or(if model.name.is_empty() { stem } else { model.name.clone() }),
            n_predict: cfg.n_predict,
            n_ctx_slot: cfg.engine.n_ctx / cfg.engine.n_seq,
            n_vocab: model.hp.n_vocab,
            max_steps: model.hp.max_steps,
            step: cfg.step,
            grammars: Grammars::new(&tokenizer, &model.vocab.eog)
                .inspect_err(|e| log::warn!("structured output is off: {e}"))
                .ok(),
            tokenizer,
            chat_template,
            eog: model.vocab.eog.clone(),
            hidden,
        };
        Ok((Arc::new(info), engine, decode))
    };
    let (info, mut engine, decode) = match setup() {
        Ok(x) => x,
        Err(e) => return drop(ready.send(Err(StartError::Model(cfg.model.clone(), e)))),
    };
    let _ = ready.send(Ok(info.clone()));
    let mut tasks = 0u64;
    metrics::set(&m.kv_cells_total, engine.kv().n_cells() as u64);
    let mut gens: Vec<SeqGen<'static>> = Vec::new();
    let mut slots: Vec<Slot> = Vec::new();
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut free: Vec<SeqId> = (0..cfg.engine.n_seq).rev().collect();
    let mut open = true;
    while open || !gens.is_empty() || !waiting.is_empty() {
        // Take the queued jobs: block for one only when nothing runs or waits.
        while open {
            let idle = gens.is_empty() && waiting.is_empty();
            match if idle { rx.recv().map_err(|_| TryRecvError::Disconnected) } else { rx.try_recv() } {
                Ok(job) => waiting.push_back(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        // Leave: waiting jobs and running sequences whose client has gone.
        let n_waiting = waiting.len();
        waiting.retain(|job| !job.events.is_closed());
        let gone = (n_waiting - waiting.len()) as u64;
        m.queue_depth.fetch_sub(gone, Ordering::Relaxed);
        metrics::add(&m.cancelled, gone);
        for i in (0..gens.len()).rev() {
            if slots[i].events.is_closed() {
                release(&mut engine, &mut free, gens.swap_remove(i).seq());
                slots.swap_remove(i);
                metrics::add(&m.cancelled, 1);
            }
        }
        // Admit waiting jobs into free slots.
        while let Some(seq) = free.last().copied().filter(|_| !waiting.is_empty()) {
            let job = waiting.pop_front().expect("a waiting job");
            free.pop();
            m.queue_depth.fetch_sub(1, Ordering::Relaxed);
            engine.clear_seq(seq);
            let p = &job.params;
            let mut sg = SeqGen::new(seq, &job.prompt, p.n_predict, Sampler::new(p.sampler)).with_rule(p.rule);
            if p.ignore_eos {
                sg = sg.ignoring_eog();
            }
            if let Some(c) = &p.constraint {
                sg = sg.constrained(c.start());
            }
            metrics::add(&m.prompt_tokens, job.prompt.len() as u64);
            gens.push(sg);
            tasks += 1;
            slots.push(Slot {
                task: tasks,
                events: job.events,
                stop: p.stop.clone(),
                n_predict: p.n_predict,
                stream: p.stream,
                ignore_eos: p.ignore_eos,
                deadline: job.deadline,
                detok: TextStream::new(&info.tokenizer),
                decoded_ids: 0,
                text: String::new(),
                sent: 0,
                stopped_by_string: false,
                n_tokens_to_stop: None,
                timed_out: false,
            });
        }
        // Deadline: the sequences past theirs end with what they have.
        let now = Instant::now();
        for (sg, slot) in gens.iter_mut().zip(&mut slots).filter(|(_, slot)| now >= slot.deadline) {
            slot.timed_out = true;
            sg.stop(&engine);
        }
        answer_finished(&info, m, &mut engine, &mut free, &mut gens, &mut slots);
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
        answer_finished(&info, m, &mut engine, &mut free, &mut gens, &mut slots);
        set_gauges(m, &engine, gens.len());
    }
}

/// Sends every sequence its new text, and the finished ones their end: why
/// they ended and their statistics, counting the tokens of the answer.
fn answer_finished(
    info: &ModelInfo,
    m: &Metrics,
    engine: &mut Engine,
    free: &mut Vec<SeqId>,
    gens: &mut Vec<SeqGen>,
    slots: &mut Vec<Slot>,
) {
    for i in (0..gens.len()).rev() {
        send_text(info, &mut gens[i], &mut slots[i], engine);
        if !gens[i].is_done() {
            continue;
        }
        let (sg, slot) = (gens.swap_remove(i), slots.swap_remove(i));
        let mut timings = sg.generation().timings.clone();
        let ended_by_eog = !slot.ignore_eos && sg.generation().output_ids.last().is_some_and(|t| info.eog.contains(t));
        timings.gen_tokens = slot.n_tokens_to_stop.unwrap_or(timings.gen_tokens);
        metrics::add(&m.generated_tokens, timings.gen_tokens as u64);
        metrics::add(&m.finished_macro_steps, timings.macro_steps as u64);
        let reason =
            if slot.timed_out || !(slot.stopped_by_string || ended_by_eog) && timings.gen_tokens >= slot.n_predict {
                FinishReason::Length
            } else {
                FinishReason::Stop
            };
        let t = &timings;
        let (prompt, steps, per_step) = (t.prompt_tokens, t.macro_steps, t.tokens_per_step());
        log::info!("task {} (slot {}): prompt {prompt} tokens in {:.0} ms; {} tokens in {steps} macro steps ({per_step:.2} per step) in {:.0} ms; {reason:?}", slot.task, sg.seq(), t.prompt_ms, t.gen_tokens, t.gen_ms);
        let _ = slot.events.send(Event::Done { reason, timings });
        release(engine, free, sg.seq());
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
/// at the end): end-of-generation and special tokens are left out, a stop
/// string ends the sequence (and is cut with what follows it, the tokens
/// after it uncounted), and a tail that may still become a stop string is
/// held back (the [`TextStream`] holds back an incomplete UTF-8 character
/// until the end).
fn send_text(info: &ModelInfo, sg: &mut SeqGen, slot: &mut Slot, engine: &Engine) {
    if !slot.stream && slot.stop.is_empty() && !sg.is_done() {
        return;
    }
    let visible = |ids: &[u32]| ids.iter().copied().filter(|t| !info.hidden.contains(t)).collect::<Vec<u32>>();
    let out = &sg.generation().output_ids;
    let first_new = slot.decoded_ids;
    slot.text.push_str(&slot.detok.push(&visible(&out[first_new..])));
    slot.decoded_ids = out.len();
    if sg.is_done() {
        slot.text.push_str(&slot.detok.finish());
    }
    let text = &mut slot.text;
    if let Some((at, len)) = slot.stop.iter().filter_map(|s| text.find(s.as_str()).map(|at| (at, s.len()))).min() {
        text.truncate(at);
        slot.stopped_by_string = true;
        // The first token whose text completes the stop string ends the answer.
        let n = (first_new + 1..=out.len()).find(|&n| info.tokenizer.decode(&visible(&out[..n])).len() >= at + len);
        slot.n_tokens_to_stop = Some(n.unwrap_or(out.len()));
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
