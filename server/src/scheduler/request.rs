//! One running request: the single owner of everything the engine thread
//! keeps for it, as llama.cpp's `server_slot` or mistral.rs's `Sequence` do:
//! its generation (sampler and decode state, a [`SeqGen`]), its stop strings
//! and what they cut, its deadline, the text it has been sent and the channel
//! its events go to.

use std::borrow::{Borrow, BorrowMut};
use std::time::Instant;

use hamburger::generate::{Pending, SeqGen, SyntheticAcceptance};
use hamburger::kv_cache::SeqId;
use hamburger::{Engine, Sampler, Timings, TokenLogprob};
use tokio::sync::mpsc::Sender;

use super::answer_text::AnswerText;
use super::slot_board::{SlotParams, SlotState};
use crate::job::{Event, FinishReason, Job, ModelInfo};
use crate::metrics::{self, Metrics};

/// A prompt scored at admission ([`hamburger::Engine::score`]): all its
/// tokens but the last are fed, and each after the first has its log-probability.
pub(super) struct ScoredPrompt {
    /// The log-probabilities of the prompt's tokens after the first.
    pub(super) logprobs: Vec<TokenLogprob>,
    /// How long scoring took (part of the prompt's time).
    pub(super) ms: f64,
}

/// What a request reuses of the prefix cache's cells ([`hamburger::row_class::reusable_prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reused {
    /// Leading prompt tokens whose cells are adopted.
    pub(super) tokens: usize,
    /// Whether the answer is the one a fresh read of the prompt gives.
    pub(super) exact: bool,
}

/// A request admitted into a slot (one engine sequence), from admission to its last event.
pub(super) struct Request<'t> {
    /// The request's number since the server started (in its log line).
    task: u64,
    /// Its decoding: prompt still to feed, sampler, budget and generated tokens.
    gen: SeqGen<'static>,
    /// The whole prompt, its first `reused.tokens` tokens' entries adopted from the prefix cache.
    prompt: Vec<u32>,
    reused: Reused,
    /// Its prompt's log-probabilities, when scored at admission.
    scored: Option<ScoredPrompt>,
    /// Where its events go: a bounded channel, so text is held back (and
    /// goes out with a later event) while its reader has not taken the
    /// earlier ones, one place always kept for the end.
    events: Sender<Event>,
    n_predict: usize,
    stream: bool,
    timings_per_token: bool,
    /// The prompt tokens last reported read (`return_progress`), if it asks.
    progress: Option<usize>,
    ignore_eos: bool,
    deadline: Instant,
    /// Its text, cut at a stop string.
    text: AnswerText<'t>,
    /// Output ids already turned into text.
    decoded_ids: usize,
    /// Bytes of the text already sent.
    sent: usize,
    /// Tokens and macro steps whose text was already sent.
    sent_tokens: usize,
    sent_steps: usize,
    timed_out: bool,
    /// While preempted: the tokens each entry it held covered, in order.
    written: Vec<usize>,
    /// Whether its prompt's entries were given to the prefix cache.
    published: bool,
    /// Its settings, as `/slots` shows them.
    shown: SlotParams,
}

