//! `hamburger-eval`: what a trained HAMburger is worth against its base, on
//! real prompts. For each prompt it generates greedily with libllama on the
//! base-only GGUF once, then with our engine at each confidence, in the same
//! run (the same prompt ids, the same number of new tokens, end of generation
//! ignored so both produce exactly `n`), timing each end to end; then it scores both
//! outputs with the base (a [`Scorer`]): the base's mean log-likelihood of
//! HAMburger's greedy text against that of its own greedy text, and how many
//! leading tokens the two share. Quality is taken on each output up to its
//! first end-of-generation token.
//!
//! The same [`Scorer`] gives the training tool the base's entropies (`score`).

use std::time::Instant;

use anyhow::{Context, Result};
use ggml::llama::{LlamaContext, LlamaContextParams, LlamaModel};
use hamburger::chat::{ChatTemplate, Message};
use hamburger::tokenizer::Tokenizer;
use hamburger::{DraftParams, EngineParams, Model, Session, SessionParams, StepParams};
use serde_json::{json, Value};

/// The base's view of a token sequence: for every position after the prompt,
/// the log-probability of the token there, the entropy of the distribution
/// it was drawn from, and that distribution's most likely tokens (the soft
/// targets a distilled model learns from).
pub struct Scored {
    /// `ln p(ids[i] | ids[..i])` for each `i` from the prompt's end.
    pub logprob: Vec<f32>,
    /// Entropy (nats) of the base's next-token distribution at each such `i`.
    pub entropy: Vec<f32>,
    /// The `top` most likely tokens of that distribution at each such `i`,
    /// as (token, log-probability), most likely first; empty lists when the
    /// scorer was asked for none.
    pub top: Vec<Vec<(u32, f32)>>,
}

/// Scores sequences with libllama: the whole sequence in one pass per batch,
/// every position's logits kept.
pub struct Scorer<'m> {
    ctx: LlamaContext<'m>,
    n_batch: usize,
    n_ctx: usize,
}

impl<'m> Scorer<'m> {
    /// A scorer of sequences up to `n_ctx` tokens on `model`, attending
    /// fused (flash attention) or not as `fused` says: as our engine does
    /// ([`hamburger::EngineParams::fused_attention`]), so that its
    /// log-probabilities are the ones the server's `echo` gives.
    ///
    /// # Errors
    /// When libllama cannot create the context.
    pub fn new(model: &'m LlamaModel, n_ctx: usize, threads: usize, fused: bool) -> Result<Scorer<'m>> {
        let n_batch = 512.min(n_ctx);
        let params = LlamaContextParams {
            n_ctx: n_ctx as u32,
            n_batch: n_batch as u32,
            n_threads: threads as i32,
            flash_attn: Some(fused),
            ..Default::default()
        };
        Ok(Scorer { ctx: LlamaContext::new(model, params)?, n_batch, n_ctx })
    }

    /// Scores `ids[n_prompt..]` given everything before each token, keeping
    /// the `top` most likely tokens of each next-token distribution.
    ///
    /// # Errors
    /// When the sequence is longer than the context, `n_prompt` is 0, or a decode fails.
    pub fn score(&mut self, ids: &[u32], n_prompt: usize, top: usize) -> Result<Scored> {
        anyhow::ensure!(
            n_prompt >= 1 && n_prompt <= ids.len(),
            "a scored sequence needs a prompt of 1..={} tokens",
            ids.len()
        );
        anyhow::ensure!(
            ids.len() <= self.n_ctx,
            "a sequence of {} tokens exceeds the scorer's context of {}",
            ids.len(),
            self.n_ctx
        );
        self.ctx.clear();
        let mut out = Scored { logprob: Vec::new(), entropy: Vec::new(), top: Vec::new() };
        let last = ids.len() - 1;
        for (c, chunk) in ids[..last].chunks(self.n_batch).enumerate() {
            let start = c * self.n_batch;
            let inputs: Vec<(i32, i32, i32)> =
                chunk.iter().enumerate().map(|(j, &t)| (t as i32, (start + j) as i32, 0)).collect();
            self.ctx.decode_seqs(&inputs)?;
            for j in 0..chunk.len() {
                let pos = start + j;
                if pos + 1 < n_prompt {
                    continue;
                }
                let lp = crate::logits::log_softmax(&self.ctx.logits_ith(j)?);
                out.logprob.push(lp[ids[pos + 1] as usize] as f32);
                out.entropy.push(lp.iter().map(|&x| -x.exp() * x).sum::<f64>() as f32);
                out.top.push(most_likely(&lp, top));
            }
        }
        self.ctx.pause_threads();
        Ok(out)
    }
}

/// The `k` largest log-probabilities of `lp` with their tokens, largest first.
fn most_likely(lp: &[f64], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(lp.len());
    if k == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..lp.len()).collect();
    order.select_nth_unstable_by(k - 1, |&a, &b| lp[b].total_cmp(&lp[a]));
    order.truncate(k);
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
    order.into_iter().map(|t| (t as u32, lp[t] as f32)).collect()
}

