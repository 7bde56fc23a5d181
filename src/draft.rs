//! Self-verified decoding's drafts: how many tokens the micro decoder drafts
//! after each verified token (llama.cpp's `--spec-draft-n-max`, `-n-min`,
//! `-p-min`), and the gate that learns, per sequence, when a draft is worth
//! computing.
//!
//! A drafted token costs a micro step (the micro decoder's layers and an
//! lm_head) and one more row in the next base forward; it earns a token only
//! when the base agrees. With modules that rarely agree (random grafted
//! modules reject nearly every draft) drafting must stop, or decoding is
//! slower than one token per forward; with modules that agree where their
//! stop head is confident, drafting must go on there. So the gate keeps, per
//! bucket of the stop head's signal (`1 - p_stop` after the token a draft
//! would follow: HAMburger's own "the step may go on"), the acceptance it has
//! seen, and drafts the next token only while the chance that every draft so
//! far and this one are accepted pays for its cost. A bucket it has given up
//! on is probed now and then, at intervals that double after each failed
//! probe, so that it notices when drafts start to agree. Everything is
//! deterministic (no timing), so a seeded generation repeats itself.

use crate::error::{Param, ParamError};
use crate::hparams::HParams;

/// Speculative decoding's type, by llama.cpp's names (`--spec-type`, the
/// server's `speculative.type`): those that apply to a HAMburger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecType {
    /// `none`: no verification; HAMburger's macro steps (the micro decoder's
    /// tokens are kept as its stop head allows).
    None,
    /// `draft-mtp`: self-verified decoding; the micro decoder, the model's
    /// own multi-token head, drafts and the base checks every token.
    SelfVerified,
    /// `draft-simple`: a separate draft model drafts for this one.
    DraftModel,
}

impl SpecType {
    /// The name llama.cpp gives it.
    pub fn name(self) -> &'static str {
        match self {
            SpecType::None => "none",
            SpecType::SelfVerified => "draft-mtp",
            SpecType::DraftModel => "draft-simple",
        }
    }

    /// Parses llama.cpp's `--spec-type` value: `none`, `draft-mtp` and
    /// `draft-simple` apply; its other types are refused saying why; a
    /// comma-separated list (llama.cpp chains types) must name one type.
    ///
    /// # Errors
    /// An unknown type, one that does not apply, or several.
    pub fn parse(s: &str) -> Result<SpecType, String> {
        let names: Vec<&str> = s.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
        let [name] = names.as_slice() else {
            return Err(
                "one type at a time here: none, draft-mtp (self-verified) or draft-simple (a draft model)".into()
            );
        };
        match *name {
            "none" => Ok(SpecType::None),
            "draft-mtp" => Ok(SpecType::SelfVerified),
            "draft-simple" => Ok(SpecType::DraftModel),
            "draft-eagle3" | "draft-dflash" | "draft-dspark" => Err(format!(
                "{name} needs a draft head of its own; a HAMburger's own head is its micro decoder: use draft-mtp"
            )),
            n if n.starts_with("ngram-") => Err(format!(
                "{n}: n-gram drafting is not implemented here; the model's micro decoder drafts (draft-mtp)"
            )),
            n => Err(format!("unknown type '{n}' (valid here: none, draft-mtp, draft-simple)")),
        }
    }
}

/// The draft settings as a user gives them (llama.cpp's flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftParams {
    /// The most tokens drafted after each verified token (`None`: the
    /// model's, `max_steps - 1`: what the micro decoder can emit after one
    /// base token).
    pub n_max: Option<usize>,
    /// Tokens drafted whatever the gate and `p_min` say (tests, benchmarks).
    pub n_min: usize,
    /// A drafted token whose probability under the micro decoder is below
    /// this is dropped, with the drafting (0: none is).
    pub p_min: f32,
}

impl Default for DraftParams {
    /// llama.cpp's defaults (n-min 0, p-min 0), the model's most drafts.
    fn default() -> Self {
        DraftParams { n_max: None, n_min: 0, p_min: 0.0 }
    }
}

