//! `hamburger-eval draft`: speculative decoding with a draft model, a
//! HAMburger drafting for a target (our [`DraftSession`]) against llama.cpp's
//! way with an ordinary draft model, on the same real prompts in the same
//! run. The llama.cpp side is `llama-speculative-simple`'s greedy loop
//! (llama.cpp's `-md`, `common/speculative.cpp`'s draft-simple) on libllama:
//! the draft decodes the last token, then drafts `n_max` tokens greedily
//! one forward each (the last not fed), the target decodes its last token
//! and the draft with logits at every row, the agreeing prefix and the
//! target's next token are kept, and both caches are cut back after them.
//! Both sides and the target alone (ours and libllama's) run each prompt in
//! turn, so a shared machine's drift hits all alike.

use std::time::Instant;

use anyhow::Result;
use ggml::llama::LlamaContext;
use hamburger::draft_model::DraftSession;
use hamburger::sampling::argmax;
use hamburger::Session;

/// What one configuration did on one prompt, greedy.
#[derive(Debug, Clone, Default)]
pub struct SpecRun {
    /// Output tokens.
    pub ids: Vec<u32>,
    /// Nanoseconds after the prompt (ours: after the prompt's forward, which
    /// yields the first token; libllama's loop: after all but the prompt's
    /// last token, which its first verification feeds).
    pub ns: u64,
    /// Tokens those nanoseconds produced (ours: all but the first).
    pub timed: usize,
    /// Target forwards that yielded tokens (ours: the prompt's included).
    pub target_forwards: usize,
    /// Draft forwards.
    pub draft_forwards: usize,
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafted tokens accepted.
    pub accepted: usize,
}

/// Our target alone, one token per forward.
///
/// # Errors
/// When generation fails.
pub fn target_alone(session: &mut Session, prompt: &[u32], n: usize) -> Result<SpecRun> {
    session.clear();
    let gen = session.generate(prompt, n, |_| true)?;
    session.pause_threads();
    let t = &gen.timings;
    Ok(SpecRun {
        ns: (t.gen_ms * 1e6) as u64,
        timed: gen.output_ids.len().saturating_sub(1),
        target_forwards: t.macro_steps,
        ids: gen.output_ids,
        ..Default::default()
    })
}

/// Our target verifying a HAMburger's drafts.
///
/// # Errors
/// When generation fails.
pub fn hamburger_drafted(session: &mut DraftSession, prompt: &[u32], n: usize) -> Result<SpecRun> {
    session.restart(0);
    let (gen, d) = session.generate(prompt, n, |_| true)?;
    let t = &gen.timings;
    Ok(SpecRun {
        timed: gen.output_ids.len().saturating_sub(1),
        ids: gen.output_ids,
        ns: (t.gen_ms * 1e6) as u64,
        target_forwards: d.target_forwards,
        draft_forwards: d.draft_forwards,
        drafted: d.drafted,
        accepted: d.accepted,
    })
}

/// libllama's greedy argmax of input `i` of the last decode.
fn choice(ctx: &LlamaContext, i: usize) -> Result<u32> {
    Ok(argmax(&ctx.logits_ith(i)?))
}

