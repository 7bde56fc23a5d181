//! Choosing tokens from logits: rules that see a distribution and the tokens
//! so far, never an engine or a cache, so that each is tested on its own
//! (llama.cpp's `llama-sampling`, grammar sampler included; candle's
//! `generation`). The engine's scores and the decode loop both use them.
//!
//! * [`speculative`]: the acceptance rule of speculative decoding, which
//!   every drafter shares;
//! * [`constraint`]: structured output (JSON schema, regex, grammar): which
//!   tokens a sequence may take next, over the tokenizer's token bytes;
//! * here, token sampling, applied to every micro token: logit biases, then
//!   the repeat, frequency and presence penalties over the last
//!   `repeat_last_n` tokens, then greedy or top-k / top-p / min-p /
//!   temperature, llama.cpp's order and arithmetic, drawn with llama.cpp's
//!   random numbers ([`llama_rng`]). Also the log-probabilities a client
//!   may ask for beside each token.

pub mod constraint;
pub mod gbnf;
pub mod llama_rng;
pub mod speculative;

use std::borrow::Cow;

use llama_rng::LlamaRng;

use crate::error::{Param, ParamError};

/// Sampling settings (llama-cli's flags and defaults).
#[derive(Debug, Clone, Copy)]
pub struct SamplerParams {
    /// Temperature; 0 or less is greedy.
    pub temp: f32,
    /// Keep the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (0: the
    /// most likely only; 1: all), in 0..=1 as llama.cpp takes it.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely (0: none).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recent tokens (1: off).
    pub repeat_penalty: f32,
    /// Subtract this times a token's count among the recent tokens from its
    /// logit (OpenAI's `frequency_penalty`; 0: off).
    pub frequency_penalty: f32,
    /// Subtract this from the logit of every token among the recent tokens
    /// (OpenAI's `presence_penalty`; 0: off).
    pub presence_penalty: f32,
    /// How many recent tokens (prompt included) the penalties look at (0: none).
    pub repeat_last_n: usize,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerParams {
    /// Greedy decoding, the tests' default.
    pub fn greedy() -> Self {
        SamplerParams { temp: 0.0, ..Default::default() }
    }

    /// Checks every setting's range, the one rule of every front-end.
    ///
    /// # Errors
    /// Naming the first parameter out of range: `temp` negative, `top_p` or
    /// `min_p` outside 0..=1, `repeat_penalty` not above 0, the frequency or
    /// presence penalty outside -2..=2 (OpenAI's range), or any of them not a
    /// finite number.
    pub fn validate(&self) -> Result<(), ParamError> {
        let checks = [
            (Param::Temp, self.temp, self.temp >= 0.0, "a finite number >= 0"),
            (Param::TopP, self.top_p, (0.0..=1.0).contains(&self.top_p), "a number from 0 to 1"),
            (Param::MinP, self.min_p, (0.0..=1.0).contains(&self.min_p), "a number from 0 to 1"),
            (Param::RepeatPenalty, self.repeat_penalty, self.repeat_penalty > 0.0, "a finite number above 0"),
            (Param::FrequencyPenalty, self.frequency_penalty, self.frequency_penalty.abs() <= 2.0, PENALTY_RANGE),
            (Param::PresencePenalty, self.presence_penalty, self.presence_penalty.abs() <= 2.0, PENALTY_RANGE),
        ];
        match checks.into_iter().find(|&(_, x, ok, _)| !(x.is_finite() && ok)) {
            Some((param, x, _, want)) => Err(ParamError::new(&[param], format!("{param} {x}: expected {want}"))),
            None => Ok(()),
        }
    }
}

const PENALTY_RANGE: &str = "a number from -2 to 2";

/// A seeded sampler.
pub struct Sampler {
    p: SamplerParams,
    /// Added to the logits of these tokens before anything else (OpenAI's `logit_bias`).
    logit_bias: Vec<(u32, f32)>,
    rng: LlamaRng,
}

impl Sampler {
    /// A sampler with settings `p`.
    pub fn new(p: SamplerParams) -> Sampler {
        Sampler { p, logit_bias: Vec::new(), rng: LlamaRng::new(p.seed) }
    }

