//! The GPU a GPU test runs on: the first GPU of this build (CUDA, Metal or
//! Vulkan; in CI, Mesa's lavapipe through Vulkan), named by its `--device`
//! value, and models opened with layers on it.

use std::path::Path;

use hamburger::{DeviceChoice, LoadOptions, Model};

/// Why the GPU tests are ignored, and how to run them.
pub const NEEDS_GPU: &str =
    "needs a GPU: cargo test --release --features vulkan (or cuda, metal) --test integration -- --ignored gpu::; \
     on Mesa's lavapipe with GGML_VK_VISIBLE_DEVICES=0";

/// The `--device` choice naming the first GPU of this build and machine
/// (`cuda`, `metal` or `vulkan`), so tests exercise the named backend's path.
///
/// # Panics
/// Where this build or machine has no GPU: the GPU tests fail there, never pass.
pub fn gpu_choice() -> DeviceChoice {
    let gpu = DeviceChoice::Auto.gpu().unwrap();
    let gpu = gpu.unwrap_or_else(|| panic!("no GPU backend in this build or no GPU on this machine ({NEEDS_GPU})"));
    gpu.backend_name().parse().unwrap()
}

/// The `--device` value of [`gpu_choice`] (`cuda`, `metal` or `vulkan`).
pub fn gpu_flag() -> String {
    format!("{:?}", gpu_choice()).to_ascii_lowercase()
}

/// Opens `gguf` with its last `ngl` base layers (and what follows them) on
/// the first GPU ([`gpu_choice`]).
///
/// # Panics
/// Where there is none, or the model does not open: a test failure.
pub fn on_gpu(gguf: &Path, ngl: usize) -> Model {
    let options = LoadOptions { device: gpu_choice(), n_gpu_layers: ngl, ..Default::default() };
    let model = Model::open(gguf, &options).unwrap();
    assert!(model.plan.gpu().is_some(), "{NEEDS_GPU}");
    model
}

/// The worst departures (logit, p_stop) from the golden file of an F32
/// conversion with an F32 cache on ggml-vulkan, measured on Mesa's lavapipe
/// at `-ngl` 0, 8 and 16 with its F16 arithmetic on: the worst of Mesa
/// 22.3.6 (all 18 cases) and 25.0.7, which CI runs (docs/gpu.md).
/// The prompt-sized products hold their operands in F16.
pub const VULKAN_F32_DEPARTURES: (f32, f32) = (3.52e-2, 3.77e-3);

/// The same for an F16 conversion with an F16 cache and flash attention,
/// where ggml-vulkan's prompt-sized products also accumulate in F16.
pub const VULKAN_F16_DEPARTURES: (f32, f32) = (3.23e-1, 1.13e-2);

/// The golden tolerances (logit, p_stop) of a model of type `ty` on
/// `backend`'s GPU: twice the departures of that arithmetic. F32 on CUDA
/// (and Metal, not measured) rounds prompt-sized products' operands to 10
/// bits as TF32 does, emulated on the CPU ([`crate::golden::tf32_emulation`]);
/// F32 on Vulkan and F16 anywhere take lavapipe's measured departures
/// (F16 accumulation on CUDA and Metal not measured).
pub fn golden_tolerances(backend: DeviceChoice, ty: ggml::Type) -> (f32, f32) {
    let (logit, stop) = match (backend, ty) {
        (DeviceChoice::Vulkan, ggml::Type::F32) => VULKAN_F32_DEPARTURES,
        (_, ggml::Type::F32) => {
            let (logit, stop) = crate::golden::tf32_emulation();
            (logit.diff, stop.diff)
        }
        _ => VULKAN_F16_DEPARTURES,
    };
    (2.0 * logit, 2.0 * stop)
}
