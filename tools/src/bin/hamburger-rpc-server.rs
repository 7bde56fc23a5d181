//! `hamburger-rpc-server`: exposes this machine's devices to `--rpc` clients
//! (`hamburger-cli`, `-bench`, `-server`, and llama.cpp built from the same
//! ggml), a thin binary around ggml's RPC server, like llama.cpp's `rpc-server`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Parser;
use ggml::{Device, DeviceKind};
use hamburger::DeviceChoice;

/// Serves this machine's CPU or GPU to HAMburger (and llama.cpp) clients over
/// ggml's RPC protocol. The protocol has no authentication or encryption: keep
/// it on loopback, a trusted network, or behind an SSH tunnel.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address to listen on (loopback by default; anything else is reachable by anyone who can route to it).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on.
    #[arg(long, default_value_t = 50052)]
    port: u16,
    /// The device to serve: cpu, cuda, metal, vulkan, or auto (the first GPU, else the CPU).
    #[arg(long, default_value = "cpu", value_parser = tools::cli::parse_device)]
    device: DeviceChoice,
    /// CPU threads for the computations the CPU device runs.
    #[arg(short = 't', long, value_parser = tools::cli::thread_count, default_value_t = hamburger::EngineParams::default().n_threads)]
    threads: usize,
    /// Directory caching large tensors by hash, so a client that loads the same model again sends only hashes.
    #[arg(long)]
    cache: Option<PathBuf>,
}

fn main() -> ExitCode {
    tools::cli::run_tool("hamburger-rpc-server", "info", run)
}

fn run(args: Args) -> Result<()> {
    // The GPU asked for (auto: the first, if any), else the CPU.
    let device = match args.device.gpu()? {
        Some(gpu) => gpu,
        None => match Device::all().into_iter().find(|d| d.kind() == DeviceKind::Cpu) {
            Some(cpu) => cpu,
            None => bail!("ggml's registry has no CPU device"),
        },
    };
    if !args.host.is_loopback() {
        log::warn!(
            "listening on {}: ggml's RPC protocol has no authentication or encryption, so anyone who can reach this port can run computations and read or write this device's memory; use it only on a trusted network or through an SSH tunnel",
            args.host
        );
    }
    if let Some(dir) = &args.cache {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("--cache {}: {e}", dir.display()))?;
    }
    let endpoint = std::net::SocketAddr::new(args.host, args.port).to_string();
    std::net::TcpListener::bind(&endpoint).map_err(|e| anyhow::anyhow!("cannot listen on {endpoint}: {e}"))?;
    log::info!("serving {} ({}) on {endpoint}", device.name(), device.description());
    ggml::rpc::serve(&endpoint, args.cache.as_deref(), args.threads, &[device])?;
    Ok(())
}
