//! Speed measurements shared by `hamburger-bench` and the quantization sweep,
//! modelled on llama-bench: a prompt-processing test (pp: N random tokens
//! through an empty context) and a generation test (tg: N tokens one macro
//! step after another), each warmed up once and repeated; and the same tests
//! on libllama for a same-run baseline.

use std::time::Instant;

use ggml::llama::{LlamaContext, LlamaContextParams, LlamaModel};
use rand::{Rng, SeedableRng};

use crate::{Model, Result, Sampler, SamplerParams, Session, SessionParams};

/// One test's samples.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// Prompt tokens (pp) or 0.
    pub n_prompt: usize,
    /// Generated tokens (tg) or 0.
    pub n_gen: usize,
    /// Nanoseconds per repetition.
    pub samples_ns: Vec<u64>,
    /// Mean tokens per macro step (1 for pp and for llama.cpp).
    pub tokens_per_step: f64,
    /// KV-cache bytes per token of context.
    pub kv_bytes_per_token: f64,
}

impl Measurement {
    fn tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }

    /// Tokens per second of each repetition.
    pub fn samples_ts(&self) -> Vec<f64> {
        self.samples_ns.iter().map(|&ns| self.tokens() as f64 * 1e9 / ns as f64).collect()
    }

    /// Mean tokens per second.
    pub fn avg_ts(&self) -> f64 {
        let s = self.samples_ts();
        s.iter().sum::<f64>() / s.len().max(1) as f64
    }

    /// Standard deviation of tokens per second.
    pub fn stddev_ts(&self) -> f64 {
        let s = self.samples_ts();
        if s.len() < 2 {
            return 0.0;
        }
        let m = self.avg_ts();
        (s.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (s.len() - 1) as f64).sqrt()
    }

    /// Mean nanoseconds per repetition.
    pub fn avg_ns(&self) -> u64 {
        self.samples_ns.iter().sum::<u64>() / self.samples_ns.len().max(1) as u64
    }
}

/// Random token ids, as llama-bench feeds (reproducible).
pub fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..n_vocab as u32)).collect()
}

/// Prompt processing: `n` random tokens into an empty context, `reps` times after a warm-up.
///
/// # Errors
/// When a computation fails.
pub fn hamburger_pp(model: &Model, params: &SessionParams, n: usize, reps: usize) -> Result<Measurement> {
    let mut session = Session::new(model, SessionParams { n_ctx: params.n_ctx.max(n + 1), ..params.clone() })?;
    let tokens = random_tokens(n, model.hp.n_vocab, 1);
    let mut samples = Vec::new();
    for rep in 0..=reps {
        session.clear();
        let t = Instant::now();
        session.feed(&tokens, false)?;
        if rep > 0 {
            samples.push(t.elapsed().as_nanos() as u64);
        }
    }
    let (_, per_entry) = session.kv_bytes();
    Ok(Measurement { n_prompt: n, n_gen: 0, samples_ns: samples, tokens_per_step: 1.0, kv_bytes_per_token: per_entry as f64 })
}

/// Generation: `n` tokens after a one-token prompt, greedy, end-of-generation
/// tokens ignored, `reps` times after a warm-up. `params.forced_steps` fixes
/// the tokens per macro step.
///
/// # Errors
/// When a computation fails.
pub fn hamburger_tg(model: &Model, params: &SessionParams, n: usize, reps: usize) -> Result<Measurement> {
    let p = SessionParams { n_ctx: params.n_ctx.max(n + 2), ignore_eog: true, ..params.clone() };
    let mut session = Session::new(model, p)?;
    let first = [model.vocab.bos.unwrap_or(0)];
    let (mut samples, mut per_step, mut kv) = (Vec::new(), 0.0, 0.0);
    for rep in 0..=reps {
        session.clear();
        let gen = session.generate(&first, n, &mut Sampler::new(SamplerParams::greedy()), |_| true)?;
        if rep > 0 {
            samples.push((gen.timings.gen_ms * 1e6) as u64);
        }
        per_step = gen.timings.tokens_per_step();
        let t = &gen.timings;
        kv = (t.kv_entries * t.kv_bytes_per_entry) as f64 / t.context_tokens.max(1) as f64;
    }
    Ok(Measurement { n_prompt: 0, n_gen: n, samples_ns: samples, tokens_per_step: per_step, kv_bytes_per_token: kv })
}

fn llama_params(params: &SessionParams, n_ctx: usize) -> LlamaContextParams {
    LlamaContextParams {
        n_ctx: n_ctx as u32,
        n_batch: params.n_batch as u32,
        n_threads: params.n_threads as i32,
        flash_attn: Some(params.flash_attn),
        kv_type: params.kv_type,
    }
}

/// llama.cpp's prompt processing with the same settings.
///
/// # Errors
/// When libllama fails.
pub fn llama_pp(model: &LlamaModel, params: &SessionParams, n: usize, reps: usize) -> Result<Measurement> {
    let mut ctx = LlamaContext::new(model, llama_params(params, params.n_ctx.max(n + 1)))?;
    let tokens: Vec<i32> = random_tokens(n, model.n_vocab(), 1).into_iter().map(|t| t as i32).collect();
    let mut samples = Vec::new();
    for rep in 0..=reps {
        ctx.clear();
        let t = Instant::now();
        for chunk in tokens.chunks(params.n_batch) {
            ctx.decode(chunk)?;
        }
        ctx.synchronize();
        if rep > 0 {
            samples.push(t.elapsed().as_nanos() as u64);
        }
    }
    Ok(Measurement { n_prompt: n, n_gen: 0, samples_ns: samples, tokens_per_step: 1.0, kv_bytes_per_token: 0.0 })
}

/// llama.cpp's generation with the same settings (one token per forward,
/// llama-bench's method: no sampling, the next input is a random token).
///
/// # Errors
/// When libllama fails.
pub fn llama_tg(model: &LlamaModel, params: &SessionParams, n: usize, reps: usize) -> Result<Measurement> {
    let mut ctx = LlamaContext::new(model, llama_params(params, params.n_ctx.max(n + 2)))?;
    let tokens: Vec<i32> = random_tokens(n, model.n_vocab(), 2).into_iter().map(|t| t as i32).collect();
    let mut samples = Vec::new();
    for rep in 0..=reps {
        ctx.clear();
        let t = Instant::now();
        for &tok in &tokens {
            ctx.decode(&[tok])?;
        }
        ctx.synchronize();
        if rep > 0 {
            samples.push(t.elapsed().as_nanos() as u64);
        }
    }
    Ok(Measurement { n_prompt: 0, n_gen: n, samples_ns: samples, tokens_per_step: 1.0, kv_bytes_per_token: 0.0 })
}