impl DraftParams {
    /// Checks the settings for a model of `model_max` tokens per macro step.
    ///
    /// # Errors
    /// Naming the parameter: `n_max` beyond `model_max - 1`, `n_min` beyond
    /// `n_max`, `p_min` outside 0..=1.
    pub fn validate(&self, model_max: usize) -> Result<(), ParamError> {
        let most = model_max.saturating_sub(1);
        let n_max = self.n_max.unwrap_or(most);
        if n_max > most {
            let message = format!(
                "{} {n_max} exceeds the {most} tokens the micro decoder drafts after one base token (max_steps {model_max} - 1)",
                Param::DraftNMax
            );
            return Err(ParamError::new(&[Param::DraftNMax], message));
        }
        if self.n_min > n_max {
            let (min, max) = (Param::DraftNMin, Param::DraftNMax);
            let message = format!("{min} {} exceeds {max} {n_max}", self.n_min);
            return Err(ParamError::new(&[min, max], message));
        }
        if !(self.p_min.is_finite() && (0.0..=1.0).contains(&self.p_min)) {
            let message = format!("{} {}: expected a number from 0 to 1", Param::DraftPMin, self.p_min);
            return Err(ParamError::new(&[Param::DraftPMin], message));
        }
        Ok(())
    }

    /// The rule these settings give a model of `model_max` tokens per macro step.
    ///
    /// # Errors
    /// As [`DraftParams::validate`].
    pub fn rule(&self, model_max: usize) -> Result<DraftRule, ParamError> {
        self.validate(model_max)?;
        let n_max = self.n_max.unwrap_or(model_max.saturating_sub(1));
        Ok(DraftRule { n_max, n_min: self.n_min, p_min: self.p_min })
    }
}

/// The draft settings resolved against a model ([`DraftParams::rule`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftRule {
    /// The most tokens drafted after each verified token.
    pub n_max: usize,
    /// Tokens drafted whatever the gate and `p_min` say.
    pub n_min: usize,
    /// Drafted tokens less likely than this under the micro decoder are dropped.
    pub p_min: f32,
}

impl DraftRule {
    /// Whether a drafted token may stay in the draft: within `n_min`, or at
    /// least `p_min` likely (`prob`, the micro decoder's probability of it).
    pub fn keeps(&self, depth: usize, prob: f32) -> bool {
        depth <= self.n_min || prob >= self.p_min
    }
}

/// What one drafted token costs, as a share of one base forward of one
/// token: a micro step reads the micro decoder's layers and the lm_head, a
/// base forward the base's layers and the lm_head; decoding one sequence on
/// a CPU reads every weight once per forward, so the share is that of the
/// weights, plus what one more row adds to the verifying forward.
pub fn draft_cost(hp: &HParams) -> f32 {
    /// One more row of a base forward, relative to the forward of one row.
    const ROW_COST: f64 = 0.03;
    let (d, kv, ff) = (hp.n_embd as f64, hp.n_embd_kv() as f64, hp.n_ff as f64);
    let layer = 2.0 * d * d + 2.0 * d * kv + 3.0 * d * ff;
    let head = hp.n_vocab as f64 * d;
    let micro = hp.n_micro_layer as f64 * layer + head;
    let base = hp.n_layer as f64 * layer + head;
    (micro / base + ROW_COST) as f32
}

/// Buckets of the stop head's signal `1 - p_stop`: below 0.5, 0.8, 0.95, and above.
const EDGES: [f32; 3] = [0.5, 0.8, 0.95];
const BUCKETS: usize = EDGES.len() + 1;
/// The acceptance a bucket starts from, and the weight (in drafts) of that guess.
const PRIOR: f32 = 0.3;
const PRIOR_WEIGHT: f32 = 2.0;
/// How fast old outcomes fade: each new one weighs as much as 1 / (1 - DECAY) old ones.
const DECAY: f32 = 0.95;
/// Gated-off steps between probes: from the first, doubling after each
/// failed probe and halving after each accepted one, within the bounds.
const PROBE_FIRST: u32 = 4;
const PROBE_MOST: u32 = 256;

