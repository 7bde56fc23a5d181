//! `hamburger-server`: serves a HAMburger GGUF over an OpenAI-compatible
//! HTTP API (llama-server's flag names where they exist).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use hamburger::{EngineParams, StepParams};
use server::{Scheduler, SchedulerConfig};

/// An OpenAI-compatible server that batches macro steps across requests.
#[derive(Parser, Debug)]
#[command(name = "hamburger-server", version)]
struct Args {
    /// The HAMburger GGUF.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Addresses to listen on, comma-separated (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences decoded together (slots), all drawing on the one pool of
    /// -c KV cells; -1: auto, 4 (llama-server's auto). Also -np.
    #[arg(long = "parallel", default_value_t = -1, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..))]
    parallel: i64,
    /// Tokens a request that sets no `max_tokens` may generate; -1: until
    /// its context fills the KV pool (llama-server's -n).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..))]
    n_predict: i64,
    /// The model's names in `/v1/models`, comma-separated; the first in
    /// sorted order is its id in every answer (default: the GGUF's name).
    #[arg(short = 'a', long)]
    alias: Option<String>,
    /// The chat template instead of the model's (`--chat-template`,
    /// `--chat-template-file`; `--jinja` accepted: templates always render as Jinja).
    #[command(flatten)]
    template: tools::cli::ChatTemplateArgs,
    /// KV cells of the one pool every request draws from (one per prompt
    /// token and one per macro step; shared prompt prefixes once).
    #[arg(short = 'c', long = "ctx-size", default_value_t = EngineParams::default().n_ctx)]
    ctx_size: usize,
    /// Base inputs per forward, all sequences together.
    #[arg(short = 'b', long = "batch-size", default_value_t = EngineParams::default().n_batch)]
    batch_size: usize,
    /// The stop rule of requests that do not set theirs (`confidence`, `max_steps`).
    #[command(flatten)]
    decode: tools::decode_flags::DecodeArgs,
    /// Make every macro step emit exactly K tokens (benchmarks of untrained grafted modules).
    #[arg(long)]
    forced_steps: Option<usize>,
    /// How requests that do not set `speculative.type` decode: macro steps
    /// (none) or self-verified (draft-mtp), and the drafts' defaults.
    #[command(flatten)]
    spec: tools::decode_flags::SpecArgs,
    /// A draft model (-md) that drafts for every request that sets no other
    /// `speculative.type`; -m checks the drafts, so answers are -m's own.
    #[command(flatten)]
    draft: tools::decode_flags::DraftModelArgs,
    /// Benchmarks: the draft model's drafts are accepted at these rates
    /// (comma-separated, one per --spec-draft-n-max position, not
    /// increasing) instead of checked, so answers are NOT the model's.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true, conflicts_with = "spec_synth_len")]
    spec_synth_rates: Option<Vec<f64>>,
    /// Benchmarks: as --spec-synth-rates, the rates geometric with this
    /// mean length of a verify forward's output (its accepted drafts and
    /// the model's token, 1 to --spec-draft-n-max + 1).
    #[arg(long, allow_negative_numbers = true)]
    spec_synth_len: Option<f64>,
    /// Requests that may wait for a slot; more are answered 503.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Key clients must send as `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// CPU threads (default: every core the system reports, the same in every tool; llama.cpp takes the physical cores).
    #[arg(short = 't', long, value_parser = tools::cli::thread_count, default_value_t = EngineParams::default().n_threads)]
    threads: usize,
    #[command(flatten)]
    placement: tools::cli::PlacementArgs,
    /// Seconds a generation may take, waiting for a slot included; then it
    /// stops and answers what it has with `finish_reason: "length"`.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Accepted for older launch scripts: browsers of any origin may call
    /// the API unless --cors-origins says otherwise.
    #[arg(long)]
    cors: bool,
    /// Do not serve the chat page at `/` (llama-server's flag; also
    /// --no-ui); the API is served either way.
    #[arg(long, visible_alias = "no-ui")]
    no_webui: bool,
    /// llama-server's flags: sampling defaults, --seed, --slots, --metrics, ...
    #[command(flatten)]
    llama: tools::server_flags::LlamaServerArgs,
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

/// Benchmarks' synthetic acceptance, as the flags give it.
struct Synthetic {
    /// `--spec-synth-rates`.
    rates: Option<Vec<f64>>,
    /// `--spec-synth-len`.
    length: Option<f64>,
}

/// The draft model `-md` names, with its drafts (`--spec-draft-*`) and
/// synthetic acceptance; `None` without `-md`.
fn draft_model(
    draft: &tools::decode_flags::DraftModelArgs,
    spec: &tools::decode_flags::SpecArgs,
    synthetic: Synthetic,
    n_batch: usize,
) -> Result<Option<server::scheduler::DraftModelConfig>> {
    let (Some(model), Some(params)) = (&draft.model_draft, draft.params(spec, n_batch)?) else {
        if let Some(flag) =
            [("--spec-synth-rates", synthetic.rates.is_some()), ("--spec-synth-len", synthetic.length.is_some())]
                .iter()
                .find_map(|(f, given)| given.then_some(f))
        {
            anyhow::bail!("{flag} needs a draft model (-md, --model-draft)");
        }
        return Ok(None);
    };
    let rates = match synthetic.length {
        Some(l) => Some(
            hamburger::generate::SyntheticAcceptance::rates_for_length(l, params.n_max)
                .map_err(|e| anyhow::anyhow!("--spec-synth-len {e}"))?,
        ),
        None => synthetic.rates,
    };
    if let Some(r) = &rates {
        hamburger::generate::SyntheticAcceptance::new(r, 0).map_err(|e| anyhow::anyhow!("--spec-synth-rates: {e}"))?;
        if r.len() != params.n_max {
            anyhow::bail!(
                "--spec-synth-rates: {} rates for --spec-draft-n-max {}: give one per position",
                r.len(),
                params.n_max
            );
        }
    }
    // A HAMburger draft drafts at the confidence its file recommends.
    let confidence = hamburger::model::recommended_confidence_of(model).ok().flatten();
    let step = StepParams { confidence: confidence.unwrap_or(StepParams::default().confidence), ..Default::default() };
    Ok(Some(server::scheduler::DraftModelConfig { model: model.clone(), params, step, synthetic_rates: rates }))
}

/// Slots `-np -1` (auto) gives, as llama-server's auto.
const AUTO_PARALLEL: usize = 4;

fn run(mut args: Args) -> Result<()> {
    args.llama.refused.check()?;
    // A malformed SOURCE_DATE_EPOCH would fail every chat request: refused before loading.
    hamburger::chat::template_now()?;
    if args.cors {
        log::info!("--cors: browsers of any origin may call the API (the default; --cors-origins narrows it)");
    }
    let (sampler, seed) = args.llama.sampler()?;
    let (kv_type, flash_attn) = args.llama.kv.kv()?;
    // llama-server's slots: with -np auto the pool is unified; with an
    // explicit -np each request's context is -c / -np cells unless --kv-unified.
    let n_ctx_seq = (args.parallel > 0 && !args.llama.kv_unified).then(|| args.ctx_size / args.parallel as usize);
    let parallel = match args.parallel {
        -1 => AUTO_PARALLEL,
        0 => anyhow::bail!("-np 0: expected at least 1 slot, or -1 for auto ({AUTO_PARALLEL})"),
        n => usize::try_from(n)?,
    };
    // Each decoding sequence needs a cell for a prompt token and one for a macro step.
    if args.ctx_size < 2 * parallel {
        anyhow::bail!(
            "-c {} cannot serve -np {parallel}: each decoding sequence needs at least 2 KV cells (use -c {} or more, or a smaller -np)",
            args.ctx_size,
            2 * parallel
        );
    }
    let engine = EngineParams {
        n_ctx: args.ctx_size,
        n_seq: parallel,
        n_batch: args.llama.kv.n_batch(args.batch_size),
        n_threads: args.threads,
        kv_type,
        flash_attn,
    };
    // `--alias b,a`: every name is the model's; its id is the first in sorted order.
    let mut aliases: Vec<String> = args
        .alias
        .iter()
        .flat_map(|a| a.split(','))
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    aliases.sort();
    aliases.dedup();
    let model_path = args.model.clone();
    // A file that cannot be read leaves the library's default: the engine
    // thread's opening of the model reports why.
    args.decode.default_from_model(hamburger::model::recommended_confidence_of(&args.model).ok().flatten());
    let synthetic = Synthetic { rates: args.spec_synth_rates.take(), length: args.spec_synth_len };
    let draft = draft_model(&args.draft, &args.spec, synthetic, engine.n_batch)?;
    let cfg = SchedulerConfig {
        model: args.model,
        load: args.placement.load_options(),
        engine,
        step: StepParams {
            draft: args.spec.draft(args.draft.model_draft.is_some())?,
            ..args.decode.step_params(args.forced_steps)
        },
        queue: args.queue,
        chat_template: args.template.source()?,
        no_jinja: args.llama.no_jinja,
        template_isolation: Some(tools::cli::template_isolation()?),
        alias: aliases.first().cloned(),
        n_predict: usize::try_from(args.n_predict).ok(),
        defaults: server::job::RequestDefaults {
            sampler,
            seed,
            n_ctx_seq,
            verbose: args.llama.verbose,
            template_kwargs: args.llama.template_kwargs(),
        },
        draft,
    };
    let confidence = cfg.step.confidence;
    let mode = match (&cfg.draft, cfg.step.draft) {
        (Some(d), _) => format!("drafted by {} (draft-simple)", d.model.display()),
        (None, Some(_)) => "self-verified (draft-mtp)".into(),
        (None, None) => "macro steps".into(),
    };
    let scheduler = Scheduler::start(cfg)?;
    let info = &scheduler.info;
    log::info!(
        "model {}: {} tokens of vocabulary, up to {} tokens per macro step; {parallel} slots drawing on one pool of {} KV cells, flash attention {}, {mode} at confidence {confidence} unless a request sets them",
        info.name,
        info.n_vocab,
        info.max_steps,
        info.n_ctx,
        if info.flash_attn { "on" } else { "off" }
    );
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    // Vertex AI's environment (llama-server's): its port wins over --port.
    let vertex = server::http::Vertex::from_env(|k| std::env::var(k).ok()).map_err(anyhow::Error::msg)?;
    let port = match &vertex {
        Some(v) => {
            if v.port != args.port {
                log::warn!(
                    "Vertex AI (AIP_MODE=PREDICTION): listening on AIP_HTTP_PORT {}, not --port {}",
                    v.port,
                    args.port
                );
            }
            log::info!("Vertex AI: predictions at POST {}", v.predict);
            v.port
        }
        None => args.port,
    };
    rt.block_on(async {
        // `--host a,b`: one listener per address (llama-server's), IPv6 ones bare or in brackets.
        let mut listeners = Vec::new();
        for host in args.host.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            let host =
                if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
            let addr = format!("{host}:{port}");
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .with_context(|| format!("--host: cannot listen on {addr}"))?;
            let local: SocketAddr = listener.local_addr()?;
            log::info!("listening on http://{local} ({parallel} slots)");
            if !args.no_webui {
                log::info!("chat page: http://{local}/ (--no-webui turns it off)");
            }
            listeners.push(listener);
        }
        if listeners.is_empty() {
            anyhow::bail!("--host '{}': no address to listen on", args.host);
        }
        let http = server::HttpOptions {
            api_key: args.api_key,
            timeout: Duration::from_secs(args.timeout),
            cors: args.llama.cors_origins.as_deref().map_or(server::http::Cors::Any, server::http::Cors::of_list),
            slots_endpoint: !args.llama.no_slots,
            metrics_endpoint: args.llama.metrics,
            aliases,
            tags: args.llama.tags,
            webui: !args.no_webui,
            model_path: model_path.display().to_string(),
            total_slots: parallel,
            vertex,
        };
        server::serve(listeners, scheduler, http, shutdown_signal()).await.context("serving")
    })
}

fn main() -> ExitCode {
    tools::cli::run_tool("hamburger-server", "info", run)
}
