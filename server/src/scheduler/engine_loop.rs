//! The engine thread's loop. Each iteration takes the newly queued jobs,
//! drops the waiting and running requests whose client left (so a client
//! that leaves is noticed within one macro step), admits waiting job groups
//! (a prompt's `n` choices) into free slots, a group once there is a slot for
//! each of its jobs (one sequence each; the slot whose KV cells hold the longest
//! start of the prompt, whose entries are kept), ends the requests past their deadline,
//! runs ONE macro step over every running request (prompt chunks of new
//! requests mixed with the merged inputs of running ones, then their micro
//! steps, batched), and delivers each request the text of its step and, when
//! it has finished, its end. Requests join and leave between macro steps.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use hamburger::chat::ChatTemplate;
use hamburger::constraint::Grammars;
use hamburger::generate::{self, DecodeConfig};
use hamburger::kv_cache::SeqId;
use hamburger::row_class::reusable_prefix;
use hamburger::tokenizer::Tokenizer;
use hamburger::{Engine, Model};

use super::request::{Request, Reused, ScoredPrompt};
use super::slot_board::SlotBoard;
use super::slots::{Cached, Slots};
use super::{JobGroup, ModelInfo, SchedulerConfig, StartError};
use crate::metrics::{self, Metrics};

/// Prompt rows scored per forward: each reads back a row of logits
/// (`n_vocab` floats), so a scoring graph's outputs stay bounded whatever
/// `n_batch` is (64 rows of a 128 k vocabulary: 32 MiB).
const SCORED_ROWS: usize = 64;

/// Loads the model, says on `ready` whether it loaded, then serves the jobs
/// of `rx` until every sender is gone and the last request has finished.
pub(super) fn run(
    cfg: &SchedulerConfig,
    rx: &Receiver<JobGroup>,
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
    let _ = ready.send(Ok(info.clone()));
    metrics::set(&m.kv_cells_total, engine.kv().n_cells() as u64);
    let mut lp = EngineLoop {
        info: &info,
        m,
        engine,
        decode,
        running: Vec::new(),
        waiting: VecDeque::new(),
        slots: Slots::new(cfg.engine.n_seq),
        tasks: 0,
    };
    let mut open = true;
    while open || !lp.running.is_empty() || !lp.waiting.is_empty() {
        open = lp.take_jobs(rx, open);
        lp.drop_cancelled();
        lp.admit();
        let now = Instant::now();
        for r in &mut lp.running {
            r.end_if_past_deadline(now, &lp.engine);
        }
        lp.deliver();
        if !lp.running.is_empty() {
            lp.step();
            lp.deliver();
        }
        let n_ctx_slot = info.n_ctx_slot;
        board.publish(lp.running.iter().map(|r| r.slot_state(n_ctx_slot)));
    }
}

/// The engine, its decode loop's settings and what the HTTP side needs to know of the model.
fn setup<'m>(cfg: &SchedulerConfig, model: &'m Model) -> hamburger::Result<(Arc<ModelInfo>, Engine<'m>, DecodeConfig)> {
    let decode = DecodeConfig::new(model, &cfg.step, cfg.engine.n_batch)?;
    let engine = Engine::new(model, &cfg.engine)?;
    let tokenizer = Tokenizer::from_model(model)?;
    let chat_template = match &cfg.chat_template {
        Some(source) => Some(ChatTemplate::for_model(source, model, &tokenizer)?),
        None => ChatTemplate::of_model(model, &tokenizer)?,
    };
    let chat_template = chat_template.map(|t| match &cfg.template_isolation {
        Some(isolation) => t.isolated(isolation.clone()),
        None => t,
    });
    let tool_format = chat_template.as_ref().and_then(crate::tools::CallFormat::of_template);
    let stem = cfg.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let hidden = model.vocab.eog.iter().copied().chain(tokenizer.special_ids()).collect();
    let info = ModelInfo {
        name: cfg.alias.clone().unwrap_or(if model.name.is_empty() { stem } else { model.name.clone() }),
        n_predict: cfg.n_predict,
        n_ctx_slot: cfg.engine.n_ctx / cfg.engine.n_seq,
        n_slots: cfg.engine.n_seq,
        n_vocab: model.hp.n_vocab,
        grammars: Grammars::new(&tokenizer, &model.vocab.eog)
            .inspect_err(|e| log::warn!("structured output is off: {e}"))
            .ok(),
        max_steps: model.hp.max_steps,
        step: cfg.step,
        tokenizer,
        chat_template,
        tool_format,
        eog: model.vocab.eog.clone(),
        hidden,
    };
    Ok((Arc::new(info), engine, decode))
}

/// The engine thread's state: the engine, the requests running in its
/// slots, the job groups waiting for slots, and the free slots with what their
/// cells hold.
struct EngineLoop<'t, 'm> {
    info: &'t ModelInfo,
    m: &'t Metrics,
    engine: Engine<'m>,
    decode: DecodeConfig,
    running: Vec<Request<'t>>,
    waiting: VecDeque<JobGroup>,
    /// Slots (engine sequences) no request runs in.
    slots: Slots,
    /// Requests admitted since the server started.
    tasks: u64,
}

