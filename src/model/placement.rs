//! Where a model runs, decided once: the local device chosen through ggml's
//! backend registry, the devices of RPC servers on other machines, how many
//! base layers are offloaded and how they are split among those devices
//! (llama.cpp's `-ngl` and `--tensor-split`: the last N layers; the micro
//! decoder and heads follow the last offloaded layer unless kept local, the
//! merger sits with the first base layer, which it feeds), and which CPU
//! buffer types weights may use. The [`PlacementPlan`]
//! answers for every weight and every cache layer, and makes the backends a
//! computation runs on.

use std::rc::Rc;

use ggml::{Backend, BufferType, Device, DeviceKind, WeightOp};

use crate::error::{Error, Result};
use crate::error::{Param, ParamError};
use crate::model::arch::{TensorName, TensorUse};
use crate::model::threads;

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
    /// A Vulkan GPU (laptops' integrated Intel and AMD GPUs; Mesa's lavapipe
    /// when `GGML_VK_VISIBLE_DEVICES` names it).
    Vulkan,
}

impl std::str::FromStr for DeviceChoice {
    type Err = Error;

    /// Parses `auto`, `cpu`, `cuda`, `metal` or `vulkan` (any case).
    fn from_str(s: &str) -> Result<DeviceChoice> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda),
            "metal" => Ok(DeviceChoice::Metal),
            "vulkan" => Ok(DeviceChoice::Vulkan),
            _ => Err(device_error(format!("{s}: expected auto, cpu, cuda, metal or vulkan"))),
        }
    }
}

impl DeviceChoice {
    /// The backend a named GPU choice asks for: its name in ggml's registry,
    /// the Cargo feature that builds it, and whether this build has it
    /// (`None` for auto and cpu).
    fn backend(self) -> Option<(&'static str, &'static str, bool)> {
        match self {
            DeviceChoice::Auto | DeviceChoice::Cpu => None,
            DeviceChoice::Cuda => Some(("CUDA", "cuda", cfg!(feature = "cuda"))),
            DeviceChoice::Metal => Some(("Metal", "metal", cfg!(feature = "metal"))),
            DeviceChoice::Vulkan => Some(("Vulkan", "vulkan", cfg!(feature = "vulkan"))),
        }
    }

    /// The local GPU this choice resolves to (`None`: the CPU alone): auto
    /// takes the first GPU of ggml's registry (devices of RPC servers, which
    /// come from `--rpc`, aside), a named backend its first GPU.
    ///
    /// # Errors
    /// When the backend asked for was not compiled in, or has no device.
    pub fn gpu(self) -> Result<Option<Device>> {
        let mut gpus = Device::all()
            .into_iter()
            .filter(|d| matches!(d.kind(), DeviceKind::Gpu | DeviceKind::IntegratedGpu) && !d.is_rpc());
        let Some((backend, feature, compiled)) = self.backend() else {
            return Ok(if self == DeviceChoice::Auto { gpus.next() } else { None });
        };
        if !compiled {
            return Err(device_error(format!(
                "{feature}: this build has no {backend} backend (rebuild with `cargo build --release --workspace --features {feature}`)"
            )));
        }
        // ggml-vulkan lists a CPU-type device (Mesa's lavapipe/llvmpipe) only
        // when GGML_VK_VISIBLE_DEVICES names it: say so.
        let hint = match (self, std::env::var("GGML_VK_VISIBLE_DEVICES")) {
            (DeviceChoice::Vulkan, Ok(v)) => format!(" (no Vulkan driver, or GGML_VK_VISIBLE_DEVICES={v} names no GPU it drives)"),
            (DeviceChoice::Vulkan, Err(_)) => " (no Vulkan driver for a GPU here; a software renderer such as Mesa's lavapipe is used only when GGML_VK_VISIBLE_DEVICES names it, e.g. GGML_VK_VISIBLE_DEVICES=0)".to_string(),
            _ => String::new(),
        };
        gpus.find(|d| d.backend_name().eq_ignore_ascii_case(backend))
            .map(Some)
            .ok_or_else(|| device_error(format!("{feature}: the {backend} backend found no GPU{hint}")))
    }
}

/// A refused device choice, naming the parameter (front-ends name their flag).
fn device_error(what: String) -> Error {
    ParamError::new(&[Param::Device], format!("{} {what}", Param::Device)).into()
}

/// Where one weight's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the memory-mapped file (host memory, no copy).
    Mapped,
    /// Copied into a buffer of this type (a GPU's, or the CPU's repacked layouts).
    Buffer(BufferType),
}

