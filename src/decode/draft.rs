//! Self-verified decoding's drafts: how many tokens the micro decoder drafts
//! after each verified token (llama.cpp's `--spec-draft-n-max`, `-n-min`,
//! `-p-min`), and the gate that learns, per sequence, when a draft is worth
//! computing.
//!
//! A drafted token costs a micro step and one more row in the next base
//! forward, at the prices the engine has measured ([`crate::engine::forward_cost`]);
//! it earns a token only when the base agrees. With modules that rarely
//! agree (random grafted modules reject nearly every draft), or where a
//! second row costs about a forward of its own (two CPU cores), drafting
//! must stop, or decoding is slower than one token per forward; with
//! modules that agree where their stop head is confident, drafting must go
//! on there. So the gate keeps, per bucket of the stop head's signal
//! (`1 - p_stop` after the token a draft would follow: HAMburger's own "the
//! step may go on"), the acceptance it has seen, and drafts the next token
//! when some draft length from there on earns more tokens per cost than
//! stopping. A bucket it has given up on is probed now and then, at
//! intervals that double after each failed probe and keep probes within 2%
//! of the forwards, so that it notices when drafts start to agree; where
//! even drafts that were always accepted would not pay, it probes only once
//! in [`REPRICE_INTERVAL`] steps: no draft could earn there, but the probe
//! times a forward of two rows and a micro step again, so a price measured
//! wrong (one slow forward on a busy machine) does not stop drafting for
//! good; where the prices are fixed ([`crate::engine::calibration`]), no
//! forward would reprice them, and it does not probe there at all.

use crate::engine::forward_cost::Prices;
use crate::error::{Param, ParamError};
use crate::graph::base::MAX_TREE_DRAFTS;

/// Speculative decoding's type, by llama.cpp's names (`--spec-type`, the
/// server's `speculative.type`): those that apply to a HAMburger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecType {
    /// `none`: no verification; HAMburger's macro steps (the micro decoder's
    /// tokens are kept as its stop head allows).
    None,
    /// `draft-mtp`: self-verified decoding; the micro decoder, the model's
    /// own multi-token head, drafts and the base checks every token. With
    /// `ngram`, `ngram-simple,draft-mtp`: the context drafts first
    /// ([`crate::decode::ngram`]), the micro decoder where it has no match.
    SelfVerified {
        /// The context drafts first (llama.cpp's `ngram-simple`).
        ngram: bool,
    },
    /// `draft-simple`: a separate draft model drafts for this one.
    DraftModel,
}

