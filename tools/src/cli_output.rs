//! What `hamburger-cli` writes about a generation: each macro step's text
//! as it streams (coloured by step with `--color`), the statistics on
//! stderr after it, and the `--json` report.

use std::io::Write;

use hamburger::draft_model::DraftStats;
use hamburger::tokenizer::{TextStream, Tokenizer};
use hamburger::{EngineCounters, Generation, Model};

/// ANSI colours cycled through by macro step.
const PALETTE: [&str; 4] = ["\x1b[38;5;39m", "\x1b[38;5;208m", "\x1b[38;5;42m", "\x1b[38;5;170m"];
const RESET: &str = "\x1b[0m";

/// Streams each macro step's text as it completes, coloured by step with
/// `--color`, and keeps the turn's text for the reverse prompts.
pub struct StepPrinter<'t> {
    /// The detokenizer (`None`: print ids, for models without a tokenizer).
    stream: Option<TextStream<'t>>,
    color: bool,
    step: usize,
    /// The text generated so far.
    pub turn: String,
}

impl<'t> StepPrinter<'t> {
    /// A printer for one turn (`color`: each step in the next colour).
    pub fn new(tokenizer: Option<&'t Tokenizer>, color: bool) -> Self {
        StepPrinter { stream: tokenizer.map(TextStream::new), color, step: 0, turn: String::new() }
    }

    /// The text of one macro step's `tokens`, added to the turn's.
    pub fn text(&mut self, model: &Model, tokens: &[u32]) -> String {
        let text = match self.stream.as_mut() {
            Some(s) => s.push(&visible(model, tokens)),
            None => tokens.iter().map(|t| format!("{t} ")).collect(),
        };
        self.turn.push_str(&text);
        text
    }

    /// Writes one step's `text`, coloured with `--color`.
    pub fn print(&mut self, out: &mut impl Write, text: &str) {
        // Output errors (a closed pipe) end nothing here; generation finishes.
        let _ = if self.color {
            write!(out, "{}{text}{RESET}", PALETTE[self.step % PALETTE.len()])
        } else {
            write!(out, "{text}")
        };
        let _ = out.flush();
        self.step += 1;
    }
}

/// The tokens to show: end-of-generation tokens are not text.
pub fn visible(model: &Model, tokens: &[u32]) -> Vec<u32> {
    tokens.iter().copied().filter(|t| !model.vocab.eog.contains(t)).collect()
}

/// The `--json` object of one generation: prompt and output ids, each macro
/// step's tokens, the text, the server's timings object, what the engine did
/// (`engine`: graphs built and computed and host reads, in all and per
/// macro step, the prompt's forwards included) and, with `-md`, the draft
/// model's counts.
pub fn json_report(
    prompt: &[u32],
    gen: &Generation,
    drafted: Option<&DraftStats>,
    engine: EngineCounters,
    text: &str,
) -> serde_json::Value {
    let mut kept = gen.output_ids.len();
    let steps: Vec<Vec<u32>> = gen
        .macro_steps
        .iter()
        .map(|s| {
            let n = s.tokens.len().min(kept);
            kept -= n;
            s.tokens[..n].to_vec()
        })
        .collect();
    let mut report = serde_json::json!({
        "prompt_ids": prompt,
        "output_ids": gen.output_ids,
        "macro_steps": steps,
        "text": text,
        // The server's timings object: one schema for both tools.
        "timings": server::response::timings(&gen.timings),
        "engine": engine_counts(engine, gen.timings.macro_steps),
    });
    if let Some(d) = drafted {
        report["draft"] = serde_json::json!({
            "draft_forwards": d.draft_forwards,
            "target_forwards": d.target_forwards,
            "drafted": d.drafted,
            "accepted": d.accepted,
        });
    }
    report
}

/// `engine`'s counts, in all and per macro step of `steps`.
fn engine_counts(engine: EngineCounters, steps: usize) -> serde_json::Value {
    let counts = [
        ("graph_builds", engine.graph_builds),
        ("graph_computes", engine.graph_computes),
        ("host_reads", engine.host_reads),
        ("host_read_bytes", engine.host_read_bytes),
    ];
    let mut v = serde_json::Map::new();
    for (name, n) in counts {
        v.insert(name.into(), n.into());
        v.insert(format!("{name}_per_macro_step"), (n as f64 / steps.max(1) as f64).into());
    }
    v.into()
}

/// The statistics printed to stderr after a generation (with -md, a
/// "macro step" is a verify forward of the target).
pub fn report(gen: &Generation, drafted: Option<&DraftStats>) -> String {
    let t = &gen.timings;
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    let mut s = format!(
        "\nprompt: {} tokens in {:.1} ms ({:.1} tok/s)\ngeneration: {} tokens in {:.1} ms ({:.1} tok/s)\n\
         macro steps: {} ({:.2} tokens per step)\nKV cache: {} entries for {} tokens ({:.2} tokens per entry, {} bytes per entry, {:.0} bytes per token)\n",
        t.prompt_tokens,
        t.prompt_ms,
        rate(t.prompt_tokens, t.prompt_ms),
        t.gen_tokens,
        t.gen_ms,
        rate(t.gen_tokens, t.gen_ms),
        t.macro_steps,
        t.tokens_per_step(),
        t.kv_entries,
        t.context_tokens,
        t.context_tokens as f64 / t.kv_entries.max(1) as f64,
        t.kv_bytes_per_entry,
        (t.kv_entries * t.kv_bytes_per_entry) as f64 / t.context_tokens.max(1) as f64,
    );
    let reach: Vec<String> = t
        .reached
        .iter()
        .enumerate()
        .map(|(i, &r)| format!("{}: {:.0}%", i + 1, 100.0 * r as f64 / t.macro_steps.max(1) as f64))
        .collect();
    match drafted {
        Some(d) => s.push_str(&draft_report(d)),
        None => s.push_str(&format!("micro-step positions reached: {}\n", reach.join(", "))),
    }
    if t.verify_forwards > 0 {
        s.push_str(&format!(
            "self-verified: {} drafted tokens checked in {} forwards, {} accepted ({:.2} per verify forward)\n",
            t.drafted,
            t.verify_forwards,
            t.draft_accepted,
            t.accepted_per_verify()
        ));
    }
    s
}

/// The lines `hamburger-cli` prints on stderr about a draft model's work.
pub fn draft_report(d: &DraftStats) -> String {
    format!(
        "draft model: {} tokens drafted in {} draft forwards, {} accepted ({:.0}%, {:.2} per draft forward); {} target forwards\n",
        d.drafted,
        d.draft_forwards,
        d.accepted,
        100.0 * d.acceptance(),
        d.accepted_per_draft_forward(),
        d.target_forwards
    )
}
