//! Self-verified decoding's check: the base forward read the last verified
//! token and the drafted tokens after it, one row each; the base's
//! distribution at each row accepts the next drafted token or replaces it
//! (speculative sampling, [`crate::sampling::Sampler::verify_draft`]; greedy: the
//! tokens agree or the base's own token takes its place; in a tree of
//! drafts, [`crate::decode::tree`], a sibling that is the base's token is
//! accepted instead, and ends the path), and at the first
//! rejection, or after the last draft, the base adds its own token. So every
//! token is the base's, drawn as one token per forward would draw it. A
//! draft model's drafts ([`super::model_drafts`]) are checked as
//! llama-server checks them: each row's token is drawn exactly as a plain
//! decode draws it and a drafted token is kept where they agree, so the
//! output does not depend on the drafts (or, benchmarking, kept at
//! synthetic rates). The rejected rows' KV entries go, and the next draft starts from the last
//! accepted row's features (`docs/model.md`). Before the first such
//! sequence, [`fix_prices`] fixes the prices its draft gate weighs by.

use super::micro_loop::Start;
use super::{DecodeConfig, SeqGen};
use crate::decode::step::MacroStep;
use crate::decode::tree;
use crate::engine::Engine;
use crate::error::Result;
use crate::graph::StepOut;

/// Checks `sg`'s drafts against `rows`, its output rows of the forward just
/// run (the last verified token's, then each drafted token's): emits the
/// accepted drafts and the base's token, drops the rejected rows' entries,
/// records the outcome in the draft gate and the timings, and takes the
/// tokens a grammar forces after them. Returns how the micro loop starts
/// (drafting after the last token, unless forced tokens follow it or the
/// forward stored no `features` to draft from).
///
/// # Errors
/// When the engine has no such rows (a bug of the caller).
pub(super) fn check(
    sg: &mut SeqGen,
    cfg: &DecodeConfig,
    engine: &mut Engine,
    rows: Vec<StepOut>,
    features: bool,
) -> Result<Start> {
    let draft = sg.take_draft();
    let nodes = tree::rows(&draft.tokens, &draft.siblings);
    let drafted = nodes.len();
    debug_assert_eq!(rows.len(), drafted + 1, "one output row per drafted token, and the verified one's");
    let by_model = sg.rule(cfg).draft.is_some_and(|d| d.by_model);
    let mut step = MacroStep::default();
    let (mut accepted, mut chain_accepted) = (0, 0);
    let mut rows: Vec<Option<StepOut>> = rows.into_iter().map(Some).collect();
    // The output row read next, and once the check ends the last accepted one.
    let mut row = 0;
    let mut on_chain = true;
    loop {
        let mut out = rows[row].take().expect("each output row is read once");
        let j = step.tokens.len();
        let p = sg.distribution(&out, true);
        let (token, mut agreed) = match draft.tokens.get(j).filter(|_| on_chain) {
            Some(&d) if by_model => {
                // As llama-server: the row's token is drawn as a plain decode
                // draws it, so the output is the same with drafts or without.
                let t = sg.sampler.draw(&p);
                let eog = sg.is_eog(cfg, d);
                match sg.synthetic.as_mut().map(|s| s.keeps(j) && !eog) {
                    Some(kept) => (if kept { d } else { t }, kept),
                    None => (t, t == d),
                }
            }
            Some(&d) => match sg.sampler.verify_draft(&p, &draft.q[j], d) {
                None => (d, true),
                Some(t) => (t, false),
            },
            None => (sg.sampler.draw(&p), false),
        };
        chain_accepted += usize::from(agreed);
        // The chain's rows come first ([`tree::rows`]): its next row is node `j`.
        let mut next = agreed.then_some(j);
        if on_chain && !agreed {
            // A tree: the base's token may be a sibling's, whose path ends with it.
            next = nodes.iter().position(|n| n.sibling && n.depth == j + 1 && n.token == token);
            agreed = next.is_some();
            on_chain = !agreed;
        }
        if let Some(c) = &mut sg.constraint {
            c.commit(token);
        }
        sg.history.push(token);
        if let Some(lp) = sg.token_logprob(&out, &p, token) {
            step.logprobs.push(lp);
        }
        step.tokens.push(token);
        step.p_stop.push(out.p_stop_for(true));
        if cfg.keep_logits {
            step.logits.push(out.logits.take().unwrap_or_default());
        }
        accepted += usize::from(agreed);
        if let Some(n) = next {
            row = n + 1;
        }
        if !agreed || sg.is_eog(cfg, token) || step.tokens.len() >= sg.remaining() {
            break;
        }
    }
    engine.keep_through_output(sg.seq, row)?;
    let gate = if draft.from_context { &mut sg.context_gate } else { &mut sg.gate };
    if let Some(gate) = gate {
        // The gate weighs the chain's drafts: it learns how many of them held.
        gate.record(&draft.p_stop_before, chain_accepted);
    }
    let t = &mut sg.gen.timings;
    t.drafted += drafted;
    t.draft_accepted += accepted;
    t.verify_forwards += usize::from(drafted > 0);
    let p_stop = *step.p_stop.last().expect("a check emits a token");
    let last = *step.tokens.last().expect("a check emits a token");
    let forced = if sg.is_eog(cfg, last) { Vec::new() } else { sg.forced(engine, &mut step) };
    step.p_stop.extend(forced.iter().map(|_| 1.0));
    let n_forced = forced.len();
    step.tokens.extend(forced);
    Ok(Start::Verified { step, n_forced, p_stop, features })
}

/// Before the first self-verified sequence whose gate decides its drafts
/// is fed, fixes the engine's prices ([`Engine::fix_prices`]) on a sequence
/// that holds no cells; when every sequence holds some (a busy server's
/// full pool), the prices follow the clock until a self-verified sequence
/// starts while one is free.
pub(super) fn fix_prices(engine: &mut Engine, cfg: &DecodeConfig, seqs: &[&mut SeqGen]) -> Result<()> {
    if engine.costs().is_fixed() {
        return Ok(());
    }
    let new = seqs.iter().filter(|s| !s.done && s.gen.timings.reached.is_empty());
    let gated = new.filter_map(|s| s.rule(cfg).draft).filter(|d| !d.by_model && d.gated());
    let (Some(n_max), Some(free)) = (
        gated.map(|d| d.n_max).max(),
        (0..engine.n_seq()).find(|&q| engine.kv().n_cells_of(q) == 0 && engine.next_pos(q) == 0),
    ) else {
        return Ok(());
    };
    engine.fix_prices(free, n_max)
}
