//! `hamburger-eval`: a trained HAMburger against its base on real prompts
//! (tokens per macro step, KV entries per token, end-to-end tokens/s against
//! libllama on the base in the same run, and the base's log-likelihood of the
//! outputs), `score`, the base's per-token entropies and log-probabilities
//! of answers (what `hamburger-train segment` reads), and `tokenize`, chat
//! prompts as token ids (what `hamburger-train pack` ships).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use ggml::llama::{LlamaContext, LlamaContextParams, LlamaModel};
use hamburger::draft::SpecType;
use hamburger::{EngineParams, Model, Session, SessionParams};
use serde_json::{json, Value};
use tools::devices::BaselinePlacement;
use tools::eval::{self, Prompts, Row, Scorer};

/// Evaluates a HAMburger GGUF against its base.
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once per run: the size of `Run`'s constraint flags costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Generates from every prompt with HAMburger (at each confidence) and
    /// with libllama on the base; prints a table of speed and quality.
    Run {
        /// The HAMburger GGUF.
        #[arg(short = 'm', long)]
        model: PathBuf,
        /// The base-only GGUF libllama generates with (the speed baseline).
        #[arg(long)]
        baseline: PathBuf,
        /// The base GGUF that scores the outputs (default: --baseline); a
        /// quantization sweep scores every type with the same F16 base.
        #[arg(long)]
        scorer: Option<PathBuf>,
        /// JSON lines with a `prompt` field (a user message).
        #[arg(long)]
        prompts: PathBuf,
        /// Use only the first N prompts.
        #[arg(long)]
        limit: Option<usize>,
        /// New tokens per prompt (both engines generate exactly this many).
        #[arg(short = 'n', long, default_value_t = 128, value_parser = tools::cli::at_least_one)]
        n_predict: usize,
        /// Stop-head confidences, comma-separated (one row each).
        #[arg(long, value_delimiter = ',', default_value = "0.8", value_parser = tools::cli::finite, allow_negative_numbers = true)]
        confidence: Vec<f32>,
        /// CPU threads (default: every core the system reports, the same in every tool; llama.cpp takes the physical cores).
        #[arg(short = 't', long, default_value_t = EngineParams::default().n_threads, value_parser = tools::cli::thread_count)]
        threads: usize,
        /// Output: md or json.
        #[arg(short = 'o', long, default_value = "md", value_parser = ["md", "json"])]
        output: String,
        /// Constrain HAMburger's outputs (llama-cli's flags; the base's
        /// greedy run stays free): each generation then ends where the
        /// constraint is complete, and `--grammar-micro` picks what a
        /// forbidden micro token does.
        #[command(flatten)]
        grammar: tools::grammar::GrammarArgs,
        /// Where the models run (libllama's base and scorer where HAMburger runs).
        #[command(flatten)]
        placement: tools::cli::PlacementArgs,
        /// `--spec-type draft-mtp` adds a self-verified row (its drafts as
        /// `--spec-draft-*` say) beside the confidences'.
        #[command(flatten)]
        spec: tools::decode_flags::SpecArgs,
    },
    /// Reads JSON lines `{"prompt": user message, "response": text}` (other
    /// fields are kept) and writes each with `ids` (prompt and answer, the
    /// answer ended by the end-of-turn token), `n_prompt`, and the base's
    /// `entropy` and `logprob` of every answer token, and with `--top K` its
    /// K most likely tokens there (`top`: [[token, log-probability], ...]).
    Score {
        /// The HAMburger GGUF (its tokenizer and chat template).
        #[arg(short = 'm', long)]
        model: PathBuf,
        /// The base-only GGUF that scores.
        #[arg(long)]
        baseline: PathBuf,
        /// CPU threads (default: every core the system reports, the same in every tool; llama.cpp takes the physical cores).
        #[arg(short = 't', long, default_value_t = EngineParams::default().n_threads, value_parser = tools::cli::thread_count)]
        threads: usize,
        /// Longest sequence scored; longer ones are cut there.
        #[arg(short = 'c', long, default_value_t = 2048, value_parser = tools::cli::at_least_one)]
        ctx_size: usize,
        /// The base's most likely tokens kept at every answer token (the
        /// training tool's soft targets); 0 keeps none.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=256))]
        top: u16,
        /// Where the models run (libllama's base where HAMburger runs).
        #[command(flatten)]
        placement: tools::cli::PlacementArgs,
    },
    /// Reads JSON lines with a `prompt` (a user message) or `messages` (a
    /// chat) and writes each with `ids`: the prompt rendered with the
    /// model's chat template and tokenized, ready for the answer (what
    /// `hamburger-train pack` ships to a machine without this runtime). A
    /// record with a `response` gets the answer's ids after the prompt's,
    /// as `score` makes them, and `n_prompt`, but no scores (what
    /// `hamburger-train draft` reads, its base scoring in PyTorch).
    Tokenize {
        /// The GGUF whose tokenizer and chat template are used.
        #[arg(short = 'm', long)]
        model: PathBuf,
        /// Longest prompt and answer; longer ones are cut there, as `score` cuts them.
        #[arg(short = 'c', long, default_value_t = 2048, value_parser = tools::cli::at_least_one)]
        ctx_size: usize,
    },
    /// Speculative decoding with a draft model, greedy, on every prompt in
    /// turn: the target alone (ours and libllama's), the target verifying
    /// the HAMburger's drafts (-md, at each confidence), and libllama with
    /// an ordinary draft model (llama.cpp's draft-model loop); prints
    /// tokens/s, tokens per target forward and accepted tokens per draft forward.
    Draft {
        /// The target GGUF (a llama GGUF; our engine and libllama both run it).
        #[arg(short = 'm', long)]
        target: PathBuf,
        /// The HAMburger GGUF that drafts for it (also -md).
        #[arg(long = "model-draft")]
        draft: PathBuf,
        /// The ordinary draft GGUF libllama drafts with (llama.cpp's -md).
        #[arg(long)]
        baseline_draft: PathBuf,
        /// JSON lines with a `prompt` field (a user message).
        #[arg(long)]
        prompts: PathBuf,
        /// Use only the first N prompts.
        #[arg(long)]
        limit: Option<usize>,
        /// New tokens per prompt (end of generation ignored).
        #[arg(short = 'n', long, default_value_t = 96, value_parser = tools::cli::at_least_one)]
        n_predict: usize,
        /// The HAMburger's stop-head confidences, comma-separated (one row each).
        #[arg(long, value_delimiter = ',', default_value = "0.9", value_parser = tools::cli::finite, allow_negative_numbers = true)]
        confidence: Vec<f32>,
        /// The most tokens drafted per verification, both sides.
        #[arg(long, default_value_t = hamburger::draft_model::DraftModelParams::default().n_max)]
        spec_draft_n_max: usize,
        /// CPU threads.
        #[arg(short = 't', long, default_value_t = EngineParams::default().n_threads, value_parser = tools::cli::thread_count)]
        threads: usize,
    },
}