impl<'t> Request<'t> {
    /// Admits `job` as task number `task` into sequence `seq`, whose cells
    /// hold the entries of the prompt's first `reused.tokens` tokens, then
    /// those `scored` fed, and nothing else. Its context may grow to
    /// `info.n_ctx_seq` cells (the whole pool, or llama-server's slot context) (one per macro step, so k tokens a
    /// step answer k times longer in them); its text is decoded with the
    /// model's tokenizer.
    pub(super) fn admit(
        task: u64,
        seq: SeqId,
        job: Job,
        reused: Reused,
        scored: Option<ScoredPrompt>,
        info: &'t ModelInfo,
    ) -> Request<'t> {
        let p = job.params;
        let shown = SlotParams::from(&p);
        let (before, rest) = job.prompt.split_at(reused.tokens + scored.as_ref().map_or(0, |s| s.logprobs.len()));
        let sampler = Sampler::new(p.sampler).with_logit_bias(p.logit_bias);
        let mut gen = SeqGen::new(seq, rest, p.n_predict, sampler)
            .continuing(Pending::default(), before.to_vec())
            .with_rule(p.rule);
        // llama-server ends an answer when its next token would fill the
        // slot's context: one cell stays free.
        gen = gen.with_cell_limit(info.n_ctx_seq.saturating_sub(1));
        if p.ignore_eos {
            gen = gen.ignoring_eog();
        }
        if let Some(top) = p.logprobs {
            gen = gen.with_logprobs(top);
            if p.post_sampling {
                gen = gen.with_sampled_logprobs();
            }
        }
        if let Some(c) = &p.constraint {
            gen = gen.constrained(c.start());
        }
        let by_model = p.rule.draft.is_some_and(|d| d.by_model);
        let rates = info.synthetic_rates.as_deref().filter(|_| by_model);
        if let Some(s) = rates.and_then(|r| SyntheticAcceptance::new(r, p.sampler.seed).ok()) {
            gen = gen.with_synthetic_acceptance(s);
        }
        Request {
            task,
            gen,
            prompt: job.prompt,
            reused,
            scored,
            events: job.events,
            text: AnswerText::new(&info.tokenizer, p.stop),
            n_predict: p.n_predict,
            stream: p.stream,
            timings_per_token: p.timings_per_token,
            progress: p.return_progress.then_some(usize::MAX),
            ignore_eos: p.ignore_eos,
            deadline: job.deadline,
            decoded_ids: 0,
            sent: 0,
            sent_tokens: 0,
            sent_steps: 0,
            timed_out: false,
            written: Vec::new(),
            published: false,
            shown,
        }
    }

    /// The tokens of its context: the prompt, then the generated tokens.
    pub(super) fn context(&self) -> Vec<u32> {
        self.prompt.iter().chain(&self.gen.generation().output_ids).copied().collect()
    }

    /// The prompt's tokens.
    pub(super) fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Whether its prompt's entries are all written but not yet given to the
    /// prefix cache: requests sharing its prompt's start wait for them.
    pub(super) fn prompt_in_flight(&self) -> bool {
        !self.published
    }

    /// The prompt length whose fresh read its cells of the prompt are (for
    /// [`hamburger::row_class::reusable_prefix`]): the whole prompt's when
    /// its reuse was exact and the rest was read alike (not when scored,
    /// whose forwards are cut otherwise, nor once resumed: see
    /// [`SeqGen::refeed`]), else 0 (the cells it adopted keep what the cache
    /// knew of them).
    pub(super) fn read_fresh(&self) -> usize {
        let alike = self.reused.exact && self.scored.is_none() && self.gen.prompt_read_alike();
        if alike && self.gen.prompt_fed() {
            self.prompt.len()
        } else {
            0
        }
    }

    /// Whether its whole prompt is fed and its entries may be cached (once).
    pub(super) fn take_prompt_to_publish(&mut self) -> bool {
        let ready = !self.published && self.gen.prompt_fed();
        self.published |= ready;
        ready
    }

    /// Records that it was preempted while its cells held entries at
    /// `positions` (by position): resumed, it feeds again the entries the
    /// cache no longer holds exactly as they were written.
    pub(super) fn preempted(&mut self, positions: &[i32]) {
        let mut start = 0;
        self.written = positions
            .iter()
            .map(|&p| {
                let n = p as usize + 1 - start;
                start = p as usize + 1;
                n
            })
            .collect();
    }

    /// How many tokens each entry it held when preempted covered, in order.
    pub(super) fn written(&self) -> &[usize] {
        &self.written
    }

    /// The entries it writes again when resumed with its first `kept`
    /// written entries adopted: the others, each one input as it was
    /// written (a prompt token, a plain token, or a macro step's tokens
    /// merged). What it had not fed yet follows as it would have.
    fn refed_inputs(&self, kept: usize) -> Vec<Vec<u32>> {
        let context = self.context();
        let mut at: usize = self.written[..kept].iter().sum();
        self.written[kept..]
            .iter()
            .map(|&n| {
                at += n;
                context[at - n..at].to_vec()
            })
            .collect()
    }

    /// How many cells it takes when resumed with its first `kept` written
    /// entries adopted, before its next outputs.
    pub(super) fn cells_to_resume(&self, kept: usize) -> usize {
        self.written.len() - kept + self.gen.pending_inputs()
    }

    /// Resumes it in sequence `seq`, whose cells hold the entries of its
    /// first `kept` written entries (the others are fed again first).
    pub(super) fn resume(&mut self, seq: SeqId, kept: usize) {
        let inputs = self.refed_inputs(kept);
        self.written.clear();
        self.gen.refeed(seq, inputs);
    }

    /// Base inputs it feeds before its next outputs (one cell each).
    pub(super) fn pending_inputs(&self) -> usize {
        self.gen.pending_inputs()
    }

    /// Its slot's state so far, for `/slots` (`n_ctx`: the cells it may use).
    pub(super) fn slot_state(&self, n_ctx: usize) -> SlotState {
        let generation = self.gen.generation();
        SlotState {
            id: self.seq(),
            id_task: i64::try_from(self.task).unwrap_or(i64::MAX),
            n_ctx,
            is_processing: true,
            n_prompt_tokens: self.prompt.len(),
            n_decoded: generation.output_ids.len(),
            n_macro_steps: generation.macro_steps.len(),
            params: Some(self.shown.clone()),
        }
    }

    /// Its number since the server started (in its log line).
    pub(super) fn task(&self) -> u64 {
        self.task
    }

    /// The engine sequence (slot) it runs in.
    pub(super) fn seq(&self) -> SeqId {
        self.gen.seq()
    }

    /// Whether its client has gone (its event channel is closed).
    pub(super) fn client_left(&self) -> bool {
        self.events.is_closed()
    }

    /// Whether its generation has ended (and only its last events remain to send).
    pub(super) fn is_done(&self) -> bool {
        self.gen.is_done()
    }

    /// The macro steps it has run.
    pub(super) fn macro_steps(&self) -> usize {
        self.gen.generation().macro_steps.len()
    }

    /// Whether `now` is past its deadline.
    pub(super) fn past_deadline(&self, now: Instant) -> bool {
        now >= self.deadline
    }

    /// Ends the generation with what it has when `now` is past its deadline.
    pub(super) fn end_if_past_deadline(&mut self, now: Instant, engine: &Engine) {
        if self.past_deadline(now) {
            self.timed_out = true;
            self.gen.stop(engine);
        }
    }

    /// Turns the tokens generated since the last call into text (a
    /// streaming request's, one with stop strings, or at the end): a stop
    /// string ends the generation (it is cut with what follows it, the
    /// tokens after it uncounted). Then sends what may be sent (a tail that
    /// may still become a stop string is held back, and so is everything
    /// while the reader has not taken earlier events: it goes out with a
    /// later one).
    pub(super) fn send_text(&mut self, info: &ModelInfo, engine: &Engine) {
        #[cfg(test)]
        super::fault::panic_if_injected(&self.prompt);
        self.report_progress();
        let done = self.gen.is_done();
        if !self.stream && !self.text.has_stop_strings() && !done {
            return;
        }
        let out = &self.gen.generation().output_ids;
        if self.text.push(&out[self.decoded_ids..], &info.hidden, done) {
            self.gen.stop(engine);
        }
        self.decoded_ids = self.gen.generation().output_ids.len();
        self.flush();
    }

    /// Tells a request that asks (`return_progress`) how much of its prompt
    /// has been read, when that changed: reused and read tokens, with the
    /// statistics so far. Skipped while its channel has no room to spare.
    pub(super) fn report_progress(&mut self) {
        let Some(last) = self.progress else { return };
        let cache = self.reused.tokens + self.scored.as_ref().map_or(0, |s| s.logprobs.len());
        let processed = cache + self.gen.prompt_tokens_fed();
        if processed == last || self.events.capacity() < 3 {
            return;
        }
        self.progress = Some(processed);
        let timings =
            Timings { cached_tokens: cache, prompt_tokens: processed - cache, ..self.gen.generation().timings.clone() };
        let total = self.prompt.len();
        let _ = self.events.try_send(Event::Progress { total, cache, processed, timings });
    }

    /// Sends the text not yet sent, when the request streams or has ended
    /// and its channel has room for it and for the end after it. Returns
    /// whether nothing is left to send.
    pub(super) fn flush(&mut self) -> bool {
        let done = self.gen.is_done();
        let end = self.text.sendable(done);
        if !(self.stream || done) || end <= self.sent {
            return true;
        }
        if self.events.capacity() < 2 || !self.text.text().is_char_boundary(self.sent) {
            return false;
        }
        let tokens = self.counted_tokens();
        let steps = self.gen.generation().macro_steps.len();
        let (new_tokens, new_steps) = (tokens - self.sent_tokens, steps - self.sent_steps);
        let text = self.text.text()[self.sent..end].to_string();
        let logprobs = self.logprobs(self.sent_tokens, tokens);
        let ids = self.gen.generation().output_ids[self.sent_tokens..tokens].to_vec();
        let timings = self.timings_per_token.then(|| Timings {
            gen_tokens: tokens,
            cached_tokens: self.reused.tokens,
            prompt_tokens: self.prompt.len() - self.reused.tokens,
            ..self.gen.generation().timings.clone()
        });
        let _ =
            self.events.try_send(Event::Text { text, tokens: new_tokens, steps: new_steps, logprobs, ids, timings });
        (self.sent, self.sent_tokens, self.sent_steps) = (end, tokens, steps);
        true
    }

    /// The tokens of the answer: up to the one that completed a stop
    /// string (those after it, in the same macro step, are not part of it).
    fn counted_tokens(&self) -> usize {
        self.text.stopped_at().unwrap_or(self.gen.generation().output_ids.len())
    }

    /// Answers a finished request: why it ended and its statistics, counting
    /// the tokens of the answer; logs its line and counts it in `m`.
    pub(super) fn answer(self, info: &ModelInfo, m: &Metrics) {
        let generation = self.gen.generation();
        let mut timings = generation.timings.clone();
        let ended_by_eog = !self.ignore_eos && generation.output_ids.last().is_some_and(|t| info.eog.contains(t));
        timings.gen_tokens = self.counted_tokens();
        timings.cached_tokens = self.reused.tokens;
        // The prompt's tokens not reused, scored at admission or fed by its first macro step.
        timings.prompt_tokens = self.prompt.len() - self.reused.tokens;
        timings.prompt_ms += self.scored.as_ref().map_or(0.0, |s| s.ms);
        metrics::add(&m.generated_tokens, timings.gen_tokens as u64);
        metrics::add(&m.prompt_us, (timings.prompt_ms * 1e3) as u64);
        metrics::add(&m.generation_us, (timings.gen_ms * 1e3) as u64);
        m.context_tokens_max
            .fetch_max((self.prompt.len() + timings.gen_tokens) as u64, std::sync::atomic::Ordering::Relaxed);
        metrics::add(&m.finished_macro_steps, timings.macro_steps as u64);
        metrics::add(&m.draft_tokens, timings.drafted as u64);
        metrics::add(&m.draft_accepted, timings.draft_accepted as u64);
        metrics::add(&m.verify_forwards, timings.verify_forwards as u64);
        let reason = if self.timed_out
            || !(self.text.stopped_at().is_some() || ended_by_eog)
                && (timings.gen_tokens >= self.n_predict || generation.context_full)
        {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let t = &timings;
        let (prompt, steps, per_step) = (t.prompt_tokens, t.macro_steps, t.tokens_per_step());
        log::info!("task {} (slot {}): prompt {prompt} tokens ({} reused) in {:.0} ms; {} tokens in {steps} macro steps ({per_step:.2} per step) in {:.0} ms; {} of {} drafted tokens accepted; {reason:?}", self.task, self.seq(), t.cached_tokens, t.prompt_ms, t.gen_tokens, t.gen_ms, t.draft_accepted, t.drafted);
        let logprobs = self.logprobs(self.sent_tokens, timings.gen_tokens);
        let prompt_logprobs = self.scored.as_ref().map(|s| s.logprobs.clone()).unwrap_or_default();
        // The end always has its place: text goes out only while two are free.
        let ids = generation.output_ids[..timings.gen_tokens].to_vec();
        let stop_word = self.text.stop_word().map(str::to_string);
        let truncated = generation.context_full && reason == FinishReason::Length;
        let end = crate::job::End { reason, stop_word, truncated, ids };
        let _ = self.events.try_send(Event::Done { end, timings, logprobs, prompt_logprobs });
    }

    /// The log-probabilities of the generated tokens `from..to` (none when
    /// the request did not ask).
    fn logprobs(&self, from: usize, to: usize) -> Vec<TokenLogprob> {
        let steps = &self.gen.generation().macro_steps;
        steps.iter().flat_map(|s| &s.logprobs).take(to).skip(from).cloned().collect()
    }

    /// Tells the client its generation failed with `error`.
    pub(super) fn fail(self, error: &str) {
        let _ = self.events.try_send(Event::Failed(error.to_string()));
    }
}

/// The decoding loop ([`hamburger::generate::macro_step`]) runs over the requests themselves.
impl Borrow<SeqGen<'static>> for Request<'_> {
    fn borrow(&self) -> &SeqGen<'static> {
        &self.gen
    }
}

impl BorrowMut<SeqGen<'static>> for Request<'_> {
    fn borrow_mut(&mut self) -> &mut SeqGen<'static> {
        &mut self.gen
    }
}