impl SpecType {
    /// The name llama.cpp gives it.
    pub fn name(self) -> &'static str {
        match self {
            SpecType::None => "none",
            SpecType::SelfVerified { ngram: false } => "draft-mtp",
            SpecType::SelfVerified { ngram: true } => "ngram-simple,draft-mtp",
            SpecType::DraftModel => "draft-simple",
        }
    }

    /// Parses llama.cpp's `--spec-type` value: `none`, `draft-mtp` and
    /// `draft-simple` apply, and of llama.cpp's chains (a comma-separated
    /// list, the first type that drafts drafts) `ngram-simple,draft-mtp`;
    /// its other types are refused saying why.
    ///
    /// # Errors
    /// An unknown type, one that does not apply, or a chain other than
    /// `ngram-simple,draft-mtp`.
    pub fn parse(s: &str) -> Result<SpecType, String> {
        let names: Vec<&str> = s.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
        let name = match names.as_slice() {
            [name] => *name,
            ["ngram-simple", "draft-mtp"] => return Ok(SpecType::SelfVerified { ngram: true }),
            _ => {
                return Err("one type at a time here (none, draft-mtp, draft-simple), or the chain \
                            ngram-simple,draft-mtp"
                    .into())
            }
        };
        match name {
            "none" => Ok(SpecType::None),
            "draft-mtp" => Ok(SpecType::SelfVerified { ngram: false }),
            "draft-simple" => Ok(SpecType::DraftModel),
            "draft-eagle3" | "draft-dflash" | "draft-dspark" => Err(format!(
                "{name} needs a draft head of its own; a HAMburger's own head is its micro decoder: use draft-mtp"
            )),
            "ngram-simple" => Err("ngram-simple drafts here before the micro decoder, which verifies \
                                   through the same forwards: use ngram-simple,draft-mtp"
                .into()),
            n if n.starts_with("ngram-") => Err(format!(
                "{n}: not implemented here; ngram-simple,draft-mtp drafts from the context, then with the \
                 model's micro decoder"
            )),
            n => Err(format!("unknown type '{n}' (valid here: none, draft-mtp, draft-simple, ngram-simple,draft-mtp)")),
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
    /// The context drafts first, where its last `ngram` tokens occurred
    /// before (`ngram-simple,draft-mtp`, llama.cpp's
    /// `--spec-ngram-simple-size-n`); `None`: the micro decoder alone.
    pub ngram: Option<usize>,
    /// Verify a tree of up to this many of the micro decoder's drafts: its
    /// chain and the likeliest alternatives to its tokens
    /// ([`crate::decode::tree`]); 0: the chain alone. Greedy or sampling,
    /// under a grammar too.
    pub tree: usize,
}

impl Default for DraftParams {
    /// llama.cpp's defaults (n-min 0, p-min 0), the model's most drafts, a chain.
    fn default() -> Self {
        DraftParams { n_max: None, n_min: 0, p_min: 0.0, ngram: None, tree: 0 }
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
        if self.ngram == Some(0) {
            let message = format!("{} 0: an n-gram of 1 token or more", Param::NgramSizeN);
            return Err(ParamError::new(&[Param::NgramSizeN], message));
        }
        if self.tree > MAX_TREE_DRAFTS {
            let message = format!("{} {}: a tree of at most {MAX_TREE_DRAFTS} drafts", Param::DraftTree, self.tree);
            return Err(ParamError::new(&[Param::DraftTree], message));
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
        let (n_min, p_min, ngram, tree) = (self.n_min, self.p_min, self.ngram, self.tree);
        Ok(DraftRule { n_max, n_min, p_min, by_model: false, ngram, tree })
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
    /// The drafts come from a draft model (llama.cpp's `-md`), given before
    /// each forward ([`crate::generate::SeqGen::set_draft`]), and are checked
    /// as llama-server checks them: each row's token is sampled as a plain
    /// decode samples it and a drafted token is kept where they agree. The
    /// micro decoder drafts nothing and no gate decides.
    pub by_model: bool,
    /// The context drafts first, where its last `ngram` tokens occurred
    /// before ([`crate::decode::ngram`]).
    pub ngram: Option<usize>,
    /// The most drafts of a tree ([`DraftParams::tree`]; 0: a chain).
    pub tree: usize,
}

impl DraftRule {
    /// Whether a drafted token may stay in the draft: within `n_min`, or at
    /// least `p_min` likely (`prob`, the micro decoder's probability of it).
    pub fn keeps(&self, depth: usize, prob: f32) -> bool {
        depth <= self.n_min || prob >= self.p_min
    }

    /// Whether the draft gate decides some drafts (those past `n_min`), at
    /// the engine's prices: not where every verify forward drafts `n_max`.
    pub fn gated(&self) -> bool {
        self.n_min < self.n_max
    }
}

/// Buckets of the stop head's signal `1 - p_stop`: below 0.5, 0.8, 0.95, and above.
const EDGES: [f32; 3] = [0.5, 0.8, 0.95];
const BUCKETS: usize = EDGES.len() + 1;
/// The acceptance a bucket starts from, and the weight (in drafts) of that guess.
const PRIOR: f32 = 0.3;
const PRIOR_WEIGHT: f32 = 2.0;
/// How fast old outcomes fade: each new one weighs as much as 1 / (1 - DECAY) old ones.
const DECAY: f32 = 0.95;
/// Gated-off steps before the first probe, and the most between two.
const PROBE_FIRST: u32 = 4;
const PROBE_MOST: u32 = 1024;
/// After a failed probe, probes are spaced so that they cost at most this
/// share of the forwards between them.
const PROBE_BUDGET: f32 = 0.02;
/// Gated-off steps between probes where drafts could not pay even if always
/// accepted: their only use is to time the drafts' forwards again, at some
/// 0.15% of the forwards on two CPU cores (a probe there costs 1.5 forwards).
const REPRICE_INTERVAL: u32 = PROBE_MOST;

/// One sequence's record of which drafts the base accepted, and the
/// decision of whether to draft the next token (see the module's doc).
#[derive(Debug, Clone)]
pub struct DraftGate {
    tried: [f32; BUCKETS],
    accepted: [f32; BUCKETS],
    /// Gated-off steps since the last probe.
    waited: u32,
    /// Gated-off steps between probes.
    interval: u32,
    /// The fewest steps between probes that keeps them within [`PROBE_BUDGET`].
    spacing: u32,
    /// The current draft's first token was drafted as a probe.
    probing: bool,
}

/// The bucket of the stop head's signal after the token a draft would follow.
fn bucket(p_stop: f32) -> usize {
    let go_on = if p_stop.is_nan() { 0.0 } else { 1.0 - p_stop };
    EDGES.iter().filter(|&&e| go_on >= e).count()
}

/// Expected tokens per cost of a step that drafts `d` tokens, for each `d`
/// from 0 to `n_max`, when drafted token `j` is accepted with probability
/// `acceptance[j]` if given, else `then`: the verified token's 1 plus the
/// chance that each draft and those before it are accepted, over
/// [`Prices::step`].
fn rates(prices: &Prices, n_max: usize, acceptance: &[f32], then: f32) -> Vec<f32> {
    let (mut reach, mut expected) = (1.0, 1.0);
    let mut out = vec![1.0 / prices.step(0)];
    for d in 1..=n_max {
        reach *= acceptance.get(d - 1).copied().unwrap_or(then);
        expected += reach;
        out.push(expected / prices.step(d));
    }
    out
}

/// Whether some draft length of `depth` or more earns more than stopping
/// before draft `depth` (`rates` as [`rates`] gives them).
fn pays(rates: &[f32], depth: usize) -> bool {
    rates[depth..].iter().any(|&r| r > rates[depth - 1])
}

impl Default for DraftGate {
    fn default() -> Self {
        DraftGate::new()
    }
}

impl DraftGate {
    /// A gate with no outcome seen yet.
    pub fn new() -> DraftGate {
        DraftGate {
            tried: [0.0; BUCKETS],
            accepted: [0.0; BUCKETS],
            waited: 0,
            interval: PROBE_FIRST,
            spacing: PROBE_FIRST,
            probing: false,
        }
    }

    /// The acceptance expected of a draft after a token of stop probability `p_stop`.
    fn acceptance(&self, p_stop: f32) -> f32 {
        self.bucket_acceptance(bucket(p_stop))
    }

    fn bucket_acceptance(&self, b: usize) -> f32 {
        (self.accepted[b] + PRIOR * PRIOR_WEIGHT) / (self.tried[b] + PRIOR_WEIGHT)
    }

    /// Whether to draft token `depth` (1 for the first) of a draft, given the
    /// stop probability after the token it follows, `p_stop_before` (those
    /// after the verified token and each drafted one so far, in order, the
    /// last the one it follows), at `prices`. Drafts within `rule.n_min`
    /// always; none past `rule.n_max`; else when some draft length from
    /// `depth` on (later drafts expected to fare as this one) earns more
    /// tokens per cost than stopping before it, and as a probe when the
    /// first draft has been gated off long enough and drafts that were
    /// always accepted would pay.
    pub fn wants(&mut self, rule: &DraftRule, depth: usize, p_stop_before: &[f32], prices: &Prices) -> bool {
        if depth > rule.n_max {
            return false;
        }
        if depth <= rule.n_min {
            return true;
        }
        let acceptance: Vec<f32> = p_stop_before[..depth].iter().map(|&p| self.acceptance(p)).collect();
        if pays(&rates(prices, rule.n_max, &acceptance, acceptance[depth - 1]), depth) {
            return true;
        }
        if depth > 1 {
            return false;
        }
        self.waited += 1;
        self.probing = self.waited >= self.due(rule, prices);
        if self.probing {
            self.waited = 0;
            // A probe's cost, in steps without one.
            let cost = prices.step(1) / prices.step(0) - 1.0;
            self.spacing = ((cost / PROBE_BUDGET).ceil() as u32).clamp(PROBE_FIRST, PROBE_MOST);
        }
        self.probing
    }

    /// Counts a step that could not draft (its forward stored no features,
    /// as [`DraftGate::may_draft`] foresaw): it brings the next probe nearer.
    pub fn skip(&mut self) {
        self.waited += 1;
    }

    /// Whether the next forward's outputs may be drafted from at `prices`: a
    /// draft is wanted in some bucket, or a probe is due (a forward without
    /// drafting to follow stores no features and runs no stop head).
    pub fn may_draft(&self, rule: &DraftRule, prices: &Prices) -> bool {
        if rule.n_min > 0 {
            return true;
        }
        if rule.n_max == 0 {
            return false;
        }
        self.waited + 1 >= self.due(rule, prices)
            || (0..BUCKETS).any(|b| pays(&rates(prices, rule.n_max, &[], self.bucket_acceptance(b)), 1))
    }

    /// Gated-off steps before the next probe: the current interval; where
    /// drafts could not pay even if always accepted, [`REPRICE_INTERVAL`], or
    /// never once the prices are fixed.
    fn due(&self, rule: &DraftRule, prices: &Prices) -> u32 {
        if could_pay(prices, rule.n_max) {
            self.interval
        } else if prices.fixed {
            u32::MAX
        } else {
            REPRICE_INTERVAL
        }
    }

    /// Records the verification of a draft: `p_stop_before[j]` the stop
    /// probability after the token draft token `j` followed, and `accepted`
    /// of them accepted (the tokens after the first rejection were never
    /// judged and teach nothing). A failed probe puts the next one twice as
    /// far, and at least as far as keeps probes within their budget.
    pub fn record(&mut self, p_stop_before: &[f32], accepted: usize) {
        let judged = (accepted + 1).min(p_stop_before.len());
        for (j, &p) in p_stop_before[..judged].iter().enumerate() {
            let b = bucket(p);
            self.tried[b] = self.tried[b] * DECAY + 1.0;
            self.accepted[b] = self.accepted[b] * DECAY + f32::from(u8::from(j < accepted));
        }
        if std::mem::take(&mut self.probing) && judged > 0 {
            self.interval = if accepted > 0 {
                (self.interval / 2).max(PROBE_FIRST)
            } else {
                (self.interval * 2).max(self.spacing).min(PROBE_MOST)
            };
        }
    }
}

/// Whether drafting could pay at `prices` if every draft were accepted:
/// when not (a second row costs about a forward of its own, as on two CPU
/// cores), the gate drafts only to time the drafts' forwards again
/// ([`REPRICE_INTERVAL`]).
fn could_pay(prices: &Prices, n_max: usize) -> bool {
    pays(&rates(prices, n_max, &[], 1.0), 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: DraftRule = DraftRule { n_max: 3, n_min: 0, p_min: 0.0, by_model: false, ngram: None, tree: 0 };

    #[test]
    fn spec_types_by_llama_cpps_names() {
        assert_eq!(SpecType::parse("draft-mtp"), Ok(SpecType::SelfVerified { ngram: false }));
        assert_eq!(SpecType::parse("ngram-simple, draft-mtp"), Ok(SpecType::SelfVerified { ngram: true }));
        assert_eq!(SpecType::SelfVerified { ngram: true }.name(), "ngram-simple,draft-mtp");
        assert_eq!(SpecType::parse("none"), Ok(SpecType::None));
        assert!(SpecType::parse("ngram-mod").unwrap_err().contains("ngram-mod: not implemented here"));
        assert!(SpecType::parse("ngram-simple").unwrap_err().contains("use ngram-simple,draft-mtp"));
        assert!(SpecType::parse("draft-eagle3").unwrap_err().contains("use draft-mtp"));
        assert!(SpecType::parse("none,draft-mtp").unwrap_err().starts_with("one type at a time"));
        assert!(SpecType::parse("draft-mtp,ngram-simple").unwrap_err().starts_with("one type at a time"));
        assert!(SpecType::parse("fast").unwrap_err().starts_with("unknown type 'fast'"));
    }

    #[test]
    fn validation_names_the_parameter() {
        let ok = DraftParams::default();
        assert_eq!(ok.rule(4), Ok(DraftRule { n_max: 3, n_min: 0, p_min: 0.0, by_model: false, ngram: None, tree: 0 }));
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
        let e = DraftParams { ngram: Some(0), ..ok }.validate(4).unwrap_err();
        assert_eq!(e.to_string(), "ngram_size_n 0: an n-gram of 1 token or more");
    }

    /// Rows nearly free (a GPU, or many sequences' rows), micro steps 0.4.
    fn cheap() -> Prices {
        Prices::from_curve(&[1.0, 1.03, 1.06, 1.09], 0.4)
    }

    #[test]
    fn n_min_drafts_always_and_n_max_never_more() {
        let mut g = DraftGate::new();
        let dear = Prices::from_curve(&[1.0, 3.0, 5.0, 7.0], 1.0); // nothing is worth its cost
        let rule = DraftRule { n_max: 2, n_min: 1, p_min: 0.9, by_model: false, ngram: None, tree: 0 };
        assert!(g.wants(&rule, 1, &[0.5], &dear));
        assert!(!g.wants(&DraftRule { n_max: 0, ..rule }, 1, &[0.5], &dear));
        assert!(rule.keeps(1, 0.0) && !rule.keeps(2, 0.5) && rule.keeps(2, 0.95));
    }

    #[test]
    fn rejected_drafts_stop_drafting_but_for_probes_ever_further_apart() {
        let mut g = DraftGate::new();
        let prices = cheap();
        // The prior (0.3) does not pay for a draft at these prices, but a probe may.
        let mut drafted = Vec::new();
        for step in 0..600 {
            if g.wants(&RULE, 1, &[0.3], &prices) {
                drafted.push(step);
                g.record(&[0.3], 0);
            }
        }
        // A probe costs 0.43 forwards: after a failed one, 22 steps at least
        // keep probes within 2%, then the intervals double.
        assert_eq!(drafted, [3, 25, 69, 157, 333], "probes after 4, 22, 44, 88, 176 gated-off steps");
    }

    #[test]
    fn where_even_accepted_drafts_would_not_pay_the_gate_only_probes_to_reprice() {
        // Two CPU cores, 135M Q8_0: two rows cost 2.3 forwards, four 3.1, a micro step 0.45.
        let cpu = Prices::from_curve(&[1.0, 2.3, 2.7, 3.1], 0.45);
        let mut g = DraftGate::new();
        for _ in 0..10 {
            g.record(&[0.01, 0.01, 0.01], 3); // every draft accepted
        }
        assert!(!g.may_draft(&RULE, &cpu));
        // Only a probe in every REPRICE_INTERVAL steps, to time the drafts' forwards again.
        let probes: Vec<u32> = (0..3 * REPRICE_INTERVAL).filter(|_| g.wants(&RULE, 1, &[0.01], &cpu)).collect();
        assert_eq!(probes, [REPRICE_INTERVAL - 1, 2 * REPRICE_INTERVAL - 1, 3 * REPRICE_INTERVAL - 1]);
        assert!(!g.may_draft(&RULE, &cpu), "the last probe just ran");
        assert!(g.may_draft(&RULE, &cheap()) && g.wants(&RULE, 1, &[0.01], &cheap()));
        // Fixed prices: no forward would reprice them, so no probe at all.
        let mut fixed = cpu.clone();
        fixed.fixed = true;
        assert!(!(0..3 * REPRICE_INTERVAL).any(|_| g.wants(&RULE, 1, &[0.01], &fixed)));
    }

    #[test]
    fn a_dear_first_row_is_paid_for_by_deep_drafts() {
        // One more row costs 0.9 forwards, three only 1.2 (a kernel for four rows).
        let prices = Prices::from_curve(&[1.0, 1.9, 2.0, 2.2], 0.1);
        let mut g = DraftGate::new();
        for _ in 0..20 {
            g.record(&[0.01, 0.01, 0.01], 3);
        }
        // One draft alone would not pay (1.9 tokens for 2.0), three do (3.5 for 2.5).
        assert!(g.wants(&RULE, 1, &[0.01], &prices));
        assert!(g.wants(&RULE, 2, &[0.01, 0.01], &prices) && g.wants(&RULE, 3, &[0.01; 3], &prices));
    }

    #[test]
    fn accepted_drafts_in_a_confident_bucket_keep_drafting_there() {
        let mut g = DraftGate::new();
        let prices = cheap();
        // A probe in the confident bucket (p_stop 0.01) is accepted, then every draft.
        let mut n = 0;
        for _ in 0..40 {
            if g.wants(&RULE, 1, &[0.01], &prices) {
                n += 1;
                let deeper = g.wants(&RULE, 2, &[0.01, 0.01], &prices);
                g.record(&[0.01, 0.01][..1 + usize::from(deeper)], 1 + usize::from(deeper));
            }
        }
        assert!(n >= 30, "drafted {n} times of 40");
        assert!(g.wants(&RULE, 3, &[0.01, 0.01, 0.01], &prices), "deep drafts pay where all are accepted");
        // The unconfident bucket was never tried: still gated off.
        assert!(rates(&prices, 3, &[], g.acceptance(0.9))[1..].iter().all(|&r| r <= 1.0 / prices.step(0)));
    }
}
