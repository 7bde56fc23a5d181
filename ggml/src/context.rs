//! ggml contexts (tensor metadata arenas) and reference-counted tensor handles.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::ptr::NonNull;
use std::rc::Rc;

use crate::{sys, Error, Result, Type, MAX_DIMS};

pub(crate) struct ContextInner {
    ptr: NonNull<sys::ggml_context>,
    /// Things the tensors of this context point into or at: backend buffers,
    /// memory maps, and other contexts whose tensors are sources of ours.
    keep_alive: RefCell<Vec<Rc<dyn Any>>>,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from ggml_init and is freed exactly once, here; every
        // Tensor handle holds an Rc to this inner value, so none outlives it.
        unsafe { sys::ggml_free(self.ptr.as_ptr()) }
    }
}

/// A ggml context that holds tensor metadata (never tensor data: tensors get
/// their memory from a [`crate::Buffer`] or a [`crate::Scheduler`]).
///
/// Cloning is cheap and shares the context.
#[derive(Clone)]
pub struct Context(pub(crate) Rc<ContextInner>);

impl Context {
    /// A context with room for `n_tensors` tensor headers and one graph of up to
    /// `graph_nodes` nodes (0 for none).
    ///
    /// # Errors
    /// When ggml cannot allocate the metadata arena.
    pub fn new(n_tensors: usize, graph_nodes: usize) -> Result<Context> {
        crate::init_logging();
        // SAFETY: pure size computations.
        let mem_size = unsafe {
            sys::ggml_tensor_overhead() * n_tensors
                + if graph_nodes > 0 { sys::ggml_graph_overhead_custom(graph_nodes, false) } else { 0 }
        };
        let params = sys::ggml_init_params { mem_size, mem_buffer: std::ptr::null_mut(), no_alloc: true };
        // SAFETY: a null mem_buffer makes ggml allocate (and own) the arena.
        let ptr = unsafe { sys::ggml_init(params) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::Invalid("ggml_init failed".into()))?;
        Ok(Context(Rc::new(ContextInner { ptr, keep_alive: RefCell::new(Vec::new()) })))
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_context {
        self.0.ptr.as_ptr()
    }

    /// Keeps `owner` alive for as long as this context lives.
    pub(crate) fn keep(&self, owner: Rc<dyn Any>) {
        let mut keep = self.0.keep_alive.borrow_mut();
        if !keep.iter().any(|k| Rc::ptr_eq(k, &owner)) {
            keep.push(owner);
        }
    }

    /// Makes this context keep the contexts of `tensors` alive (they may be
    /// sources of tensors created here).
    pub(crate) fn adopt(&self, tensors: &[&Tensor]) {
        for t in tensors {
            if !Rc::ptr_eq(&t.ctx, &self.0) {
                self.keep(t.ctx.clone());
            }
        }
    }

    fn check_room(&self) {
        // SAFETY: reads sizes of a live context.
        let (used, size) = unsafe { (sys::ggml_used_mem(self.raw()), sys::ggml_get_mem_size(self.raw())) };
        // SAFETY: pure size computation.
        let need = unsafe { sys::ggml_tensor_overhead() };
        assert!(used + need <= size, "ggml context is full ({used} of {size} bytes): size it for more tensors");
    }

    /// Wraps a tensor pointer just returned by ggml for this context.
    pub(crate) fn wrap(&self, ptr: *mut sys::ggml_tensor) -> Tensor {
        Tensor { ptr: NonNull::new(ptr).expect("ggml returned a null tensor"), ctx: self.0.clone() }
    }

    /// Runs `f` (a ggml call creating one or more tensors in this context)
    /// after checking there is room, adopting the source tensors' contexts.
    pub(crate) fn op(
        &self,
        srcs: &[&Tensor],
        f: impl FnOnce(*mut sys::ggml_context) -> *mut sys::ggml_tensor,
    ) -> Tensor {
        self.check_room();
        self.adopt(srcs);
        self.wrap(f(self.raw()))
    }

    /// A new tensor of type `ty` and shape `ne` (ggml order: `ne[0]` is the row length).
    ///
    /// # Panics
    /// When `ne` has no or more than [`MAX_DIMS`] dimensions or the context is full.
    pub fn new_tensor(&self, ty: Type, ne: &[i64]) -> Tensor {
        assert!(!ne.is_empty() && ne.len() <= MAX_DIMS, "bad tensor rank");
        self.op(&[], |ctx| {
            // SAFETY: ctx is live and `ne` holds ne.len() valid dimensions.
            unsafe { sys::ggml_new_tensor(ctx, ty.raw(), ne.len() as i32, ne.as_ptr()) }
        })
    }

    /// Every tensor of this context, in creation order.
    pub fn tensors(&self) -> Vec<Tensor> {
        let mut out = Vec::new();
        // SAFETY: iterating the tensor list of a live context.
        let mut t = unsafe { sys::ggml_get_first_tensor(self.raw()) };
        while !t.is_null() {
            out.push(self.wrap(t));
            // SAFETY: `t` is a tensor of this context.
            t = unsafe { sys::ggml_get_next_tensor(self.raw(), t) };
        }
        out
    }
}

/// A handle to a tensor: its metadata lives in a [`Context`] that the handle
/// keeps alive. Cloning is cheap.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) ptr: NonNull<sys::ggml_tensor>,
    pub(crate) ctx: Rc<ContextInner>,
}

impl Tensor {
    pub(crate) fn raw(&self) -> *mut sys::ggml_tensor {
        self.ptr.as_ptr()
    }