/// A user prompt rendered with the model's chat template and tokenized.
pub struct Prompts {
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

impl Prompts {
    /// The chat template and tokenizer of `model`.
    ///
    /// # Errors
    /// When the model has no tokenizer or no chat template.
    pub fn new(model: &Model) -> Result<Prompts> {
        let tokenizer = Tokenizer::from_model(model)?;
        let template = ChatTemplate::of_model(model, &tokenizer)?
            .context("the model has no chat template")?
            .isolated(crate::cli::template_isolation()?);
        Ok(Prompts { tokenizer, template })
    }

    /// The token ids of a conversation of one user message, ready for the answer.
    ///
    /// # Errors
    /// When the template or the tokenizer fails.
    pub fn user(&self, text: &str) -> Result<Vec<u32>> {
        self.chat(&[Message::new("user", text)])
    }

    /// The token ids of a conversation, ready for the answer to its last message.
    ///
    /// # Errors
    /// When the template or the tokenizer fails.
    pub fn chat(&self, messages: &[Message]) -> Result<Vec<u32>> {
        let rendered = self.template.render(messages, true)?;
        Ok(self.tokenizer.encode(&rendered, true)?)
    }

    /// The prompt ids of one JSON record: its `messages` (a chat, each
    /// `{role, content}`), or else its `prompt` (one user message).
    ///
    /// # Errors
    /// When the record has neither in that shape (`what` names it), or the
    /// template or the tokenizer fails.
    pub fn of_record(&self, v: &Value, what: &str) -> Result<Vec<u32>> {
        if let Some(msgs) = v.get("messages") {
            let msgs = msgs.as_array().with_context(|| format!("{what}: 'messages' is not an array"))?;
            let mut chat = Vec::with_capacity(msgs.len());
            for (j, m) in msgs.iter().enumerate() {
                let field =
                    |k: &str| m[k].as_str().with_context(|| format!("{what}: messages[{j}] has no string field '{k}'"));
                chat.push(Message::new(field("role")?, field("content")?));
            }
            return self.chat(&chat);
        }
        self.user(v["prompt"].as_str().with_context(|| format!("{what}: no string field 'prompt' or 'messages'"))?)
    }

    /// The token ids of an answer's text (no special tokens added).
    ///
    /// # Errors
    /// When the tokenizer fails.
    pub fn text(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.tokenizer.encode(text, false)?)
    }
}

