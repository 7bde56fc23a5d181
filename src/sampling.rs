//! Token sampling, applied to every micro token: repeat penalty, then greedy
//! or top-k / top-p / min-p / temperature, llama.cpp's order.

use rand::{Rng, SeedableRng};

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
    /// How many recent tokens the penalty looks at.
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
    /// `min_p` outside 0..=1, `repeat_penalty` not above 0, or any of them
    /// not a finite number.
    pub fn validate(&self) -> Result<(), ParamError> {
        let checks = [
            (Param::Temp, self.temp, self.temp >= 0.0, "a finite number >= 0"),
            (Param::TopP, self.top_p, (0.0..=1.0).contains(&self.top_p), "a number from 0 to 1"),
            (Param::MinP, self.min_p, (0.0..=1.0).contains(&self.min_p), "a number from 0 to 1"),
            (Param::RepeatPenalty, self.repeat_penalty, self.repeat_penalty > 0.0, "a finite number above 0"),
        ];
        match checks.into_iter().find(|&(_, x, ok, _)| !(x.is_finite() && ok)) {
            Some((param, x, _, want)) => Err(ParamError::new(&[param], format!("{param} {x}: expected {want}"))),
            None => Ok(()),
        }
    }
}

/// A seeded sampler.
pub struct Sampler {
    p: SamplerParams,
    rng: rand::rngs::StdRng,
}

impl Sampler {
    /// A sampler with settings `p`.
    pub fn new(p: SamplerParams) -> Sampler {
        Sampler { p, rng: rand::rngs::StdRng::seed_from_u64(p.seed) }
    }

    /// The settings.
    pub fn params(&self) -> &SamplerParams {
        &self.p
    }

    /// Whether sampling is a plain argmax (then the graph's argmax suffices and
    /// the logits need not be read).
    pub fn is_greedy(&self) -> bool {
        self.p.temp <= 0.0 && self.p.repeat_penalty == 1.0
    }

    /// Picks the next token from `logits`, given the tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let mut logits = logits.to_vec();
        if self.p.repeat_penalty != 1.0 {
            let start = history.len().saturating_sub(self.p.repeat_last_n);
            let mut seen = std::collections::HashSet::new();
            for &t in &history[start..] {
                if let Some(l) = logits.get_mut(t as usize).filter(|_| seen.insert(t)) {
                    *l = if *l > 0.0 { *l / self.p.repeat_penalty } else { *l * self.p.repeat_penalty };
                }
            }
        }
        if self.p.temp <= 0.0 {
            return argmax(&logits);
        }
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        if self.p.top_k > 0 {
            cand.truncate(self.p.top_k);
        }
        let probs = softmax(&cand, 1.0);
        if self.p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs.iter().position(|&p| {
                acc += p;
                acc >= self.p.top_p
            });
            cand.truncate(keep.map_or(cand.len(), |i| i + 1));
        }
        if self.p.min_p > 0.0 {
            let max = probs[0];
            let keep = probs.iter().take(cand.len()).take_while(|&&p| p >= self.p.min_p * max).count().max(1);
            cand.truncate(keep);
        }
        let probs = softmax(&cand, self.p.temp);
        let mut r = self.rng.random::<f32>();
        for (c, p) in cand.iter().zip(&probs) {
            if r < *p {
                return c.0;
            }
            r -= p;
        }
        cand.last().map_or(0, |c| c.0)
    }
}

fn softmax(cand: &[(u32, f32)], temp: f32) -> Vec<f32> {
    let max = cand.first().map_or(0.0, |c| c.1);
    let e: Vec<f32> = cand.iter().map(|c| ((c.1 - max) / temp).exp()).collect();
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
