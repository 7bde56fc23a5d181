//! The engine thread's loop. Each iteration takes the newly queued jobs,
//! drops the requests whose client left (so a client that leaves is noticed
//! within one macro step), admits waiting requests while the pool has cells
//! for them (`admission`: preempted ones first, then new jobs), ends the
//! requests past their deadline, makes room for the step (cached entries
//! taken back, else the youngest request preempted), runs ONE macro step
//! over every running request (prompt chunks of new requests mixed with the
//! merged inputs of running ones, then their micro steps, batched), caches
//! the prompts it finished feeding, and delivers each request the text of
//! its step and, when it has finished, its end. Requests join and leave
//! between macro steps.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hamburger::chat::ChatTemplate;
use hamburger::generate::{self, DecodeConfig};
use hamburger::tokenizer::Tokenizer;
use hamburger::{Engine, Model};

use super::drafting::Drafting;
use super::pool::Pool;
use super::request::Request;
use super::slot_board::SlotBoard;
use super::{SchedulerConfig, StartError};
use crate::job::{Job, ModelInfo};
use crate::metrics::{self, Metrics};

/// How often ended requests whose reader is behind are looked at when
/// nothing else runs.
const READER_POLL: Duration = Duration::from_millis(20);

/// How long an ended request waits for its reader to take its last events
/// (a client that reads nothing for this long is dropped).
const READER_GRACE: Duration = Duration::from_secs(60);

/// Runs `f`; a panic in it becomes an error saying why, so one request's
/// fault fails that request (or that step) and the engine thread goes on.
pub(super) fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let why = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        format!("the request failed on the engine thread: {}", why.unwrap_or_else(|| "a panic".into()))
    })
}

/// Loads the model, says on `ready` whether it loaded, then serves the jobs
/// of `rx` until every sender is gone and the last request has finished.
pub(super) fn run(
    cfg: &SchedulerConfig,
    rx: &Receiver<Vec<Job>>,
    ready: &Sender<Result<Arc<ModelInfo>, StartError>>,
    m: &Metrics,
    board: &SlotBoard,
) {
    let model = match Model::open(&cfg.model, &cfg.load) {
        Ok(model) => model,
        Err(e) => return drop(ready.send(Err(StartError::Open(e)))),
    };
    let (info, engine, decode) = match setup(cfg, &model) {
        Ok(x) => x,
        Err(e) => return drop(ready.send(Err(StartError::Model(cfg.model.clone(), e)))),
    };
    let draft_model = match cfg.draft.as_ref().map(|d| Model::open(&d.model, &cfg.load)).transpose() {
        Ok(m) => m,
        Err(e) => return drop(ready.send(Err(StartError::Open(e)))),
    };
    let drafting = match (&draft_model, &cfg.draft) {
        (Some(draft), Some(d)) => match Drafting::new(draft, &model, &cfg.engine, d) {
            Ok(x) => Some(x),
            Err(e) => return drop(ready.send(Err(StartError::Model(d.model.clone(), e)))),
        },
        _ => None,
    };
    let _ = ready.send(Ok(info.clone()));
    metrics::set(&m.kv_cells_total, engine.kv().n_cells() as u64);
    let mut lp = EngineLoop {
        info: &info,
        m,
        board,
        engine,
        decode,
        drafting,
        running: Vec::new(),
        preempted: VecDeque::new(),
        finishing: Vec::new(),
        waiting: VecDeque::new(),
        pool: Pool::new(cfg.engine.n_seq),
        tasks: 0,
    };
    let mut open = true;
    while open || !lp.idle() {
        open = lp.take_jobs(rx, open);
        lp.drop_cancelled();
        lp.admit();
        let now = Instant::now();
        for r in &mut lp.running {
            r.end_if_past_deadline(now, &lp.engine);
        }
        lp.deliver();
        if !lp.running.is_empty() {
            if let Some(d) = &mut lp.drafting {
                d.draft(&mut lp.running, &lp.engine, &lp.decode);
            }
            lp.make_room();
            lp.step();
            lp.publish_prompts();
            lp.deliver();
        }
    }
}