fn main() -> ExitCode {
    tools::cli::run_tool("hamburger-eval", "warn", |args: Args| match args.cmd {
        Cmd::Run {
            model,
            baseline,
            scorer,
            prompts,
            limit,
            n_predict,
            confidence,
            threads,
            output,
            grammar,
            placement,
            spec,
        } => {
            let opts =
                RunOptions { n_predict, confidence, threads, limit, grammar, placement, draft: spec.draft(false)? };
            let rows = run(&model, &baseline, scorer.as_deref(), &prompts, &opts)?;
            match output.as_str() {
                "md" => print!("{}", eval::markdown(&rows)),
                _ => println!("{}", serde_json::to_string_pretty(&rows.iter().map(Row::to_json).collect::<Vec<_>>())?),
            }
            Ok(())
        }
        Cmd::Score { model, baseline, threads, ctx_size, top, placement } => {
            score(&model, &baseline, threads, ctx_size, top.into(), &placement)
        }
        Cmd::Tokenize { model, ctx_size } => tokenize(&model, ctx_size),
        Cmd::Draft {
            target,
            draft,
            baseline_draft,
            prompts,
            limit,
            n_predict,
            confidence,
            spec_draft_n_max,
            threads,
        } => {
            let texts = read_prompts(&prompts, limit)?;
            let o = DraftOptions { n_predict, confidence, n_max: spec_draft_n_max, threads };
            print!("{}", draft_run(&target, &draft, &baseline_draft, &texts, &o)?);
            Ok(())
        }
    })
}

