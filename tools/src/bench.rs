//! Speed measurements shared by `hamburger-bench` and the quantization sweep,
//! modelled on llama-bench: a prompt-processing test (pp: N random tokens
//! through an empty context) and a generation test (tg: N tokens one macro
//! step after another), and the same tests on libllama for a same-run
//! baseline. Tests are prepared as runners and repeated in interleaved
//! rounds after one warm-up each. Each engine is measured alone: a runner
//! puts its CPU workers to sleep when its clock stops, so they do not spin
//! (as ggml's workers do after every graph) beside the next runner's test.

use std::time::Instant;

use ggml::llama::{LlamaContext, LlamaContextParams, LlamaModel};
use rand::{Rng, SeedableRng};

use hamburger::generate::{self, SeqGen};
use hamburger::{Batch, Engine, EngineParams, Model, Result, Sampler, SamplerParams, Session, SessionParams, Wants};

/// Memory the comparing tools take, touch and hold before they load any
/// model, so that neither engine's weights land in it.
///
/// Measured on the 2-core VMs these benchmarks run on: of two models loaded
/// one after the other in a process, the first read its one-row forward
/// 5-10% slower than the second, libllama against libllama as much as ours
/// against libllama, whichever ran first in a round; loading a model and
/// dropping it first did not help, holding this much touched memory did
/// (libllama against itself 1.00-1.01x). Without it a same-run ratio measures
/// the load order. `docs/performance.md` has the numbers.
#[must_use = "the memory helps only while it is held"]
pub fn hold_first_pages() -> Box<[u8]> {
    // black_box: an allocation nothing reads may otherwise be optimised away.
    std::hint::black_box(vec![1u8; FIRST_PAGES].into_boxed_slice())
}

/// How much [`hold_first_pages`] holds: 256 MiB was enough in every process measured.
const FIRST_PAGES: usize = 256 << 20;

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
    /// An empty measurement of an `n`-token prompt test.
    pub fn prompt(n: usize) -> Measurement {
        Measurement { n_prompt: n, n_gen: 0, samples_ns: Vec::new(), tokens_per_step: 1.0, kv_bytes_per_token: 0.0 }
    }

    /// An empty measurement of an `n`-token generation test.
    pub fn generation(n: usize) -> Measurement {
        Measurement { n_gen: n, n_prompt: 0, ..Measurement::prompt(0) }
    }

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

/// Tokens per macro step and KV bytes per token of the last generation run.
pub type TgStats = std::rc::Rc<std::cell::Cell<(f64, f64)>>;

/// A prepared test: each call runs one repetition and returns its nanoseconds.
pub type Runner<'a> = Box<dyn FnMut() -> Result<u64> + 'a>;

/// Runs every runner once as a warm-up, then `reps` rounds in which each runs
/// once, in turn: interleaving makes machine drift hit all engines alike.
///
/// # Errors
/// The first failed repetition.
pub fn interleaved(reps: usize, runners: &mut [Runner]) -> Result<Vec<Vec<u64>>> {
    for r in runners.iter_mut() {
        r()?;
    }
    let mut samples = vec![Vec::with_capacity(reps); runners.len()];
    for _ in 0..reps {
        for (r, s) in runners.iter_mut().zip(&mut samples) {
            s.push(r()?);
        }
    }
    Ok(samples)
}

/// Prompt processing: `n` random tokens into an empty context.
///
/// # Errors
/// When the session cannot be created.
pub fn hamburger_pp<'m>(model: &'m Model, params: &SessionParams, n: usize) -> Result<(Runner<'m>, Measurement)> {
    let engine = EngineParams { n_ctx: params.engine.n_ctx.max(n + 1), ..params.engine.clone() };
    let mut session = Session::new(model, SessionParams { engine, ..params.clone() })?;
    let tokens = random_tokens(n, model.hp.n_vocab, 1);
    let meta = Measurement {
        n_prompt: n,
        n_gen: 0,
        samples_ns: Vec::new(),
        tokens_per_step: 1.0,
        kv_bytes_per_token: session.kv_bytes().1 as f64,
    };
    let run = Box::new(move || {
        session.clear();
        let t = Instant::now();
        session.feed(&tokens, false)?;
        let ns = t.elapsed().as_nanos() as u64;
        session.pause_threads();
        Ok(ns)
    });
    Ok((run, meta))
}

