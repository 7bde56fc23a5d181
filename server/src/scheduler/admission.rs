//! Who decodes, and in which cells: admission and preemption over the one
//! pool of KV cells (vLLM's scheduling, at the cell granularity of a
//! HAMburger cache: one cell per prompt token or macro step).
//!
//! * Preempted requests resume first, oldest first; then waiting jobs in
//!   order of arrival. A job starts when a sequence is free (at most `-np`
//!   decode together) and the pool has cells for its prompt beyond the
//!   cached entries it adopts, plus what the running requests have yet to
//!   feed; otherwise it waits (and so do the jobs after it).
//! * A job whose prompt shares more with a prompt still being fed than with
//!   the cache waits for that prompt's entries (at most a few steps) and then
//!   adopts them: `n` choices, or clients sending the same system prompt
//!   together, compute it once.
//! * Before each step, the step's inputs must find free cells: cached
//!   entries are taken back, least recently used first, and when that is not
//!   enough the youngest running request is preempted (its entries go to the
//!   cache, its sequence is freed), until they fit. A preempted request
//!   resumes with the same KV entries: those still cached are adopted, the
//!   others are fed again exactly as they were written (prompt tokens one
//!   per entry, each macro step's tokens merged into one), so its answer is
//!   the one it would have given uninterrupted. Only a request that alone
//!   outgrows the pool is cut (`length`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use hamburger::kv_cache::SeqId;
use hamburger::row_class::reusable_prefix;

use super::engine_loop::{guarded, EngineLoop};
use super::prefix_cache::Found;
use super::request::{Request, Reused, ScoredPrompt};
use crate::job::{Event, Job};
use crate::metrics;

/// Prompt rows scored per forward: each reads back a row of logits
/// (`n_vocab` floats), so a scoring graph's outputs stay bounded whatever
/// `n_batch` is (64 rows of a 128 k vocabulary: 32 MiB).
const SCORED_ROWS: usize = 64;

/// A job waits for a prompt being fed when that would spare it this many
/// prompt tokens at least (or all it would feed but its last token).
const WAIT_FOR_SHARED: usize = 32;

