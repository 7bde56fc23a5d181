//! Where a model runs: the device chosen through ggml's backend registry and
//! how many base layers are offloaded to it (llama.cpp's `-ngl`: the last N
//! layers; the micro decoder, merger and heads follow the last offloaded layer).

use ggml::{Device, DeviceKind};

use crate::arch::TensorName;
use crate::{Error, Result};

/// The `--device` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The first GPU in the registry, else the CPU.
    Auto,
    /// The CPU only.
    Cpu,
    /// A CUDA GPU.
    Cuda,
    /// Apple's Metal GPU.
    Metal,
}

impl DeviceChoice {
    /// Parses `auto`, `cpu`, `cuda` or `metal`.
    pub fn from_name(s: &str) -> Option<DeviceChoice> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Some(DeviceChoice::Auto),
            "cpu" => Some(DeviceChoice::Cpu),
            "cuda" => Some(DeviceChoice::Cuda),
            "metal" => Some(DeviceChoice::Metal),
            _ => None,
        }
    }
}

/// The GPU a choice resolves to (`None`: the CPU alone).
///
/// # Errors
/// When the backend asked for was not compiled in or has no device.
pub fn select(choice: DeviceChoice) -> Result<Option<Device>> {
    let gpus: Vec<Device> =
        Device::all().into_iter().filter(|d| matches!(d.kind(), DeviceKind::Gpu | DeviceKind::IntegratedGpu)).collect();
    let named = |backend: &str, feature: &str, compiled: bool| -> Result<Option<Device>> {
        if !compiled {
            return Err(Error::Invalid(format!(
                "--device {feature}: this build has no {backend} backend (rebuild with `cargo build --release --features {feature}`)"
            )));
        }
        gpus.iter()
            .find(|d| d.backend_name().eq_ignore_ascii_case(backend))
            .copied()
            .map(Some)
            .ok_or_else(|| Error::Invalid(format!("--device {feature}: the {backend} backend found no device")))
    };
    match choice {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::Auto => Ok(gpus.first().copied()),
        DeviceChoice::Cuda => named("CUDA", "cuda", cfg!(feature = "cuda")),
        DeviceChoice::Metal => named("Metal", "metal", cfg!(feature = "metal")),
    }
}

/// Every device of this build, one line each (`--list-devices`).
pub fn describe_devices() -> String {
    Device::all()
        .iter()
        .map(|d| {
            let (free, total) = d.memory();
            format!(
                "{} ({}): {} [{:?}], {} of {} MiB free\n",
                d.name(),
                d.backend_name(),
                d.description(),
                d.kind(),
                free >> 20,
                total >> 20
            )
        })
        .collect()
}

/// A model's placement: the GPU (if any) and how many base layers it holds.
#[derive(Debug, Clone, Copy)]
pub struct Offload {
    /// The GPU, or `None` for CPU only.
    pub gpu: Option<Device>,
    /// Base layers on the GPU (the last ones), capped at the layer count.
    pub n_gpu_layers: usize,
}

impl Offload {
    /// CPU only.
    pub fn cpu() -> Offload {
        Offload { gpu: None, n_gpu_layers: 0 }
    }

    /// The first offloaded base layer (`n_layer` when none is).
    pub fn first_gpu_layer(&self, n_layer: usize) -> usize {
        if self.gpu.is_some() {
            n_layer - self.n_gpu_layers.min(n_layer)
        } else {
            n_layer
        }
    }

    /// Whether tensor `name` lives on the GPU: offloaded base layers, and,
    /// once any layer is offloaded (the last one is then), everything after
    /// the base: final norm, lm_head, rope factors, merger, micro decoder and
    /// stop head. The token embedding (row lookups of the input) stays on the CPU.
    pub fn on_gpu(&self, name: TensorName, n_layer: usize) -> bool {
        let first = self.first_gpu_layer(n_layer);
        match name {
            TensorName::TokenEmbd => false,
            TensorName::Base(il, _) => il >= first,
            _ => first < n_layer,
        }
    }
}

/// Loads `path` on the device `choice` resolves to, with `n_gpu_layers` base
/// layers offloaded when it is a GPU (the binaries' `--device` / `-ngl`), and
/// CPU weights in repacked layouts when `repack`.
///
/// # Errors
/// As [`select`] and [`crate::Model::load_offloaded`].
pub fn load_model(
    path: &std::path::Path,
    choice: DeviceChoice,
    n_gpu_layers: usize,
    repack: bool,
) -> Result<crate::Model> {
    let gpu = select(choice)?;
    crate::Model::load_placed(path, Offload { gpu, n_gpu_layers: if gpu.is_some() { n_gpu_layers } else { 0 } }, repack)
}