/// Generation: `n` tokens after a one-token prompt, greedy, end-of-generation
/// tokens ignored. `params.step.forced_steps` fixes the tokens per macro step; the
/// returned measurement's tokens per step and KV bytes are filled by the runs.
///
/// # Errors
/// When the session cannot be created.
pub fn hamburger_tg<'m>(model: &'m Model, params: &SessionParams, n: usize) -> Result<(Runner<'m>, TgStats)> {
    let engine = EngineParams { n_ctx: params.engine.n_ctx.max(n + 2), ..params.engine.clone() };
    let mut session = Session::new(model, SessionParams { engine, ignore_eog: true, ..params.clone() })?;
    let first = [model.vocab.bos.unwrap_or(0)];
    let stats = std::rc::Rc::new(std::cell::Cell::new((0.0, 0.0)));
    let out = stats.clone();
    let run = Box::new(move || {
        session.clear();
        let gen = session.generate(&first, n, |_| true)?;
        let t = &gen.timings;
        let kv = (t.kv_entries * t.kv_bytes_per_entry) as f64 / t.context_tokens.max(1) as f64;
        out.set((t.tokens_per_step(), kv));
        session.pause_threads();
        Ok((t.gen_ms * 1e6) as u64)
    });
    Ok((run, stats))
}

/// Generation of `n_seq` sequences together (a server's slots): each emits
/// `n` tokens after a one-token prompt, every macro step ONE base forward over
/// all of them, end-of-generation tokens ignored. A run's tokens are all
/// sequences' together.
///
/// # Errors
/// When the engine cannot be created or the stop rule does not fit the model.
pub fn hamburger_tg_parallel<'m>(
    model: &'m Model,
    params: &SessionParams,
    n: usize,
    n_seq: usize,
) -> Result<Runner<'m>> {
    let mut engine = Engine::new(model, &EngineParams { n_ctx: n_seq * (n + 2), n_seq, ..params.engine.clone() })?;
    let cfg = SessionParams { ignore_eog: true, ..params.clone() }.decode_config(model)?;
    let first = [model.vocab.bos.unwrap_or(0)];
    Ok(Box::new(move || {
        let greedy = || Sampler::new(SamplerParams::greedy());
        let mut seqs: Vec<SeqGen> = (0..n_seq).map(|s| SeqGen::new(s, &first, n, greedy())).collect();
        (0..n_seq).for_each(|s| engine.clear_seq(s));
        let t = Instant::now();
        generate::run(&mut engine, &cfg, &mut seqs)?;
        let ns = t.elapsed().as_nanos() as u64;
        engine.pause_threads();
        Ok(ns)
    }))
}

/// libllama's generation of `n_seq` sequences together, as llama-server
/// decodes its slots: one `llama_decode` per step with one token of every
/// sequence, logits for each (llama-bench's method for the tokens: random).
///
/// # Errors
/// When libllama cannot create the context.
pub fn llama_tg_parallel<'m>(
    model: &'m LlamaModel,
    params: &EngineParams,
    n: usize,
    n_seq: usize,
) -> Result<Runner<'m>> {
    let lp = LlamaContextParams { n_seq_max: n_seq as u32, ..llama_params(params, n_seq * (n + 2)) };
    let mut ctx = LlamaContext::new(model, lp)?;
    let tokens = random_tokens(n * n_seq, model.n_vocab(), 3);
    Ok(Box::new(move || {
        ctx.clear();
        let t = Instant::now();
        for (pos, step) in tokens.chunks(n_seq).enumerate() {
            let inputs: Vec<(i32, i32, i32)> =
                step.iter().enumerate().map(|(s, &tok)| (tok as i32, pos as i32, s as i32)).collect();
            ctx.decode_seqs(&inputs)?;
        }
        ctx.synchronize();
        let ns = t.elapsed().as_nanos() as u64;
        ctx.pause_threads();
        Ok(ns)
    }))
}

/// Verify forwards, a target's work in speculative decoding: after a
/// context of `n_context` random tokens (fed once, untimed), `n_forwards`
/// forwards of `k` single-token rows, every row an output (the target's
/// token after each of `k - 1` drafted ones; argmax only, as a greedy
/// verification reads), each rolled back before the next. The measurement
/// counts rows.
///
/// # Errors
/// When the engine cannot be created or a forward fails.
pub fn hamburger_verify<'m>(
    model: &'m Model,
    params: &EngineParams,
    k: usize,
    n_context: usize,
    n_forwards: usize,
) -> Result<(Runner<'m>, Measurement)> {
    let mut engine = Engine::new(model, &EngineParams { n_ctx: n_context + k + 1, n_seq: 1, ..params.clone() })?;
    let none = Wants { stop_head: false, logits: false, features: false, draft_stop: false };
    for chunk in random_tokens(n_context, model.hp.n_vocab, 1).chunks(params.n_batch) {
        let mut batch = Batch::new();
        batch.push_tokens(0, chunk);
        engine.decode(&batch, none)?;
    }
    let mut batch = Batch::new();
    batch.push_tokens(0, &random_tokens(k, model.hp.n_vocab, 4));
    let meta = Measurement::prompt(k * n_forwards);
    let run = Box::new(move || {
        let t = Instant::now();
        for _ in 0..n_forwards {
            engine.decode_every(&batch, none)?;
            engine.keep_prefix(0, n_context);
        }
        let ns = t.elapsed().as_nanos() as u64;
        engine.pause_threads();
        Ok(ns)
    });
    Ok((run, meta))
}

