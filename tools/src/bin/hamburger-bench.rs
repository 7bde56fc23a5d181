//! `hamburger-bench`: llama-bench for HAMburger models, with an in-process
//! llama.cpp baseline on the base-only GGUF and our / llama.cpp ratios.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use ggml::llama::LlamaModel;
use hamburger::draft::SpecType;
use hamburger::{EngineParams, Model, SessionParams, StepParams};
use tools::bench::{self, Measurement};
use tools::cli::FlashAttn;

/// Measures prompt processing (pp) and generation (tg) speed, llama-bench style.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The HAMburger GGUF.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Prompt lengths of the pp tests (0: none).
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    n_prompt: Vec<usize>,
    /// Generation lengths of the tg tests (0: none).
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    n_gen: Vec<usize>,
    /// CPU threads; a list sweeps them (`-t 2,4,8,16`), every test at each count
    /// (default: every core the system reports, the same in every tool).
    #[arg(short = 't', long, value_delimiter = ',', value_parser = tools::cli::thread_count, default_values_t = [EngineParams::default().n_threads])]
    threads: Vec<usize>,
    /// Repetitions of each test (after one warm-up).
    #[arg(short = 'r', long, default_value_t = 5)]
    repetitions: usize,
    /// Tokens every macro step emits in tg tests, ignoring the stop head
    /// (comma-separated, one test each; default: the stop head decides at --confidence).
    #[arg(long, value_delimiter = ',')]
    forced_steps: Option<Vec<usize>>,
    /// The stop rule of tg tests without --forced-steps.
    #[command(flatten)]
    decode: tools::decode_flags::DecodeArgs,
    /// `--spec-type draft-mtp` adds self-verified tg tests beside the others
    /// (drafts as `--spec-draft-*` say).
    #[command(flatten)]
    spec: tools::decode_flags::SpecArgs,
    /// A llama GGUF (the base-only export) to run with libllama in the same process.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Output format: md, json or csv.
    #[arg(short = 'o', long, default_value = "md", value_parser = ["md", "json", "csv"])]
    output: String,
    /// Prompt tokens per base forward.
    #[arg(short = 'b', long = "batch-size", default_value_t = EngineParams::default().n_batch)]
    batch_size: usize,
    /// Where the model runs (both engines: libllama sees the same RPC devices and -ngl).
    #[command(flatten)]
    placement: tools::cli::PlacementArgs,
    /// Also generate with this many sequences decoded together (a server's
    /// slots; aggregate tokens/s against libllama's multi-sequence decode).
    #[arg(long, value_delimiter = ',')]
    parallel: Vec<usize>,
    /// Verify forwards of these many rows (comma-separated): a target's work
    /// in speculative decoding, every row an output, after a context of
    /// --verify-context tokens, each forward rolled back; t/s counts rows.
    #[arg(long, value_delimiter = ',')]
    verify_rows: Vec<usize>,
    /// The context before each verify forward.
    #[arg(long, default_value_t = 128)]
    verify_context: usize,
    /// Flash attention: on, off or auto (on); also 1 and 0, as llama-bench takes it.
    #[arg(long = "flash-attn", value_enum, default_value_t = FlashAttn::On)]
    flash_attn: FlashAttn,
}

/// One row of the report.
struct Row {
    threads: usize,
    test: String,
    forced_steps: Option<usize>,
    /// The row's `--spec-type` where it decodes self-verified.
    verified: Option<&'static str>,
    ours: Measurement,
    base: Option<Measurement>,
}

/// One way the tg tests decode: a forced step length, the stop head at
/// --confidence, or self-verified.
struct Setting {
    /// The test name's suffix.
    label: String,
    step: StepParams,
    forced_steps: Option<usize>,
}

/// The tg settings `args` ask for, checked against `model`: each forced
/// step length (or the stop head), then self-verified with --spec-type draft-mtp.
fn settings(args: &Args, model: &Model) -> Result<Vec<Setting>> {
    let forced: Vec<Option<usize>> = match &args.forced_steps {
        Some(k) => k.iter().map(|&k| Some(k)).collect(),
        None => vec![None],
    };
    let mut out: Vec<Setting> = forced
        .into_iter()
        .map(|k| Setting {
            label: k.map_or_else(|| format!("c={}", args.decode.confidence()), |k| format!("k={k}")),
            step: args.decode.step_params(k),
            forced_steps: k,
        })
        .collect();
    if let Some(draft) = args.spec.draft(false)? {
        let n = draft.n_max.map_or_else(String::new, |n| format!(" n={}..{n}", draft.n_min));
        let step = StepParams { draft: Some(draft), ..args.decode.step_params(None) };
        out.push(Setting { label: format!("verified{n}"), step, forced_steps: None });
    }
    for s in &out {
        s.step.validate(model.hp.max_steps)?;
    }
    Ok(out)
}

fn main() -> ExitCode {
    tools::cli::run_tool("hamburger-bench", "warn", |args: Args| run(args))
}

