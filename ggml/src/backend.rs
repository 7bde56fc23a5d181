//! Devices, backends, backend buffers and the CPU thread pool.

use std::any::Any;
use std::ffi::{c_char, CStr};
use std::ptr::NonNull;
use std::rc::Rc;

use crate::log_bridge::capture_errors;
use crate::{sys, Context, Error, Result, Tensor};

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated strings owned by the registry (static).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// What kind of hardware a [`Device`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// A discrete GPU.
    Gpu,
    /// An integrated GPU.
    IntegratedGpu,
    /// An accelerator used alongside the CPU (BLAS, AMX...).
    Accelerator,
    /// Anything else.
    Other,
}

/// A device of ggml's backend registry (CPU, CUDA GPU, Metal GPU, ...).
/// Devices are owned by the registry and live for the whole program; two
/// handles are equal when they are the same registry entry.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Device(sys::ggml_backend_dev_t);

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

impl Device {
    /// Wraps a registry entry.
    pub(crate) fn from_raw(raw: sys::ggml_backend_dev_t) -> Device {
        Device(raw)
    }

    /// The registry entry.
    pub(crate) fn raw(&self) -> sys::ggml_backend_dev_t {
        self.0
    }

    /// Every device compiled into this build, in registry order.
    pub fn all() -> Vec<Device> {
        crate::init_logging();
        // SAFETY: the registry is initialised statically; indices are in range.
        (0..unsafe { sys::ggml_backend_dev_count() }).map(|i| Device(unsafe { sys::ggml_backend_dev_get(i) })).collect()
    }

    /// The device's short name (`CPU`, `CUDA0`, `Metal`...).
    pub fn name(&self) -> String {
        // SAFETY: the device handle is a registry entry, valid for the program.
        cstr(unsafe { sys::ggml_backend_dev_name(self.0) })
    }

    /// A human description (the GPU or CPU model).
    pub fn description(&self) -> String {
        // SAFETY: as in name().
        cstr(unsafe { sys::ggml_backend_dev_description(self.0) })
    }

    /// The name of the registry (backend family) the device belongs to (`CPU`, `CUDA`, `Metal`).
    pub fn backend_name(&self) -> String {
        // SAFETY: as in name(); the registry pointer is static too.
        cstr(unsafe { sys::ggml_backend_reg_name(sys::ggml_backend_dev_backend_reg(self.0)) })
    }

    /// Whether the device is an RPC server's (joined with [`crate::rpc::add_server`]).
    pub fn is_rpc(&self) -> bool {
        self.backend_name().as_bytes() == crate::rpc::BACKEND_NAME.to_bytes()
    }

    /// The device kind.
    pub fn kind(&self) -> DeviceKind {
        // SAFETY: as in name().
        match unsafe { sys::ggml_backend_dev_type(self.0) } {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
            sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accelerator,
            _ => DeviceKind::Other,
        }
    }

    /// Free and total memory in bytes.
    pub fn memory(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: as in name(); the out-pointers are valid.
        unsafe { sys::ggml_backend_dev_memory(self.0, &mut free, &mut total) };
        (free, total)
    }

    /// The device's default buffer type (device memory).
    pub fn buffer_type(&self) -> BufferType {
        // SAFETY: as in name().
        BufferType(unsafe { sys::ggml_backend_dev_buffer_type(self.0) })
    }

