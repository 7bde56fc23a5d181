//! The micro steps that follow one base forward, all sequences batched: at
//! each micro step every sequence whose step goes on feeds its last token.
//! In macro steps the micro decoder's tokens are the step's (HAMburger's
//! stop rule ends it); self-verified, they are drafts that the next base
//! forward checks (the draft gate ends them). Tokens a grammar forces after
//! a step's tokens end it, and are fed one input each by the next forward.

use super::{DecodeConfig, SeqGen};
use crate::decode::draft::DraftRule;
use crate::decode::step::MacroStep;
use crate::decode::tree::Level;
use crate::decode::{copy, ngram};
use crate::engine::forward_cost::Prices;
use crate::engine::Engine;
use crate::error::Result;
use crate::graph::micro::MicroWants;
use crate::graph::StepOut;
use crate::memory::kv_cache::SeqId;
use crate::sampling::TokenLogprob;

/// How a sequence's micro loop starts.
pub(super) enum Start {
    /// Macro steps: the base forward's outputs, from which the step's first token is drawn.
    Base(StepOut),
    /// Self-verified: the step's tokens, verified ([`super::verify::check`]),
    /// the last `n_forced` of them forced by a grammar, the stop
    /// probability after the last verified one (the draft gate's signal),
    /// and whether the forward stored the features drafting starts from.
    Verified { step: MacroStep, n_forced: usize, p_stop: f32, features: bool },
}

/// One sequence's macro step in the making.
struct InStep {
    index: usize,
    step: MacroStep,
    /// Tokens at the end of `step` that a grammar forced.
    n_forced: usize,
    /// Self-verified: the stop probability after the last token drafted from.
    p_stop: f32,
    /// Self-verified: whether the micro decoder has features to draft from.
    features: bool,
}

/// Runs the micro loops of the sequences in `ready` (index, start), batched:
/// at each micro step every sequence whose step continues (or drafts) feeds
/// its token, and the step computes the stop head and the logits where
/// `stop_head` and `logits` ask, from the draft vocabulary where every
/// sequence drafts (drafts priced at `prices`); then records each
/// sequence's step.
///
/// # Errors
/// When a micro step fails.
pub(super) fn run(
    engine: &mut Engine,
    cfg: &DecodeConfig,
    seqs: &mut [&mut SeqGen],
    ready: Vec<(usize, Start)>,
    stop_head: bool,
    logits: bool,
    prices: &Prices,
) -> Result<()> {
    let mut steps = Vec::with_capacity(ready.len());
    let mut current = Vec::with_capacity(ready.len());
    for (a, (index, start)) in ready.into_iter().enumerate() {
        let (step, n_forced, p_stop, features, out) = match start {
            Start::Base(out) => (MacroStep::default(), 0, f32::NAN, true, Some(out)),
            Start::Verified { step, n_forced, p_stop, features } => (step, n_forced, p_stop, features, None),
        };
        steps.push(InStep { index, step, n_forced, p_stop, features });
        current.push((a, out));
    }
    for s in 0.. {
        let mut next = Vec::new();
        for (a, out) in current {
            let st = &mut steps[a];
            let sg = &mut *seqs[st.index];
            let feed = match sg.rule(cfg).draft {
                None => step_token(sg, cfg, engine, st, out.expect("a macro step's micro step has outputs")),
                Some(rule) => draft_token(sg, cfg, engine, st, out, &rule, prices),
            };
            if let Some(token) = feed {
                next.push((a, sg.seq, token));
            }
        }
        if next.is_empty() {
            break;
        }
        let outs = micro_step(engine, cfg, seqs, &steps, s, &next, (stop_head, logits))?;
        current = next.iter().map(|&(a, _, _)| a).zip(outs.into_iter().map(Some)).collect();
    }
    for st in steps {
        let sg = &mut *seqs[st.index];
        // Drafted tokens are no history until verified.
        sg.history.truncate(sg.history.len() - sg.draft.tokens.len());
        if let Some(rule) = sg.rule(cfg).draft {
            // A tree's rows take cells too, as the chain's do (`draft_token`).
            let room = sg.cells_left(engine).saturating_sub(1);
            // Forced drafts grow the tree asked for; the gate prices its siblings.
            sg.draft.grow_tree(sg.tree_nodes(&rule).min(room), rule.gated().then_some(prices));
        }
        sg.end_step(st.step, st.n_forced, cfg, engine);
    }
    Ok(())
}