fn run(mut args: Args) -> Result<()> {
    let _first_pages = args.baseline.is_some().then(bench::hold_first_pages);
    let model = hamburger::Model::open(&args.model, &args.placement.load_options())?;
    args.decode.default_from_model(model.recommended_confidence);
    let args = &args;
    let settings = settings(args, &model)?;
    // libllama runs where we run.
    let placement = tools::devices::BaselinePlacement::new(&model.plan, &args.placement);
    let baseline = args.baseline.as_ref().map(|b| LlamaModel::load_with(b, &placement.llama())).transpose()?;
    let mut rows = Vec::new();
    for &threads in &args.threads {
        rows.extend(measure(args, &model, baseline.as_ref(), &settings, threads)?);
    }
    eprintln!("placement: {}", model.plan.describe());
    let name = args.model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let size = model.size_bytes as f64 / (1u64 << 30) as f64;
    match args.output.as_str() {
        "md" => print_md(&name, size, &rows),
        "json" => println!("{}", serde_json::to_string_pretty(&json_rows(&name, &model, &rows))?),
        _ => print_csv(&json_rows(&name, &model, &rows)),
    }
    Ok(())
}

/// Every test of `args` at `threads` threads, ours and (with a baseline) libllama's, interleaved.
fn measure(
    args: &Args,
    model: &Model,
    baseline: Option<&LlamaModel>,
    settings: &[Setting],
    threads: usize,
) -> Result<Vec<Row>> {
    let engine = EngineParams {
        n_ctx: 0,
        n_batch: args.batch_size,
        n_threads: threads,
        flash_attn: args.flash_attn.choice(),
        ..Default::default()
    };
    // libllama gets the attention ours resolves to, so the two run alike.
    let engine = EngineParams { flash_attn: Some(engine.fused_attention(model)), ..engine };
    let params = SessionParams { engine, step: args.decode.step_params(None), ..Default::default() };
    let with = |s: &Setting| SessionParams { step: s.step, ..params.clone() };
    let r = args.repetitions.max(1);
    let mut rows = Vec::new();
    for &n in args.n_prompt.iter().filter(|&&n| n > 0) {
        let base = baseline.map(|b| bench::llama_pp(b, &params.engine, n)).transpose()?;
        let (ours, base) = interleave_pair(r, bench::hamburger_pp(model, &params, n)?, base)?;
        rows.push(Row { threads, test: format!("pp{n}"), forced_steps: None, verified: None, ours, base });
    }
    // A repetition runs enough verify forwards to take about as long as a pp64.
    for &k in args.verify_rows.iter().filter(|&&k| k > 0) {
        let n_forwards = 64usize.div_ceil(k).max(8);
        let (ctx, engine) = (args.verify_context, &params.engine);
        let base = baseline.map(|b| bench::llama_verify(b, engine, k, ctx, n_forwards)).transpose()?;
        let (ours, base) = interleave_pair(r, bench::hamburger_verify(model, engine, k, ctx, n_forwards)?, base)?;
        rows.push(Row { threads, test: format!("verify{k} @{ctx}"), forced_steps: None, verified: None, ours, base });
    }
    for &n in args.n_gen.iter().filter(|&&n| n > 0) {
        // One round runs every setting and the baseline in turn.
        let mut runners = Vec::new();
        let mut stats = Vec::new();
        for s in settings {
            let (run, s) = bench::hamburger_tg(model, &with(s), n)?;
            runners.push(run);
            stats.push(s);
        }
        let mut base = None;
        if let Some(b) = baseline {
            let (run, m) = bench::llama_tg(b, &params.engine, n)?;
            runners.push(run);
            base = Some(m);
        }
        let mut samples = bench::interleaved(r, &mut runners)?;
        if let Some(m) = base.as_mut() {
            m.samples_ns = samples.pop().unwrap_or_default();
        }
        for ((setting, s), samples_ns) in settings.iter().zip(&stats).zip(samples) {
            let (tokens_per_step, kv_bytes_per_token) = s.get();
            let ours = Measurement { samples_ns, tokens_per_step, kv_bytes_per_token, ..Measurement::generation(n) };
            rows.push(Row {
                threads,
                test: format!("tg{n} {}", setting.label),
                forced_steps: setting.forced_steps,
                verified: setting.step.draft.map(|d| SpecType::SelfVerified { ngram: d.ngram.is_some() }.name()),
                ours,
                base: base.clone(),
            });
        }
    }
    for &n in args.n_gen.iter().filter(|&&n| n > 0) {
        for &p in args.parallel.iter().filter(|&&p| p > 0) {
            let mut runners = Vec::new();
            for s in settings {
                runners.push(bench::hamburger_tg_parallel(model, &with(s), n, p)?);
            }
            if let Some(b) = baseline {
                runners.push(bench::llama_tg_parallel(b, &params.engine, n, p)?);
            }
            let mut samples = bench::interleaved(r, &mut runners)?;
            let base = baseline.map(|_| Measurement {
                samples_ns: samples.pop().unwrap_or_default(),
                ..Measurement::generation(n * p)
            });
            for (setting, samples_ns) in settings.iter().zip(samples) {
                let ours = Measurement {
                    samples_ns,
                    tokens_per_step: setting.forced_steps.unwrap_or(0) as f64,
                    ..Measurement::generation(n * p)
                };
                rows.push(Row {
                    threads,
                    test: format!("tg{n} x{p} {}", setting.label),
                    forced_steps: setting.forced_steps,
                    verified: setting.step.draft.map(|d| SpecType::SelfVerified { ngram: d.ngram.is_some() }.name()),
                    ours,
                    base: base.clone(),
                });
            }
        }
    }
    Ok(rows)
}