/// The engine, its decode loop's settings and what the HTTP side needs to know of the model.
fn setup<'m>(cfg: &SchedulerConfig, model: &'m Model) -> hamburger::Result<(Arc<ModelInfo>, Engine<'m>, DecodeConfig)> {
    let decode = DecodeConfig::new(model, &cfg.step, cfg.engine.n_batch)?;
    let engine = Engine::new(model, &cfg.engine)?;
    let tokenizer = Tokenizer::from_model(model)?;
    let source = cfg.chat_template.as_deref().or(model.vocab.chat_template.as_deref());
    let source = match source {
        Some(s) if cfg.no_jinja => Some(hamburger::chat::without_jinja(s)?),
        other => other,
    };
    let chat_template = source.map(|s| ChatTemplate::for_model(s, model, &tokenizer)).transpose()?;
    let chat_template = chat_template.map(|t| match &cfg.template_isolation {
        Some(isolation) => t.isolated(isolation.clone()),
        None => t,
    });
    let stem = cfg.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let hidden = model.vocab.eog.iter().copied().chain(tokenizer.special_ids()).collect();
    let info = ModelInfo {
        name: cfg.alias.clone().unwrap_or(if model.name.is_empty() { stem } else { model.name.clone() }),
        n_predict: cfg.n_predict,
        n_ctx: cfg.engine.n_ctx,
        n_ctx_seq: cfg.n_ctx_seq(),
        defaults: cfg.defaults.clone(),
        n_slots: cfg.engine.n_seq,
        n_batch: cfg.engine.n_batch,
        n_vocab: model.hp.n_vocab,
        grammars: OnceLock::new(),
        max_steps: model.hp.max_steps,
        flash_attn: engine.fuses_attention(),
        step: cfg.step,
        draft_model: cfg.draft.as_ref().map(|d| d.params),
        synthetic_rates: cfg.draft.as_ref().and_then(|d| d.synthetic_rates.clone()),
        tokenizer,
        chat_template,
        eog: model.vocab.eog.clone(),
        hidden,
    };
    Ok((Arc::new(info), engine, decode))
}

/// The engine thread's state: the engine, the requests running in its
/// sequences, those preempted, those waiting, those whose reader is behind,
/// and the pool of cells.
pub(super) struct EngineLoop<'t, 'm> {
    pub(super) info: &'t ModelInfo,
    pub(super) m: &'t Metrics,
    /// What `/slots` shows, published with the gauges.
    pub(super) board: &'t SlotBoard,
    pub(super) engine: Engine<'m>,
    pub(super) decode: DecodeConfig,
    /// The draft model, when the server has one (`-md`).
    pub(super) drafting: Option<Drafting<'m>>,
    /// Requests decoding, each in its own sequence (at most `-np`).
    pub(super) running: Vec<Request<'t>>,
    /// Requests whose cells were taken back, oldest first: they resume
    /// before any new job is admitted.
    pub(super) preempted: VecDeque<Request<'t>>,
    /// Ended requests whose reader has not yet taken their last text: their
    /// cells and sequence are free already.
    pub(super) finishing: Vec<(Request<'t>, Instant)>,
    /// Jobs not yet admitted, in order of arrival.
    pub(super) waiting: VecDeque<Job>,
    /// Free sequences and cached prefixes.
    pub(super) pool: Pool,
    /// Requests admitted since the server started.
    pub(super) tasks: u64,
}

impl<'t> EngineLoop<'t, '_> {
    /// Whether nothing runs, waits, or waits for its reader.
    fn idle(&self) -> bool {
        self.running.is_empty() && self.preempted.is_empty() && self.waiting.is_empty() && self.finishing.is_empty()
    }