/// How to place a model: the device, the remote devices, the offloaded layers
/// and their split, and whether CPU weights may use repacked layouts (the
/// binaries' `--device`, `--rpc`, `-ngl`, `--tensor-split`, `--micro-local`
/// and `--no-repack`).
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The local device choice (the default is the CPU).
    pub device: DeviceChoice,
    /// RPC servers (`HOST:PORT`) whose devices join the offload devices, before the local GPU.
    pub rpc: Vec<String>,
    /// Base layers to offload (the last ones), shared among the offload devices.
    pub n_gpu_layers: usize,
    /// The share of the offloaded layers each offload device takes (empty: equal shares).
    pub tensor_split: Vec<f32>,
    /// Keep the micro decoder and heads on this machine's CPU instead
    /// of the device of the last base layer (each micro step then stays local
    /// when that device is remote).
    pub micro_local: bool,
    /// Whether CPU matrices may be copied into repacked layouts (llama.cpp's default: yes).
    pub repack: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: DeviceChoice::Cpu,
            rpc: Vec::new(),
            n_gpu_layers: 0,
            tensor_split: Vec::new(),
            micro_local: false,
            repack: true,
        }
    }
}

/// The placement of one model, built once at load from its [`LoadOptions`]
/// and layer count, and asked for every weight's and cache layer's buffer type.
///
/// Offload devices are the RPC servers' devices (in `--rpc` order), then the
/// local GPU. The last `n_gpu_layers` base layers are offloaded, split among
/// them in order by `tensor_split` (llama.cpp's rule); the base layers before
/// stay on the CPU. The token embedding stays on the CPU (row lookups).
#[derive(Debug, Clone)]
pub struct PlacementPlan {
    /// Offload devices, in layer order.
    devices: Vec<Device>,
    /// Each base layer's offload device (index into `devices`), `None` for the CPU.
    layer_device: Vec<Option<usize>>,
    /// The device of the micro decoder and heads.
    tail_device: Option<usize>,
    cpu: Option<Device>,
    /// The CPU's extra (repacked) buffer types weights may use.
    repack: Vec<BufferType>,
}

impl PlacementPlan {
    /// The plan of a model of `n_layer` base layers.
    ///
    /// # Errors
    /// When the device asked for was not compiled in or has no device, an RPC
    /// server cannot be joined, or the split does not match the devices.
    pub fn new(options: &LoadOptions, n_layer: usize) -> Result<PlacementPlan> {
        let mut devices = Vec::new();
        for endpoint in &options.rpc {
            devices.extend(ggml::rpc::add_server(endpoint)?);
        }
        devices.extend(options.device.gpu()?);
        let split = shares(&options.tensor_split, devices.len())?;
        let n_off = if devices.is_empty() { 0 } else { options.n_gpu_layers.min(n_layer) };
        let first = n_layer - n_off;
        // Offloaded layer j goes to the first device whose cumulative share covers it.
        let layer_device: Vec<Option<usize>> = (0..n_layer)
            .map(|il| {
                (il >= first).then(|| {
                    let at = (il - first) as f64 + 0.5;
                    split.iter().position(|&end| at < end * n_off as f64).unwrap_or(devices.len() - 1)
                })
            })
            .collect();
        let tail_device = if options.micro_local { None } else { layer_device.last().copied().flatten() };
        let cpu = Device::all().into_iter().find(|d| d.kind() == DeviceKind::Cpu);
        let repack = match (&cpu, options.repack) {
            (Some(d), true) => d.extra_buffer_types(),
            _ => Vec::new(),
        };
        Ok(PlacementPlan { devices, layer_device, tail_device, cpu, repack })
    }

    /// The offload devices, in layer order (the RPC servers' in `--rpc` order,
    /// then the local GPU; empty: the CPU alone). A libllama baseline given
    /// exactly these runs where we run.
    pub fn offload_devices(&self) -> &[Device] {
        &self.devices
    }

    /// The local GPU, if the plan uses one.
    pub fn gpu(&self) -> Option<Device> {
        self.devices.iter().copied().find(|d| !d.is_rpc())
    }

    /// The device of the micro decoder and heads (`None`: the CPU).
    pub fn tail_device(&self) -> Option<Device> {
        self.tail_device.map(|i| self.devices[i])
    }

    /// Whether every layer and the micro decoder run on this machine's CPU.
    pub fn cpu_only(&self) -> bool {
        self.n_gpu_layers() == 0 && self.tail_device.is_none()
    }

    /// Base layers offloaded (to any device).
    pub fn n_gpu_layers(&self) -> usize {
        self.layer_device.iter().filter(|d| d.is_some()).count()
    }

    /// Base layers on each place: the CPU (`None`) and each offload device.
    pub fn layer_counts(&self) -> Vec<(Option<Device>, usize)> {
        let on = |d: Option<usize>| self.layer_device.iter().filter(|&&x| x == d).count();
        std::iter::once((None, on(None)))
            .chain(self.devices.iter().enumerate().map(|(i, d)| (Some(*d), on(Some(i)))))
            .collect()
    }

