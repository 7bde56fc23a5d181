//! ggml's RPC backend, as llama.cpp's `--rpc` and `rpc-server` use it: remote
//! machines' devices joined to the backend registry (the scheduler then
//! places layers on them like on a local GPU), and the server that exposes
//! this machine's devices. Its functions are reached through the registry's
//! `ggml_backend_reg_get_proc_address`, so a build without the backend
//! (`GGML_RPC=OFF`) still links and says so at run time.

use std::ffi::{c_char, CString};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use crate::{sys, Device, Error, Result};

/// The name of the RPC backend's registry, which its devices report as
/// their backend name.
pub const BACKEND_NAME: &std::ffi::CStr = c"RPC";

/// How long a first connection to an RPC server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The registry of the RPC backend, if this build has one.
fn rpc_reg() -> Result<sys::ggml_backend_reg_t> {
    crate::init_logging();
    // SAFETY: the name is NUL-terminated; the registry is initialised statically.
    let reg = unsafe { sys::ggml_backend_reg_by_name(BACKEND_NAME.as_ptr()) };
    if reg.is_null() {
        return Err(Error::Invalid("this build has no RPC backend (build with GGML_RPC=ON)".into()));
    }
    Ok(reg)
}

/// Looks up the RPC backend's function `name`.
fn proc_address(name: &std::ffi::CStr) -> Result<*mut std::ffi::c_void> {
    let reg = rpc_reg()?;
    // SAFETY: a live registry and a NUL-terminated name.
    let f = unsafe { sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr()) };
    if f.is_null() {
        return Err(Error::Invalid(format!("the RPC backend lacks {}", name.to_string_lossy())));
    }
    Ok(f)
}

/// Checks that `endpoint` (`HOST:PORT`) accepts connections: ggml's RPC client
/// aborts the process when it cannot connect, so it is never handed an
/// endpoint that does not answer.
fn reachable(endpoint: &str) -> Result<()> {
    let bad = |why: String| Error::Invalid(format!("RPC server {endpoint}: {why}"));
    let addrs: Vec<_> =
        endpoint.to_socket_addrs().map_err(|e| bad(format!("not a HOST:PORT address ({e})")))?.collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(bad(last.map_or_else(|| "no address".into(), |e| format!("cannot connect ({e})"))))
}

/// The devices of each endpoint already joined, so a second call adds nothing
/// twice. Device handles are registry entries valid for the whole program,
/// kept as addresses so the static is `Send`.
static JOINED: Mutex<Vec<(String, Vec<usize>)>> = Mutex::new(Vec::new());

/// Joins the devices of the RPC server at `endpoint` (`HOST:PORT`) to the
/// backend registry and returns them (the same ones on a repeated call).
///
/// # Errors
/// When this build has no RPC backend, the endpoint does not parse or answer,
/// or the server offers no device.
pub fn add_server(endpoint: &str) -> Result<Vec<Device>> {
    let mut joined = JOINED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, devs)) = joined.iter().find(|(e, _)| e == endpoint) {
        return Ok(devs.iter().map(|&d| Device::from_raw(d as sys::ggml_backend_dev_t)).collect());
    }
    type AddServer = unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t;
    let f = proc_address(c"ggml_backend_rpc_add_server")?;
    reachable(endpoint)?;
    let c = CString::new(endpoint).map_err(|_| Error::Invalid(format!("RPC server {endpoint:?}: NUL in address")))?;
    // SAFETY: ggml documents this proc address with exactly this signature.
    let add: AddServer = unsafe { std::mem::transmute(f) };
    // SAFETY: a NUL-terminated endpoint; the returned registry lives for the program.
    let reg = unsafe { add(c.as_ptr()) };
    if reg.is_null() {
        return Err(Error::Invalid(format!("RPC server {endpoint} offers no devices")));
    }
    // SAFETY: a live registry; indices are in range; registering makes its
    // devices part of the global list, as llama.cpp's --rpc does.
    let devices: Vec<Device> = unsafe {
        sys::ggml_backend_register(reg);
        (0..sys::ggml_backend_reg_dev_count(reg))
            .map(|i| Device::from_raw(sys::ggml_backend_reg_dev_get(reg, i)))
            .collect()
    };
    joined.push((endpoint.to_string(), devices.iter().map(|d| d.raw() as usize).collect()));
    Ok(devices)
}

/// Serves `devices` to RPC clients on `endpoint` (`HOST:PORT`) until the
/// process ends; CPU devices compute with `n_threads` threads, and tensors
/// sent by hash are cached in `cache_dir` when given.
///
/// # Errors
/// When this build has no RPC backend or an argument holds a NUL.
pub fn serve(endpoint: &str, cache_dir: Option<&Path>, n_threads: usize, devices: &[Device]) -> Result<()> {
    type StartServer = unsafe extern "C" fn(*const c_char, *const c_char, usize, usize, *mut sys::ggml_backend_dev_t);
    let f = proc_address(c"ggml_backend_rpc_start_server")?;
    let nul = |what: &str| Error::Invalid(format!("{what} holds a NUL byte"));
    let ep = CString::new(endpoint).map_err(|_| nul("the address"))?;
    let cache = cache_dir
        .map(|d| CString::new(d.as_os_str().as_encoded_bytes()).map_err(|_| nul("the cache directory")))
        .transpose()?;
    let mut devs: Vec<sys::ggml_backend_dev_t> = devices.iter().map(|d| d.raw()).collect();
    // SAFETY: ggml documents this proc address with exactly this signature.
    let start: StartServer = unsafe { std::mem::transmute(f) };
    // SAFETY: NUL-terminated strings and a device array that outlive the call
    // (it returns only when the server stops).
    unsafe {
        start(
            ep.as_ptr(),
            cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            n_threads,
            devs.len(),
            devs.as_mut_ptr(),
        )
    };
    Ok(())
}
