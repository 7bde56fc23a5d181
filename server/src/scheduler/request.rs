//! One running request: the single owner of everything the engine thread
//! keeps for it, as llama.cpp's `server_slot` or mistral.rs's `Sequence` do:
//! its generation (sampler and decode state, a [`SeqGen`]), its stop strings
//! and what they cut, its deadline, the text it has been sent and the channel
//! its events go to.

use std::borrow::{Borrow, BorrowMut};
use std::time::Instant;

use hamburger::generate::{Pending, SeqGen};
use hamburger::kv_cache::SeqId;
use hamburger::tokenizer::TextStream;
use hamburger::{Engine, Sampler, TokenLogprob};
use tokio::sync::mpsc::UnboundedSender;

use super::slot_board::{SlotParams, SlotState};
use super::slots::Cached;
use super::{Event, FinishReason, Job, ModelInfo};
use crate::metrics::{self, Metrics};

/// A prompt scored at admission ([`hamburger::Engine::score`]): all its
/// tokens but the last are fed, and each after the first has its log-probability.
pub(super) struct ScoredPrompt {
    /// The log-probabilities of the prompt's tokens after the first.
    pub(super) logprobs: Vec<TokenLogprob>,
    /// How long scoring took (part of the prompt's time).
    pub(super) ms: f64,
}

/// What a request reuses of its slot's cells ([`hamburger::row_class::reusable_prefix`]).
pub(super) struct Reused {
    /// Leading prompt tokens whose cells are kept.
    pub(super) tokens: usize,
    /// Whether the answer is the one a fresh read of the prompt gives.
    pub(super) exact: bool,
    /// The slot's [`Cached::alike`] before the request.
    pub(super) alike_before: usize,
}

/// A request admitted into a slot (one engine sequence), from admission to its last event.
pub(super) struct Request<'t> {
    /// The request's number since the server started (in its log line).
    task: u64,
    /// Its decoding: prompt still to feed, sampler, budget and generated tokens.
    gen: SeqGen<'static>,
    /// The whole prompt, its first `reused.tokens` tokens' entries reused from the slot's cells.
    prompt: Vec<u32>,
    reused: Reused,
    /// Its prompt's log-probabilities, when scored at admission.
    scored: Option<ScoredPrompt>,
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
    /// Tokens and macro steps whose text was already sent.
    sent_tokens: usize,
    sent_steps: usize,
    stopped_by_string: bool,
    /// The tokens up to the one that completed the stop string (those after
    /// it, in the same macro step, are not part of the answer).
    n_tokens_to_stop: Option<usize>,
    timed_out: bool,
    /// Its settings, as `/slots` shows them.
    shown: SlotParams,
}