    /// Extra buffer types the device offers for weights (the CPU's repacked
    /// layouts, for example), in order of preference.
    pub fn extra_buffer_types(&self) -> Vec<BufferType> {
        type GetExtra = unsafe extern "C" fn(sys::ggml_backend_dev_t) -> *mut sys::ggml_backend_buffer_type_t;
        // SAFETY: as in name(); the name is NUL-terminated.
        let reg = unsafe { sys::ggml_backend_dev_backend_reg(self.0) };
        // SAFETY: looks up an optional function by name in a live registry.
        let f = unsafe { sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_dev_get_extra_bufts".as_ptr()) };
        if f.is_null() {
            return Vec::new();
        }
        // SAFETY: ggml documents this proc address with exactly this signature.
        let f: GetExtra = unsafe { std::mem::transmute(f) };
        let mut out = Vec::new();
        // SAFETY: the function returns a null-terminated static array of buffer types.
        unsafe {
            let mut p = f(self.0);
            while !p.is_null() && !(*p).is_null() {
                out.push(BufferType(*p));
                p = p.add(1);
            }
        }
        out
    }

    /// Whether the device can run the operation that produces `op`.
    pub fn supports_op(&self, op: &Tensor) -> bool {
        // SAFETY: the device is static and the tensor header live.
        unsafe { sys::ggml_backend_dev_supports_op(self.0, op.raw()) }
    }

    /// Whether a weight of type `ty` and shape `ne` stored in a buffer of type
    /// `buft` can feed `op` on this device (how llama.cpp picks the CPU's
    /// repacked layouts: only some types, shapes and ops have kernels).
    pub fn supports_weight(&self, buft: BufferType, ty: crate::Type, ne: &[i64], op: WeightOp) -> bool {
        let Ok(ctx) = Context::new(4, 0) else { return false };
        let w = ctx.new_tensor(ty, ne);
        let probe = match op {
            WeightOp::MulMat => ctx.mul_mat(&w, &ctx.new_tensor(crate::Type::F32, &[ne[0], 512])),
            WeightOp::GetRows => ctx.get_rows(&w, &ctx.new_tensor(crate::Type::I32, &[512])),
        };
        let Ok(dummy) = Buffer::alloc(buft, 0) else { return false };
        // SAFETY: the probe tensor borrows the (zero-size) buffer only for the
        // support query; it is detached before either is freed and holds no data.
        unsafe { (*w.raw()).buffer = dummy.raw() };
        let ok = self.supports_op(&probe);
        // SAFETY: as above.
        unsafe { (*w.raw()).buffer = std::ptr::null_mut() };
        ok
    }
}

/// The operation a weight feeds, for [`Device::supports_weight`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightOp {
    /// A matrix product (projections, lm_head).
    MulMat,
    /// A row lookup (the token embedding).
    GetRows,
}

/// A buffer type (where a buffer's memory lives and how tensors are laid out in it).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BufferType(pub(crate) sys::ggml_backend_buffer_type_t);

impl std::fmt::Debug for BufferType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferType({})", self.name())
    }
}

impl BufferType {
    /// The host (CPU) buffer type.
    pub fn cpu() -> BufferType {
        // SAFETY: returns a static buffer type.
        BufferType(unsafe { sys::ggml_backend_cpu_buffer_type() })
    }

    /// The buffer type's name.
    pub fn name(&self) -> String {
        // SAFETY: buffer types are static.
        cstr(unsafe { sys::ggml_backend_buft_name(self.0) })
    }

    /// Bytes a tensor takes in a buffer of this type (repacked layouts may differ).
    pub fn alloc_size(&self, t: &Tensor) -> usize {
        // SAFETY: both are live.
        unsafe { sys::ggml_backend_buft_get_alloc_size(self.0, t.raw()) }
    }

    pub(crate) fn raw(&self) -> sys::ggml_backend_buffer_type_t {
        self.0
    }
}

struct BufferInner {
    ptr: NonNull<sys::ggml_backend_buffer>,
    _owner: Option<Rc<dyn Any>>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        // SAFETY: freed once; tensors placed in the buffer keep this value alive
        // through their context's keep-alive list.
        unsafe { sys::ggml_backend_buffer_free(self.ptr.as_ptr()) }
    }
}

/// A backend buffer: memory on a device that tensors are placed in.
#[derive(Clone)]
pub struct Buffer(Rc<BufferInner>);

