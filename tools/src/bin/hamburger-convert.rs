//! `hamburger-convert`: HAMburger checkpoint -> GGUF.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use convert::hf::HamburgerJson;
use convert::{ConvertOptions, OUTTYPES};

/// Packs a HAMburger checkpoint plus its base model's config and tokenizer into one GGUF.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The checkpoint: a Lightning .ckpt, a .safetensors file, a
    /// model.safetensors.index.json, or a directory holding one.
    checkpoint: PathBuf,
    /// The GGUF file to write.
    #[arg(long, short = 'o')]
    outfile: PathBuf,
    /// Type of the weight matrices (norms, biases and small tables stay f32).
    #[arg(long, default_value = "f16", value_parser = parse_outtype)]
    outtype: ggml::Type,
    /// Directory with the base model's config.json, tokenizer.json and
    /// tokenizer_config.json (and optionally hamburger.json); default: the checkpoint's.
    #[arg(long)]
    base_dir: Option<PathBuf>,
    /// Write only the base model, as a plain llama GGUF that llama.cpp runs.
    #[arg(long)]
    base_only: bool,
    /// Base layers whose outputs feed the micro decoder (comma-separated).
    #[arg(long, value_delimiter = ',')]
    feature_layers: Option<Vec<usize>>,
    /// Micro-step decoder layers.
    #[arg(long)]
    micro_layers: Option<usize>,
    /// Merger attention heads.
    #[arg(long)]
    merger_heads: Option<usize>,
    /// Most tokens one macro step may emit.
    #[arg(long)]
    max_steps: Option<usize>,
    /// The confidence to store as the model's recommended one
    /// (`hamburger.recommended_confidence`), which every tool and the server
    /// then use when none is asked for; default: `recommended_confidence` of
    /// hamburger.json if any, else none is stored (the tools use 0.8).
    #[arg(long, value_parser = tools::cli::non_negative, allow_negative_numbers = true)]
    confidence: Option<f32>,
    /// The draft vocabulary of self-verified decoding: a JSON list of token
    /// ids (`hamburger-train draft-vocab`), stored as `hamburger.draft_vocab`;
    /// default: `draft_vocab` of hamburger.json if any, else none.
    #[arg(long, value_name = "FILE")]
    draft_vocab: Option<PathBuf>,
    /// llama.cpp pre-tokenizer name (gpt-2, llama-bpe, smollm...) when it cannot be recognised.
    #[arg(long)]
    vocab_pre: Option<String>,
    /// Hide the progress bar.
    #[arg(long)]
    no_progress: bool,
}

fn parse_outtype(s: &str) -> Result<ggml::Type, String> {
    if !OUTTYPES.contains(&s.to_ascii_lowercase().as_str()) {
        return Err(format!("unknown output type '{s}' (expected one of {})", OUTTYPES.join(", ")));
    }
    ggml::Type::from_name(s).ok_or_else(|| format!("unknown output type '{s}'"))
}

fn main() -> ExitCode {
    tools::cli::run_tool("hamburger-convert", "warn", run)
}

fn run(args: Args) -> anyhow::Result<()> {
    tools::cli::remove_partial_files_on_interrupt()?;

    let opts = ConvertOptions {
        checkpoint: args.checkpoint,
        outfile: args.outfile,
        outtype: args.outtype,
        base_dir: args.base_dir,
        base_only: args.base_only,
        overrides: HamburgerJson {
            max_steps: args.max_steps,
            micro_layers: args.micro_layers,
            feature_layers: args.feature_layers,
            merger_heads: args.merger_heads,
            recommended_confidence: args.confidence,
            draft_vocab: None,
        },
        draft_vocab: args.draft_vocab,
        vocab_pre: args.vocab_pre,
        progress: !args.no_progress,
    };
    let r = convert::convert(&opts).map_err(|e| match e {
        convert::ConvertError::MissingBaseFiles { .. } => anyhow::anyhow!("{e} (--base-dir DIR)"),
        e => e.into(),
    })?;
    for f in &r.fallbacks {
        log::warn!("{f}");
    }
    let mb = r.bytes_out as f64 / 1e6;
    println!(
        "wrote {} ({} tensors, {:.1} MB) in {:.2} s: {:.0} MB/s read, {:.0} MB/s written",
        opts.outfile.display(),
        r.n_tensors,
        mb,
        r.seconds,
        r.bytes_in as f64 / 1e6 / r.seconds,
        mb / r.seconds
    );
    Ok(())
}