    fn header(&self) -> &sys::ggml_tensor {
        // SAFETY: the tensor header lives in a context kept alive by `self.ctx`.
        unsafe { self.ptr.as_ref() }
    }

    /// The element type.
    pub fn ty(&self) -> Type {
        Type::from_raw(self.header().type_).expect("tensor of unknown type")
    }

    /// The shape in ggml order (`ne[0]` is the contiguous row length).
    pub fn ne(&self) -> [i64; 4] {
        self.header().ne
    }

    /// The strides in bytes.
    pub fn nb(&self) -> [usize; 4] {
        self.header().nb
    }

    /// Number of elements.
    pub fn n_elements(&self) -> i64 {
        self.ne().iter().product()
    }

    /// Bytes of the tensor's data.
    pub fn nbytes(&self) -> usize {
        // SAFETY: the header is live.
        unsafe { sys::ggml_nbytes(self.raw()) }
    }

    /// The tensor's name.
    pub fn name(&self) -> String {
        // SAFETY: `name` is a NUL-terminated fixed-size array inside the header.
        unsafe { CStr::from_ptr(self.header().name.as_ptr()) }.to_string_lossy().into_owned()
    }

    /// Names the tensor (truncated by ggml to 63 bytes) and returns it, for chaining.
    pub fn named(self, name: &str) -> Tensor {
        let c = CString::new(name).expect("tensor name with NUL");
        // SAFETY: the header is live; ggml copies (and truncates) the name.
        unsafe { sys::ggml_set_name(self.raw(), c.as_ptr()) };
        self
    }

    /// Marks the tensor as a graph input (the scheduler allocates it before any compute).
    pub fn set_input(&self) {
        // SAFETY: the header is live.
        unsafe { sys::ggml_set_input(self.raw()) }
    }

    /// Marks the tensor as a graph output (its memory is not reused by later nodes).
    pub fn set_output(&self) {
        // SAFETY: the header is live.
        unsafe { sys::ggml_set_output(self.raw()) }
    }

    /// Whether the tensor has memory (a buffer) attached.
    pub fn is_allocated(&self) -> bool {
        !self.header().buffer.is_null() && !self.header().data.is_null()
    }

    fn check_access(&self, offset: usize, len: usize) -> Result<()> {
        if !self.is_allocated() {
            return Err(Error::Invalid(format!("tensor {} has no memory allocated", self.name())));
        }
        if offset.checked_add(len).is_none_or(|end| end > self.nbytes()) {
            return Err(Error::Invalid(format!(
                "access of {len} bytes at {offset} outside tensor {} ({} bytes)",
                self.name(),
                self.nbytes()
            )));
        }
        Ok(())
    }

    /// Copies `bytes` into the tensor's memory at byte `offset` (on any backend).
    ///
    /// # Errors
    /// When the tensor has no memory or the range lies outside it.
    pub fn write_bytes(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.check_access(offset, bytes.len())?;
        // SAFETY: the tensor is allocated and [offset, offset+len) lies inside it.
        unsafe { sys::ggml_backend_tensor_set(self.raw(), bytes.as_ptr().cast(), offset, bytes.len()) };
        Ok(())
    }

    /// Copies tensor memory at byte `offset` into `out` (from any backend).
    ///
    /// # Errors
    /// When the tensor has no memory or the range lies outside it.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_access(offset, out.len())?;
        // SAFETY: the tensor is allocated and [offset, offset+len) lies inside it.
        unsafe { sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), offset, out.len()) };
        Ok(())
    }

    /// Writes plain values (`f32`, `i32`, `u16` halves...) from element 0.
    ///
    /// # Errors
    /// As [`Tensor::write_bytes`].
    pub fn write<T: Pod>(&self, values: &[T]) -> Result<()> {
        self.write_bytes(0, as_bytes(values))
    }

    /// Reads plain values into `out` from element 0.
    ///
    /// # Errors
    /// As [`Tensor::read_bytes`].
    pub fn read<T: Pod>(&self, out: &mut [T]) -> Result<()> {
        // SAFETY: T is plain-old-data (the Pod bound), so any bytes are a valid T.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(out)) };
        self.read_bytes(0, bytes)
    }

    /// Reads the whole tensor as f32 values (it must be an F32 tensor).
    ///
    /// # Errors
    /// When the tensor is not F32 or has no memory.
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        if self.ty() != Type::F32 {
            return Err(Error::Invalid(format!("tensor {} is not f32", self.name())));
        }
        let mut out = vec![0f32; self.nbytes() / 4];
        self.read(&mut out)?;
        Ok(out)
    }
}

/// Plain-old-data element types that may be copied to and from tensor memory.
///
/// # Safety
/// Implementors must have no padding and accept every bit pattern.
pub unsafe trait Pod: Copy + 'static {}
// SAFETY: primitive numeric types have no padding and no invalid bit patterns.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for i64 {}
// SAFETY: as above.
unsafe impl Pod for u16 {}
// SAFETY: as above.
unsafe impl Pod for u8 {}
// SAFETY: half's f16 is a transparent u16.
unsafe impl Pod for half::f16 {}
// SAFETY: half's bf16 is a transparent u16.
unsafe impl Pod for half::bf16 {}

/// Views a slice of plain values as bytes.
pub fn as_bytes<T: Pod>(values: &[T]) -> &[u8] {
    // SAFETY: T is Pod (no padding), so its bytes are initialised; the length is exact.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}
