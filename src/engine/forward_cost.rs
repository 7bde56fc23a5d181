//! What this engine's forwards cost: the prices the self-verified draft
//! gate ([`crate::decode::draft::DraftGate`]) weighs drafts by.
//!
//! A drafted token costs a micro step and one more row in the next base
//! forward, and neither price follows from the weights alone. On two CPU
//! cores a forward of two rows costs 2.3 forwards of one (ggml leaves its
//! one-row kernel for tinyBLAS's tiles), four rows about three, and a micro
//! step 0.4-0.5 of a forward where the weights' share says 0.35
//! (`docs/performance.md`); on a GPU, or with Q4_0's repacked kernels, the
//! curve has another shape. So the engine times the compute of every base
//! forward by its number of rows and of every micro step once its graph is
//! warm (the engine leaves out a graph's first two runs: the first builds
//! and allocates, and on CUDA the second captures a CUDA graph), and prices
//! are the median of the latest times (only their ratios matter). Until a
//! row count has been seen, its price is interpolated between the counts
//! seen, or, before any, taken from the weights' shares.
//!
//! Prices that followed the clock would make the gate's choices, and with
//! them the rows each forward reads (and so ggml's summation order,
//! [`crate::memory::row_class`]), vary from run to run, and a greedy answer
//! with them at near-ties. So before its first self-verified sequence an
//! engine fixes its prices for its lifetime ([`ForwardCosts::fix`]): timed
//! once on a scratch sequence, or read from the price cache of an earlier
//! run with the same model and settings ([`crate::engine::calibration`]).

use std::time::Duration;

use crate::model::hparams::HParams;

/// Row counts timed one by one; larger forwards (prompt chunks) are not the gate's concern.
const MAX_ROWS: usize = 64;
/// The times a price is the median of: the latest this many.
const RECENT: usize = 8;
/// One more row of a base forward, relative to a forward of one row, before any is timed.
const PRIOR_ROW: f64 = 0.03;

/// The latest [`RECENT`] durations of one kind, in seconds, and their median
/// as the price: one slow run (a page fault, the machine's other work) does
/// not move it once three are in, and the gate, which may stop running a
/// kind of forward on a price it dislikes, is not led by a single outlier.
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    times: [f64; RECENT],
    /// Times recorded so far (the ring holds the latest `min(seen, RECENT)`).
    seen: usize,
}

impl Recent {
    fn add(&mut self, seconds: f64) {
        self.times[self.seen % RECENT] = seconds;
        self.seen += 1;
    }

    /// The median of the times held (the mean of the middle two for an even
    /// count), None before the first.
    fn median(&self) -> Option<f64> {
        let n = self.seen.min(RECENT);
        if n == 0 {
            return None;
        }
        let mut t = self.times;
        let t = &mut t[..n];
        t.sort_by(f64::total_cmp);
        Some(if n % 2 == 1 { t[n / 2] } else { (t[n / 2 - 1] + t[n / 2]) / 2.0 })
    }
}

/// The engine's measured forward and micro-step times.
#[derive(Debug, Clone)]
pub struct ForwardCosts {
    /// Seconds of a base forward's compute by rows (index: rows - 1).
    forward: [Recent; MAX_ROWS],
    /// Seconds of a micro step per sequence in it.
    micro: Recent,
    /// A micro step's share of a one-row forward before one is timed.
    prior_micro: f64,
    /// Whether the prices are fixed: times recorded since are not kept.
    fixed: bool,
}

impl ForwardCosts {
    /// No times yet; `hp` gives the prices used until there are.
    pub fn new(hp: &HParams) -> ForwardCosts {
        ForwardCosts {
            forward: [Recent::default(); MAX_ROWS],
            micro: Recent::default(),
            prior_micro: weights_share(hp),
            fixed: false,
        }
    }

    /// Fixes the prices as they stand: later times no longer move them.
    pub fn fix(&mut self) {
        self.fixed = true;
    }

    /// Whether the prices are fixed ([`ForwardCosts::fix`]).
    pub fn is_fixed(&self) -> bool {
        self.fixed
    }