/// What one engine did on one prompt.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Output tokens (exactly `n`: end of generation ignored).
    pub ids: Vec<u32>,
    /// Base forwards (macro steps; `ids.len()` for the base).
    pub forwards: usize,
    /// Self-verified: base forwards that checked drafts, and the drafted tokens accepted.
    pub verify_forwards: usize,
    /// See `verify_forwards`.
    pub accepted: usize,
    /// KV entries the output takes (the last, still unfed input's counted):
    /// one per macro step, or one per token self-verified.
    pub kv_entries: usize,
    /// Wall-clock nanoseconds, prompt included.
    pub ns: u64,
}

/// Greedy generation of `n` tokens with our engine (a session at its confidence).
///
/// # Errors
/// When generation fails.
pub fn run_hamburger(session: &mut Session, prompt: &[u32], n: usize) -> Result<Run> {
    session.clear();
    let t = Instant::now();
    let gen = session.generate(prompt, n, |_| true)?;
    let ns = t.elapsed().as_nanos() as u64;
    session.pause_threads();
    let t = &gen.timings;
    Ok(Run {
        forwards: t.macro_steps,
        verify_forwards: t.verify_forwards,
        accepted: t.draft_accepted,
        kv_entries: (t.kv_entries + 1).saturating_sub(t.prompt_tokens),
        ns,
        ids: gen.output_ids,
    })
}

/// Greedy generation of `n` tokens with libllama on the base.
///
/// # Errors
/// When a decode fails.
pub fn run_base(ctx: &mut LlamaContext, prompt: &[u32], n: usize) -> Result<Run> {
    let prompt: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let t = Instant::now();
    let ids = ctx.greedy(&prompt, n, None)?;
    let ns = t.elapsed().as_nanos() as u64;
    ctx.pause_threads();
    let ids: Vec<u32> = ids.into_iter().map(|t| t as u32).collect();
    Ok(Run { forwards: ids.len(), ids, ns, ..Default::default() })
}

/// Per-confidence (or self-verified) totals over the prompts.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// The stop-head confidence.
    pub confidence: f32,
    /// Self-verified decoding (the confidence does not apply): its
    /// `--spec-type` (`draft-mtp`, or `ngram-simple,draft-mtp`).
    pub verified: Option<&'static str>,
    /// Self-verified: base forwards that checked drafts.
    pub verify_forwards: usize,
    /// Self-verified: drafted tokens the base accepted.
    pub accepted: usize,
    /// Prompts run.
    pub prompts: usize,
    /// Tokens generated by each engine.
    pub tokens: usize,
    /// Our base forwards (macro steps).
    pub macro_steps: usize,
    /// KV entries our outputs take ([`Run::kv_entries`]).
    pub kv_entries: usize,
    /// Our nanoseconds and libllama's.
    pub ns: u64,
    /// libllama's nanoseconds on the same prompts.
    pub base_ns: u64,
    /// Sum of the base's log-likelihood of our kept tokens, and their count.
    pub ll: f64,
    /// Our kept tokens (up to the first end of generation).
    pub kept: usize,
    /// The same for the base's own greedy outputs.
    pub base_ll: f64,
    /// The base's kept tokens.
    pub base_kept: usize,
    /// Leading tokens our output shares with the base's, summed over prompts.
    pub shared: usize,
    /// Prompts whose kept outputs are identical.
    pub identical: usize,
    /// Per prompt whose outputs part: at the first token they differ in,
    /// the larger of the base's log-probability gaps from its best token to
    /// ours and to its own greedy one (nats). Near 0 means the base all but
    /// tied the two tokens there: rounding, not a different decision, parted
    /// the texts.
    pub divergence_gaps: Vec<f64>,
    /// libllama against itself over the prompts: the positions of its
    /// greedy outputs where its own scoring forward (many rows at once)
    /// ranks another token first, and the largest such gap (nats): the
    /// rounding noise of the base alone, the floor under
    /// [`Row::divergence_gaps`].
    pub base_flips: usize,
    /// The largest of those gaps.
    pub base_flip_gap: f64,
}

impl Row {
    /// Mean tokens per macro step.
    pub fn tokens_per_step(&self) -> f64 {
        self.tokens as f64 / self.macro_steps.max(1) as f64
    }

