//! `hamburger-server`: serves a HAMburger GGUF over an OpenAI-compatible
//! HTTP API (llama-server's flag names where they exist).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use hamburger::SessionParams;
use server::{Scheduler, SchedulerConfig};

/// An OpenAI-compatible server that batches macro steps across requests.
#[derive(Parser, Debug)]
#[command(name = "hamburger-server", version)]
struct Args {
    /// The HAMburger GGUF.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences decoded together (slots). Also --parallel.
    #[arg(short = 'n', long = "parallel", default_value_t = 4)]
    parallel: usize,
    /// KV cache entries of all slots together (each slot gets an equal share).
    #[arg(short = 'c', long = "ctx-size", default_value_t = SessionParams::default().n_ctx)]
    ctx_size: usize,
    /// Base inputs per forward, all sequences together.
    #[arg(short = 'b', long = "batch-size", default_value_t = SessionParams::default().n_batch)]
    batch_size: usize,
    /// Default stop confidence: a macro step ends when 1 - p_stop < confidence.
    #[arg(long, default_value_t = SessionParams::default().confidence, value_parser = tools::cli::non_negative, allow_negative_numbers = true)]
    confidence: f32,
    /// Default cap of tokens per macro step (0: the model's).
    #[arg(long, default_value_t = 0)]
    max_steps: usize,
    /// Make every macro step emit exactly K tokens (benchmarks of untrained grafted modules).
    #[arg(long, value_parser = tools::cli::at_least_one)]
    forced_steps: Option<usize>,
    /// Requests that may wait for a slot; more are answered 503.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Key clients must send as `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// CPU threads.
    #[arg(short = 't', long, value_parser = tools::cli::thread_count, default_value_t = SessionParams::default().n_threads)]
    threads: usize,
    #[command(flatten)]
    placement: tools::cli::PlacementArgs,
    /// Seconds a generation may take, waiting for a slot included; then it
    /// stops and answers what it has with `finish_reason: "length"`.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Allow cross-origin requests from any origin (CORS headers, preflights
    /// answered), so browser front-ends on other origins can call the API.
    #[arg(long)]
    cors: bool,
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    log::info!("stopping: no new requests; finishing the ones in flight");
}

fn run(args: Args) -> Result<()> {
    if args.parallel == 0 || args.ctx_size < args.parallel || args.threads == 0 || args.batch_size == 0 {
        anyhow::bail!(
            "--parallel, --ctx-size (at least one entry per slot), --threads and --batch-size must be positive"
        );
    }
    let session = SessionParams {
        n_ctx: args.ctx_size,
        n_batch: args.batch_size,
        n_threads: args.threads,
        confidence: args.confidence,
        max_steps: args.max_steps,
        forced_steps: args.forced_steps,
        ..Default::default()
    };
    let load = args.placement.load_options();
    let cfg = SchedulerConfig {
        model: args.model,
        load,
        session,
        n_slots: args.parallel,
        queue: args.queue,
        template_isolation: Some(tools::cli::template_isolation()?),
    };
    let scheduler = Scheduler::start(cfg).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async {
        let addr = format!("{}:{}", args.host, args.port);
        let listener =
            tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let local: SocketAddr = listener.local_addr()?;
        log::info!("listening on http://{local} ({} slots)", args.parallel);
        let http =
            server::HttpOptions { api_key: args.api_key, timeout: Duration::from_secs(args.timeout), cors: args.cors };
        server::serve(listener, scheduler, http, shutdown_signal()).await.context("serving")
    })
}

fn main() -> ExitCode {
    tools::cli::run_tool("hamburger-server", "info", run)
}
