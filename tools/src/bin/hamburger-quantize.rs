//! `hamburger-quantize`: llama-quantize for HAMburger (and base-only llama)
//! GGUFs, plus `hamburger-quantize sweep` to measure a list of types.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Parser;
use ggml::Type;
use quant::policy::{parse_tensor_type, parse_type};
use quant::quantize::{self, QuantizeOptions};
use quant::{Mix, Overrides};

/// Quantizes a GGUF to a llama.cpp mix, with HAMburger's per-role policy for the grafted tensors.
#[derive(Parser)]
#[command(
    version,
    after_help = "Subcommands: `hamburger-quantize sweep --help` (quantization sweeps), `hamburger-quantize compare --help` (timing against llama.cpp's quantizer)."
)]
struct Args {
    /// Input GGUF (F32/F16/BF16; quantized only with --allow-requantize).
    input: PathBuf,
    /// Output GGUF.
    output: PathBuf,
    /// The mix: F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_1, Q5_0, Q4_K_M,
    /// Q4_K_S, Q4_1, Q4_0, IQ4_NL, IQ4_XS, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K.
    #[arg(value_parser = tools::cli::parse_mix)]
    mix: Mix,
    /// Threads.
    #[arg(short = 't', long, value_parser = tools::cli::thread_count)]
    threads: Option<usize>,
    /// Allow quantizing tensors that are already quantized.
    #[arg(long)]
    allow_requantize: bool,
    /// Give every matrix the mix's default type (no per-tensor bumps).
    #[arg(long)]
    pure: bool,
    /// Type of the lm_head (output.weight, or the tied embedding).
    #[arg(long, value_parser = parse_type)]
    output_tensor_type: Option<Type>,
    /// Type of the untied token embedding.
    #[arg(long, value_parser = parse_type)]
    token_embedding_type: Option<Type>,
    /// Type of the grafted matrices (merger, micro decoder, stop head).
    #[arg(long, value_parser = parse_type)]
    grafted_type: Option<Type>,
    /// REGEX=TYPE: tensors whose name matches get TYPE (repeatable; first match wins).
    #[arg(long = "tensor-type", value_parser = parse_tensor_type)]
    tensor_types: Vec<(regex::Regex, Type)>,
    /// Print the plan (tensor, role, type, size) without writing.
    #[arg(long)]
    dry_run: bool,
}

fn main() -> ExitCode {
    tools::cli::init_logger("warn");
    ggml::exit_on_ggml_abort("hamburger-quantize");
    let args: Vec<String> = std::env::args().collect();
    let sub = |name: &str| {
        let mut rest = args.clone();
        rest.remove(1);
        (format!("hamburger-quantize {name}"), rest)
    };
    let result = match args.get(1).map(String::as_str) {
        Some("sweep") => {
            let (name, rest) = sub("sweep");
            tools::sweep::main(tools::cli::parse_or_exit(&name, rest))
        }
        Some("compare") => {
            let (name, rest) = sub("compare");
            tools::compare::main(tools::cli::parse_or_exit(&name, rest))
        }
        _ => run(tools::cli::parse_or_exit("hamburger-quantize", args)),
    };
    tools::cli::report("hamburger-quantize", result)
}

fn run(args: Args) -> Result<()> {
    tools::cli::remove_partial_files_on_interrupt()?;
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global().context("thread pool")?;
    }
    let opts = QuantizeOptions {
        input: args.input,
        output: args.output,
        mix: args.mix,
        overrides: Overrides {
            pure: args.pure,
            output: args.output_tensor_type,
            token_embd: args.token_embedding_type,
            grafted: args.grafted_type,
            tensor_types: args.tensor_types,
        },
        allow_requantize: args.allow_requantize,
        progress: !args.dry_run,
    };
    if args.dry_run {
        let gguf = ggml::gguf::Gguf::open(&opts.input)?;
        let plan = quantize::plan(&gguf, opts.mix, &opts.overrides)?;
        print!("{}", quantize::describe(&plan, &opts.input));
        return Ok(());
    }
    let report = quantize::quantize(&opts)?;
    // One warning per kind of fallback, not one per tensor (a k-quant mix of
    // a model with 576-wide rows falls back on some 200 tensors alike).
    let mut fallbacks: std::collections::BTreeMap<(&str, String), Vec<&str>> = Default::default();
    for r in &report.plan.rows {
        if let Some(why) = r.fallback.as_deref() {
            fallbacks.entry((why, r.to.name().to_string())).or_default().push(&r.name);
        }
    }
    for ((why, to), names) in &fallbacks {
        let more = if names.len() > 1 { format!(" and {} more", names.len() - 1) } else { String::new() };
        log::warn!("{} tensor(s) ({}{more}): {why}; using {to}", names.len(), names[0]);
    }
    let n_fallback: usize = fallbacks.values().map(Vec::len).sum();
    println!(
        "wrote {} ({}, {:.2} MiB, {:.2} bits per weight, {} tensors fell back) in {:.2} s",
        opts.output.display(),
        opts.mix.name(),
        report.plan.bytes() as f64 / ggml::MIB,
        report.plan.bits_per_weight(),
        n_fallback,
        report.seconds
    );
    Ok(())
}
