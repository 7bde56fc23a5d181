//! A request's choices: `n` for each of its prompts (a completions `prompt`
//! may list several), each its own job in its own slot. A prompt's `n` jobs
//! form one group, which the engine admits together so they decode in the
//! same macro steps. Choices are numbered prompt-major, as OpenAI numbers
//! them: `index = prompt_i * n + j`. This module fans a request out into its
//! jobs, waits on their events together, and adds their statistics up.

use std::future::poll_fn;
use std::task::Poll;
use std::time::Instant;

use axum::http::StatusCode;
use hamburger::Timings;
use serde_json::Value;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::{self, Common};
use crate::error::ApiError;
use crate::scheduler::{Event, Job, JobParams, SubmitError, Submitter};

/// The running choices of one request: the event channel of each.
pub(crate) struct Choices {
    /// `events[index]`: the choice's channel, `None` once it has ended.
    events: Vec<Option<UnboundedReceiver<Event>>>,
    /// Choices per prompt.
    n: usize,
}

/// Queues `n` choices of each of `prompts` (with its settings), all ending
/// at `deadline`; choice `j` of a prompt samples with
/// [`Common::seed_of_choice`]`(j)`.
///
/// # Errors
/// A 400 naming `n` (or `prompt` for a list) when the request has more
/// choices than the queue holds; a 503 when the queue is full or the engine
/// has stopped.
pub(crate) fn submit(
    submitter: &Submitter,
    prompts: Vec<(Vec<u32>, JobParams)>,
    n: usize,
    common: &Common,
    deadline: Instant,
) -> Result<Choices, ApiError> {
    let total = prompts.len() * n;
    if total > submitter.limit() {
        let field = if prompts.len() > 1 { "prompt" } else { "n" };
        return Err(ApiError::field(
            field,
            format!(
                "{total} choices ({} prompts, n = {n}) exceed the server's queue of {}",
                prompts.len(),
                submitter.limit()
            ),
        ));
    }
    let mut events = Vec::with_capacity(total);
    let groups = prompts
        .into_iter()
        .map(|(prompt, params)| {
            (0..n)
                .map(|j| {
                    let (tx, rx) = unbounded_channel();
                    events.push(Some(rx));
                    let mut params = params.clone();
                    params.sampler.seed = common.seed_of_choice(j);
                    Job { prompt: prompt.clone(), params, events: tx, deadline }
                })
                .collect()
        })
        .collect();
    submitter.submit(groups).map_err(|e| match e {
        SubmitError::Full => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is busy: the queue is full"),
        SubmitError::Closed => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"),
    })?;
    Ok(Choices { events, n })
}

impl Choices {
    /// How many choices the request has.
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether every choice has ended.
    pub(crate) fn all_done(&self) -> bool {
        self.events.iter().all(Option::is_none)
    }

    /// The next event of any running choice, with the choice's index (call
    /// only while not [`Choices::all_done`]). No timeout here: the engine
    /// ends a generation at its deadline and answers it.
    ///
    /// # Errors
    /// When a choice failed (500) or the engine stopped during it (503):
    /// the whole request fails, never answering part of its choices.
    pub(crate) async fn next(&mut self) -> Result<(usize, Event), ApiError> {
        let (index, event) = poll_fn(|cx| {
            for (i, rx) in self.events.iter_mut().enumerate() {
                if let Some(Poll::Ready(event)) = rx.as_mut().map(|rx| rx.poll_recv(cx)) {
                    return Poll::Ready((i, event));
                }
            }
            Poll::Pending
        })
        .await;
        match event {
            Some(Event::Failed(e)) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e)),
            Some(e) => {
                if matches!(e, Event::Done { .. }) {
                    self.events[index] = None;
                }
                Ok((index, e))
            }
            None => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine stopped during the generation")),
        }
    }

    /// An empty sum of the statistics of these choices.
    pub(crate) fn totals(&self) -> Totals {
        Totals { n: self.n, timings: Timings::default(), prompt_tokens: 0 }
    }
}

/// The statistics of a request's finished choices added up.
pub(crate) struct Totals {
    /// Choices per prompt.
    n: usize,
    /// Token and step counts summed over the choices (the prompt's
    /// processed and reused tokens as often as it ran), times the longest
    /// choice's: the choices ran together.
    timings: Timings,
    /// `usage.prompt_tokens`: each prompt counted once, however many choices
    /// it has (as OpenAI counts).
    prompt_tokens: usize,
}

impl Totals {
    /// Adds the statistics of choice `index`.
    pub(crate) fn add(&mut self, index: usize, t: &Timings) {
        if index.is_multiple_of(self.n) {
            self.prompt_tokens += t.cached_tokens + t.prompt_tokens;
        }
        let sum = &mut self.timings;
        sum.prompt_tokens += t.prompt_tokens;
        sum.cached_tokens += t.cached_tokens;
        sum.prompt_ms = sum.prompt_ms.max(t.prompt_ms);
        sum.gen_tokens += t.gen_tokens;
        sum.gen_ms = sum.gen_ms.max(t.gen_ms);
        sum.macro_steps += t.macro_steps;
        sum.kv_entries += t.kv_entries;
        sum.context_tokens += t.context_tokens;
        sum.kv_bytes_per_entry = t.kv_bytes_per_entry;
        if sum.reached.len() < t.reached.len() {
            sum.reached.resize(t.reached.len(), 0);
        }
        sum.reached.iter_mut().zip(&t.reached).for_each(|(s, r)| *s += r);
        sum.drafted += t.drafted;
        sum.draft_accepted += t.draft_accepted;
        sum.verify_forwards += t.verify_forwards;
    }

    /// The `usage` object: the prompts once each, the completion tokens of every choice.
    pub(crate) fn usage(&self) -> Value {
        api::usage(self.prompt_tokens, self.timings.gen_tokens)
    }

    /// The `timings` object of the choices together.
    pub(crate) fn timings(&self) -> Value {
        api::timings(&self.timings)
    }
}
