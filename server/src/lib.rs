//! `hamburger-server`: an OpenAI-compatible HTTP server for HAMburger models
//! that batches macro steps across requests.
//!
//! * [`scheduler`]: the engine thread, continuous batching over one engine;
//! * [`routes`]: the axum routes (chat and text completions, models, health,
//!   tokenize, detokenize, metrics), the API key, Server-Sent Events;
//! * [`api`]: request bodies, their checks, the usage and timings objects;
//! * [`messages`]: chat messages in OpenAI's shapes checked into the template's;
//! * `choices`: a request's `n` choices per prompt fanned out into jobs
//!   (a prompt's admitted together), their events merged, their usage summed;
//! * [`fields`]: which request fields are honoured, no-ops, or refused;
//! * [`speculative`]: a request's decoding mode (`speculative.type`: macro
//!   steps or self-verified) and drafts (`speculative.n_max` ...);
//! * [`webui`]: the chat page at `/`, built into the binary;
//! * [`structured`]: `response_format`, `grammar` and `json_schema` compiled into a constraint;
//! * [`tools`]: `tools` / `tool_choice`: the template's tools, the call's grammar, `tool_calls`;
//! * [`logprobs`]: per-token log-probabilities in chat's and completions' shapes;
//! * [`llama_routes`]: llama-server's `/props`, `/slots`, `/apply-template`
//!   and the answer naming the route to use instead of `/completion`;
//! * [`error`]: errors in OpenAI's shape; [`metrics`]: Prometheus counters.

pub mod api;
mod choices;
pub mod error;
pub mod fields;
pub mod llama_routes;
pub mod logprobs;
pub mod messages;
pub mod metrics;
pub mod routes;
pub mod scheduler;
pub mod speculative;
pub mod structured;
pub mod tools;
pub mod webui;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

pub use routes::AppState;
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
    let state = AppState {
        submitter: scheduler.submitter.clone(),
        info: scheduler.info.clone(),
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
    let app = routes::router(state).into_make_service_with_connect_info::<SocketAddr>();
    let served = axum::serve(listener, app).with_graceful_shutdown(stop).await;
    let joined = tokio::task::spawn_blocking(move || scheduler.shutdown()).await;
    served?;
    match (died_rx.await, joined) {
        (Ok(()), _) => Err(std::io::Error::other("the engine thread stopped")),
        (_, Ok(Err(e))) => Err(std::io::Error::other(e)),
        _ => Ok(()),
    }
}
