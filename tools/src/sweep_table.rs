//! The results of a quantization sweep: one row per measured mix, written
//! as CSV and as a Markdown table (and drawn by [`crate::plot`]).

/// One measured mix.
#[derive(Debug, Clone)]
pub struct SweepRow {
    /// The mix (or the input's type).
    pub name: String,
    /// File size in bytes.
    pub bytes: u64,
    /// Bits per weight.
    pub bpw: f64,
    /// Prompt tok/s.
    pub pp_ts: f64,
    /// Generation tok/s at the sweep's confidence.
    pub tg_ts: f64,
    /// Mean tokens per macro step at the sweep's confidence.
    pub tokens_per_step: f64,
    /// Fraction of positions where free-running greedy output equals the reference's.
    pub token_match: f64,
    /// Fraction of macro steps whose first token (teacher-forced) equals the reference's.
    pub top1_agree: f64,
    /// Mean KL(reference || this) of each macro step's first-token distribution, teacher-forced.
    pub kl_mean: f64,
    /// Fraction of later micro tokens (teacher-forced) equal to the reference's.
    pub micro_agree: f64,
    /// Fraction of stop/continue decisions (teacher-forced) equal to the reference's.
    pub stop_agree: f64,
}

/// A fraction with `digits` decimals, or `none` when it is NaN (nothing measured).
fn fraction(x: f64, digits: usize, none: &str) -> String {
    if x.is_nan() {
        none.to_string()
    } else {
        format!("{x:.digits$}")
    }
}

/// The cells of a row: exact values for CSV, rounded ones for Markdown.
fn cells(r: &SweepRow, csv: bool) -> Vec<String> {
    // Decimals of: rates, bits per weight, tokens per step, fractions, KL.
    let (rate, bpw, steps, frac, kl) = if csv { (2, 4, 3, 4, 6) } else { (1, 2, 2, 3, 5) };
    let none = if csv { "" } else { "-" };
    let size = if csv { r.bytes.to_string() } else { format!("{:.1}", r.bytes as f64 / ggml::MIB) };
    vec![
        r.name.clone(),
        size,
        format!("{:.bpw$}", r.bpw),
        format!("{:.rate$}", r.pp_ts),
        format!("{:.rate$}", r.tg_ts),
        format!("{:.steps$}", r.tokens_per_step),
        format!("{:.frac$}", r.token_match),
        format!("{:.frac$}", r.top1_agree),
        format!("{:.kl$}", r.kl_mean),
        fraction(r.micro_agree, frac, none),
        fraction(r.stop_agree, frac, none),
    ]
}

const COLUMNS: [(&str, &str); 11] = [
    ("type", "type"),
    ("bytes", "size (MiB)"),
    ("bits_per_weight", "bits/weight"),
    ("pp_ts", "pp t/s"),
    ("tg_ts", "tg t/s"),
    ("tokens_per_step", "tokens/step"),
    ("token_match", "token match"),
    ("top1_agree", "top-1 agree"),
    ("kl_mean", "mean KL"),
    ("micro_agree", "micro agree"),
    ("stop_agree", "stop agree"),
];

/// The rows as CSV.
pub fn csv(rows: &[SweepRow]) -> String {
    let mut s = COLUMNS.map(|c| c.0).join(",") + "\n";
    for r in rows {
        s.push_str(&(cells(r, true).join(",") + "\n"));
    }
    s
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[SweepRow]) -> String {
    let mut s = format!("| {} |\n", COLUMNS.map(|c| c.1).join(" | "));
    s.push_str(&format!("| --- |{}\n", " ---: |".repeat(COLUMNS.len() - 1)));
    for r in rows {
        s.push_str(&format!("| {} |\n", cells(r, false).join(" | ")));
    }
    s
}