impl Buffer {
    /// Allocates one buffer of type `buft` holding every tensor of `ctx`, and
    /// places them in it.
    ///
    /// # Errors
    /// When the device is out of memory.
    pub fn alloc_context(ctx: &Context, buft: BufferType) -> Result<Buffer> {
        // SAFETY: ctx is live and holds only unallocated tensors (no_alloc context).
        let (ptr, _why) =
            capture_errors(|| unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.raw(), buft.raw()) });
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::Alloc {
            buffer_type: buft.name(),
            size: ctx.tensors().iter().map(|t| buft.alloc_size(t)).sum(),
        })?;
        let buf = Buffer(Rc::new(BufferInner { ptr, _owner: None }));
        ctx.keep(buf.0.clone());
        Ok(buf)
    }

    /// An empty buffer of `size` bytes of type `buft`.
    ///
    /// # Errors
    /// When the device is out of memory.
    pub fn alloc(buft: BufferType, size: usize) -> Result<Buffer> {
        // SAFETY: plain allocation call.
        let (ptr, _why) = capture_errors(|| unsafe { sys::ggml_backend_buft_alloc_buffer(buft.raw(), size) });
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::Alloc { buffer_type: buft.name(), size })?;
        Ok(Buffer(Rc::new(BufferInner { ptr, _owner: None })))
    }

    /// A CPU buffer over host memory owned by `owner` (a memory map, say), so
    /// tensors can use it without a copy.
    ///
    /// # Errors
    /// When ggml rejects the range.
    pub fn from_host_memory<T: AsRef<[u8]> + 'static>(owner: Rc<T>) -> Result<Buffer> {
        let bytes = (*owner).as_ref();
        // SAFETY: the memory stays valid as long as `owner`, which the buffer keeps
        // alive; ggml only reads through the pointer (weights are never written).
        let ptr = unsafe { sys::ggml_backend_cpu_buffer_from_ptr(bytes.as_ptr() as *mut _, bytes.len()) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::Alloc { buffer_type: "CPU (host pointer)".into(), size: bytes.len() })?;
        Ok(Buffer(Rc::new(BufferInner { ptr, _owner: Some(owner) })))
    }

    fn raw(&self) -> *mut sys::ggml_backend_buffer {
        self.0.ptr.as_ptr()
    }

    /// Buffer size in bytes.
    pub fn size(&self) -> usize {
        // SAFETY: the buffer is live.
        unsafe { sys::ggml_backend_buffer_get_size(self.raw()) }
    }

    /// Marks the buffer as holding weights (schedulers then run ops on its device).
    pub fn set_weights_usage(&self) {
        // SAFETY: the buffer is live.
        unsafe { sys::ggml_backend_buffer_set_usage(self.raw(), sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS) }
    }

    /// Fills the whole buffer with `value`.
    pub fn clear(&self, value: u8) {
        // SAFETY: the buffer is live.
        unsafe { sys::ggml_backend_buffer_clear(self.raw(), value) }
    }

    /// Places the (unallocated) tensor `t` at byte `offset` of this buffer.
    ///
    /// # Errors
    /// When `t` already has memory or does not fit at `offset`.
    pub fn place(&self, t: &Tensor, offset: usize) -> Result<()> {
        if t.is_allocated() {
            return Err(Error::Invalid(format!("tensor {} is already allocated", t.name())));
        }
        // SAFETY: the buffer is live.
        let (base, size) = unsafe { (sys::ggml_backend_buffer_get_base(self.raw()) as usize, self.size()) };
        // SAFETY: both are live.
        let need = unsafe { sys::ggml_backend_buffer_get_alloc_size(self.raw(), t.raw()) };
        if offset.checked_add(need).is_none_or(|end| end > size) {
            return Err(Error::Invalid(format!(
                "tensor {} ({need} bytes at offset {offset}) does not fit in a {size}-byte buffer",
                t.name()
            )));
        }
        // SAFETY: the address lies inside the buffer with room for the tensor (checked above).
        let status = unsafe { sys::ggml_backend_tensor_alloc(self.raw(), t.raw(), (base + offset) as *mut _) };
        if status != sys::GGML_STATUS_SUCCESS {
            return Err(Error::Invalid(format!("could not place tensor {}", t.name())));
        }
        // The tensor's context must keep this buffer alive.
        let owner: Rc<dyn Any> = self.0.clone();
        crate::Context(t.ctx.clone()).keep(owner);
        Ok(())
    }
}

