//! Computation graphs.

use std::ptr::NonNull;

use crate::{sys, Context, Tensor};

/// A ggml computation graph. Its node list lives in the [`Context`] it was
/// created from, which the graph keeps alive.
pub struct Graph {
    ptr: NonNull<sys::ggml_cgraph>,
    ctx: Context,
}

impl Graph {
    /// An empty graph of up to `max_nodes` nodes in `ctx` (which must have been
    /// created with room for a graph of that size).
    pub fn new(ctx: &Context, max_nodes: usize) -> Graph {
        // SAFETY: ctx is live; ggml asserts if the context lacks room, which
        // Context::new(.., graph_nodes) provides for.
        let ptr = unsafe { sys::ggml_new_graph_custom(ctx.raw(), max_nodes, false) };
        Graph { ptr: NonNull::new(ptr).expect("ggml_new_graph_custom returned null"), ctx: ctx.clone() }
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_cgraph {
        self.ptr.as_ptr()
    }

    /// Adds `t` and everything it depends on to the graph.
    pub fn expand(&mut self, t: &Tensor) {
        self.ctx.adopt(&[t]);
        // SAFETY: the graph and tensor are live, and the graph's context now keeps
        // t's context (and through it every source) alive.
        unsafe { sys::ggml_build_forward_expand(self.raw(), t.raw()) }
    }

    /// Number of nodes (operations) in the graph.
    pub fn n_nodes(&self) -> usize {
        // SAFETY: the graph is live.
        unsafe { sys::ggml_graph_n_nodes(self.raw()) as usize }
    }

    /// The context the graph and its nodes live in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}