/// One sequence's record of which drafts the base accepted, and the
/// decision of whether to draft the next token (see the module's doc).
#[derive(Debug, Clone)]
pub struct DraftGate {
    cost: f32,
    tried: [f32; BUCKETS],
    accepted: [f32; BUCKETS],
    /// Gated-off steps since the last probe.
    waited: u32,
    /// Gated-off steps between probes.
    interval: u32,
    /// The current draft's first token was drafted as a probe.
    probing: bool,
}

/// The bucket of the stop head's signal after the token a draft would follow.
fn bucket(p_stop: f32) -> usize {
    let go_on = if p_stop.is_nan() { 0.0 } else { 1.0 - p_stop };
    EDGES.iter().filter(|&&e| go_on >= e).count()
}

impl DraftGate {
    /// A gate for drafts of cost `cost` ([`draft_cost`]), with no outcome seen yet.
    pub fn new(cost: f32) -> DraftGate {
        DraftGate {
            cost,
            tried: [0.0; BUCKETS],
            accepted: [0.0; BUCKETS],
            waited: 0,
            interval: PROBE_FIRST,
            probing: false,
        }
    }

    /// The acceptance expected of a draft after a token of stop probability `p_stop`.
    fn acceptance(&self, p_stop: f32) -> f32 {
        let b = bucket(p_stop);
        (self.accepted[b] + PRIOR * PRIOR_WEIGHT) / (self.tried[b] + PRIOR_WEIGHT)
    }

    /// Whether to draft token `depth` (1 for the first) of a draft, given the
    /// stop probability after the token it follows, `p_stop_before` (those
    /// after the verified token and each drafted one so far, in order, the
    /// last the one it follows). Drafts within `rule.n_min` always; none past
    /// `rule.n_max`; else while the chance that this and every earlier draft
    /// are accepted pays for one more draft at the rate the draft so far
    /// earns, and as a probe when the first draft has been gated off long
    /// enough.
    pub fn wants(&mut self, rule: &DraftRule, depth: usize, p_stop_before: &[f32]) -> bool {
        if depth > rule.n_max {
            return false;
        }
        if depth <= rule.n_min {
            return true;
        }
        let mut reach = 1.0; // the chance that the drafts before this one are all accepted
        let mut expected = 1.0; // tokens the step earns with them
        for &p in &p_stop_before[..depth - 1] {
            reach *= self.acceptance(p);
            expected += reach;
        }
        let chance = reach * self.acceptance(p_stop_before[depth - 1]);
        let rate = expected / (1.0 + (depth - 1) as f32 * self.cost);
        if chance >= self.cost * rate {
            return true;
        }
        if depth > 1 {
            return false;
        }
        self.waited += 1;
        self.probing = self.waited >= self.interval;
        if self.probing {
            self.waited = 0;
        }
        self.probing
    }

    /// Counts a step that could not draft (its forward stored no features,
    /// as [`DraftGate::may_draft`] foresaw): it brings the next probe nearer.
    pub fn skip(&mut self) {
        self.waited += 1;
    }

    /// Whether the next forward's outputs may be drafted from: a draft is
    /// wanted or a probe is due (a forward without drafting to follow stores
    /// no features and runs no stop head).
    pub fn may_draft(&self, rule: &DraftRule) -> bool {
        rule.n_min > 0 || (rule.n_max > 0 && (self.waited + 1 >= self.interval || (0..BUCKETS).any(|b| self.worth(b))))
    }

    fn worth(&self, b: usize) -> bool {
        (self.accepted[b] + PRIOR * PRIOR_WEIGHT) / (self.tried[b] + PRIOR_WEIGHT) >= self.cost
    }