/// llama.cpp's draft-model speculative decoding on libllama, greedy, up to
/// `n_max` drafted tokens per verification (`n_max` 0: the target alone).
///
/// # Errors
/// When a decode fails.
pub fn llama_drafted(
    target: &mut LlamaContext,
    mut draft: Option<&mut LlamaContext>,
    prompt: &[u32],
    n: usize,
    n_max: usize,
) -> Result<SpecRun> {
    let prompt: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let head = &prompt[..prompt.len() - 1];
    target.clear();
    if let Some(d) = draft.as_deref_mut() {
        d.clear();
    }
    if !head.is_empty() {
        target.decode(head)?;
        if let Some(d) = draft.as_deref_mut() {
            d.decode(head)?;
        }
    }
    let mut run = SpecRun::default();
    // Every token so far; the target holds all but the last, the draft the first `draft_past`.
    let mut seq = prompt.clone();
    let mut draft_past = head.len();
    let t0 = Instant::now();
    while run.ids.len() < n {
        let n_past = seq.len() - 1;
        let room = (n - run.ids.len() - 1).min(n_max);
        let mut drafted: Vec<i32> = Vec::new();
        if let Some(d) = draft.as_deref_mut().filter(|_| room > 0) {
            // What the draft has not seen (the last token, and accepted
            // drafts it never fed), then one forward per drafted token.
            let feed: Vec<(i32, i32, i32)> =
                seq[draft_past..].iter().enumerate().map(|(i, &t)| (t, (draft_past + i) as i32, 0)).collect();
            d.decode_seqs(&feed)?;
            run.draft_forwards += 1;
            draft_past = seq.len();
            let mut row = feed.len() - 1;
            for i in 0..room {
                let tok = choice(d, row)? as i32;
                drafted.push(tok);
                if i + 1 == room {
                    break;
                }
                d.decode_seqs(&[(tok, draft_past as i32, 0)])?;
                (run.draft_forwards, draft_past, row) = (run.draft_forwards + 1, draft_past + 1, 0);
            }
        }
        let rows: Vec<(i32, i32, i32)> = std::iter::once(seq[n_past])
            .chain(drafted.iter().copied())
            .enumerate()
            .map(|(i, t)| (t, (n_past + i) as i32, 0))
            .collect();
        target.decode_seqs(&rows)?;
        run.target_forwards += 1;
        run.drafted += drafted.len();
        let mut i = 0;
        loop {
            let t = choice(target, i)?;
            run.ids.push(t);
            seq.push(t as i32);
            if i < drafted.len() && drafted[i] as u32 == t {
                run.accepted += 1;
                i += 1;
            } else {
                break;
            }
        }
        // Entries at the rejected rows go; the new last token is pending.
        target.truncate(0, (seq.len() - 1) as i32)?;
        if let Some(d) = draft.as_deref_mut() {
            draft_past = draft_past.min(seq.len() - 1);
            d.truncate(0, draft_past as i32)?;
        }
    }
    target.synchronize();
    run.ns = t0.elapsed().as_nanos() as u64;
    target.pause_threads();
    if let Some(d) = draft {
        d.pause_threads();
    }
    run.ids.truncate(n);
    run.timed = run.ids.len();
    Ok(run)
}

/// One configuration's totals over the prompts.
#[derive(Debug, Clone, Default)]
pub struct SpecRow {
    /// The configuration.
    pub label: String,
    /// Tokens, nanoseconds, forwards and drafts, summed.
    pub total: SpecRun,
    /// Prompts run, and those whose output equals the target's own.
    pub prompts: usize,
    /// Outputs equal to our target alone's.
    pub same: usize,
}

impl SpecRow {
    /// Adds one prompt's run, `reference` being the target alone's output.
    pub fn add(&mut self, run: &SpecRun, reference: &[u32]) {
        let t = &mut self.total;
        t.ids.extend_from_slice(&run.ids);
        t.ns += run.ns;
        t.timed += run.timed;
        t.target_forwards += run.target_forwards;
        t.draft_forwards += run.draft_forwards;
        t.drafted += run.drafted;
        t.accepted += run.accepted;
        self.prompts += 1;
        self.same += usize::from(run.ids == reference);
    }
}

/// The table of rows, Markdown.
pub fn markdown(rows: &[SpecRow]) -> String {
    let mut s = String::from(
        "| configuration | tokens | tok/s | tokens per target forward | drafted | accepted | accepted per draft forward | outputs equal to the target's |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        let t = &r.total;
        let n = t.ids.len();
        s.push_str(&format!(
            "| {} | {n} | {:.2} | {:.2} | {} | {} | {:.2} | {}/{} |\n",
            r.label,
            t.timed as f64 * 1e9 / t.ns.max(1) as f64,
            n as f64 / t.target_forwards.max(1) as f64,
            t.drafted,
            t.accepted,
            t.accepted as f64 / t.draft_forwards.max(1) as f64,
            r.same,
            r.prompts
        ));
    }
    s
}