/// Micro step `s` of the sequences of `next` (their step's index in
/// `steps`, sequence, token), computing the stop head and the logits where
/// `(stop_head, logits)` ask; their outputs in order. Drafting sequences
/// run the model's draft head, when it has one, and macro steps their own
/// modules: a step that has both runs as two groups. Drafts come from the
/// draft vocabulary when every sequence of their group drafts (a macro
/// step's micro tokens are its output) and no grammar masks them. A draft
/// head that copies reads each drafting sequence's copy candidates: its
/// history ends with the token fed ([`copy::candidates`]).
fn micro_step(
    engine: &mut Engine,
    cfg: &DecodeConfig,
    seqs: &[&mut SeqGen],
    steps: &[InStep],
    s: usize,
    next: &[(usize, SeqId, u32)],
    (stop_head, logits): (bool, bool),
) -> Result<Vec<StepOut>> {
    let sg = |a: usize| &seqs[steps[a].index];
    let drafts = |a: usize| sg(a).rule(cfg).draft.is_some();
    let groups: Vec<Vec<usize>> = if engine.model().weights.has_draft_head() {
        let (d, m): (Vec<usize>, Vec<usize>) = (0..next.len()).partition(|&j| drafts(next[j].0));
        [d, m].into_iter().filter(|g| !g.is_empty()).collect()
    } else {
        vec![(0..next.len()).collect()]
    };
    let mut outs: Vec<Option<StepOut>> = vec![None; next.len()];
    for group in groups {
        let all = |f: &dyn Fn(usize) -> bool| group.iter().all(|&j| f(next[j].0));
        let want = MicroWants {
            stop_head,
            logits,
            drafts: all(&drafts),
            draft_vocab: all(&|a| drafts(a) && sg(a).constraint.is_none()),
        };
        let inputs: Vec<(SeqId, u32)> = group.iter().map(|&j| (next[j].1, next[j].2)).collect();
        let longest = if want.drafts { engine.model().hp.draft_copy_ngram } else { 0 };
        let copies: Vec<Option<u32>> =
            group.iter().flat_map(|&j| copy::candidates(&sg(next[j].0).history, longest)).collect();
        for (&j, out) in group.iter().zip(engine.micro_step(s, &inputs, &copies, want)?) {
            outs[j] = Some(out);
        }
    }
    Ok(outs.into_iter().map(|o| o.expect("every sequence is in a group")).collect())
}

/// Macro steps: draws the step's next token from `out` (the base's for the
/// first, the micro decoder's after), then takes the tokens a grammar forces;
/// returns the token to feed to the next micro step, or None when the step
/// ends (by the stop rule, at end of generation or the budget, or after
/// forced tokens).
fn step_token(sg: &mut SeqGen, cfg: &DecodeConfig, engine: &Engine, st: &mut InStep, mut out: StepOut) -> Option<u32> {
    let token = sg.pick(&out, &mut st.step)?;
    st.step.tokens.push(token);
    st.step.p_stop.push(out.p_stop);
    if cfg.keep_logits {
        st.step.logits.push(out.logits.take().unwrap_or_default());
    }
    let n = st.step.tokens.len();
    let ends = sg.step_ends(cfg, n, out.p_stop, token);
    let forced = if sg.is_eog(cfg, token) { Vec::new() } else { sg.forced(engine, &mut st.step) };
    if !forced.is_empty() {
        // Forced tokens end the step: the micro decoder never saw them.
        st.step.p_stop.extend(forced.iter().map(|_| 1.0));
        st.n_forced = forced.len();
        st.step.tokens.extend(forced);
        return None;
    }
    (!ends).then_some(token)
}

