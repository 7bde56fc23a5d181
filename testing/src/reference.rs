//! A plain-Rust f32 implementation of HAMburger on a checkpoint in the
//! ORIGINAL layout (Hugging Face rotate-half rope, unpermuted q/k, torch
//! shapes), written straight from `docs/model.md`. Of the
//! runtime it uses only the hyper-parameter struct (filled by the converter's
//! config reader) and `argmax`; none of its math (no ggml, no graph, no
//! layout change), which makes it an independent oracle for tests: the
//! converter's layout changes and the runtime's graphs are both checked
//! against it. It is slow (matrix-vector products in plain loops).

use std::collections::HashMap;
use std::path::Path;

use hamburger::hparams::HParams;
pub use hamburger::sampling::argmax;
use rayon::prelude::*;

use convert::checkpoint::Checkpoint;
use convert::hf::{self, HamburgerJson, HfConfig};
use convert::ConvertError;

/// A model loaded for reference evaluation.
pub struct Reference {
    /// Hyper-parameters.
    pub hp: HParams,
    inv_freq: Vec<f32>,
    w: HashMap<String, Vec<f32>>,
    lm_head: String,
}

/// What one macro step of [`Reference::generate`] produced.
#[derive(Debug, Clone)]
pub struct RefStep {
    /// Tokens emitted.
    pub tokens: Vec<u32>,
    /// Stop probability after each token.
    pub p_stop: Vec<f32>,
    /// Logits of each micro step.
    pub logits: Vec<Vec<f32>>,
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * s * g).collect()
}

/// `W x` for a torch-layout weight `[rows, x.len()]`.
fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.par_chunks(x.len()).map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