impl<'t> EngineLoop<'t, '_> {
    /// Takes the queued jobs (blocking for one only when nothing runs or
    /// waits); returns whether the queue is still open.
    fn take_jobs(&mut self, rx: &Receiver<JobGroup>, mut open: bool) -> bool {
        while open {
            let idle = self.running.is_empty() && self.waiting.is_empty();
            match if idle { rx.recv().map_err(|_| TryRecvError::Disconnected) } else { rx.try_recv() } {
                Ok(group) => self.waiting.push_back(group),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        open
    }

    /// Drops the waiting jobs and running requests whose client has gone.
    fn drop_cancelled(&mut self) {
        let n_waiting: usize = self.waiting.iter().map(Vec::len).sum();
        for group in &mut self.waiting {
            group.retain(|job| !job.events.is_closed());
        }
        self.waiting.retain(|group| !group.is_empty());
        let gone = (n_waiting - self.waiting.iter().map(Vec::len).sum::<usize>()) as u64;
        self.m.queue_depth.fetch_sub(gone, Ordering::Relaxed);
        metrics::add(&self.m.cancelled, gone);
        for i in (0..self.running.len()).rev() {
            if self.running[i].client_left() {
                let r = self.running.swap_remove(i);
                self.slots.give_back(r.seq(), r.held(&self.engine));
                metrics::add(&self.m.cancelled, 1);
            }
        }
    }

    /// Admits waiting job groups, oldest first, into the free slots, a group
    /// only once there is a free slot for each of its jobs (so a prompt's
    /// choices decode in the same macro steps; a group never holds more jobs
    /// than there are slots): each job keeps the entries of the longest start
    /// of its prompt that its slot's cells hold (all but the prompt's last
    /// token, whose output the first step needs) and feeds the rest. A prompt
    /// whose log-probabilities are asked for is scored here (all but its last
    /// token, reusing nothing); a request for no token is answered at once.
    fn admit(&mut self) {
        while self.waiting.front().is_some_and(|group| group.len() <= self.slots.n_free()) {
            for job in self.waiting.pop_front().expect("a waiting group") {
                let taken = self.slots.take(&job.prompt, job.params.cache_prompt).expect("a free slot");
                let seq = taken.seq;
                self.m.queue_depth.fetch_sub(1, Ordering::Relaxed);
                let classes = self.engine.row_classes();
                let reuse = reusable_prefix(classes, self.decode.n_batch, taken.common, job.prompt.len(), taken.alike);
                let cached = self.engine.keep_prefix(seq, reuse.keep);
                metrics::add(&self.m.prompt_tokens, (job.prompt.len() - cached) as u64);
                metrics::add(&self.m.prompt_tokens_cached, cached as u64);
                self.tasks += 1;
                let scored = match job.params.prompt_logprobs.map(|top| self.score(seq, &job.prompt, top)).transpose() {
                    Ok(scored) => scored,
                    Err(e) => {
                        log::error!("scoring the prompt of task {} failed: {e}", self.tasks);
                        let _ = job.events.send(super::Event::Failed(e.to_string()));
                        self.engine.clear_seq(seq);
                        self.slots.give_back(seq, Cached::default());
                        continue;
                    }
                };
                let no_tokens = job.params.n_predict == 0;
                let reused = Reused { tokens: cached, exact: reuse.exact, alike_before: taken.alike };
                let r = Request::admit(self.tasks, seq, job, reused, scored, self.info);
                if no_tokens {
                    let held = r.held(&self.engine);
                    r.answer(self.info, self.m);
                    self.slots.give_back(seq, held);
                } else {
                    self.running.push(r);
                }
            }
        }
    }

    /// Scores `prompt` in sequence `seq` (empty), at most [`SCORED_ROWS`]
    /// tokens per forward, with `top` alternatives per token.
    fn score(&mut self, seq: SeqId, prompt: &[u32], top: usize) -> hamburger::Result<ScoredPrompt> {
        let (t, forwards) = (Instant::now(), self.engine.n_forwards());
        let logprobs = self.engine.score(seq, prompt, self.decode.n_batch.min(SCORED_ROWS), top);
        metrics::add(&self.m.base_forwards, (self.engine.n_forwards() - forwards) as u64);
        let logprobs = logprobs?;
        Ok(ScoredPrompt { logprobs, ms: t.elapsed().as_secs_f64() * 1e3 })
    }

    /// Runs one macro step over the running requests; when it fails, every
    /// one of them is told so and ends.
    fn step(&mut self) {
        let forwards = self.engine.n_forwards();
        let steps_of = |running: &[Request]| running.iter().map(|r| r.macro_steps() as u64).sum::<u64>();
        let steps_before = steps_of(&self.running);
        let t = Instant::now();
        let result = generate::macro_step(&mut self.engine, &self.decode, &mut self.running);
        log::trace!("macro step over {} sequences: {:.1} ms", self.running.len(), t.elapsed().as_secs_f64() * 1e3);
        metrics::add(&self.m.base_forwards, (self.engine.n_forwards() - forwards) as u64);
        metrics::add(&self.m.macro_steps, steps_of(&self.running) - steps_before);
        if let Err(e) = result {
            log::error!("macro step failed: {e}");
            for r in std::mem::take(&mut self.running) {
                let seq = r.seq();
                r.fail(&e.to_string());
                self.engine.clear_seq(seq);
                self.slots.give_back(seq, Cached::default());
            }
        }
    }

    /// Sends every running request its new text, and the finished ones their
    /// end; their slots become free. Updates the gauges of what runs.
    fn deliver(&mut self) {
        for i in (0..self.running.len()).rev() {
            self.running[i].send_text(self.info, &self.engine);
            if self.running[i].is_done() {
                let r = self.running.swap_remove(i);
                let (seq, held) = (r.seq(), r.held(&self.engine));
                r.answer(self.info, self.m);
                self.slots.give_back(seq, held);
            }
        }
        metrics::set(&self.m.processing, self.running.len() as u64);
        metrics::set(&self.m.kv_cells_used, self.engine.kv().n_used() as u64);
    }
}