    /// Records the verification of a draft: `p_stop_before[j]` the stop
    /// probability after the token draft token `j` followed, and `accepted`
    /// of them accepted (the tokens after the first rejection were never
    /// judged and teach nothing).
    pub fn record(&mut self, p_stop_before: &[f32], accepted: usize) {
        let judged = (accepted + 1).min(p_stop_before.len());
        for (j, &p) in p_stop_before[..judged].iter().enumerate() {
            let b = bucket(p);
            self.tried[b] = self.tried[b] * DECAY + 1.0;
            self.accepted[b] = self.accepted[b] * DECAY + f32::from(u8::from(j < accepted));
        }
        if std::mem::take(&mut self.probing) && judged > 0 {
            self.interval =
                if accepted > 0 { (self.interval / 2).max(PROBE_FIRST) } else { (self.interval * 2).min(PROBE_MOST) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: DraftRule = DraftRule { n_max: 3, n_min: 0, p_min: 0.0 };

    #[test]
    fn spec_types_by_llama_cpps_names() {
        assert_eq!(SpecType::parse("draft-mtp"), Ok(SpecType::SelfVerified));
        assert_eq!(SpecType::parse("none"), Ok(SpecType::None));
        assert!(SpecType::parse("ngram-mod").unwrap_err().contains("n-gram drafting is not implemented"));
        assert!(SpecType::parse("draft-eagle3").unwrap_err().contains("use draft-mtp"));
        assert!(SpecType::parse("none,draft-mtp").unwrap_err().starts_with("one type at a time"));
        assert!(SpecType::parse("fast").unwrap_err().starts_with("unknown type 'fast'"));
    }

    #[test]
    fn validation_names_the_parameter() {
        let ok = DraftParams::default();
        assert_eq!(ok.rule(4), Ok(DraftRule { n_max: 3, n_min: 0, p_min: 0.0 }));
        let e = DraftParams { n_max: Some(4), ..ok }.validate(4).unwrap_err();
        assert_eq!(e.params, [Param::DraftNMax]);
        assert_eq!(
            e.to_string(),
            "draft_n_max 4 exceeds the 3 tokens the micro decoder drafts after one base token (max_steps 4 - 1)"
        );
        let e = DraftParams { n_max: Some(1), n_min: 2, ..ok }.validate(4).unwrap_err();
        assert_eq!(e.to_string(), "draft_n_min 2 exceeds draft_n_max 1");
        let e = DraftParams { p_min: 1.5, ..ok }.validate(4).unwrap_err();
        assert_eq!(
            (e.params.as_slice(), e.to_string().as_str()),
            ([Param::DraftPMin].as_slice(), "draft_p_min 1.5: expected a number from 0 to 1")
        );
        assert!(DraftParams { n_max: Some(0), ..ok }.validate(4).is_ok(), "0: never draft");
    }

    #[test]
    fn n_min_drafts_always_and_n_max_never_more() {
        let mut g = DraftGate::new(10.0); // nothing is worth its cost
        let rule = DraftRule { n_max: 2, n_min: 1, p_min: 0.9 };
        assert!(g.wants(&rule, 1, &[0.5]));
        assert!(!g.wants(&DraftRule { n_max: 0, ..rule }, 1, &[0.5]));
        assert!(rule.keeps(1, 0.0) && !rule.keeps(2, 0.5) && rule.keeps(2, 0.95));
    }

    #[test]
    fn rejected_drafts_stop_drafting_but_for_probes_ever_further_apart() {
        let mut g = DraftGate::new(0.4);
        // The prior (0.3) is below the cost: no draft, but probes.
        let mut drafted = Vec::new();
        for step in 0..200 {
            if g.wants(&RULE, 1, &[0.3]) {
                drafted.push(step);
                g.record(&[0.3], 0);
            }
        }
        assert_eq!(drafted, [3, 11, 27, 59, 123], "probes after 4, 8, 16, 32, 64 gated-off steps");
    }

    #[test]
    fn accepted_drafts_in_a_confident_bucket_keep_drafting_there() {
        let mut g = DraftGate::new(0.4);
        // A probe in the confident bucket (p_stop 0.01) is accepted, then every draft.
        let mut n = 0;
        for _ in 0..40 {
            if g.wants(&RULE, 1, &[0.01]) {
                n += 1;
                let deeper = g.wants(&RULE, 2, &[0.01, 0.01]);
                g.record(&[0.01, 0.01][..1 + usize::from(deeper)], 1 + usize::from(deeper));
            }
        }
        assert!(n >= 30, "drafted {n} times of 40");
        assert!(g.wants(&RULE, 3, &[0.01, 0.01, 0.01]), "deep drafts pay where all are accepted");
        // The unconfident bucket was never tried: still gated off.
        assert!(!g.worth(bucket(0.9)));
    }
}
