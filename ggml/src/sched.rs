//! The backend scheduler: splits a graph across backends, allocates its
//! intermediate tensors and runs it.

use std::ptr::NonNull;
use std::rc::Rc;

use crate::{sys, Backend, BufferType, Context, Error, Graph, Result};

/// A ggml backend scheduler over an ordered list of backends (most preferred
/// first; the CPU last). It remembers the graph it allocated, so running the
/// same graph again skips splitting and allocation.
pub struct Scheduler {
    ptr: NonNull<sys::ggml_backend_sched>,
    backends: Vec<Rc<Backend>>,
    /// The graph whose tensors are currently allocated, with its context kept alive
    /// (the scheduler holds pointers into its nodes).
    allocated: Option<(NonNull<sys::ggml_cgraph>, Context)>,
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // SAFETY: freed once, before the backends it references (held in self.backends).
        unsafe { sys::ggml_backend_sched_free(self.ptr.as_ptr()) }
    }
}

impl Scheduler {
    /// A scheduler over `backends` (the last must be the CPU) for graphs of up to
    /// `graph_size` nodes; `op_offload` lets it move ops on host weights to a GPU.
    ///
    /// # Errors
    /// When ggml cannot create the scheduler.
    pub fn new(backends: &[Rc<Backend>], graph_size: usize, op_offload: bool) -> Result<Scheduler> {
        if backends.last().is_none_or(|b| !b.is_cpu()) {
            return Err(Error::Invalid("the scheduler's last backend must be the CPU".into()));
        }
        let mut raw: Vec<sys::ggml_backend_t> = backends.iter().map(|b| b.raw()).collect();
        // SAFETY: `raw` holds live backends; null bufts means each backend's default.
        let ptr = unsafe {
            sys::ggml_backend_sched_new(
                raw.as_mut_ptr(),
                std::ptr::null_mut(),
                raw.len() as i32,
                graph_size,
                false,
                op_offload,
            )
        };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::BackendInit("scheduler".into()))?;
        Ok(Scheduler { ptr, backends: backends.to_vec(), allocated: None })
    }

    fn raw(&self) -> *mut sys::ggml_backend_sched {
        self.ptr.as_ptr()
    }

    /// Forgets the allocated graph (its intermediate memory may then be reused).
    pub fn reset(&mut self) {
        // SAFETY: the scheduler is live.
        unsafe { sys::ggml_backend_sched_reset(self.raw()) };
        self.allocated = None;
    }

    /// Splits and allocates `graph`, so its input tensors can be written.
    ///
    /// # Errors
    /// When the compute buffers cannot be allocated.
    pub fn alloc(&mut self, graph: &Graph) -> Result<()> {
        self.reset();
        // SAFETY: graph and scheduler are live.
        if !unsafe { sys::ggml_backend_sched_alloc_graph(self.raw(), graph.raw()) } {
            return Err(Error::SchedAlloc);
        }
        // SAFETY: graph.raw() is non-null.
        self.allocated = Some((unsafe { NonNull::new_unchecked(graph.raw()) }, graph.context().clone()));
        Ok(())
    }

    /// Whether `graph` is the one currently allocated.
    pub fn is_allocated(&self, graph: &Graph) -> bool {
        self.allocated.as_ref().is_some_and(|(g, _)| g.as_ptr() == graph.raw())
    }

    /// Runs `graph` (allocating it first unless it is the graph already allocated)
    /// and waits for the result.
    ///
    /// # Errors
    /// On allocation failure or a failed computation.
    pub fn compute(&mut self, graph: &Graph) -> Result<()> {
        if !self.is_allocated(graph) {
            self.alloc(graph)?;
        }
        // SAFETY: `graph` is the allocated graph (checked above), kept alive by self.allocated.
        let status = unsafe { sys::ggml_backend_sched_graph_compute(self.raw(), graph.raw()) };
        if status != sys::GGML_STATUS_SUCCESS {
            return Err(Error::Compute(status));
        }
        Ok(())
    }

    /// Number of backend splits of the allocated graph.
    pub fn n_splits(&self) -> usize {
        // SAFETY: the scheduler is live.
        unsafe { sys::ggml_backend_sched_get_n_splits(self.raw()) as usize }
    }

    /// The compute-buffer size on each backend, with the backend's buffer type.
    pub fn buffer_sizes(&self) -> Vec<(BufferType, usize)> {
        self.backends
            .iter()
            .map(|b| {
                // SAFETY: the backend belongs to this scheduler.
                unsafe {
                    (
                        BufferType(sys::ggml_backend_sched_get_buffer_type(self.raw(), b.raw())),
                        sys::ggml_backend_sched_get_buffer_size(self.raw(), b.raw()),
                    )
                }
            })
            .collect()
    }
}
