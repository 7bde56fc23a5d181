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
//! 4. planning: [`prompt`] (a chat rendered to its prompt text), [`plan`]
//!    (a request's settings checked into jobs, `n` choices per prompt fanned out);
//! 5. the engine loop: [`scheduler`] (continuous batching over one engine;
//!    it knows jobs, not HTTP or tool formats);
//! 6. response assembly: `choices` (a request's choices' events),
//!    [`response`] (OpenAI's objects and chunks, usage, timings),
//!    [`native`] (llama-server's native `/completion`: its fields and objects),
//!    [`logprobs`] (per-token log-probabilities in chat's and completions' shapes),
//!    [`compat`] (other APIs over the chat pipeline: Anthropic's Messages,
//!    OpenAI's Responses);
//! 7. HTTP on top: [`http`] (axum routes, Server-Sent Events, llama-server's
//!    operations routes, resumable streams, Vertex AI's predictions, the
//!    chat page) and [`serve`].

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
pub mod prompt;

pub mod scheduler;

mod choices;
pub mod compat;
pub mod logprobs;
pub mod native;
pub mod response;

pub mod http;

use std::future::Future;
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
    /// Which origins' browsers may call the API (CORS).
    pub cors: http::Cors,
    /// Serve `/slots` (llama-server's `--slots`, its default; `--no-slots`: 501).
    pub slots_endpoint: bool,
    /// Serve `/metrics` (llama-server's `--metrics`; otherwise 501).
    pub metrics_endpoint: bool,
    /// The model's names (`--alias a,b`; `/v1/models`), sorted: the first is its id.
    pub aliases: Vec<String>,
    /// Its tags (`--tags`; `/v1/models`).
    pub tags: Vec<String>,
    /// Serve the chat page at `/` (llama-server's web UI; `--no-webui` turns it off).
    pub webui: bool,
    /// The model file's path, as `/props` shows it.
    pub model_path: String,
    /// The slots (sequences decoded together), as `/props` shows them.
    pub total_slots: usize,
    /// Vertex AI's prediction route, when its environment asks for it.
    pub vertex: Option<http::Vertex>,
}

/// The server's routes over `scheduler`, answered as [`serve`] answers them
/// (Vertex AI's route too, when `http` asks for it). A front-end that answers
/// requests in its own process, without a socket (the Python package), calls
/// these routes directly. The router holds the queue's sender: drop it before
/// [`Scheduler::shutdown`].
pub fn app(scheduler: &Scheduler, http: HttpOptions) -> axum::Router {
    let tool_format = scheduler.info.chat_template.as_ref().and_then(hamburger::chat::CallFormat::of_template);
    let vertex = http.vertex;
    let state = AppState {
        submitter: scheduler.submitter.clone(),
        info: scheduler.info.clone(),
        tool_format,
        metrics: scheduler.metrics.clone(),
        api_key: http.api_key,
        timeout: http.timeout,
        cors: http.cors,
        slots_endpoint: http.slots_endpoint,
        metrics_endpoint: http.metrics_endpoint,
        aliases: http.aliases,
        tags: http.tags,
        webui: http.webui,
        model_path: http.model_path,
        total_slots: http.total_slots,
        slots: scheduler.slots.clone(),
        alive: scheduler.alive.clone(),
        streams: Default::default(),
    };
    let app = http::router(state);
    match &vertex {
        Some(v) => http::vertex::wrap(app, v),
        None => app,
    }
}

/// Serves `scheduler` on `listeners` (one per address, llama-server's
/// `--host a,b`) until `shutdown` resolves or the engine thread stops; then
/// stops accepting, lets in-flight requests finish, and stops the engine thread.
///
/// # Errors
/// When a listener fails, or the engine thread stopped (died) before
/// `shutdown` resolved.
pub async fn serve(
    listeners: Vec<tokio::net::TcpListener>,
    scheduler: Scheduler,
    http: HttpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut alive = scheduler.alive.clone();
    let (died_tx, died_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown => {}
            _ = alive.wait_for(|alive| !alive) => {
                log::error!("the engine thread stopped: no more requests can be served");
                let _ = died_tx.send(());
            }
        }
        let _ = stop_tx.send(true);
    });
    let app = app(&scheduler, http);
    let servers: Vec<_> =
        listeners.into_iter().map(|l| tokio::spawn(http::listen(l, app.clone(), stop_rx.clone()))).collect();
    // The router holds the queue's sender: the engine thread ends once every copy is gone.
    drop(app);
    let mut served = Ok(());
    for s in servers {
        let result = s.await.unwrap_or_else(|e| Err(std::io::Error::other(e)));
        served = served.and(result);
    }
    let joined = tokio::task::spawn_blocking(move || scheduler.shutdown()).await;
    served?;
    match (died_rx.await, joined) {
        (Ok(()), _) => Err(std::io::Error::other("the engine thread stopped")),
        (_, Ok(Err(e))) => Err(std::io::Error::other(e)),
        _ => Ok(()),
    }
}