    /// The prices as text for the price cache: a line `forward ROWS SECONDS`
    /// per row count timed and `micro SECONDS` once a micro step is.
    pub fn to_text(&self) -> String {
        let mut text = String::new();
        for r in 1..=MAX_ROWS {
            if let Some(t) = self.forward[r - 1].median() {
                text += &format!("forward {r} {t:e}\n");
            }
        }
        if let Some(t) = self.micro.median() {
            text += &format!("micro {t:e}\n");
        }
        text
    }

    /// Fixed prices read from [`ForwardCosts::to_text`]'s text, None when it
    /// is not such text (a damaged or foreign file): no line of another
    /// form, every time finite and positive, every row count within range.
    pub fn from_text(hp: &HParams, text: &str) -> Option<ForwardCosts> {
        let mut costs = ForwardCosts::new(hp);
        let seconds = |s: &str| s.parse::<f64>().ok().filter(|t| t.is_finite() && *t > 0.0);
        for line in text.lines() {
            match line.split(' ').collect::<Vec<_>>()[..] {
                ["forward", rows, t] => {
                    let rows = rows.parse::<usize>().ok().filter(|r| (1..=MAX_ROWS).contains(r))?;
                    costs.forward[rows - 1].add(seconds(t)?);
                }
                ["micro", t] => costs.micro.add(seconds(t)?),
                _ => return None,
            }
        }
        if costs.forward.iter().all(|r| r.seen == 0) {
            return None;
        }
        costs.fix();
        Some(costs)
    }

    /// Records a base forward of `rows` rows whose compute took `took`.
    pub fn record_forward(&mut self, rows: usize, took: Duration) {
        if !self.fixed && (1..=MAX_ROWS).contains(&rows) {
            self.forward[rows - 1].add(took.as_secs_f64());
        }
    }

    /// Records a micro step of `n_seq` sequences whose compute took `took`.
    pub fn record_micro(&mut self, n_seq: usize, took: Duration) {
        if !self.fixed && n_seq > 0 {
            self.micro.add(took.as_secs_f64() / n_seq as f64);
        }
    }

    /// The prices as they stand, for a sequence that shares its forwards
    /// with `others` rows of other sequences, in seconds (before anything is
    /// timed, in forwards of one row from the weights' shares: only their
    /// ratios matter to the gate).
    pub fn prices(&self, others: usize) -> Prices {
        // More rows never cost less: each count at least the dearest of fewer.
        let mut dearest = 0.0f64;
        let known: Vec<(usize, f64)> = (1..=MAX_ROWS)
            .filter_map(|r| self.forward[r - 1].median().map(|t| (r, t)))
            .map(|(r, t)| {
                dearest = dearest.max(t);
                (r, dearest)
            })
            .collect();
        if known.is_empty() {
            return Prices { known: vec![(1, 1.0)], others, micro: self.prior_micro as f32, fixed: self.fixed };
        }
        let mut p = Prices { known, others, micro: 0.0, fixed: self.fixed };
        p.micro = self.micro.median().unwrap_or_else(|| self.prior_micro * p.forward(1)) as f32;
        p
    }
}

/// The times as they stand, for a log line: a base forward's milliseconds by
/// the row counts timed, and a micro step's per sequence ("-" until timed).
impl std::fmt::Display for ForwardCosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |a: &Recent| a.median().map_or("-".to_string(), |s| format!("{:.3}", s * 1e3));
        let rows: Vec<String> = (1..=MAX_ROWS)
            .filter(|&r| self.forward[r - 1].seen > 0)
            .map(|r| format!("{r}: {}", ms(&self.forward[r - 1])))
            .collect();
        let fixed = if self.fixed { " (fixed)" } else { "" };
        write!(
            f,
            "base forward ms by rows [{}], micro step ms per sequence {}{fixed}",
            rows.join(", "),
            ms(&self.micro)
        )
    }
}