    /// Our end-to-end tokens/s over libllama's.
    pub fn speedup(&self) -> f64 {
        self.base_ns as f64 / self.ns.max(1) as f64
    }

    /// The base's mean log-likelihood per token of our outputs.
    pub fn mean_ll(&self) -> f64 {
        self.ll / self.kept.max(1) as f64
    }

    /// ... and of its own outputs.
    pub fn base_mean_ll(&self) -> f64 {
        self.base_ll / self.base_kept.max(1) as f64
    }

    /// How much worse our outputs score than the base's own, relatively
    /// (0.05: 5% lower mean log-likelihood).
    pub fn ll_loss(&self) -> f64 {
        self.mean_ll() / self.base_mean_ll() - 1.0
    }

    /// Self-verified: drafted tokens accepted per base forward that checked drafts.
    pub fn accepted_per_verify(&self) -> f64 {
        self.accepted as f64 / self.verify_forwards.max(1) as f64
    }

    /// The median and the largest of [`Row::divergence_gaps`] (0 when no
    /// output parted from the base's).
    pub fn divergence_gap(&self) -> (f64, f64) {
        let mut g = self.divergence_gaps.clone();
        g.sort_by(f64::total_cmp);
        (g.get(g.len() / 2).copied().unwrap_or(0.0), g.last().copied().unwrap_or(0.0))
    }

    /// The row's name in reports: its confidence, or its `--spec-type`.
    pub fn mode(&self) -> String {
        self.verified.map_or_else(|| self.confidence.to_string(), str::to_string)
    }

    /// The row as JSON (the columns of every report).
    pub fn to_json(&self) -> Value {
        let (gap_median, gap_max) = self.divergence_gap();
        json!({
            "confidence": if self.verified.is_some() { Value::Null } else { json!(self.confidence) },
            "spec_type": self.verified.unwrap_or("none"),
            "accepted_per_verify": self.accepted_per_verify(),
            "verify_forwards": self.verify_forwards,
            "prompts": self.prompts,
            "tokens": self.tokens,
            "tokens_per_step": self.tokens_per_step(),
            "kv_entries_per_token": self.kv_entries as f64 / self.tokens.max(1) as f64,
            "tokens_per_s": self.tokens as f64 * 1e9 / self.ns.max(1) as f64,
            "base_tokens_per_s": self.tokens as f64 * 1e9 / self.base_ns.max(1) as f64,
            "speedup": self.speedup(),
            "mean_ll": self.mean_ll(),
            "base_mean_ll": self.base_mean_ll(),
            "ll_loss": self.ll_loss(),
            "shared_prefix": self.shared as f64 / self.prompts.max(1) as f64,
            "identical": self.identical,
            "divergence_gap_median": gap_median,
            "divergence_gap_max": gap_max,
            "base_flips": self.base_flips,
            "base_flip_gap": self.base_flip_gap,
        })
    }
}

/// `ids` up to and including its first end-of-generation token.
pub fn kept<'a>(ids: &'a [u32], eog: &[u32]) -> &'a [u32] {
    match ids.iter().position(|t| eog.contains(t)) {
        Some(i) => &ids[..=i],
        None => ids,
    }
}

/// A run with its quality: the output kept up to the first end of
/// generation, the base's log-likelihood of that (summed), and how far each
/// kept token stood below the base's choice there.
#[derive(Debug, Clone)]
pub struct Judged {
    /// The run.
    pub run: Run,
    /// Its output up to and including the first end-of-generation token.
    pub kept: Vec<u32>,
    /// `sum ln p_base(kept[i] | prompt, kept[..i])`.
    pub ll: f64,
    /// Per kept token: the base's most likely log-probability there less the
    /// kept token's (nats, 0 where the kept token is the base's choice).
    pub below_best: Vec<f32>,
}

