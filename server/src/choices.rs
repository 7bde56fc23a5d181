//! A request's running choices, on the answering side: the event channel of
//! each (index prompt-major, `prompt_i * n + j`), waited on together.

use std::future::poll_fn;
use std::task::Poll;

use tokio::sync::mpsc::Receiver;

use crate::error::{status, ApiError};
use crate::job::Event;

/// The running choices of one request: the event channel of each.
pub(crate) struct Choices {
    /// `events[index]`: the choice's channel, `None` once it has ended.
    events: Vec<Option<Receiver<Event>>>,
    /// Choices per prompt.
    n: usize,
}

impl Choices {
    /// The choices whose events come on `events` (by index), `n` per prompt.
    pub(crate) fn new(events: Vec<Receiver<Event>>, n: usize) -> Choices {
        Choices { events: events.into_iter().map(Some).collect(), n }
    }

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
            Some(Event::Failed(e)) => Err(ApiError::new(status::INTERNAL, e)),
            Some(e) => {
                if matches!(e, Event::Done { .. }) {
                    self.events[index] = None;
                }
                Ok((index, e))
            }
            None => Err(ApiError::new(status::UNAVAILABLE, "the engine stopped during the generation")),
        }
    }

    /// Choices per prompt.
    pub(crate) fn per_prompt(&self) -> usize {
        self.n
    }
}