impl<'t> Request<'t> {
    /// Admits `job` as task number `task` into sequence `seq`, whose cells
    /// hold the entries of the prompt's first `reused.tokens` tokens, then
    /// those `scored` fed, and nothing else. It may take the slot's share of
    /// the cache, `info.n_ctx_slot` cells (one per macro step, so k tokens a
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
        gen = gen.with_cell_limit(info.n_ctx_slot);
        if p.ignore_eos {
            gen = gen.ignoring_eog();
        }
        if let Some(top) = p.logprobs {
            gen = gen.with_logprobs(top);
        }
        if let Some(c) = &p.constraint {
            gen = gen.constrained(c.start());
        }
        Request {
            task,
            gen,
            prompt: job.prompt,
            reused,
            scored,
            events: job.events,
            stop: p.stop,
            n_predict: p.n_predict,
            stream: p.stream,
            ignore_eos: p.ignore_eos,
            deadline: job.deadline,
            detok: TextStream::new(&info.tokenizer),
            decoded_ids: 0,
            text: String::new(),
            sent: 0,
            sent_tokens: 0,
            sent_steps: 0,
            stopped_by_string: false,
            n_tokens_to_stop: None,
            timed_out: false,
            shown,
        }
    }

    /// Its slot's state so far, for `/slots` (`n_ctx`: the slot's cells).
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

    /// What its slot's cells hold: the prompt, then the generated tokens as
    /// they were fed (all but the last step's); and how many leading tokens'
    /// cells are what a fresh read of a prompt that long computes: the whole
    /// prompt's when the reuse was exact and the rest was read alike (not
    /// when scored, whose forwards are cut otherwise), else the slot's
    /// earlier prompt's when they were kept, else none.
    pub(super) fn held(&self, engine: &Engine) -> Cached {
        let output = &self.gen.generation().output_ids;
        let mut tokens: Vec<u32> = self.prompt.iter().chain(output).copied().collect();
        tokens.truncate(engine.next_pos(self.seq()));
        let alike = if !self.reused.exact {
            self.reused.alike_before
        } else if self.scored.is_none() && self.gen.prompt_read_alike() && tokens.len() >= self.prompt.len() {
            self.prompt.len()
        } else {
            0
        };
        Cached { tokens, alike }
    }

    /// The macro steps it has run.
    pub(super) fn macro_steps(&self) -> usize {
        self.gen.generation().macro_steps.len()
    }

    /// Ends the generation with what it has when `now` is past its deadline.
    pub(super) fn end_if_past_deadline(&mut self, now: Instant, engine: &Engine) {
        if now >= self.deadline {
            self.timed_out = true;
            self.gen.stop(engine);
        }
    }

    /// Sends the text generated since the last call (a streaming request's,
    /// or at the end): end-of-generation and special tokens are left out, a
    /// stop string ends the generation (and is cut with what follows it, the
    /// tokens after it uncounted), and a tail that may still become a stop
    /// string is held back (the [`TextStream`] holds back an incomplete UTF-8
    /// character until the end).
    pub(super) fn send_text(&mut self, info: &ModelInfo, engine: &Engine) {
        if !self.stream && self.stop.is_empty() && !self.gen.is_done() {
            return;
        }
        let visible = |ids: &[u32]| ids.iter().copied().filter(|t| !info.hidden.contains(t)).collect::<Vec<u32>>();
        let out = &self.gen.generation().output_ids;
        let first_new = self.decoded_ids;
        self.text.push_str(&self.detok.push(&visible(&out[first_new..])));
        self.decoded_ids = out.len();
        if self.gen.is_done() {
            self.text.push_str(&self.detok.finish());
        }
        let text = &mut self.text;
        if let Some((at, len)) = self.stop.iter().filter_map(|s| text.find(s.as_str()).map(|at| (at, s.len()))).min() {
            text.truncate(at);
            self.stopped_by_string = true;
            // The first token whose text completes the stop string ends the answer.
            let n = (first_new + 1..=out.len()).find(|&n| info.tokenizer.decode(&visible(&out[..n])).len() >= at + len);
            self.n_tokens_to_stop = Some(n.unwrap_or(out.len()));
            self.gen.stop(engine);
        }
        let mut end = text.len();
        if !self.gen.is_done() {
            let held = self
                .stop
                .iter()
                .flat_map(|s| (1..s.len()).filter(move |&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
                .filter(|prefix| text.ends_with(prefix))
                .map(str::len)
                .max()
                .unwrap_or(0);
            end -= held;
        }
        if (self.stream || self.gen.is_done()) && end > self.sent && text.is_char_boundary(self.sent) {
            let tokens = self.n_tokens_to_stop.unwrap_or(self.gen.generation().output_ids.len());
            let steps = self.gen.generation().macro_steps.len();
            let (new_tokens, new_steps) = (tokens - self.sent_tokens, steps - self.sent_steps);
            let text = text[self.sent..end].to_string();
            let logprobs = self.logprobs(self.sent_tokens, tokens);
            let _ = self.events.send(Event::Text { text, tokens: new_tokens, steps: new_steps, logprobs });
            (self.sent, self.sent_tokens, self.sent_steps) = (end, tokens, steps);
        }
    }

    /// Answers a finished request: why it ended and its statistics, counting
    /// the tokens of the answer; logs its line and counts it in `m`.
    pub(super) fn answer(self, info: &ModelInfo, m: &Metrics) {
        let generation = self.gen.generation();
        let mut timings = generation.timings.clone();
        let ended_by_eog = !self.ignore_eos && generation.output_ids.last().is_some_and(|t| info.eog.contains(t));
        timings.gen_tokens = self.n_tokens_to_stop.unwrap_or(timings.gen_tokens);
        timings.cached_tokens = self.reused.tokens;
        // The prompt's tokens not reused, scored at admission or fed by its first macro step.
        timings.prompt_tokens = self.prompt.len() - self.reused.tokens;
        timings.prompt_ms += self.scored.as_ref().map_or(0.0, |s| s.ms);
        metrics::add(&m.generated_tokens, timings.gen_tokens as u64);
        metrics::add(&m.finished_macro_steps, timings.macro_steps as u64);
        metrics::add(&m.draft_tokens, timings.drafted as u64);
        metrics::add(&m.draft_accepted, timings.draft_accepted as u64);
        metrics::add(&m.verify_forwards, timings.verify_forwards as u64);
        let reason = if self.timed_out
            || !(self.stopped_by_string || ended_by_eog)
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
        let _ = self.events.send(Event::Done { reason, timings, logprobs, prompt_logprobs });
    }

    /// The log-probabilities of the generated tokens `from..to` (none when
    /// the request did not ask).
    fn logprobs(&self, from: usize, to: usize) -> Vec<TokenLogprob> {
        let steps = &self.gen.generation().macro_steps;
        steps.iter().flat_map(|s| &s.logprobs).take(to).skip(from).cloned().collect()
    }

    /// Tells the client its generation failed with `error`.
    pub(super) fn fail(self, error: &str) {
        let _ = self.events.send(Event::Failed(error.to_string()));
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
