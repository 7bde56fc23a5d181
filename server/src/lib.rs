//! `hamburger-server`: an OpenAI-compatible HTTP server for HAMburger models
//! that batches macro steps across requests. Its modules are layers, each
//! importing only those below it (none imports another in a circle):
//!
//! 1. protocol: [`error`] (errors in OpenAI's shape, no HTTP framework),
//!    [`protocol`] (the request bodies, typed: `tools`, `tool_choice`,
//!    `response_format`), [`fields`] (which request fields are honoured,
//!    no-ops, or refused), [`messages`] (chat messages checked into the
//!    template's), [`ids`] (unique response and call ids, seeds), [`metrics`];
//! 2. the engine's contract: [`job`] (jobs, their events, the model's facts);
//! 3. features: [`structured`] (`response_format`, `grammar`, `json_schema`
//!    compiled into a constraint), [`tools`] (`tools` / `tool_choice` over
//!    the core's tool-call format, grammar and parser), [`speculative`] (a
//!    request's decoding mode, `speculative.type`: macro steps or
//!    self-verified, and its drafts, `speculative.n_max` ...);
//! 4. planning: [`plan`] (a request's settings checked into jobs, `n`
//!    choices per prompt fanned out);
//! 5. the engine loop: [`scheduler`] (continuous batching over one engine;
//!    it knows jobs, not HTTP or tool formats);
//! 6. response assembly: `choices` (a request's choices' events),
//!    [`response`] (OpenAI's objects and chunks, usage, timings),
//!    [`logprobs`] (per-token log-probabilities in chat's and completions' shapes);
//! 7. HTTP on top: [`http`] (axum routes, Server-Sent Events, llama-server's
//!    operations routes, the chat page) and [`serve`].

pub mod error;
pub mod fields;
pub mod ids;
pub mod messages;
pub mod metrics;
pub mod protocol;

pub mod job;

pub mod speculative;
pub mod structured;
pub mod tools;

pub mod plan;

pub mod scheduler;

mod choices;
pub mod logprobs;
pub mod response;

pub mod http;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

pub use http::AppState;
pub use scheduler::{Scheduler, SchedulerConfig};

/// How the HTTP side serves requests.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The key clients must send as `Authorization: Bearer KEY`, if any.
    pub api_key: Option<String>,
    /// Longest a generation may take, waiting included, before it answers
    /// what it has with `finish_reason: "length"`.
    pub timeout: Duration,
    /// Allow cross-origin requests from any origin (CORS).
    pub cors: bool,
    /// Serve the chat page at `/` (llama-server's web UI; `--no-webui` turns it off).
    pub webui: bool,
    /// The model file's path, as `/props` shows it.
    pub model_path: String,
    /// The slots (sequences decoded together), as `/props` shows them.
    pub total_slots: usize,
}

/// Serves `scheduler` on `listener` until `shutdown` resolves or the engine
/// thread stops; then stops accepting, lets in-flight requests finish, and
/// stops the engine thread.
///
/// # Errors
/// When the listener fails, or the engine thread stopped (died) before
/// `shutdown` resolved.
pub async fn serve(
    listener: tokio::net::TcpListener,
    scheduler: Scheduler,
    http: HttpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tool_format = scheduler.info.chat_template.as_ref().and_then(hamburger::chat::CallFormat::of_template);
    let state = AppState {
        submitter: scheduler.submitter.clone(),
        info: scheduler.info.clone(),
        tool_format,
        metrics: scheduler.metrics.clone(),
        api_key: http.api_key,
        timeout: http.timeout,
        cors: http.cors,
        webui: http.webui,
        model_path: http.model_path,
        total_slots: http.total_slots,
        slots: scheduler.slots.clone(),
        alive: scheduler.alive.clone(),
    };
    let mut alive = scheduler.alive.clone();
    let (died_tx, died_rx) = tokio::sync::oneshot::channel();
    let stop = async move {
        tokio::select! {
            () = shutdown => {}
            _ = alive.wait_for(|alive| !alive) => {
                log::error!("the engine thread stopped: no more requests can be served");
                let _ = died_tx.send(());
            }
        }
    };
    let app = http::router(state).into_make_service_with_connect_info::<SocketAddr>();
    let served = axum::serve(listener, app).with_graceful_shutdown(stop).await;
    let joined = tokio::task::spawn_blocking(move || scheduler.shutdown()).await;
    served?;
    match (died_rx.await, joined) {
        (Ok(()), _) => Err(std::io::Error::other("the engine thread stopped")),
        (_, Ok(Err(e))) => Err(std::io::Error::other(e)),
        _ => Ok(()),
    }
}
