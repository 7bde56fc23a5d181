//! Counters of the server, rendered in Prometheus' text format at `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// The server's counters and gauges, shared by the HTTP side and the engine thread.
#[derive(Debug, Default)]
pub struct Metrics {
    /// When the server started (Unix seconds; `Process-Start-Time-Unix`).
    pub started_unix: AtomicU64,
    /// Microseconds finished answers spent on their prompts.
    pub prompt_us: AtomicU64,
    /// Microseconds finished answers spent generating.
    pub generation_us: AtomicU64,
    /// The longest context (prompt and answer tokens) of a finished answer.
    pub context_tokens_max: AtomicU64,
    /// Base forwards of macro steps, each times the sequences it served.
    pub busy_slot_forwards: AtomicU64,
    /// Requests accepted into the queue, each choice of one (`n`, a list of prompts) counted.
    pub requests: AtomicU64,
    /// Requests answered 503 because the queue was full.
    pub rejected: AtomicU64,
    /// Requests (choices) ended because their client left.
    pub cancelled: AtomicU64,
    /// Prompt tokens of admitted requests that were processed.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens of admitted requests whose KV entries were adopted from the prefix cache.
    pub prompt_tokens_cached: AtomicU64,
    /// Requests preempted (their cells taken back when the pool was full; each resumed later).
    pub preemptions: AtomicU64,
    /// Tokens of finished answers.
    pub generated_tokens: AtomicU64,
    /// Macro steps of finished answers: `tokens_per_step` divides
    /// `generated_tokens` by these, both counted when an answer ends.
    pub finished_macro_steps: AtomicU64,
    /// Macro steps of all sequences.
    pub macro_steps: AtomicU64,
    /// Base forwards run (each shared by the sequences of its batch).
    pub base_forwards: AtomicU64,
    /// Requests (choices) waiting for a slot.
    pub queue_depth: AtomicU64,
    /// Requests decoding.
    pub processing: AtomicU64,
    /// KV cells in use (held by requests or kept by the prefix cache).
    pub kv_cells_used: AtomicU64,
    /// KV cells only the prefix cache keeps (taken back when the pool needs them).
    pub kv_cells_cached: AtomicU64,
    /// Entries in the prefix cache (each one cell, possibly also held by requests).
    pub cached_entries: AtomicU64,
    /// KV cells in all.
    pub kv_cells_total: AtomicU64,
    /// Self-verified: drafted tokens that base forwards checked, of finished answers.
    pub draft_tokens: AtomicU64,
    /// Self-verified: of those, the tokens the base accepted.
    pub draft_accepted: AtomicU64,
    /// Self-verified: base forwards that checked drafts, of finished answers.
    pub verify_forwards: AtomicU64,
}

/// Adds `n` to a counter.
pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Sets a gauge.
pub fn set(c: &AtomicU64, n: u64) {
    c.store(n, Ordering::Relaxed);
}

impl Metrics {
    /// Counters at zero, started now.
    pub fn new() -> Metrics {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Metrics { started_unix: AtomicU64::new(now), ..Metrics::default() }
    }

