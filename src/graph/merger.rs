//! The compositional embedder: the k tokens one macro step emitted become ONE
//! input embedding (shared/docs/hamburger-model.md, "Compositional embedder").

use ggml::{Context, Tensor};

use super::linear;
use crate::hparams::HParams;
use crate::weights::MergerWeights;

/// Merges the token embeddings `e [D, k]` (k > 1, in emission order) into `[D, 1]`:
/// `mean + Wo · attention(q = Wq·mean, keys/values from [e_j, P_j])`.
pub fn merge(g: &Context, w: &MergerWeights, hp: &HParams, e: &Tensor) -> Tensor {
    let (d, k) = (hp.n_embd as i64, e.ne()[1]);
    let (hm, hd) = (hp.n_merger_head as i64, hp.merger_head_dim() as i64);
    let mean = g.reshape(&g.mean(&g.cont(&g.transpose(e))), &[d, 1]).named("merger_mean"); // [D, 1]
    let q = linear(g, &w.q, &mean); // [D, 1]
    let pos = g.view(&w.pos, &[d / 2, k], &[w.pos.nb()[1]], 0); // [D/2, k]: rows 0..k of P
    let u = g.concat(e, &pos, 0); // [3D/2, k]
    let keys = linear(g, &w.k, &u); // [D, k]
    let values = linear(g, &w.v, &u); // [D, k]
    let q = g.permute(&g.reshape(&q, &[hd, hm, 1]), [0, 2, 1, 3]); // [hd, 1, Hm]
    let keys = g.permute(&g.reshape(&keys, &[hd, hm, k]), [0, 2, 1, 3]); // [hd, k, Hm]
    let scores = g.mul_mat(&keys, &q); // [k, 1, Hm]
    let attn = g.soft_max_ext(&scores, None, 1.0 / (hd as f32).sqrt()); // softmax over j
    let values = g.cont(&g.permute(&g.reshape(&values, &[hd, hm, k]), [1, 2, 0, 3])); // [k, hd, Hm]
    let o = g.reshape(&g.mul_mat(&values, &attn), &[d, 1]); // [hd, 1, Hm] -> concat of heads [D, 1]
    g.add(&mean, &linear(g, &w.out, &o)).named("merged")
}

/// The merger alone as a runnable graph on the CPU, for unit tests and
/// benchmarks: token ids in, the merged embedding out.
pub struct StandaloneMerger {
    graph: ggml::Graph,
    sched: ggml::Scheduler,
    ids: Tensor,
    merged: Tensor,
}

impl StandaloneMerger {
    /// Builds the merger of `model` for `k` tokens on `n_threads` CPU threads.
    ///
    /// # Errors
    /// When the backend or the graph cannot be created.
    pub fn new(model: &crate::Model, k: usize, n_threads: usize) -> crate::Result<StandaloneMerger> {
        let g = Context::new(256, 256)?;
        let mut graph = ggml::Graph::new(&g, 256);
        let ids = g.new_tensor(ggml::Type::I32, &[k as i64]);
        ids.set_input();
        let e = g.get_rows(&model.weights.tok_embd, &ids);
        let merged = merge(&g, &model.weights.merger, &model.hp, &e);
        merged.set_output();
        graph.expand(&merged);
        let cpu = ggml::Backend::cpu()?;
        cpu.set_n_threads(n_threads);
        cpu.set_threadpool(std::rc::Rc::new(ggml::ThreadPool::new(n_threads)?));
        let mut sched = ggml::Scheduler::new(&[std::rc::Rc::new(cpu)], 256, false)?;
        sched.alloc(&graph)?;
        Ok(StandaloneMerger { graph, sched, ids, merged })
    }

    /// Merges `tokens` (as many as the graph was built for) into one embedding.
    ///
    /// # Errors
    /// On a wrong token count or a failed computation.
    pub fn run(&mut self, tokens: &[u32]) -> crate::Result<Vec<f32>> {
        self.ids.write(&tokens.iter().map(|&t| t as i32).collect::<Vec<_>>())?;
        self.sched.compute(&self.graph)?;
        Ok(self.merged.to_vec_f32()?)
    }
}