/// A micro step's share of a base forward by the weights each reads (one
/// row on a CPU reads every weight once): the micro decoder's layers and the
/// lm_head against the base's layers and the lm_head.
fn weights_share(hp: &HParams) -> f64 {
    let (d, kv, ff) = (hp.n_embd as f64, hp.n_embd_kv() as f64, hp.n_ff as f64);
    let layer = 2.0 * d * d + 2.0 * d * kv + 3.0 * d * ff;
    let head = hp.n_vocab as f64 * d;
    (hp.n_micro_layer as f64 * layer + head) / (hp.n_layer as f64 * layer + head)
}

/// What drafting costs a sequence now ([`ForwardCosts::prices`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Prices {
    /// Row counts timed, ascending, with their cost (never empty).
    known: Vec<(usize, f64)>,
    /// Rows of other sequences in the same forwards.
    others: usize,
    /// A micro step's cost per sequence.
    micro: f32,
    /// Whether they are fixed ([`ForwardCosts::fix`]): no forward reprices them.
    pub fixed: bool,
}

impl Prices {
    /// Prices of forwards that cost `forward[r - 1]` at `r` rows (a
    /// measured curve, or a test's) and micro steps `micro`, in forwards of
    /// one row, for a sequence alone (the gate's tests).
    #[cfg(test)]
    pub(crate) fn from_curve(forward: &[f64], micro: f32) -> Prices {
        let known = forward.iter().enumerate().map(|(i, &c)| (i + 1, c / forward[0])).collect();
        Prices { known, others: 0, micro, fixed: false }
    }

    /// The cost of a forward of `rows` rows: as timed; between two counts
    /// timed, on the line between them; below the fewest timed, scaled down
    /// from it by the prior's row cost; past the most, on from it at the
    /// slope of the last two (with one alone, the prior's row cost). A busy
    /// server may never time a forward of one row.
    fn forward(&self, rows: usize) -> f64 {
        let prior = |r: usize| 1.0 + PRIOR_ROW * (r as f64 - 1.0);
        if rows == 0 {
            return 0.0;
        }
        let (first, last) = (self.known[0], self.known[self.known.len() - 1]);
        if rows < first.0 {
            return first.1 * prior(rows) / prior(first.0);
        }
        let after = self.known.iter().position(|&(r, _)| r >= rows);
        match after {
            Some(i) if self.known[i].0 == rows => self.known[i].1,
            Some(i) => {
                let ((r0, c0), (r1, c1)) = (self.known[i - 1], self.known[i]);
                c0 + (c1 - c0) * (rows - r0) as f64 / (r1 - r0) as f64
            }
            None => {
                let n = self.known.len();
                let slope = if n >= 2 {
                    let (r0, c0) = self.known[n - 2];
                    ((last.1 - c0) / (last.0 - r0) as f64).max(0.0)
                } else {
                    last.1 * PRIOR_ROW / prior(last.0)
                };
                last.1 + slope * (rows - last.0) as f64
            }
        }
    }

    /// What `drafts` drafted tokens and the verified one cost the sequence:
    /// its share of a forward of one row per sequence, what the drafts' rows
    /// add to that forward, and the micro steps that drafted them.
    pub fn step(&self, drafts: usize) -> f32 {
        let plain = self.others + 1;
        let share = self.forward(plain) / plain as f64;
        (share + self.forward(plain + drafts) - self.forward(plain)) as f32 + drafts as f32 * self.micro
    }