    /// One line: the base layers on each place, and where the tail runs
    /// (`CPU: 4 layers, RPC0 (127.0.0.1:50052): 12 layers; micro steps on RPC0`).
    pub fn describe(&self) -> String {
        let name = |d: Option<Device>| match d {
            None => "CPU".to_string(),
            Some(d) if d.is_rpc() => format!("{} ({})", d.name(), d.description()),
            Some(d) => d.name(),
        };
        let places: Vec<String> =
            self.layer_counts().into_iter().map(|(d, n)| format!("{}: {n} layers", name(d))).collect();
        format!("{}; micro steps on {}", places.join(", "), name(self.tail_device()))
    }

    /// The device weight `name` lives on (`None`: host memory).
    fn device_of(&self, name: TensorName) -> Option<Device> {
        let index = match name {
            TensorName::TokenEmbd => None,
            TensorName::Base(il, _) => self.layer_device.get(il).copied().flatten(),
            // The merged input feeds base layer 0: computed elsewhere, it
            // would cost the base forward a hop to that device and back.
            TensorName::Merger(..) | TensorName::MergerPos => self.layer_device.first().copied().flatten(),
            _ => self.tail_device,
        };
        index.map(|i| self.devices[i])
    }

    /// Where weight `name` of type `ty` and shape `ne` goes. On the CPU,
    /// matrix-product weights of more than one row go to the first repacked
    /// buffer type that has a kernel for them; everything else stays on the
    /// mapped file. The token embedding is read by row lookups (and is the
    /// tied lm_head), so it stays mapped, as in llama.cpp.
    pub fn weight(&self, name: TensorName, ty: ggml::Type, ne: &[i64]) -> Placement {
        if let Some(dev) = self.device_of(name) {
            return Placement::Buffer(dev.buffer_type());
        }
        let matrix = name.info().usage == TensorUse::MatMul && ne.len() == 2 && ne[1] > 1;
        match &self.cpu {
            Some(dev) if matrix => self
                .repack
                .iter()
                .find(|b| dev.supports_weight(**b, ty, ne, WeightOp::MulMat))
                .map_or(Placement::Mapped, |b| Placement::Buffer(*b)),
            _ => Placement::Mapped,
        }
    }

    fn buffer_type(&self, device: Option<usize>) -> BufferType {
        device.map_or_else(BufferType::cpu, |i| self.devices[i].buffer_type())
    }

    /// The buffer type of base layer `il`'s KV cache: the device of its weights.
    pub fn cache_layer(&self, il: usize) -> BufferType {
        self.buffer_type(self.layer_device.get(il).copied().flatten())
    }

    /// The buffer type of what follows the base (the micro decoder's cache and
    /// the features): the device of the micro decoder.
    pub fn tail(&self) -> BufferType {
        self.buffer_type(self.tail_device)
    }

    /// The backends a computation runs on: the offload devices first (the
    /// scheduler prefers earlier backends), then the CPU with `n_threads`
    /// threads of this thread's shared pool.
    ///
    /// # Errors
    /// When a backend cannot be created.
    pub fn backends(&self, n_threads: usize) -> Result<Vec<Rc<Backend>>> {
        let cpu = Backend::cpu()?;
        cpu.set_n_threads(n_threads);
        cpu.set_threadpool(threads::shared_pool(n_threads)?);
        let mut backends = Vec::new();
        for dev in &self.devices {
            backends.push(Rc::new(Backend::new(*dev)?));
        }
        backends.push(Rc::new(cpu));
        Ok(backends)
    }
}

/// Cumulative shares of `n` devices from `--tensor-split` (empty: equal).
///
/// # Errors
/// When the split names another number of devices or is not a set of
/// non-negative finite numbers with a positive sum.
fn shares(split: &[f32], n: usize) -> Result<Vec<f64>> {
    let split: Vec<f64> = if split.is_empty() { vec![1.0; n] } else { split.iter().map(|&x| x as f64).collect() };
    let sum: f64 = split.iter().sum();
    if split.len() != n || split.iter().any(|x| !x.is_finite() || *x < 0.0) || (n > 0 && sum <= 0.0) {
        let what = format!(
            "{} {split:?}: expected {n} non-negative shares (one per offload device) with a positive sum",
            Param::TensorSplit
        );
        return Err(ParamError::new(&[Param::TensorSplit], what).into());
    }
    Ok(split
        .iter()
        .scan(0.0, |acc, x| {
            *acc += x / sum;
            Some(*acc)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::shares;

    #[test]
    fn tensor_split_shares() {
        assert_eq!(shares(&[], 2).unwrap(), [0.5, 1.0]);
        assert_eq!(shares(&[3.0, 1.0], 2).unwrap(), [0.75, 1.0]);
        assert!(shares(&[], 0).unwrap().is_empty());
        for bad in [&[1.0][..], &[1.0, 1.0, 1.0], &[0.0, 0.0], &[f32::NAN, 1.0], &[-1.0, 2.0]] {
            assert!(shares(bad, 2).unwrap_err().to_string().contains("tensor_split"), "{bad:?}");
        }
    }
}