fn add(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn softmax(v: &mut [f32]) {
    let m = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let s: f32 = v
        .iter_mut()
        .map(|x| {
            *x = (*x - m).exp();
            *x
        })
        .sum();
    v.iter_mut().for_each(|x| *x /= s);
}

/// Per-layer key/value cache: one entry per input (slot), keys after rope.
#[derive(Default, Clone)]
struct Cache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl Reference {
    /// Loads the checkpoint and configs of `dir` (or `checkpoint` with `base_dir`).
    ///
    /// # Errors
    /// When the files are missing or invalid.
    pub fn load(checkpoint: &Path, base_dir: &Path) -> Result<Reference, ConvertError> {
        let ck = Checkpoint::open(checkpoint)?;
        let config: HfConfig = hf::read_json(&base_dir.join("config.json"))?;
        let hj_path = base_dir.join("hamburger.json");
        let hj: HamburgerJson = if hj_path.exists() { hf::read_json(&hj_path)? } else { HamburgerJson::default() };
        let hp = config.hparams(&hj, &HamburgerJson::default(), ck.max_steps);
        let factors = config.llama3_rope_freqs().unwrap_or_else(|| vec![1.0; hp.head_dim / 2]);
        let inv_freq = (0..hp.head_dim / 2)
            .map(|i| (1.0 / (hp.rope_freq_base as f64).powf((2 * i) as f64 / hp.head_dim as f64)) as f32 / factors[i])
            .collect();
        let w = ck
            .tensors
            .iter()
            .filter(|(_, t)| t.dtype.is_ok())
            .map(|(k, t)| (k.clone(), ck.read_f32(t, 0, t.n_elements())))
            .collect::<HashMap<_, _>>();
        let lm_head = if w.contains_key("model.lm_head.weight") && !config.tie_word_embeddings {
            "model.lm_head.weight"
        } else {
            "model.model.embed_tokens.weight"
        };
        Ok(Reference { hp, inv_freq, w, lm_head: lm_head.into() })
    }

    fn t(&self, key: &str) -> &[f32] {
        self.w.get(key).unwrap_or_else(|| panic!("reference: no tensor {key}"))
    }

    /// Rotate-half rope of one head vector at position `pos`.
    fn rope(&self, x: &mut [f32], pos: usize) {
        let half = x.len() / 2;
        for i in 0..half {
            let (s, c) = (pos as f32 * self.inv_freq[i]).sin_cos();
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }

    /// One Llama decoder layer (prefix e.g. `model.model.layers.3`) on input `x`
    /// at rope position `pos`, appending to `cache`; causal over everything cached.
    fn layer(&self, prefix: &str, x: &mut [f32], pos: usize, cache: &mut Cache) {
        let hp = &self.hp;
        let (hd, nh, nkv) = (hp.head_dim, hp.n_head, hp.n_head_kv);
        let p = |n: &str| format!("{prefix}.{n}");
        let h = rms_norm(x, self.t(&p("input_layernorm.weight")), hp.rms_eps);
        let mut q = matvec(self.t(&p("self_attn.q_proj.weight")), &h);
        let mut k = matvec(self.t(&p("self_attn.k_proj.weight")), &h);
        let v = matvec(self.t(&p("self_attn.v_proj.weight")), &h);
        q.chunks_mut(hd).for_each(|c| self.rope(c, pos));
        k.chunks_mut(hd).for_each(|c| self.rope(c, pos));
        cache.k.push(k);
        cache.v.push(v);
        let mut attn = vec![0f32; nh * hd];
        for head in 0..nh {
            let kvh = head / (nh / nkv);
            let qh = &q[head * hd..(head + 1) * hd];
            let mut scores: Vec<f32> = cache
                .k
                .iter()
                .map(|k| {
                    qh.iter().zip(&k[kvh * hd..(kvh + 1) * hd]).map(|(a, b)| a * b).sum::<f32>() / (hd as f32).sqrt()
                })
                .collect();
            softmax(&mut scores);
            for (s, v) in scores.iter().zip(&cache.v) {
                for d in 0..hd {
                    attn[head * hd + d] += s * v[kvh * hd + d];
                }
            }
        }
        add(x, &matvec(self.t(&p("self_attn.o_proj.weight")), &attn));
        let h = rms_norm(x, self.t(&p("post_attention_layernorm.weight")), hp.rms_eps);
        let g = matvec(self.t(&p("mlp.gate_proj.weight")), &h);
        let u = matvec(self.t(&p("mlp.up_proj.weight")), &h);
        let a: Vec<f32> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        add(x, &matvec(self.t(&p("mlp.down_proj.weight")), &a));
    }

    fn embed(&self, tok: u32) -> Vec<f32> {
        let d = self.hp.n_embd;
        self.t("model.model.embed_tokens.weight")[tok as usize * d..(tok as usize + 1) * d].to_vec()
    }

    /// One base forward of input embedding `x` at rope position `pos`: the
    /// features (last one normed) and the caches updated.
    fn base_forward(&self, mut x: Vec<f32>, pos: usize, caches: &mut [Cache]) -> Vec<Vec<f32>> {
        let mut features = Vec::new();
        for (l, cache) in caches.iter_mut().enumerate() {
            self.layer(&format!("model.model.layers.{l}"), &mut x, pos, cache);
            if self.hp.feature_layers.contains(&l) {
                features.push(x.clone());
            }
        }
        let last = features.last_mut().expect("at least one feature layer");
        *last = rms_norm(last, self.t("model.model.norm.weight"), self.hp.rms_eps);
        features
    }

    /// Logits of an output vector.
    pub fn logits(&self, out: &[f32]) -> Vec<f32> {
        matvec(self.t(&self.lm_head), out)
    }

    fn p_stop(&self, out: &[f32]) -> f32 {
        let lin = |i: usize, x: &[f32]| {
            let mut y = matvec(self.t(&format!("micro_step_decoder.stop_head.{i}.weight")), x);
            add(&mut y, self.t(&format!("micro_step_decoder.stop_head.{i}.bias")));
            y
        };
        let h1: Vec<f32> = lin(0, out).into_iter().map(silu).collect();
        let h2: Vec<f32> = lin(2, &h1).into_iter().map(silu).collect();
        1.0 / (1.0 + (-lin(4, &h2)[0]).exp())
    }

    /// The compositional embedder: one input embedding for the tokens of a step.
    pub fn merge(&self, tokens: &[u32]) -> Vec<f32> {
        let (d, k) = (self.hp.n_embd, tokens.len());
        let e: Vec<Vec<f32>> = tokens.iter().map(|&t| self.embed(t)).collect();
        if k == 1 {
            return e[0].clone();
        }
        let m: Vec<f32> = (0..d).map(|i| e.iter().map(|v| v[i]).sum::<f32>() / k as f32).collect();
        let lin = |name: &str, x: &[f32]| {
            let mut y = matvec(self.t(&format!("comp_embedder.{name}.weight")), x);
            add(&mut y, self.t(&format!("comp_embedder.{name}.bias")));
            y
        };
        let q = lin("merger.q_proj", &m);
        let pos = self.t("comp_embedder.merger.pos");
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for (j, ej) in e.iter().enumerate() {
            let mut u = ej.clone();
            u.extend_from_slice(&pos[j * d / 2..(j + 1) * d / 2]);
            ks.push(lin("merger.k_proj", &u));
            vs.push(lin("merger.v_proj", &u));
        }
        let (hm, hd) = (self.hp.n_merger_head, self.hp.merger_head_dim());
        let mut o = vec![0f32; d];
        for h in 0..hm {
            let r = h * hd..(h + 1) * hd;
            let mut a: Vec<f32> = ks
                .iter()
                .map(|kj| q[r.clone()].iter().zip(&kj[r.clone()]).map(|(x, y)| x * y).sum::<f32>() / (hd as f32).sqrt())
                .collect();
            softmax(&mut a);
            for (aj, vj) in a.iter().zip(&vs) {
                for i in r.clone() {
                    o[i] += aj * vj[i];
                }
            }
        }
        let mut merged = m;
        add(&mut merged, &lin("out_proj", &o));
        merged
    }

    /// The logits after feeding `prompt` token by token and then the merge of
    /// `step` as one input at rope position `pos` (a test hook for positions).
    pub fn logits_after_merge(&self, prompt: &[u32], step: &[u32], pos: usize) -> Vec<f32> {
        let mut caches = vec![Cache::default(); self.hp.n_layer];
        for (p, &t) in prompt.iter().enumerate() {
            self.base_forward(self.embed(t), p, &mut caches);
        }
        let feats = self.base_forward(self.merge(step), pos, &mut caches);
        self.logits(feats.last().expect("features"))
    }

    /// The base's logits after each token of `tokens`, fed one per forward
    /// as a plain Llama reads a prompt (the oracle of prompt scoring).
    pub fn base_logits(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
        let mut caches = vec![Cache::default(); self.hp.n_layer];
        tokens
            .iter()
            .enumerate()
            .map(|(p, &t)| self.logits(self.base_forward(self.embed(t), p, &mut caches).last().expect("features")))
            .collect()
    }

    /// Greedy decoding of the base model alone (one token per forward): the
    /// `n` tokens, each with the logits it was chosen from.
    pub fn base_greedy(&self, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
        let mut caches = vec![Cache::default(); self.hp.n_layer];
        let mut feats = Vec::new();
        for (p, &t) in prompt.iter().enumerate() {
            feats = self.base_forward(self.embed(t), p, &mut caches);
        }
        let (mut out, mut logits) = (Vec::new(), Vec::new());
        loop {
            let l = self.logits(feats.last().expect("features"));
            out.push(argmax(&l));
            logits.push(l);
            if out.len() == n {
                return (out, logits);
            }
            feats = self.base_forward(self.embed(out[out.len() - 1]), prompt.len() + out.len() - 1, &mut caches);
        }
    }

    /// Greedy HAMburger generation: macro steps until `max_new` tokens or `eos`
    /// (the last step is kept whole).
    pub fn generate(&self, prompt: &[u32], confidence: f32, max_new: usize, eos: &[u32]) -> Vec<RefStep> {
        self.generate_with(prompt, confidence, None, max_new, eos)
    }

    /// [`Reference::generate`], optionally with every macro step forced to emit
    /// `forced` tokens (the stop head ignored).
    pub fn generate_with(
        &self,
        prompt: &[u32],
        confidence: f32,
        forced: Option<usize>,
        max_new: usize,
        eos: &[u32],
    ) -> Vec<RefStep> {
        let hp = &self.hp;
        let mut caches = vec![Cache::default(); hp.n_layer];
        let mut feats = Vec::new();
        for (p, &t) in prompt.iter().enumerate() {
            feats = self.base_forward(self.embed(t), p, &mut caches);
        }
        let (mut steps, mut n_out) = (Vec::<RefStep>::new(), 0);
        loop {
            let mut micro = vec![Cache::default(); hp.n_micro_layer];
            let mut out = feats.last().expect("features").clone();
            let mut step = RefStep { tokens: Vec::new(), p_stop: Vec::new(), logits: Vec::new() };
            loop {
                let logits = self.logits(&out);
                let tok = argmax(&logits);
                let p = self.p_stop(&out);
                step.tokens.push(tok);
                step.p_stop.push(p);
                step.logits.push(logits);
                let n = step.tokens.len();
                let stop = match forced {
                    Some(k) => n >= k.min(hp.max_steps),
                    None => 1.0 - p < confidence || n == hp.max_steps,
                };
                if stop {
                    break;
                }
                // Micro step: features then embed(t_0) at positions 0..F; later tokens at F+s.
                let s = step.tokens.len() - 1;
                let mut inputs: Vec<(Vec<f32>, usize)> = Vec::new();
                if s == 0 {
                    inputs.extend(feats.iter().cloned().enumerate().map(|(i, f)| (f, i)));
                }
                inputs.push((self.embed(tok), hp.n_features() + s));
                for (mut x, pos) in inputs {
                    for (l, cache) in micro.iter_mut().enumerate() {
                        self.layer(&format!("micro_step_decoder.decoders.{l}"), &mut x, pos, cache);
                    }
                    out = x;
                }
            }
            n_out += step.tokens.len();
            let done = n_out >= max_new || step.tokens.iter().any(|t| eos.contains(t));
            let pos = prompt.len() + n_out - 1;
            let merged = self.merge(&step.tokens);
            steps.push(step);
            if done {
                return steps;
            }
            feats = self.base_forward(merged, pos, &mut caches);
        }
    }
}
