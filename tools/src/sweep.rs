//! Quantization sweeps: quantize one F16 model to several mixes and measure,
//! per mix, size, bits per weight, prompt and generation speed, tokens per
//! macro step, and agreement with the F16 model (free-running greedy token
//! match, and teacher-forced top-1 agreement and KL divergence of each macro
//! step's first-token distribution). Writes `sweep.csv`, `sweep.md` and `sweep.svg`.

use std::path::{Path, PathBuf};

use crate::bench;
use crate::logits::kl_divergence;
use crate::sweep_table::{self, SweepRow};
use anyhow::{Context as _, Result};
use ggml::Type;
use hamburger::tokenizer::Tokenizer;
use hamburger::{EngineParams, Generation, LoadOptions, Model, Session, SessionParams};

use quant::quantize::{self, QuantizeOptions};
use quant::{Mix, Overrides};

/// The prompts a sweep uses unless given others.
pub const DEFAULT_PROMPTS: &str = include_str!("../prompts/sweep.txt");

/// `hamburger-quantize sweep`: measures a list of mixes against an F16 model.
#[derive(clap::Parser, Debug)]
#[command(about)]
pub struct SweepArgs {
    /// The F16 (or F32/BF16) HAMburger GGUF to start from.
    pub model: PathBuf,
    /// Mixes to measure, comma-separated (Q8_0,Q4_K_M,Q4_0,...).
    #[arg(long, value_delimiter = ',', required = true, value_parser = crate::cli::parse_mix)]
    pub types: Vec<Mix>,
    /// Directory for the quantized models and the results.
    #[arg(long)]
    pub out: PathBuf,
    /// Prompts, one per line (default: the project's set).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Use only the first N prompts (default: all), for a quicker sweep.
    #[arg(long, value_parser = crate::cli::at_least_one)]
    pub n_prompts: Option<usize>,
    /// CPU threads (default: every core the system reports, the same in every tool; llama.cpp takes the physical cores).
    #[arg(short = 't', long, value_parser = crate::cli::thread_count, default_value_t = hamburger::EngineParams::default().n_threads)]
    pub threads: usize,
    /// Tokens generated per prompt for the quality measures.
    #[arg(short = 'n', long, default_value_t = 32)]
    pub n_gen: usize,
    /// The stop rule of the generation runs.
    #[command(flatten)]
    pub decode: crate::decode_flags::DecodeArgs,
    /// Type of the grafted matrices (default: the policy's).
    #[arg(long, value_parser = quant::policy::parse_type)]
    pub grafted_type: Option<Type>,
    /// REGEX=TYPE overrides applied to every mix (repeatable), for ablations.
    #[arg(long = "tensor-type", value_parser = quant::policy::parse_tensor_type)]
    pub tensor_types: Vec<(regex::Regex, Type)>,
    /// Prompt length of the speed test.
    #[arg(long, default_value_t = 128)]
    pub pp: usize,
    /// Generation length of the speed test.
    #[arg(long, default_value_t = 64)]
    pub tg: usize,
    /// Repetitions of the speed tests.
    #[arg(short = 'r', long, default_value_t = 2)]
    pub repetitions: usize,
}

/// Teacher-forced agreement counts.
#[derive(Default)]
struct Agreement {
    same_tokens: usize,
    tokens: usize,
    first_same: usize,
    steps: usize,
    kl: f64,
    micro_same: usize,
    micro: usize,
    stop_same: usize,
    stops: usize,
}

/// What the reference model produced for one prompt.
struct RefRun {
    prompt: Vec<u32>,
    gen: Generation,
}

fn session_params(args: &SweepArgs, keep_logits: bool) -> SessionParams {
    SessionParams {
        engine: EngineParams { n_ctx: 1024, n_threads: args.threads, ..Default::default() },
        step: args.decode.step_params(None),
        keep_logits,
        ..Default::default()
    }
}

fn greedy(session: &mut Session, prompt: &[u32], n: usize) -> Result<Generation> {
    session.clear();
    Ok(session.generate(prompt, n, |_| true)?)
}

/// Quality of `model` against the reference runs: free-running token match,
/// then, teacher-forced on each reference macro step, first-token top-1 and
/// KL, later micro tokens' top-1, and stop decisions.
fn quality(model: &Model, args: &SweepArgs, refs: &[RefRun]) -> Result<Agreement> {
    let params = session_params(args, false);
    let rule = params.step.rule(model.hp.max_steps)?;
    let mut session = Session::new(model, params)?;
    let mut a = Agreement::default();
    for r in refs {
        let ours = greedy(&mut session, &r.prompt, args.n_gen)?;
        a.same_tokens += ours.output_ids.iter().zip(&r.gen.output_ids).filter(|(x, y)| x == y).count();
        a.tokens += r.gen.output_ids.len();
        session.clear();
        let mut next = Some(session.feed(&r.prompt, true)?);
        let n_steps = r.gen.macro_steps.len();
        for (i, step) in r.gen.macro_steps.iter().enumerate() {
            let out = next.take().context("each step is fed before the next")?;
            let logits = out.logits.as_deref().context("logits were asked for")?;
            a.kl += kl_divergence(&step.logits[0], logits);
            a.first_same += usize::from(hamburger::sampling::argmax(logits) == step.tokens[0]);
            a.steps += 1;
            let outs = session.forced_micro_steps(out, &step.tokens, false)?;
            for (s, o) in outs.iter().enumerate() {
                if s > 0 {
                    a.micro_same += usize::from(o.argmax == step.tokens[s]);
                    a.micro += 1;
                }
                // The last step may have been cut by the budget: only its earlier decisions count.
                let last = s + 1 == step.tokens.len();
                if !(last && i + 1 == n_steps) {
                    a.stop_same += usize::from(rule.stops(s + 1, o.p_stop) == last);
                    a.stops += 1;
                }
            }
            if i + 1 < n_steps {
                next = Some(session.feed_merged(&step.tokens, true)?);
            }
        }
    }
    Ok(a)
}

