//! `hamburger-quantize compare`: times this quantizer against libllama's
//! `llama_model_quantize` on the same llama GGUF, in one run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result};

use quant::quantize::{self, QuantizeOptions};
use quant::{Mix, Overrides};

/// Times both quantizers on a base-only (llama) F16/F32 GGUF.
#[derive(clap::Parser, Debug)]
#[command(about)]
pub struct CompareArgs {
    /// A llama GGUF (a `--base-only` export) both quantizers can read.
    pub model: PathBuf,
    /// Mixes to time, comma-separated.
    #[arg(long, value_delimiter = ',', required = true, value_parser = crate::cli::parse_mix)]
    pub types: Vec<Mix>,
    /// Where the outputs go (deleted afterwards).
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
    /// Threads for both.
    #[arg(short = 't', long, value_parser = crate::cli::thread_count, default_value_t = hamburger::EngineParams::default().n_threads)]
    pub threads: usize,
}

/// Runs the comparison and prints a Markdown table.
///
/// # Errors
/// When either quantizer fails.
pub fn main(args: CompareArgs) -> Result<()> {
    rayon::ThreadPoolBuilder::new().num_threads(args.threads.max(1)).build_global().ok();
    println!("| type | hamburger-quantize (s) | llama_model_quantize (s) | ratio | sizes (MiB) |");
    println!("| --- | ---: | ---: | ---: | --- |");
    for &mix in &args.types {
        let ours = args.out.join(format!(".compare-ours-{}.gguf", mix.name()));
        let theirs = args.out.join(format!(".compare-llama-{}.gguf", mix.name()));
        let t = Instant::now();
        quantize::quantize(&QuantizeOptions {
            input: args.model.clone(),
            output: ours.clone(),
            mix,
            overrides: Overrides::default(),
            allow_requantize: false,
            progress: false,
        })?;
        let t_ours = t.elapsed().as_secs_f64();
        let t = Instant::now();
        ggml::llama::quantize_model(&args.model, &theirs, mix.file_type(), args.threads as i32)?;
        let t_llama = t.elapsed().as_secs_f64();
        let size = |p: &PathBuf| -> Result<f64> {
            Ok(std::fs::metadata(p).with_context(|| p.display().to_string())?.len() as f64 / ggml::MIB)
        };
        println!(
            "| {} | {t_ours:.2} | {t_llama:.2} | {:.2} | {:.1} vs {:.1} |",
            mix.name(),
            t_ours / t_llama,
            size(&ours)?,
            size(&theirs)?
        );
        let _ = std::fs::remove_file(&ours);
        let _ = std::fs::remove_file(&theirs);
    }
    Ok(())
}