    /// Adds `bias` to the logit of each token listed (`-inf` bans a token).
    /// A token beyond the vocabulary changes nothing.
    pub fn with_logit_bias(self, logit_bias: Vec<(u32, f32)>) -> Sampler {
        Sampler { logit_bias, ..self }
    }

    /// The settings.
    pub fn params(&self) -> &SamplerParams {
        &self.p
    }

    /// Whether sampling is a plain argmax (then the graph's argmax suffices and
    /// the logits need not be read).
    pub fn is_greedy(&self) -> bool {
        self.p.temp <= 0.0 && !self.penalizes() && self.logit_bias.is_empty()
    }

    /// Whether any penalty is on.
    fn penalizes(&self) -> bool {
        self.p.repeat_penalty != 1.0 || self.p.frequency_penalty != 0.0 || self.p.presence_penalty != 0.0
    }

    /// Picks the next token from `logits`, given the tokens so far (the
    /// prompt, the tokens generated, and those of the current macro step).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let dist = self.distribution(logits, history);
        self.draw(&dist)
    }

    /// The distribution [`Sampler::sample`] draws from, given the tokens so
    /// far: logit biases, penalties, then (greedy) the most likely token
    /// alone, or the tokens top-k, top-p and min-p keep with their
    /// probabilities at the temperature; most likely first. Self-verified
    /// decoding compares the base's and the micro decoder's distributions
    /// in this form.
    pub fn distribution(&self, logits: &[f32], history: &[u32]) -> Vec<(u32, f32)> {
        let logits = self.adjusted(logits, history);
        if self.p.temp <= 0.0 {
            return vec![(argmax(&logits), 1.0)];
        }
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        if self.p.top_k > 0 {
            cand.truncate(self.p.top_k);
        }
        if self.p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = softmax(&cand).iter().position(|&p| {
                acc += p;
                acc >= self.p.top_p
            });
            cand.truncate(keep.map_or(cand.len(), |i| i + 1));
        }
        if self.p.min_p > 0.0 {
            // On logits, as llama.cpp compares: p >= min_p * p_max.
            let min_logit = cand[0].1 + self.p.min_p.ln();
            let keep = 1 + cand[1..].iter().take_while(|c| c.1 >= min_logit).count();
            cand.truncate(keep);
        }
        // The temperature divides the logits, then llama.cpp's `dist`
        // normalises exp(l - max) with a sum in f64.
        for c in &mut cand {
            c.1 /= self.p.temp;
        }
        let max = cand[0].1;
        let e: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
        let sum: f64 = e.iter().map(|&x| f64::from(x)).sum();
        cand.iter().zip(e).map(|(c, x)| (c.0, (f64::from(x) / sum) as f32)).collect()
    }

    /// `logits` with the logit biases and the penalties given `history`
    /// applied: what [`Sampler::distribution`] truncates and scales
    /// (`logits` themselves, not copied, where there are none).
    pub fn adjusted<'l>(&self, logits: &'l [f32], history: &[u32]) -> Cow<'l, [f32]> {
        if self.logit_bias.is_empty() && !self.penalizes() {
            return Cow::Borrowed(logits);
        }
        let mut logits = logits.to_vec();
        for &(t, bias) in &self.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += bias;
            }
        }
        if self.penalizes() {
            self.penalize(&mut logits, history);
        }
        Cow::Owned(logits)
    }

    /// Draws a token from `dist` (a [`Sampler::distribution`]): the first
    /// when greedy (no random number drawn), else by one uniform draw of
    /// llama.cpp's (one per token, even from a single candidate), so that a
    /// seed draws what it draws in llama-server.
    pub fn draw(&mut self, dist: &[(u32, f32)]) -> u32 {
        if self.p.temp <= 0.0 {
            return dist.first().map_or(0, |c| c.0);
        }
        let r = self.rng.uniform();
        if self.p.top_k == 0 && self.p.top_p >= 1.0 {
            // No truncation sorted llama.cpp's candidates: it draws them in
            // token order, which laying the probabilities out by token gives
            // without a second sort of the vocabulary.
            let mut dense = vec![0f32; dist.iter().map(|c| c.0 as usize + 1).max().unwrap_or(0)];
            for &(t, p) in dist {
                dense[t as usize] = p;
            }
            let by_token: Vec<(u32, f32)> =
                dense.into_iter().enumerate().filter(|c| c.1 > 0.0).map(|(t, p)| (t as u32, p)).collect();
            return crate::sampling::speculative::draw(&by_token, r);
        }
        crate::sampling::speculative::draw(dist, r)
    }

    /// Speculative sampling's check of a drafted token `draft`, drawn from
    /// the draft distribution `q`, against the target distribution `p` (both
    /// [`Sampler::distribution`]s), with this sampler's random numbers:
    /// [`crate::sampling::speculative::check_draft`]. `None`: accepted; `Some(t)`:
    /// rejected, `t` takes its place.
    pub fn verify_draft(&mut self, p: &[(u32, f32)], q: &[(u32, f32)], draft: u32) -> Option<u32> {
        crate::sampling::speculative::check_draft(p, q, draft, &mut self.rng)
    }
}