struct RunOptions {
    n_predict: usize,
    confidence: Vec<f32>,
    threads: usize,
    limit: Option<usize>,
    grammar: tools::grammar::GrammarArgs,
    placement: tools::cli::PlacementArgs,
    /// Self-verified drafts: one more row.
    draft: Option<hamburger::DraftParams>,
}

/// The `prompt` of every JSON line of `path`.
fn read_prompts(path: &Path, limit: Option<usize>) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--prompts {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let p =
            v["prompt"].as_str().with_context(|| format!("{}:{}: no string field 'prompt'", path.display(), i + 1))?;
        out.push(p.to_string());
    }
    out.truncate(limit.unwrap_or(usize::MAX));
    if out.is_empty() {
        bail!("--prompts {}: no prompts", path.display());
    }
    Ok(out)
}

/// A base GGUF loaded by libllama where `placement` says.
fn load_base(path: &Path, placement: &BaselinePlacement) -> Result<LlamaModel> {
    LlamaModel::load_with(path, &placement.llama()).with_context(|| format!("{}", path.display()))
}

fn run(model: &Path, baseline: &Path, scorer: Option<&Path>, prompts: &Path, o: &RunOptions) -> Result<Vec<Row>> {
    let texts = read_prompts(prompts, o.limit)?;
    let _first_pages = tools::bench::hold_first_pages();
    let model = Model::open(model, &o.placement.load_options())?;
    let chat = Prompts::new(&model)?;
    let ids: Vec<Vec<u32>> = texts.iter().map(|t| chat.user(t)).collect::<Result<_>>()?;
    let n_ctx = ids.iter().map(Vec::len).max().unwrap_or(0) + o.n_predict + 8;
    let placement = BaselinePlacement::new(&model.plan, &o.placement);
    let base = load_base(baseline, &placement)?;
    let score_model = scorer.map(|s| load_base(s, &placement)).transpose()?;
    // libllama's plain decoding and scoring attend as ours does (fused or not).
    let fused = eval::session_params(1.0, None, o.threads, n_ctx).engine.fused_attention(&model);
    let mut scorer = Scorer::new(score_model.as_ref().unwrap_or(&base), n_ctx, o.threads, fused)?;
    let llama_params = LlamaContextParams {
        n_ctx: n_ctx as u32,
        n_threads: o.threads as i32,
        flash_attn: Some(fused),
        ..Default::default()
    };
    let mut base_ctx = LlamaContext::new(&base, llama_params)?;
    let constraint = if o.grammar.is_set() {
        Some(o.grammar.constraint(&hamburger::tokenizer::Tokenizer::from_model(&model)?, &model.vocab.eog)?)
    } else {
        None
    };
    // One row per confidence, and a self-verified one when asked.
    let modes: Vec<(f32, Option<hamburger::DraftParams>)> =
        o.confidence.iter().map(|&c| (c, None)).chain(o.draft.map(|d| (1.01, Some(d)))).collect();
    let mut sessions: Vec<Session> = modes
        .iter()
        .map(|&(c, draft)| {
            // A constrained output ends where the constraint is complete.
            let params =
                SessionParams { ignore_eog: constraint.is_none(), ..eval::session_params(c, draft, o.threads, n_ctx) };
            let mut s = Session::new(&model, params)?;
            s.set_constraint(constraint.clone());
            Ok(s)
        })
        .collect::<hamburger::Result<_>>()?;
    let mut rows: Vec<Row> = modes
        .iter()
        .map(|&(c, draft)| Row {
            confidence: c,
            verified: draft.map(|d| SpecType::SelfVerified { ngram: d.ngram.is_some() }.name()),
            ..Default::default()
        })
        .collect();
    // Warm-up: one untimed generation per engine.
    eval::run_base(&mut base_ctx, &ids[0], o.n_predict.min(8))?;
    for s in &mut sessions {
        eval::run_hamburger(s, &ids[0], o.n_predict.min(8))?;
    }
    let eog = &model.vocab.eog;
    for (i, prompt) in ids.iter().enumerate() {
        let base_run = eval::judge(&mut scorer, prompt, eval::run_base(&mut base_ctx, prompt, o.n_predict)?, eog)?;
        for (session, row) in sessions.iter_mut().zip(&mut rows) {
            let ours = eval::judge(&mut scorer, prompt, eval::run_hamburger(session, prompt, o.n_predict)?, eog)?;
            eval::account(row, &ours, &base_run);
        }
        log::info!("prompt {}/{} done", i + 1, ids.len());
    }
    Ok(rows)
}

