//! Where a model runs, decided once: the device chosen through ggml's backend
//! registry, how many base layers are offloaded to it (llama.cpp's `-ngl`: the
//! last N layers; the merger, micro decoder and heads follow the last
//! offloaded layer), and which CPU buffer types weights may use. The
//! [`PlacementPlan`] answers for every weight and every cache layer, and makes
//! the backends a computation runs on.

use std::rc::Rc;

use ggml::{Backend, BufferType, Device, DeviceKind, WeightOp};

use crate::arch::TensorName;
use crate::{threads, Error, Result};

/// The `--device` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The first GPU in the registry, else the CPU.
    Auto,
    /// The CPU only.
    #[default]
    Cpu,
    /// A CUDA GPU.
    Cuda,
    /// Apple's Metal GPU.
    Metal,
}

impl std::str::FromStr for DeviceChoice {
    type Err = Error;

    /// Parses `auto`, `cpu`, `cuda` or `metal` (any case).
    fn from_str(s: &str) -> Result<DeviceChoice> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda),
            "metal" => Ok(DeviceChoice::Metal),
            _ => Err(Error::Invalid(format!("--device {s}: expected auto, cpu, cuda or metal"))),
        }
    }
}

/// The GPU a choice resolves to (`None`: the CPU alone).
///
/// # Errors
/// When the backend asked for was not compiled in or has no device.
fn select(choice: DeviceChoice) -> Result<Option<Device>> {
    let gpus: Vec<Device> =
        Device::all().into_iter().filter(|d| matches!(d.kind(), DeviceKind::Gpu | DeviceKind::IntegratedGpu)).collect();
    let named = |backend: &str, feature: &str, compiled: bool| -> Result<Option<Device>> {
        if !compiled {
            return Err(Error::Invalid(format!(
                "--device {feature}: this build has no {backend} backend (rebuild with `cargo build --release --workspace --features {feature}`)"
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

/// Where one weight's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the memory-mapped file (host memory, no copy).
    Mapped,
    /// Copied into a buffer of this type (a GPU's, or the CPU's repacked layouts).
    Buffer(BufferType),
}

/// The placement of one model, built once at load from (device choice,
/// offloaded layers, repack, layer count) and asked for every weight's and
/// cache layer's buffer type.
#[derive(Debug, Clone)]
pub struct PlacementPlan {
    gpu: Option<Device>,
    cpu: Option<Device>,
    /// The CPU's extra (repacked) buffer types weights may use.
    repack: Vec<BufferType>,
    /// The first base layer on the GPU (`n_layer` when none is).
    first_gpu_layer: usize,
    n_layer: usize,
}

impl PlacementPlan {
    /// The plan of a model of `n_layer` base layers: `device` resolved, its
    /// last `n_gpu_layers` layers offloaded when it is a GPU, CPU matrices in
    /// repacked layouts when `repack` (llama.cpp's default).
    ///
    /// # Errors
    /// When the device asked for was not compiled in or has no device.
    pub fn new(device: DeviceChoice, n_gpu_layers: usize, repack: bool, n_layer: usize) -> Result<PlacementPlan> {
        let gpu = select(device)?;
        let cpu = Device::all().into_iter().find(|d| d.kind() == DeviceKind::Cpu);
        let repack = match (&cpu, repack) {
            (Some(d), true) => d.extra_buffer_types(),
            _ => Vec::new(),
        };
        let first_gpu_layer = if gpu.is_some() { n_layer - n_gpu_layers.min(n_layer) } else { n_layer };
        Ok(PlacementPlan { gpu, cpu, repack, first_gpu_layer, n_layer })
    }

    /// The GPU, if the plan uses one.
    pub fn gpu(&self) -> Option<Device> {
        self.gpu
    }

    /// Base layers on the GPU.
    pub fn n_gpu_layers(&self) -> usize {
        self.n_layer - self.first_gpu_layer
    }

    /// Whether tensor `name` lives on the GPU: offloaded base layers, and,
    /// once any layer is offloaded (the last one is then), everything after
    /// the base: final norm, lm_head, rope factors, merger, micro decoder and
    /// stop head. The token embedding (row lookups of the input) stays on the CPU.
    fn on_gpu(&self, name: TensorName) -> bool {
        match name {
            TensorName::TokenEmbd => false,
            TensorName::Base(il, _) => il >= self.first_gpu_layer,
            _ => self.first_gpu_layer < self.n_layer,
        }
    }

    /// Where weight `name` of type `ty` and shape `ne` goes. On the CPU,
    /// matrix-product weights go to the first repacked buffer type that has a
    /// kernel for them; everything else stays on the mapped file. The token
    /// embedding is read by row lookups (and is the tied lm_head), so it stays
    /// mapped, as in llama.cpp.
    pub fn weight(&self, name: TensorName, ty: ggml::Type, ne: &[i64]) -> Placement {
        if let Some(gpu) = self.gpu.filter(|_| self.on_gpu(name)) {
            return Placement::Buffer(gpu.buffer_type());
        }
        let matrix = ne.len() == 2 && ne[1] > 1 && name != TensorName::TokenEmbd;
        match &self.cpu {
            Some(dev) if matrix => self
                .repack
                .iter()
                .find(|b| dev.supports_weight(**b, ty, ne, WeightOp::MulMat))
                .map_or(Placement::Mapped, |b| Placement::Buffer(*b)),
            _ => Placement::Mapped,
        }
    }

    fn buffer_type(&self, on_gpu: bool) -> BufferType {
        self.gpu.filter(|_| on_gpu).map_or_else(BufferType::cpu, |d| d.buffer_type())
    }

    /// The buffer type of base layer `il`'s KV cache: the device of its weights.
    pub fn cache_layer(&self, il: usize) -> BufferType {
        self.buffer_type(il >= self.first_gpu_layer)
    }

    /// The buffer type of what follows the base (the micro decoder's cache and
    /// the features): the device of the last base layer.
    pub fn tail(&self) -> BufferType {
        self.buffer_type(self.first_gpu_layer < self.n_layer)
    }

    /// The backends a computation runs on, the GPU (if any) first since the
    /// scheduler prefers earlier backends, then the CPU with `n_threads`
    /// threads of this thread's shared pool.
    ///
    /// # Errors
    /// When a backend cannot be created.
    pub fn backends(&self, n_threads: usize) -> Result<Vec<Rc<Backend>>> {
        let cpu = Backend::cpu()?;
        cpu.set_n_threads(n_threads);
        cpu.set_threadpool(threads::shared_pool(n_threads)?);
        let mut backends = Vec::new();
        if let Some(dev) = self.gpu {
            backends.push(Rc::new(Backend::new(dev)?));
        }
        backends.push(Rc::new(cpu));
        Ok(backends)
    }
}