    /// Takes the queued jobs (blocking for one only when nothing is left to
    /// do); returns whether the queue is still open.
    fn take_jobs(&mut self, rx: &Receiver<Vec<Job>>, mut open: bool) -> bool {
        while open {
            let only_readers = self.running.is_empty() && self.preempted.is_empty() && self.waiting.is_empty();
            let next = if self.idle() {
                rx.recv().map_err(|_| TryRecvError::Disconnected)
            } else if only_readers {
                // Nothing to compute: wait for a job or for the readers a while.
                rx.recv_timeout(READER_POLL).map_err(|e| match e {
                    RecvTimeoutError::Timeout => TryRecvError::Empty,
                    RecvTimeoutError::Disconnected => TryRecvError::Disconnected,
                })
            } else {
                rx.try_recv()
            };
            match next {
                Ok(jobs) => self.waiting.extend(jobs),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        open
    }

    /// Drops the requests whose client has gone: waiting, preempted,
    /// running (their entries stay cached) or waiting for their reader.
    fn drop_cancelled(&mut self) {
        let n_waiting = self.waiting.len();
        self.waiting.retain(|job| !job.events.is_closed());
        let gone = (n_waiting - self.waiting.len()) as u64;
        self.m.queue_depth.fetch_sub(gone, Ordering::Relaxed);
        let n_preempted = self.preempted.len();
        self.preempted.retain(|r| !r.client_left());
        metrics::add(&self.m.cancelled, gone + (n_preempted - self.preempted.len()) as u64);
        self.finishing.retain(|(r, _)| !r.client_left());
        for i in (0..self.running.len()).rev() {
            if self.running[i].client_left() {
                let r = self.running.swap_remove(i);
                self.pool.release(&mut self.engine, r.seq(), Some((&r.context(), r.read_fresh())));
                metrics::add(&self.m.cancelled, 1);
            }
        }
    }

    /// Runs one macro step over the running requests; when it fails, every
    /// one of them is told so and ends.
    fn step(&mut self) {
        let forwards = self.engine.n_forwards();
        let steps_of = |running: &[Request]| running.iter().map(|r| r.macro_steps() as u64).sum::<u64>();
        let steps_before = steps_of(&self.running);
        let t = Instant::now();
        let (engine, decode, running) = (&mut self.engine, &self.decode, &mut self.running);
        let result =
            guarded(|| generate::macro_step(engine, decode, running).map_err(|e| e.to_string())).and_then(|r| r);
        log::trace!("macro step over {} sequences: {:.1} ms", self.running.len(), t.elapsed().as_secs_f64() * 1e3);
        let n_forwards = (self.engine.n_forwards() - forwards) as u64;
        metrics::add(&self.m.base_forwards, n_forwards);
        metrics::add(&self.m.busy_slot_forwards, n_forwards * self.running.len() as u64);
        metrics::add(&self.m.macro_steps, steps_of(&self.running) - steps_before);
        if let Err(e) = result {
            log::error!("macro step failed: {e}");
            for r in std::mem::take(&mut self.running) {
                let seq = r.seq();
                r.fail(&e);
                self.pool.release(&mut self.engine, seq, None);
            }
        }
    }

    /// Caches the entries of the prompts fed in full since the last step,
    /// so that requests sharing their start adopt them.
    fn publish_prompts(&mut self) {
        for r in &mut self.running {
            if r.take_prompt_to_publish() {
                self.pool.publish(&mut self.engine, r.seq(), r.prompt(), r.read_fresh());
            }
        }
    }

    /// Sends every running request its new text, and the finished ones their
    /// end; their sequences become free and their entries stay cached. A
    /// request whose text handling panics fails alone. Updates the gauges of
    /// what runs.
    fn deliver(&mut self) {
        for i in (0..self.running.len()).rev() {
            let (r, info, engine) = (&mut self.running[i], self.info, &self.engine);
            match guarded(|| r.send_text(info, engine)) {
                Ok(()) if self.running[i].is_done() => {
                    let r = self.running.swap_remove(i);
                    self.pool.release(&mut self.engine, r.seq(), Some((&r.context(), r.read_fresh())));
                    self.finishing.push((r, Instant::now()));
                }
                Ok(()) => {}
                Err(why) => {
                    let r = self.running.swap_remove(i);
                    log::error!("task {}: {why}", r.task());
                    let seq = r.seq();
                    r.fail(&why);
                    self.pool.release(&mut self.engine, seq, None);
                }
            }
        }
        // The gauges and slots first: a client that reads /metrics or
        // /slots as soon as its answer arrives sees its request gone.
        self.board.publish(self.running.iter().map(|r| r.slot_state(self.info.n_ctx_seq)));
        metrics::set(&self.m.processing, self.running.len() as u64);
        metrics::set(&self.m.kv_cells_used, self.engine.kv().n_used() as u64);
        metrics::set(&self.m.kv_cells_cached, self.engine.kv().n_pinned_only() as u64);
        metrics::set(&self.m.cached_entries, self.pool.n_cached() as u64);
        let now = Instant::now();
        let (info, m) = (self.info, self.m);
        for (mut r, ended) in std::mem::take(&mut self.finishing) {
            if r.flush() {
                let task = r.task();
                if let Err(why) = guarded(|| r.answer(info, m)) {
                    log::error!("task {task}: {why}");
                }
            } else if now.duration_since(ended) > READER_GRACE {
                log::warn!("task {}: its reader took no event for {READER_GRACE:?} after its end: dropped", r.task());
            } else {
                self.finishing.push((r, ended));
            }
        }
    }
}