/// Our test and (with a baseline) libllama's, interleaved over `r` rounds.
fn interleave_pair(
    r: usize,
    (run, mut ours): (bench::Runner, Measurement),
    base: Option<(bench::Runner, Measurement)>,
) -> Result<(Measurement, Option<Measurement>)> {
    let mut runners = vec![run];
    let mut base = base.map(|(run, m)| {
        runners.push(run);
        m
    });
    let mut samples = bench::interleaved(r, &mut runners)?.into_iter();
    ours.samples_ns = samples.next().unwrap_or_default();
    if let Some(m) = base.as_mut() {
        m.samples_ns = samples.next().unwrap_or_default();
    }
    Ok((ours, base))
}

fn print_md(name: &str, size_gib: f64, rows: &[Row]) {
    println!(
        "| model | size | threads | test | t/s | llama.cpp t/s | ratio | tok/step | KV B/tok | llama.cpp KV B/tok |"
    );
    println!("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        let (base, ratio, base_kv) = match &r.base {
            Some(b) => (
                format!("{:.2} ± {:.2}", b.avg_ts(), b.stddev_ts()),
                format!("{:.2}", r.ours.avg_ts() / b.avg_ts()),
                format!("{:.0}", b.kv_bytes_per_token),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {name} | {size_gib:.2} GiB | {} | {} | {:.2} ± {:.2} | {base} | {ratio} | {:.2} | {:.0} | {base_kv} |",
            r.threads,
            r.test,
            r.ours.avg_ts(),
            r.ours.stddev_ts(),
            r.ours.tokens_per_step,
            r.ours.kv_bytes_per_token,
        );
    }
}

/// Rows with llama-bench's field names plus `forced_steps` and `spec_type`, one per engine.
fn json_rows(name: &str, model: &Model, rows: &[Row]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for r in rows {
        for (engine, m) in [("hamburger", Some(&r.ours)), ("llama.cpp", r.base.as_ref())] {
            let Some(m) = m else { continue };
            out.push(serde_json::json!({
                "engine": engine,
                "model_filename": name,
                "model_size": model.size_bytes,
                "n_threads": r.threads,
                "n_prompt": m.n_prompt,
                "n_gen": m.n_gen,
                "test": r.test,
                "forced_steps": if engine == "hamburger" { r.forced_steps } else { None },
                "spec_type": r.verified.filter(|_| engine == "hamburger").unwrap_or("none"),
                "avg_ns": m.avg_ns(),
                "avg_ts": m.avg_ts(),
                "stddev_ts": m.stddev_ts(),
                "samples_ts": m.samples_ts(),
                "tokens_per_step": m.tokens_per_step,
                "kv_bytes_per_token": m.kv_bytes_per_token,
            }));
        }
    }
    out
}

fn print_csv(rows: &[serde_json::Value]) {
    let cols = [
        "engine",
        "model_filename",
        "model_size",
        "n_threads",
        "n_prompt",
        "n_gen",
        "test",
        "forced_steps",
        "spec_type",
        "avg_ns",
        "avg_ts",
        "stddev_ts",
        "tokens_per_step",
        "kv_bytes_per_token",
    ];
    println!("{}", cols.join(","));
    for r in rows {
        let cells: Vec<String> = cols
            .iter()
            .map(|c| match &r[*c] {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(s) => format!("\"{s}\""),
                v => v.to_string(),
            })
            .collect();
        println!("{}", cells.join(","));
    }
}

/// `-fa` takes what llama-bench takes (0/1) and what the other llama.cpp
/// tools take (on/off/auto).
#[cfg(test)]
mod tests {
    use super::*;

    fn flash_attn(value: &str) -> Result<FlashAttn, clap::Error> {
        let args = ["hamburger-bench", "-m", "m.gguf", "-fa", value].map(String::from);
        Args::try_parse_from(tools::cli::llama_style_args(args)).map(|a| a.flash_attn)
    }

    #[test]
    fn flash_attn_as_llama_bench_takes_it() {
        for (value, want) in [
            ("1", FlashAttn::On),
            ("0", FlashAttn::Off),
            ("on", FlashAttn::On),
            ("off", FlashAttn::Off),
            ("auto", FlashAttn::Auto),
        ] {
            assert_eq!(flash_attn(value).unwrap(), want, "-fa {value}");
        }
        assert_eq!(
            [FlashAttn::On, FlashAttn::Off, FlashAttn::Auto].map(FlashAttn::choice),
            [Some(true), Some(false), None]
        );
        assert!(flash_attn("2").is_err());
    }
}