impl Sampler {
    /// llama.cpp's penalties over the last `repeat_last_n` tokens of
    /// `history`: each token seen there `c` times has its logit divided (if
    /// positive, else multiplied) by the repeat penalty, then lowered by
    /// `c * frequency_penalty + presence_penalty`.
    fn penalize(&self, logits: &mut [f32], history: &[u32]) {
        let start = history.len().saturating_sub(self.p.repeat_last_n);
        let mut counts = std::collections::HashMap::<u32, usize>::new();
        for &t in &history[start..] {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / self.p.repeat_penalty } else { *l * self.p.repeat_penalty };
                *l -= c as f32 * self.p.frequency_penalty + self.p.presence_penalty;
            }
        }
    }
}

/// The most alternatives a client may ask for beside each token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A token's log-probability under the model's distribution (the raw
/// logits, before biases, penalties, temperature and truncation, as the
/// OpenAI API and vLLM report them), with the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token chosen.
    pub token: u32,
    /// Its natural log-probability.
    pub logprob: f32,
    /// The `top` most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// The log-probability of `token` under `logits`, with the `top` most
    /// likely alternatives (at most [`MAX_TOP_LOGPROBS`]).
    pub fn new(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_sum = max + logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32;
        let logprob = |t: u32| logits.get(t as usize).map_or(f32::NEG_INFINITY, |&l| l - log_sum);
        let mut best: Vec<u32> = (0..logits.len() as u32).collect();
        let top = top.min(MAX_TOP_LOGPROBS).min(best.len());
        if top > 0 {
            best.select_nth_unstable_by(top - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        }
        best.truncate(top);
        best.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        TokenLogprob { token, logprob: logprob(token), top: best.into_iter().map(|t| (t, logprob(t))).collect() }
    }

    /// The log-probability of `token` under `dist`, the distribution a
    /// sampler drew it from ([`Sampler::distribution`]: after biases,
    /// penalties, truncation and temperature, most likely first), with its
    /// first `top` tokens (at most [`MAX_TOP_LOGPROBS`]; fewer when fewer
    /// are left): llama-server's `post_sampling_probs`.
    pub fn of_distribution(dist: &[(u32, f32)], token: u32, top: usize) -> TokenLogprob {
        let p = dist.iter().find(|c| c.0 == token).map_or(0.0, |c| c.1);
        let top = dist.iter().take(top.min(MAX_TOP_LOGPROBS)).map(|&(t, p)| (t, p.ln())).collect();
        TokenLogprob { token, logprob: p.ln(), top }
    }
}