/// Self-verified: draws the next drafted token from `out` (a micro step's
/// outputs; None at the start, after the verified tokens), keeping it when
/// the rule does, then asks the gate whether to draft one more at `prices`; returns the
/// token to feed to the next micro step, or None when drafting ends.
fn draft_token(
    sg: &mut SeqGen,
    cfg: &DecodeConfig,
    engine: &Engine,
    st: &mut InStep,
    out: Option<StepOut>,
    rule: &DraftRule,
    prices: &Prices,
) -> Option<u32> {
    if let Some(out) = out {
        let depth = sg.draft.tokens.len() + 1;
        let before = sg.constraint.as_ref().map(|c| c.mark());
        sg.draft.mark = sg.draft.mark.or(before);
        let tree = sg.tree_nodes(rule);
        // A tree's alternatives: the likeliest other tokens the sampler weighs.
        let weighed = out.logits.as_deref().filter(|_| tree > 0).map(|l| sg.weighed(l));
        let (token, q) = sg.draw(&out, true)?;
        let prob = out.logits.as_deref().map_or(1.0, |l| TokenLogprob::new(l, token, 0).logprob.exp());
        if !rule.keeps(depth, prob) {
            sg.history.pop();
            if let (Some(c), Some(mark)) = (&mut sg.constraint, before) {
                c.rollback_to(mark);
            }
            return None;
        }
        if let Some(weighed) = weighed {
            let drawn = sg.sampler.params().temp > 0.0;
            sg.draft.levels.push(Level::new(&weighed, token, tree, drawn));
        }
        sg.draft.tokens.push(token);
        sg.draft.q.push(q);
        st.p_stop = out.p_stop;
    }
    let last = *sg.draft.tokens.last().or(st.step.tokens.last())?;
    let depth = sg.draft.tokens.len() + 1;
    // A draft and the token the base adds after it must fit the budget and the cells.
    let budget = sg.remaining().saturating_sub(st.step.tokens.len());
    let cells = sg.cells_left(engine).saturating_sub(1);
    if st.n_forced > 0 || sg.is_eog(cfg, last) || depth >= budget || depth > cells {
        return None;
    }
    if depth == 1 && context_draft(sg, cfg, rule, budget.saturating_sub(1).min(cells), prices) {
        return None;
    }
    // A draft model's sequences have no gate: the micro decoder drafts nothing.
    let gate = sg.gate.as_mut()?;
    if !st.features {
        gate.skip();
        return None;
    }
    let mut signal = sg.draft.p_stop_before.clone();
    signal.push(st.p_stop);
    if !gate.wants(rule, depth, &signal, prices) {
        return None;
    }
    sg.draft.p_stop_before = signal;
    Some(last)
}

/// Self-verified with `ngram-simple`: drafts up to `room` tokens from the
/// context ([`ngram::draft`]: what followed its last `rule.ngram` tokens where
/// they occurred before, up to an end-of-generation token), as many as the
/// context's gate finds worth their rows at `prices` (no micro step drafts
/// them); the micro decoder drafts only where this does not. Not under a
/// grammar, whose constraint commits each drafted token as it is drawn.
/// Returns whether it drafted.
fn context_draft(sg: &mut SeqGen, cfg: &DecodeConfig, rule: &DraftRule, room: usize, prices: &Prices) -> bool {
    let (Some(n), None) = (rule.ngram, &sg.constraint) else {
        return false;
    };
    let mut found = ngram::draft(&sg.history, n, rule.n_max.min(room)).to_vec();
    if let Some(end) = found.iter().position(|&t| sg.is_eog(cfg, t)) {
        found.truncate(end + 1);
    }
    let Some(gate) = sg.context_gate.as_mut() else {
        return false;
    };
    // One bucket: the stop head says nothing of the context's drafts.
    let signal = vec![0.0; found.len()];
    let rows = prices.rows_only();
    let take = (1..=found.len()).take_while(|&d| gate.wants(rule, d, &signal[..d], &rows)).count();
    if take == 0 {
        return false;
    }
    found.truncate(take);
    sg.history.extend_from_slice(&found);
    sg.draft.q = found.iter().map(|&t| vec![(t, 1.0)]).collect();
    sg.draft.p_stop_before = signal[..take].to_vec();
    sg.draft.tokens = found;
    sg.draft.from_context = true;
    true
}
