//! The merger alone as a runnable graph on the CPU, for the unit tests that
//! check it against the reference and the benchmarks that time it: token ids
//! in, the merged embedding out.

use std::rc::Rc;

use ggml::{Backend, Context, Graph, Result, Scheduler, Tensor, ThreadPool};
use hamburger::graph::{merger, token_input};
use hamburger::Model;

/// The merger of a model built for one input of `k` tokens.
pub struct StandaloneMerger {
    graph: Graph,
    sched: Scheduler,
    ids: Tensor,
    merged: Tensor,
}

impl StandaloneMerger {
    /// Builds the merger of `model` for one input of `k` tokens on `n_threads` CPU threads.
    ///
    /// # Errors
    /// When the backend or the graph cannot be created.
    pub fn new(model: &Model, k: usize, n_threads: usize) -> Result<StandaloneMerger> {
        const NODES: usize = 256;
        let g = Context::new(NODES, NODES)?;
        let mut graph = Graph::new(&g, NODES);
        let ids = token_input(&g, k);
        let e = g.reshape(&g.get_rows(&model.weights.tok_embd, &ids), &[model.hp.n_embd as i64, k as i64, 1]);
        let merged = merger::merge(
            &g,
            &model.weights.grafted.as_ref().expect("a HAMburger model: a base-only one has no merger").merger,
            &model.hp,
            &e,
        );
        merged.set_output();
        graph.expand(&merged);
        let cpu = Backend::cpu()?;
        cpu.set_n_threads(n_threads);
        cpu.set_threadpool(Rc::new(ThreadPool::new(n_threads)?));
        let mut sched = Scheduler::new(&[Rc::new(cpu)], NODES, false)?;
        sched.alloc(&graph)?;
        Ok(StandaloneMerger { graph, sched, ids, merged })
    }

    /// Merges `tokens` (as many as the graph was built for) into one embedding.
    ///
    /// # Errors
    /// On a wrong token count or a failed computation.
    pub fn run(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.ids.write(&tokens.iter().map(|&t| t as i32).collect::<Vec<_>>())?;
        self.sched.compute(&self.graph)?;
        self.merged.to_vec_f32()
    }
}