/// llama.cpp's softmax of sorted candidates (`llama_sampler_softmax_impl`):
/// exp(l - max), summed and divided in f32.
fn softmax(cand: &[(u32, f32)]) -> Vec<f32> {
    let max = cand.first().map_or(0.0, |c| c.1);
    let e: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
    let s: f32 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// Index of the largest value (the first on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_filters() {
        let logits = [0.0, 3.0, 1.0, 2.9];
        assert_eq!(Sampler::new(SamplerParams::greedy()).sample(&logits, &[]), 1);
        // top_k 1 is greedy whatever the temperature.
        let mut s = Sampler::new(SamplerParams { temp: 5.0, top_k: 1, ..Default::default() });
        assert!((0..20).all(|_| s.sample(&logits, &[]) == 1));
        // The repeat penalty moves the choice off a repeated token.
        let p = SamplerParams { repeat_penalty: 2.0, ..SamplerParams::greedy() };
        assert_eq!(Sampler::new(p).sample(&logits, &[1]), 3);
        // Same seed, same samples.
        let p = SamplerParams { seed: 7, top_k: 0, top_p: 1.0, min_p: 0.0, temp: 1.0, ..Default::default() };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..10).map(|_| s.sample(&logits, &[])).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..10).map(|_| s.sample(&logits, &[])).collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn penalties_and_biases_follow_llama_cpp() {
        let logits = [0.0, 3.0, 1.0, 2.9];
        let greedy = SamplerParams::greedy();
        // Token 1 seen twice: 3 - 2 * 0.1 = 2.8 < 2.9.
        let p = SamplerParams { frequency_penalty: 0.1, ..greedy };
        assert_eq!(Sampler::new(p).sample(&logits, &[1, 1]), 3);
        assert_eq!(Sampler::new(p).sample(&logits, &[1]), 1, "once: 2.9 against 2.9, the first wins");
        // Presence counts once whatever the count.
        let p = SamplerParams { presence_penalty: 0.2, ..greedy };
        assert_eq!(Sampler::new(p).sample(&logits, &[1, 1, 1]), 3);
        // Only the last repeat_last_n tokens count.
        let p = SamplerParams { presence_penalty: 2.0, repeat_last_n: 1, ..greedy };
        assert_eq!(Sampler::new(p).sample(&logits, &[1, 0]), 1);
        assert!(!Sampler::new(p).is_greedy());
        // A bias moves the choice; -inf bans a token; an id past the vocabulary is harmless.
        let s = || Sampler::new(greedy);
        assert_eq!(s().with_logit_bias(vec![(2, 5.0), (99, 1.0)]).sample(&logits, &[]), 2);
        assert_eq!(s().with_logit_bias(vec![(1, f32::NEG_INFINITY)]).sample(&logits, &[]), 3);
        assert!(!s().with_logit_bias(vec![(1, 1.0)]).is_greedy() && s().is_greedy());
    }

    #[test]
    fn the_distribution_is_what_sample_draws_from() {
        let logits = [0.0, 3.0, 1.0, 2.9];
        let p = SamplerParams { seed: 3, top_k: 3, top_p: 1.0, min_p: 0.0, temp: 0.7, ..Default::default() };
        let d = Sampler::new(p).distribution(&logits, &[]);
        assert_eq!(d.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3, 2], "top-k 3, most likely first");
        assert!((d.iter().map(|c| c.1).sum::<f32>() - 1.0).abs() < 1e-6);
        let (mut a, mut b) = (Sampler::new(p), Sampler::new(p));
        assert!((0..50).all(|_| a.sample(&logits, &[]) == b.draw(&d)), "the same draws from the same seed");
        assert_eq!(Sampler::new(SamplerParams::greedy()).distribution(&logits, &[]), [(1, 1.0)]);
        // Post-sampling log-probabilities: the kept tokens only, most likely first.
        let lp = TokenLogprob::of_distribution(&d, 3, 10);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2]);
        assert!((lp.logprob.exp() - d[1].1).abs() < 1e-6 && lp.top.iter().all(|t| t.1 <= 0.0));
    }

    #[test]
    fn speculative_sampling_keeps_the_target_distribution() {
        // Target p and draft q over 3 tokens; the result of drafting from q
        // and verifying must be distributed as p.
        let p = [(0u32, 0.5f32), (1, 0.3), (2, 0.2)];
        let q = [(1u32, 0.6f32), (0, 0.2), (2, 0.2)];
        let params = SamplerParams { seed: 11, temp: 1.0, ..Default::default() };
        let mut s = Sampler::new(params);
        let n = 200_000;
        let mut counts = [0usize; 3];
        for _ in 0..n {
            let d = s.draw(&q);
            let t = s.verify_draft(&p, &q, d).unwrap_or(d);
            counts[t as usize] += 1;
        }
        for (t, want) in [(0, 0.5), (1, 0.3), (2, 0.2)] {
            let got = counts[t] as f64 / n as f64;
            assert!((got - want).abs() < 0.005, "token {t}: {got} vs {want}");
        }
        // Greedy: the tokens agree or the target's own token replaces the draft.
        let mut g = Sampler::new(SamplerParams::greedy());
        assert_eq!(g.verify_draft(&[(4, 1.0)], &[(4, 1.0)], 4), None);
        assert_eq!(g.verify_draft(&[(4, 1.0)], &[(5, 1.0)], 5), Some(4));
    }

    #[test]
    fn log_probabilities_of_the_raw_distribution() {
        let logits = [0.0, 3.0, 1.0, 2.9];
        let lp = TokenLogprob::new(&logits, 2, 2);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((lp.logprob - (1.0f32.exp() / z).ln()).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3]);
        assert!((lp.top[0].1 - (3.0f32.exp() / z).ln()).abs() < 1e-6);
        assert!(TokenLogprob::new(&logits, 0, 0).top.is_empty());
        assert_eq!(TokenLogprob::new(&logits, 0, 99).top.len(), 4, "capped at the vocabulary");
    }

    #[test]
    fn validation_names_the_parameter_and_takes_top_p_0_to_1() {
        let d = SamplerParams::default();
        for ok in [d, SamplerParams { top_p: 0.0, min_p: 1.0, temp: 0.0, ..d }, SamplerParams { top_p: 1.0, ..d }] {
            assert_eq!(ok.validate(), Ok(()), "{ok:?}");
        }
        for (bad, param, text) in [
            (SamplerParams { temp: -1.0, ..d }, Param::Temp, "temp -1: expected a finite number >= 0"),
            (SamplerParams { temp: f32::INFINITY, ..d }, Param::Temp, "temp inf: expected a finite number >= 0"),
            (SamplerParams { top_p: 1.5, ..d }, Param::TopP, "top_p 1.5: expected a number from 0 to 1"),
            (SamplerParams { min_p: -0.1, ..d }, Param::MinP, "min_p -0.1: expected a number from 0 to 1"),
            (
                SamplerParams { repeat_penalty: 0.0, ..d },
                Param::RepeatPenalty,
                "repeat_penalty 0: expected a finite number above 0",
            ),
            (
                SamplerParams { frequency_penalty: 2.5, ..d },
                Param::FrequencyPenalty,
                "frequency_penalty 2.5: expected a number from -2 to 2",
            ),
            (
                SamplerParams { presence_penalty: f32::NAN, ..d },
                Param::PresencePenalty,
                "presence_penalty NaN: expected a number from -2 to 2",
            ),
        ] {
            let e = bad.validate().unwrap_err();
            assert_eq!((e.to_string(), e.params), (text.to_string(), vec![param]));
        }
        // top_p 0 keeps the most likely token alone, as llama.cpp does.
        let p = SamplerParams { temp: 5.0, top_k: 0, top_p: 0.0, min_p: 0.0, ..d };
        let mut s = Sampler::new(p);
        assert!((0..20).all(|_| s.sample(&[0.0, 3.0, 1.0, 2.9], &[]) == 1));
    }
}