/// libllama's verify forwards with the same settings (see
/// [`hamburger_verify`]): `k` tokens in one `llama_decode`, logits at each,
/// as llama.cpp's speculative decoding verifies a draft.
///
/// # Errors
/// When libllama cannot create the context or a decode fails.
pub fn llama_verify<'m>(
    model: &'m LlamaModel,
    params: &EngineParams,
    k: usize,
    n_context: usize,
    n_forwards: usize,
) -> Result<(Runner<'m>, Measurement)> {
    let mut ctx = LlamaContext::new(model, llama_params(params, n_context + k + 1))?;
    let context: Vec<i32> = random_tokens(n_context, model.n_vocab(), 1).into_iter().map(|t| t as i32).collect();
    for c in context.chunks(params.n_batch) {
        ctx.decode(c)?;
    }
    let rows: Vec<(i32, i32, i32)> = random_tokens(k, model.n_vocab(), 4)
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t as i32, (n_context + i) as i32, 0))
        .collect();
    let meta = Measurement::prompt(k * n_forwards);
    let run = Box::new(move || {
        let t = Instant::now();
        for _ in 0..n_forwards {
            ctx.decode_seqs(&rows)?;
            ctx.truncate(0, n_context as i32)?;
        }
        ctx.synchronize();
        let ns = t.elapsed().as_nanos() as u64;
        ctx.pause_threads();
        Ok(ns)
    });
    Ok((run, meta))
}

/// Measures `n`-token prompt processing alone (`reps` after a warm-up).
///
/// # Errors
/// When a computation fails.
pub fn measure_pp(model: &Model, params: &SessionParams, n: usize, reps: usize) -> Result<Measurement> {
    let (run, mut m) = hamburger_pp(model, params, n)?;
    m.samples_ns = interleaved(reps, &mut [run])?.remove(0);
    Ok(m)
}

/// Measures `n`-token generation alone (`reps` after a warm-up).
///
/// # Errors
/// When a computation fails.
pub fn measure_tg(model: &Model, params: &SessionParams, n: usize, reps: usize) -> Result<Measurement> {
    let (run, stats) = hamburger_tg(model, params, n)?;
    let samples_ns = interleaved(reps, &mut [run])?.remove(0);
    let (tokens_per_step, kv_bytes_per_token) = stats.get();
    Ok(Measurement { samples_ns, tokens_per_step, kv_bytes_per_token, ..Measurement::generation(n) })
}

fn llama_params(params: &EngineParams, n_ctx: usize) -> LlamaContextParams {
    LlamaContextParams {
        n_ctx: n_ctx as u32,
        n_batch: params.n_batch as u32,
        n_threads: params.n_threads as i32,
        flash_attn: params.flash_attn,
        kv_type: params.kv_type,
        ..Default::default()
    }
}

/// llama.cpp's prompt processing with the same settings: the prompt in
/// batches of `params.n_batch`.
///
/// # Errors
/// When libllama cannot create the context.
pub fn llama_pp<'m>(model: &'m LlamaModel, params: &EngineParams, n: usize) -> Result<(Runner<'m>, Measurement)> {
    llama_runner(model, params, random_tokens(n, model.n_vocab(), 1), params.n_batch, Measurement::prompt(n))
}

/// llama.cpp's generation with the same settings (one token per forward,
/// llama-bench's method: no sampling, the next input is a random token).
///
/// # Errors
/// When libllama cannot create the context.
pub fn llama_tg<'m>(model: &'m LlamaModel, params: &EngineParams, n: usize) -> Result<(Runner<'m>, Measurement)> {
    llama_runner(model, params, random_tokens(n, model.n_vocab(), 2), 1, Measurement::generation(n))
}

/// A runner decoding `tokens` into an empty libllama context, `chunk` at a time.
fn llama_runner<'m>(
    model: &'m LlamaModel,
    params: &EngineParams,
    tokens: Vec<u32>,
    chunk: usize,
    mut meta: Measurement,
) -> Result<(Runner<'m>, Measurement)> {
    let mut ctx = LlamaContext::new(model, llama_params(params, params.n_ctx.max(tokens.len() + 2)))?;
    let tokens: Vec<i32> = tokens.into_iter().map(|t| t as i32).collect();
    meta.kv_bytes_per_token = model.kv_bytes_per_token(params.kv_type) as f64;
    let run = Box::new(move || {
        ctx.clear();
        let t = Instant::now();
        for c in tokens.chunks(chunk) {
            ctx.decode(c)?;
        }
        ctx.synchronize();
        let ns = t.elapsed().as_nanos() as u64;
        ctx.pause_threads();
        Ok(ns)
    });
    Ok((run, meta))
}