/// Scores `run`'s kept output after `prompt` with the base.
///
/// # Errors
/// When scoring fails.
pub fn judge(scorer: &mut Scorer, prompt: &[u32], run: Run, eog: &[u32]) -> Result<Judged> {
    let kept = kept(&run.ids, eog).to_vec();
    let seq: Vec<u32> = prompt.iter().chain(&kept).copied().collect();
    let scored = scorer.score(&seq, prompt.len(), 1)?;
    let ll = scored.logprob.iter().map(|&x| x as f64).sum();
    let below_best = scored.logprob.iter().zip(&scored.top).map(|(&lp, top)| (top[0].1 - lp).max(0.0)).collect();
    Ok(Judged { run, kept, ll, below_best })
}

/// Adds one prompt's runs to `row`: speed from the full runs, quality from
/// the kept outputs.
pub fn account(row: &mut Row, ours: &Judged, base: &Judged) {
    let (a, b) = (&ours.kept, &base.kept);
    row.prompts += 1;
    row.tokens += ours.run.ids.len();
    row.macro_steps += ours.run.forwards;
    row.kv_entries += ours.run.kv_entries;
    row.verify_forwards += ours.run.verify_forwards;
    row.accepted += ours.run.accepted;
    row.ns += ours.run.ns;
    row.base_ns += base.run.ns;
    row.ll += ours.ll;
    row.kept += a.len();
    row.base_ll += base.ll;
    row.base_kept += b.len();
    let shared = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    row.shared += shared;
    row.identical += usize::from(a == b);
    for &g in base.below_best.iter().filter(|&&g| g > 0.0) {
        row.base_flips += 1;
        row.base_flip_gap = row.base_flip_gap.max(g as f64);
    }
    if shared < a.len().min(b.len()) {
        // Both texts follow the same prefix here: the base's preference for
        // its best token over ours, and over its own greedy one (the
        // scorer's batched forward may rank libllama's choice second).
        row.divergence_gaps.push(ours.below_best[shared].max(base.below_best[shared]) as f64);
    }
}

/// Session parameters of an evaluation at `confidence`, self-verified with `draft`.
pub fn session_params(confidence: f32, draft: Option<DraftParams>, threads: usize, n_ctx: usize) -> SessionParams {
    SessionParams {
        engine: EngineParams { n_ctx, n_threads: threads, ..Default::default() },
        step: StepParams { confidence, draft, ..Default::default() },
        ignore_eog: true,
        ..Default::default()
    }
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| confidence | tokens/step | KV entries/token | accepted/verify | tok/s | base tok/s | speedup | LL (ours) | LL (base) | LL loss | shared prefix | identical | gap at parting (median / max) |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        let j = r.to_json();
        let f = |k: &str| j[k].as_f64().unwrap_or(0.0);
        s.push_str(&format!(
            "| {} | {:.2} | {:.2} | {} | {:.1} | {:.1} | {:.2}x | {:.3} | {:.3} | {:+.1}% | {:.1} | {}/{} | {:.3} / {:.3} |\n",
            r.mode(),
            f("tokens_per_step"),
            f("kv_entries_per_token"),
            if r.verified.is_some() { format!("{:.2}", r.accepted_per_verify()) } else { "-".into() },
            f("tokens_per_s"),
            f("base_tokens_per_s"),
            f("speedup"),
            f("mean_ll"),
            f("base_mean_ll"),
            100.0 * f("ll_loss"),
            f("shared_prefix"),
            r.identical,
            r.prompts,
            f("divergence_gap_median"),
            f("divergence_gap_max")
        ));
    }
    if let Some(r) = rows.first() {
        s.push_str(&format!(
            "\nlibllama against itself: {} of its {} greedy tokens ranked below another by its own batched scoring forward (largest gap {:.3} nats)\n",
            r.base_flips, r.base_kept, r.base_flip_gap
        ));
    }
    s
}