fn score(
    model: &Path,
    baseline: &Path,
    threads: usize,
    n_ctx: usize,
    top: usize,
    placement: &tools::cli::PlacementArgs,
) -> Result<()> {
    let model = Model::open(model, &placement.load_options())?;
    let chat = Prompts::new(&model)?;
    let end = model.vocab.eos.context("the model has no end-of-turn token")?;
    let base = load_base(baseline, &BaselinePlacement::new(&model.plan, placement))?;
    let fused = EngineParams { n_ctx, n_threads: threads, ..Default::default() }.fused_attention(&model);
    let mut scorer = Scorer::new(&base, n_ctx, threads, fused)?;
    each_record(|at, mut v| {
        let Some((ids, n_prompt)) = answered(&chat, &v, at, end, n_ctx)? else {
            return Ok(None);
        };
        let s = scorer.score(&ids, n_prompt, top)?;
        v["ids"] = json!(ids);
        v["n_prompt"] = json!(n_prompt);
        v["entropy"] = json!(s.entropy);
        v["logprob"] = json!(s.logprob);
        if top > 0 {
            v["top"] = json!(s.top);
        }
        Ok(Some(v))
    })
}

/// Reads standard input's JSON lines, passes each (with where it is, for
/// errors: `input line N`) to `f`, and writes what `f` returns to standard
/// output, one line each (`None`: the record is skipped).
fn each_record(mut f: impl FnMut(&str, Value) -> Result<Option<Value>>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.context("standard input")?;
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("input line {}", i + 1);
        let v: Value = serde_json::from_str(&line).with_context(|| format!("{at}: not JSON"))?;
        if let Some(v) = f(&at, v)? {
            writeln!(out, "{v}")?;
        }
    }
    Ok(())
}

/// `hamburger-eval tokenize`: standard input's records with their prompt ids.
fn tokenize(model: &Path, n_ctx: usize) -> Result<()> {
    let model = Model::open(model, &hamburger::LoadOptions::default())?;
    let chat = Prompts::new(&model)?;
    let end = model.vocab.eos.context("the model has no end-of-turn token")?;
    each_record(|at, mut v| {
        if v.get("response").is_none() {
            v["ids"] = json!(chat.of_record(&v, at)?);
            return Ok(Some(v));
        }
        let Some((ids, n_prompt)) = answered(&chat, &v, at, end, n_ctx)? else {
            return Ok(None);
        };
        v["ids"] = json!(ids);
        v["n_prompt"] = json!(n_prompt);
        Ok(Some(v))
    })
}

/// A record's prompt and answer as one sequence of ids, the answer (its
/// string `response`) ended by `end`, cut at `n_ctx`, with the prompt's
/// length; `None` (logged) when the prompt alone fills `n_ctx`.
fn answered(chat: &Prompts, v: &Value, at: &str, end: u32, n_ctx: usize) -> Result<Option<(Vec<u32>, usize)>> {
    let response = v["response"].as_str().with_context(|| format!("{at}: no string field 'response'"))?;
    let mut ids = chat.of_record(v, at)?;
    let n_prompt = ids.len();
    ids.extend(chat.text(response)?);
    ids.push(end);
    ids.truncate(n_ctx);
    if ids.len() <= n_prompt {
        log::warn!("{at}: the prompt fills the context; skipped");
        return Ok(None);
    }
    Ok(Some((ids, n_prompt)))
}