    /// These prices for drafts that no micro step drafted (the context's,
    /// `ngram-simple`): their rows in the forward alone.
    pub fn rows_only(&self) -> Prices {
        Prices { micro: 0.0, ..self.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untimed_row_counts_are_interpolated_and_extrapolated() {
        let p = Prices { known: vec![(1, 1.0), (2, 2.3), (4, 3.1)], others: 0, micro: 0.5, fixed: false };
        assert_eq!(p.forward(2), 2.3);
        assert!((p.forward(3) - 2.7).abs() < 1e-9, "between 2 and 4");
        assert!((p.forward(5) - 3.5).abs() < 1e-9, "past 4 at the slope from 2 to 4");
        assert!((p.step(1) - 2.8).abs() < 1e-6, "two rows (2.3) and one micro step (0.5)");
        let alone = Prices { known: vec![(1, 1.0)], others: 0, micro: 0.3, fixed: false };
        assert!((alone.forward(4) - 1.09).abs() < 1e-9, "the prior's row cost");
        let shared = Prices { others: 1, ..p };
        assert!((shared.step(0) - 1.15).abs() < 1e-6, "half of a forward of two rows");
        assert!((shared.step(1) - 2.05).abs() < 1e-6, "and the third row and a micro step");
    }

    #[test]
    fn times_become_prices() {
        let hp = crate::model::hparams::small(4, 2, 4);
        let mut c = ForwardCosts::new(&hp);
        assert_eq!(c.prices(0).known, [(1, 1.0)], "nothing timed yet: the prior, in one-row forwards");
        // A busy server: forwards of 8 rows and more, never one.
        c.record_forward(8, Duration::from_millis(40));
        c.record_forward(512, Duration::from_secs(1)); // a prompt chunk: not timed
        let p = c.prices(7);
        assert_eq!(p.known, [(8, 0.04)]);
        assert!((p.forward(1) - 0.04 / 1.21).abs() < 1e-9, "scaled down by the prior's row cost");
        assert!((p.micro - (weights_share(&hp) * 0.04 / 1.21) as f32).abs() < 1e-6, "the prior micro step");
        c.record_forward(9, Duration::from_millis(50));
        c.record_micro(4, Duration::from_millis(8));
        let p = c.prices(7);
        assert!((p.step(0) - 0.005).abs() < 1e-6, "an eighth of the forward of 8 rows");
        assert!((p.step(1) - 0.017).abs() < 1e-6, "and the ninth row and a micro step");
        assert!((p.forward(10) - 0.06).abs() < 1e-9, "on at the slope from 8 to 9");
        c.record_forward(6, Duration::from_millis(45)); // a noisy time: dearer than 8 rows
        assert_eq!(c.prices(0).forward(8), 0.045, "more rows never cost less");
        assert_eq!(
            c.to_string(),
            "base forward ms by rows [6: 45.000, 8: 40.000, 9: 50.000], micro step ms per sequence 2.000"
        );
    }

    #[test]
    fn a_price_is_the_median_of_the_latest_times() {
        let hp = crate::model::hparams::small(4, 2, 4);
        let mut c = ForwardCosts::new(&hp);
        let ms = Duration::from_millis;
        c.record_forward(1, ms(10));
        c.record_forward(2, ms(200)); // one slow forward (a fault, the machine busy)
        assert_eq!(c.prices(0).forward(2), 0.2, "alone, it is the price");
        c.record_forward(2, ms(12));
        c.record_forward(2, ms(11));
        assert_eq!(c.prices(0).forward(2), 0.012, "three in, the outlier no longer sets it");
        for _ in 0..RECENT {
            c.record_forward(2, ms(30)); // the machine got slower: the latest times decide
        }
        assert_eq!(c.prices(0).forward(2), 0.03);
        c.record_micro(1, ms(4));
        c.record_micro(1, ms(6));
        assert_eq!(c.prices(0).micro, 0.005, "an even count: the middle two's mean");
    }

    #[test]
    fn fixed_prices_ignore_later_times_and_survive_their_text() {
        let hp = crate::model::hparams::small(4, 2, 4);
        let mut c = ForwardCosts::new(&hp);
        let ms = Duration::from_millis;
        c.record_forward(1, ms(10));
        c.record_forward(3, ms(25));
        c.record_micro(2, ms(8));
        c.fix();
        c.record_forward(1, ms(99));
        c.record_micro(1, ms(99));
        assert_eq!(c.prices(0), ForwardCosts::from_text(&hp, &c.to_text()).unwrap().prices(0));
        assert_eq!(
            c.to_string(),
            "base forward ms by rows [1: 10.000, 3: 25.000], micro step ms per sequence 4.000 (fixed)"
        );
        for bad in [
            "",
            "forward 0 1e-3\n",
            "forward 65 1e-3\n",
            "forward 1 -1\n",
            "forward 1 NaN\n",
            "micro 1e-3\n",
            "forward 1 1e-3 x\n",
        ] {
            assert!(ForwardCosts::from_text(&hp, bad).is_none(), "{bad:?}");
        }
    }
}