    /// When the server started, in Unix seconds.
    pub fn started_unix(&self) -> u64 {
        self.started_unix.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let steps = get(&self.macro_steps);
        let finished_steps = get(&self.finished_macro_steps);
        let tokens_per_step =
            if finished_steps == 0 { 0.0 } else { get(&self.generated_tokens) as f64 / finished_steps as f64 };
        let rows: [(&str, &str, &str, String); 16] = [
            ("requests_total", "counter", "Requests accepted (each choice counted).", get(&self.requests).to_string()),
            (
                "requests_rejected_total",
                "counter",
                "Requests refused with 503 (queue full).",
                get(&self.rejected).to_string(),
            ),
            ("requests_cancelled_total", "counter", "Requests whose client left.", get(&self.cancelled).to_string()),
            ("prompt_tokens_total", "counter", "Prompt tokens processed.", get(&self.prompt_tokens).to_string()),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Prompt tokens whose KV entries were adopted from the prefix cache.",
                get(&self.prompt_tokens_cached).to_string(),
            ),
            (
                "preemptions_total",
                "counter",
                "Requests preempted when the KV pool was full (resumed later, same answer).",
                get(&self.preemptions).to_string(),
            ),
            ("tokens_generated_total", "counter", "Tokens generated.", get(&self.generated_tokens).to_string()),
            ("macro_steps_total", "counter", "Macro steps of all sequences.", steps.to_string()),
            (
                "base_forwards_total",
                "counter",
                "Base forwards, each shared by a batch of sequences.",
                get(&self.base_forwards).to_string(),
            ),
            (
                "tokens_per_step",
                "gauge",
                "Mean tokens per macro step of finished answers.",
                format!("{tokens_per_step:.4}"),
            ),
            ("queue_depth", "gauge", "Requests waiting for a slot.", get(&self.queue_depth).to_string()),
            ("requests_processing", "gauge", "Requests decoding.", get(&self.processing).to_string()),
            ("kv_cells_used", "gauge", "KV cache cells in use.", get(&self.kv_cells_used).to_string()),
            (
                "kv_cells_cached",
                "gauge",
                "KV cache cells only the prefix cache keeps.",
                get(&self.kv_cells_cached).to_string(),
            ),
            ("prefix_cache_entries", "gauge", "Entries in the prefix cache.", get(&self.cached_entries).to_string()),
            ("kv_cells_total", "gauge", "KV cache cells.", get(&self.kv_cells_total).to_string()),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let _ = write!(
                out,
                "# HELP hamburger_{name} {help}\n# TYPE hamburger_{name} {kind}\nhamburger_{name} {value}\n"
            );
        }
        for (name, kind, help, value) in self.llama_server_rows() {
            let _ =
                write!(out, "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}\n");
        }
        out
    }

    /// The metrics llama-server's dashboards read, where ours mean the same
    /// (not `kv_cache_tokens`: a cell here holds a macro step of several tokens).
    fn llama_server_rows(&self) -> [(&'static str, &'static str, &'static str, String); 16] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (used, total) = (get(&self.kv_cells_used), get(&self.kv_cells_total));
        let usage = if total == 0 { 0.0 } else { used as f64 / total as f64 };
        let (prompt_s, gen_s) = (get(&self.prompt_us) as f64 / 1e6, get(&self.generation_us) as f64 / 1e6);
        let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        let forwards = get(&self.base_forwards);
        let busy = if forwards == 0 { 0.0 } else { get(&self.busy_slot_forwards) as f64 / forwards as f64 };
        [
            (
                "prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens whose KV entries were reused (not processed).",
                get(&self.prompt_tokens_cached).to_string(),
            ),
            ("prompt_seconds_total", "counter", "Prompt process time.", format!("{prompt_s:.6}")),
            ("tokens_predicted_seconds_total", "counter", "Predict process time.", format!("{gen_s:.6}")),
            (
                "n_tokens_max",
                "counter",
                "Largest observed n_tokens (prompt and answer of one request).",
                get(&self.context_tokens_max).to_string(),
            ),
            (
                "prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                format!("{:.4}", rate(get(&self.prompt_tokens), prompt_s)),
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                format!("{:.4}", rate(get(&self.generated_tokens), gen_s)),
            ),
            (
                "n_busy_slots_per_decode",
                "gauge",
                "Average number of busy slots per base forward.",
                format!("{busy:.4}"),
            ),
            (
                "prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                get(&self.prompt_tokens).to_string(),
            ),
            (
                "tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                get(&self.generated_tokens).to_string(),
            ),
            (
                "n_decode_total",
                "counter",
                "Total number of llama_decode() calls (base forwards).",
                get(&self.base_forwards).to_string(),
            ),
            ("requests_processing", "gauge", "Number of requests processing.", get(&self.processing).to_string()),
            ("requests_deferred", "gauge", "Number of requests deferred.", get(&self.queue_depth).to_string()),
            ("kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.", format!("{usage:.4}")),
            (
                "spec_decode_num_draft_tokens_total",
                "counter",
                "Total draft tokens generated (self-verified answers).",
                get(&self.draft_tokens).to_string(),
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "Total draft tokens accepted by the base.",
                get(&self.draft_accepted).to_string(),
            ),
            (
                "spec_decode_num_drafts_total",
                "counter",
                "Total speculative decoding verification steps.",
                get(&self.verify_forwards).to_string(),
            ),
        ]
    }
}