fn measure(path: &Path, name: &str, args: &SweepArgs, refs: &[RefRun], bpw: f64) -> Result<SweepRow> {
    let model = Model::open(path, &LoadOptions::default())?;
    let p = session_params(args, false);
    let pp = bench::measure_pp(&model, &p, args.pp, args.repetitions)?;
    let tg = bench::measure_tg(&model, &p, args.tg, args.repetitions)?;
    let q = quality(&model, args, refs)?;
    // NaN when there was nothing to compare (no micro tokens at a high confidence).
    let frac = |n: usize, d: usize| if d == 0 { f64::NAN } else { n as f64 / d as f64 };
    Ok(SweepRow {
        name: name.to_string(),
        bytes: std::fs::metadata(path).with_context(|| path.display().to_string())?.len(),
        bpw,
        pp_ts: pp.avg_ts(),
        tg_ts: tg.avg_ts(),
        tokens_per_step: tg.tokens_per_step,
        token_match: frac(q.same_tokens, q.tokens),
        top1_agree: frac(q.first_same, q.steps),
        kl_mean: q.kl / q.steps.max(1) as f64,
        micro_agree: frac(q.micro_same, q.micro),
        stop_agree: frac(q.stop_same, q.stops),
    })
}

/// Runs a sweep and writes its three files.
///
/// # Errors
/// Bad input or any failed quantization or measurement.
pub fn main(mut args: SweepArgs) -> Result<()> {
    rayon::ThreadPoolBuilder::new().num_threads(args.threads.max(1)).build_global().ok();
    std::fs::create_dir_all(&args.out).with_context(|| args.out.display().to_string())?;
    let text = match &args.prompts {
        Some(p) => std::fs::read_to_string(p).with_context(|| p.display().to_string())?,
        None => DEFAULT_PROMPTS.to_string(),
    };
    let reference = Model::open(&args.model, &LoadOptions::default())?;
    args.decode.default_from_model(reference.recommended_confidence);
    let tok = Tokenizer::from_model(&reference)?;
    let prompts: Vec<Vec<u32>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(args.n_prompts.unwrap_or(usize::MAX))
        .map(|l| tok.encode(l, true))
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(!prompts.is_empty(), "no prompts");
    let bar = quant::stream::progress_bar(true, (args.types.len() + 1) as u64, "sweep");
    bar.set_message("reference runs");
    let mut session = Session::new(&reference, session_params(&args, true))?;
    let refs: Vec<RefRun> = prompts
        .into_iter()
        .map(|prompt| Ok(RefRun { gen: greedy(&mut session, &prompt, args.n_gen)?, prompt }))
        .collect::<Result<_>>()?;
    drop(session);
    let gguf = ggml::gguf::Gguf::open(&args.model)?;
    let input_plan = quantize::plan(&gguf, Mix::F32, &Overrides { pure: true, ..Default::default() })?;
    let input_bpw = input_plan
        .rows
        .iter()
        .map(|r| r.from.nbytes(r.ne[0] as usize, r.ne.iter().product::<i64>() as usize).unwrap_or(0))
        .sum::<usize>() as f64
        * 8.0
        / input_plan.rows.iter().map(|r| r.ne.iter().product::<i64>()).sum::<i64>() as f64;
    let mut rows = vec![measure(&args.model, "input", &args, &refs, input_bpw)?];
    bar.inc(1);
    let stem = args.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    for &mix in &args.types {
        bar.set_message(mix.name().to_string());
        let out = args.out.join(format!("{stem}-{}.gguf", mix.name()));
        let overrides =
            Overrides { grafted: args.grafted_type, tensor_types: args.tensor_types.clone(), ..Default::default() };
        let report = quantize::quantize(&QuantizeOptions {
            input: args.model.clone(),
            output: out.clone(),
            mix,
            overrides,
            allow_requantize: false,
            progress: false,
        })?;
        rows.push(measure(&out, mix.name(), &args, &refs, report.plan.bits_per_weight())?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    std::fs::write(args.out.join("sweep.csv"), sweep_table::csv(&rows)).context("sweep.csv")?;
    let report = markdown(&rows, &args, refs.len());
    std::fs::write(args.out.join("sweep.md"), &report).context("sweep.md")?;
    crate::plot::write_svg(&args.out.join("sweep.svg"), &rows)?;
    print!("{report}");
    Ok(())
}

/// The Markdown report: the settings, then the table.
fn markdown(rows: &[SweepRow], args: &SweepArgs, n_prompts: usize) -> String {
    let settings = format!(
        "Sweep of `{}`: {} threads, pp{} / tg{} at confidence {}, quality over {n_prompts} prompts of {} tokens.\n\n",
        args.model.display(),
        args.threads,
        args.pp,
        args.tg,
        args.decode.confidence(),
        args.n_gen
    );
    settings + &sweep_table::markdown(rows)
}