/// A compute backend (one device's executor).
pub struct Backend {
    ptr: NonNull<sys::ggml_backend>,
    device: Device,
    threadpool: std::cell::RefCell<Option<Rc<ThreadPool>>>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: freed once; schedulers hold Rc<Backend>, so none outlives it.
        unsafe { sys::ggml_backend_free(self.ptr.as_ptr()) }
    }
}

impl Backend {
    /// Initialises a backend on `device`.
    ///
    /// # Errors
    /// When the device cannot be initialised.
    pub fn new(device: Device) -> Result<Backend> {
        // SAFETY: the device is a registry entry; a null params string is allowed.
        let ptr = unsafe { sys::ggml_backend_dev_init(device.0, std::ptr::null()) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::BackendInit(device.name()))?;
        Ok(Backend { ptr, device, threadpool: Default::default() })
    }

    /// The CPU backend.
    ///
    /// # Errors
    /// When the CPU backend cannot be initialised (never in practice).
    pub fn cpu() -> Result<Backend> {
        let dev = Device::all()
            .into_iter()
            .find(|d| d.kind() == DeviceKind::Cpu)
            .ok_or_else(|| Error::BackendInit("CPU".into()))?;
        Backend::new(dev)
    }

    pub(crate) fn raw(&self) -> sys::ggml_backend_t {
        self.ptr.as_ptr()
    }

    /// The backend's device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether this is the CPU backend.
    pub fn is_cpu(&self) -> bool {
        self.device.kind() == DeviceKind::Cpu
    }

    /// Sets the CPU backend's thread count (no-op on other backends).
    pub fn set_n_threads(&self, n: usize) {
        if self.is_cpu() {
            // SAFETY: this is a live CPU backend.
            unsafe { sys::ggml_backend_cpu_set_n_threads(self.raw(), n as i32) }
        }
    }

    /// Makes the CPU backend run on a persistent thread pool instead of starting
    /// threads for every graph (no-op on other backends).
    pub fn set_threadpool(&self, pool: Rc<ThreadPool>) {
        if self.is_cpu() {
            // SAFETY: live CPU backend and pool; the backend keeps the pool alive.
            unsafe { sys::ggml_backend_cpu_set_threadpool(self.raw(), pool.ptr.as_ptr()) };
            *self.threadpool.borrow_mut() = Some(pool);
        }
    }

    /// Puts the CPU backend's pool workers to sleep now (no-op elsewhere): see [`ThreadPool::pause`].
    pub fn pause_threads(&self) {
        if let Some(pool) = self.threadpool.borrow().as_ref() {
            pool.pause();
        }
    }

    /// Waits for queued work to finish.
    pub fn synchronize(&self) {
        // SAFETY: the backend is live.
        unsafe { sys::ggml_backend_synchronize(self.raw()) }
    }
}

/// A persistent pool of CPU worker threads.
pub struct ThreadPool {
    pub(crate) ptr: NonNull<sys::ggml_threadpool>,
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        // SAFETY: freed once; backends using it hold an Rc.
        unsafe { sys::ggml_threadpool_free(self.ptr.as_ptr()) }
    }
}

impl ThreadPool {
    /// A pool of `n_threads` threads.
    ///
    /// # Errors
    /// When the threads cannot be started.
    pub fn new(n_threads: usize) -> Result<ThreadPool> {
        // SAFETY: initialises a params struct in place.
        let mut params = unsafe { sys::ggml_threadpool_params_default(n_threads as i32) };
        // SAFETY: params is a valid, initialised struct.
        let ptr = unsafe { sys::ggml_threadpool_new(&mut params) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::BackendInit("CPU thread pool".into()))?;
        Ok(ThreadPool { ptr })
    }

    /// Puts the workers to sleep now. After a graph they otherwise spin
    /// polling for the next one (about 6.5 million pause instructions each,
    /// a good part of a second on some CPUs), which is what makes decode
    /// latency low but steals cores from anything else that runs meanwhile:
    /// another engine being measured, say. The next graph wakes them.
    pub fn pause(&self) {
        // SAFETY: the pool is live; pausing an idle or paused pool is allowed.
        unsafe { sys::ggml_threadpool_pause(self.ptr.as_ptr()) }
    }
}