struct DraftOptions {
    n_predict: usize,
    confidence: Vec<f32>,
    n_max: usize,
    threads: usize,
}

/// `hamburger-eval draft` (see [`tools::draft_eval`]).
fn draft_run(target: &Path, draft: &Path, baseline_draft: &Path, texts: &[String], o: &DraftOptions) -> Result<String> {
    use hamburger::draft_model::{DraftModelParams, DraftSession, DraftSessionParams};
    use tools::draft_eval::{self, SpecRow};
    let _first_pages = tools::bench::hold_first_pages();
    let model = Model::open(target, &hamburger::LoadOptions::default())?;
    let ham = Model::open(draft, &hamburger::LoadOptions::default()).context("--model-draft")?;
    let chat = Prompts::new(&model)?;
    let ids: Vec<Vec<u32>> = texts.iter().map(|t| chat.user(t)).collect::<Result<_>>()?;
    let n_ctx = ids.iter().map(Vec::len).max().unwrap_or(0) + o.n_predict + o.n_max + 8;
    let params = SessionParams { ignore_eog: true, ..eval::session_params(1.01, None, o.threads, n_ctx) };
    let mut alone = Session::new(&model, params.clone())?;
    let mut drafted: Vec<DraftSession> = o
        .confidence
        .iter()
        .map(|&c| {
            let p = DraftSessionParams {
                engine: params.engine.clone(),
                step: hamburger::StepParams { confidence: c, ..Default::default() },
                sampling: params.sampling,
                draft: DraftModelParams { n_max: o.n_max, ..Default::default() },
                ignore_eog: true,
            };
            DraftSession::new(&model, &ham, p)
        })
        .collect::<hamburger::Result<_>>()?;
    // On the CPU, as our sessions above.
    let load = |p: &Path| LlamaModel::load(p, 0).with_context(|| p.display().to_string());
    let (base, base_draft) = (load(target)?, load(baseline_draft)?);
    let lp = LlamaContextParams { n_ctx: n_ctx as u32, n_threads: o.threads as i32, ..Default::default() };
    let (mut llama_target, mut llama_draft) = (LlamaContext::new(&base, lp)?, LlamaContext::new(&base_draft, lp)?);
    let mut rows: Vec<SpecRow> = ["target alone (ours)", "target alone (libllama)"]
        .iter()
        .map(|l| l.to_string())
        .chain(o.confidence.iter().map(|c| format!("HAMburger draft, confidence {c} (ours)")))
        .chain([format!("ordinary draft ({}, libllama)", baseline_draft.display())])
        .map(|label| SpecRow { label, ..Default::default() })
        .collect();
    // Warm-up: one short untimed run of each (graphs built, pages mapped).
    let n_warm = o.n_predict.min(16);
    draft_eval::target_alone(&mut alone, &ids[0], n_warm)?;
    for s in &mut drafted {
        draft_eval::hamburger_drafted(s, &ids[0], n_warm)?;
    }
    draft_eval::llama_drafted(&mut llama_target, Some(&mut llama_draft), &ids[0], n_warm, o.n_max)?;
    for (i, prompt) in ids.iter().enumerate() {
        let reference = draft_eval::target_alone(&mut alone, prompt, o.n_predict)?;
        let mut runs = vec![draft_eval::llama_drafted(&mut llama_target, None, prompt, o.n_predict, 0)?];
        for s in &mut drafted {
            runs.push(draft_eval::hamburger_drafted(s, prompt, o.n_predict)?);
        }
        runs.push(draft_eval::llama_drafted(&mut llama_target, Some(&mut llama_draft), prompt, o.n_predict, o.n_max)?);
        rows[0].add(&reference, &reference.ids);
        for (row, run) in rows[1..].iter_mut().zip(&runs) {
            row.add(run, &reference.ids);
        }
        log::info!("prompt {}/{} done", i + 1, ids.len());
    }
    Ok(draft_eval::markdown(&rows))
}
