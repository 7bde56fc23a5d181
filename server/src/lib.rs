//! `hamburger-server`: an OpenAI-compatible HTTP server for HAMburger models
//! that batches macro steps across requests.
//!
//! * [`scheduler`]: the engine thread, continuous batching over one engine;
//! * [`routes`]: the axum routes (chat and text completions, models, health,
//!   tokenize, detokenize, metrics), the API key, Server-Sent Events;
//! * [`api`]: request bodies, their checks, the usage and timings objects;
//! * [`error`]: errors in OpenAI's shape; [`metrics`]: Prometheus counters.

pub mod api;
pub mod error;
pub mod metrics;
pub mod routes;
pub mod scheduler;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

pub use routes::AppState;
pub use scheduler::{Scheduler, SchedulerConfig};

/// Serves `scheduler` on `listener` until `shutdown` resolves; then stops
/// accepting, lets in-flight requests finish, and stops the engine thread.
///
/// # Errors
/// When the listener fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    scheduler: Scheduler,
    api_key: Option<String>,
    timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = AppState {
        submitter: scheduler.submitter.clone(),
        info: scheduler.info.clone(),
        metrics: scheduler.metrics.clone(),
        api_key,
        timeout,
    };
    let app = routes::router(state).into_make_service_with_connect_info::<SocketAddr>();
    let served = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    tokio::task::spawn_blocking(move || scheduler.shutdown()).await.ok();
    served
}