/// The length of the common start of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<'t> EngineLoop<'t, '_> {
    /// Cells kept free beyond an admission's own: what the running requests
    /// have yet to feed (a prompt's rest, or one merged step each) and one for
    /// the admitted one's next step.
    fn headroom(&self) -> usize {
        self.running.iter().map(|r| r.pending_inputs().max(1)).sum::<usize>() + 1
    }

    /// Admits what the pool has room for: preempted requests first (oldest
    /// first), then waiting jobs in order of arrival (a job that shares its
    /// prompt's start with a prompt being fed waits for its entries; the
    /// first that does not fit stops admission).
    pub(super) fn admit(&mut self) {
        while self.running.len() < self.info.n_slots && self.pool.has_free_seq() && !self.preempted.is_empty() {
            if !self.resume_oldest() {
                return;
            }
        }
        let mut i = 0;
        while i < self.waiting.len() && self.running.len() < self.info.n_slots && self.pool.has_free_seq() {
            let job = &self.waiting[i];
            let (prompt, cache_prompt) = (job.prompt.clone(), job.params.cache_prompt);
            let reusable = if cache_prompt { prompt.len() - 1 } else { 0 };
            let found = self.pool.lookup(&prompt, reusable, None);
            if self.sharing_in_flight(&prompt, reusable, found.covered) {
                i += 1;
                continue;
            }
            let (covered, mut reused) = (found.covered, self.reusable(&prompt, &found));
            let need = prompt.len() - reused.tokens + self.headroom();
            // Cells it writes: its prompt's rest, and at most one per answer token.
            let answer = job.params.n_predict.min(self.info.n_ctx_seq.saturating_sub(prompt.len()));
            let grow = prompt.len() - covered + answer;
            let Some(seq) = self.pool.take(&mut self.engine, &found.cells, grow, need) else { return };
            if reused.tokens < covered {
                reused.tokens = self.engine.rewind(seq, reused.tokens);
            }
            let Some(job) = self.waiting.remove(i) else { return };
            self.start(job, seq, reused);
        }
    }

    /// How much of `found` (the longest cached start of `prompt`) `prompt`
    /// keeps: as much as [`reusable_prefix`] says, so that the rest is read
    /// as a fresh read of `prompt` reads it (exact: the cells of the rest
    /// found cached are adopted too and rewritten in place, see
    /// [`hamburger::Engine::rewind`], so that the context keeps the fresh
    /// read's cell layout), or, past the cells a fresh read computed (a
    /// chat's next turn), all of it.
    fn reusable(&self, prompt: &[u32], found: &Found) -> Reused {
        let classes = self.engine.row_classes();
        let reuse = reusable_prefix(classes, self.decode.n_batch, found.covered, prompt.len(), found.alike);
        Reused { tokens: reuse.keep.min(found.covered), exact: reuse.exact }
    }

    /// Whether a prompt being fed shares more of `prompt`'s first `reusable`
    /// tokens than the `covered` ones the cache holds, by enough to wait for it.
    fn sharing_in_flight(&self, prompt: &[u32], reusable: usize, covered: usize) -> bool {
        let shared = self
            .running
            .iter()
            .filter(|r| r.prompt_in_flight())
            .map(|r| common_prefix(r.prompt(), prompt).min(reusable))
            .max()
            .unwrap_or(0);
        shared > covered && shared - covered >= WAIT_FOR_SHARED.min(reusable - covered)
    }

    /// Starts `job` in `seq`, whose cells hold its prompt's first
    /// `reused.tokens` tokens' entries: scores its prompt when asked, answers
    /// a request for no token at once.
    fn start(&mut self, job: Job, seq: SeqId, reused: Reused) {
        let cached = reused.tokens;
        self.m.queue_depth.fetch_sub(1, Ordering::Relaxed);
        metrics::add(&self.m.prompt_tokens, (job.prompt.len() - cached) as u64);
        metrics::add(&self.m.prompt_tokens_cached, cached as u64);
        self.tasks += 1;
        let (task, info, events) = (self.tasks, self.info, job.events.clone());
        let scored = match job.params.prompt_logprobs.map(|top| self.score(seq, &job.prompt, top)).transpose() {
            Ok(scored) => scored,
            Err(e) => {
                log::error!("scoring the prompt of task {task} failed: {e}");
                let _ = events.try_send(Event::Failed(e.to_string()));
                self.pool.release(&mut self.engine, seq, None);
                return;
            }
        };
        let no_tokens = job.params.n_predict == 0;
        match guarded(|| Request::admit(task, seq, job, reused, scored, info)) {
            Ok(r) if no_tokens => {
                self.pool.release(&mut self.engine, seq, Some((r.prompt(), r.read_fresh())));
                self.finishing.push((r, Instant::now()));
            }
            Ok(mut r) => {
                r.report_progress();
                self.running.push(r);
            }
            Err(why) => {
                log::error!("task {task}: {why}");
                let _ = events.try_send(Event::Failed(why));
                self.pool.release(&mut self.engine, seq, None);
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

    /// Resumes the oldest preempted request when the pool has room for the
    /// entries it must feed again; whether it did.
    fn resume_oldest(&mut self) -> bool {
        let Some(r) = self.preempted.front() else { return false };
        let (context, written) = (r.context(), r.written().to_vec());
        let cells = self.pool.lookup(&context, written.iter().sum(), Some(&written)).cells;
        let need = r.cells_to_resume(cells.len()) + self.headroom();
        let Some(seq) = self.pool.take(&mut self.engine, &cells, 0, need) else { return false };
        let Some(mut r) = self.preempted.pop_front() else { return false };
        log::debug!("task {}: resumed, {} of its {} entries still cached", r.task(), cells.len(), written.len());
        r.resume(seq, cells.len());
        self.running.push(r);
        true
    }

    /// Makes room for the next step's inputs: cached entries are taken back,
    /// and while that is not enough, the youngest running request is
    /// preempted (one running request is never preempted: alone, its context
    /// ends at the pool's size).
    pub(super) fn make_room(&mut self) {
        loop {
            let pending: usize = self.running.iter().filter(|r| !r.is_done()).map(Request::pending_inputs).sum();
            if self.pool.make_room(&mut self.engine, pending.min(self.decode.n_batch)) || self.running.len() <= 1 {
                return;
            }
            let youngest = (0..self.running.len()).max_by_key(|&i| self.running[i].task()).unwrap_or(0);
            let mut r = self.running.swap_remove(youngest);
            let seq = r.seq();
            let positions: Vec<i32> = self.engine.kv().entries_of(seq).iter().map(|&(_, pos)| pos).collect();
            r.preempted(&positions);
            self.pool.release(&mut self.engine, seq, Some((&r.context(), r.read_fresh())));
            metrics::add(&self.m.preemptions, 1);
            log::info!("task {}: preempted (the pool is full); it resumes when cells are free", r.task());
            let at = self.preempted.iter().position(|p| p.task() > r.task()).unwrap_or(self.preempted.len());
            self.preempted.insert(at, r);
        }
    }
}
