//! Devices as the tools see them: `hamburger-cli --list-devices` (every
//! device of this build, one line each), and where a libllama baseline runs
//! so that it runs where our model runs (`hamburger-bench`, `hamburger-eval`).

use ggml::llama::LlamaPlacement;
use ggml::Device;
use hamburger::placement::PlacementPlan;

use crate::cli::PlacementArgs;

/// Every device ggml's registry holds (RPC servers' too, once joined), one
/// line each: name, backend, description, kind and free memory.
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

/// libllama's placement of a base model beside ours: our offload devices
/// only (left to itself on a GPU machine it keeps even `-ngl 0`'s weights in
/// the GPU's host buffer, unpacked, and sends large batches to the GPU: not
/// where we run), our split (equal unless `-ts`; its default splits by free
/// memory), and our offloaded layers plus one when our tail (the lm_head) is
/// offloaded, since libllama's `-ngl` counts the output layer first.
pub struct BaselinePlacement {
    devices: Vec<Device>,
    n_gpu_layers: i32,
    tensor_split: Vec<f32>,
    repack: bool,
}

impl BaselinePlacement {
    /// Where libllama runs beside a model that `flags` placed as `plan` says.
    pub fn new(plan: &PlacementPlan, flags: &PlacementArgs) -> BaselinePlacement {
        let devices = plan.offload_devices().to_vec();
        let tensor_split = match flags.tensor_split.as_slice() {
            [] if !devices.is_empty() => vec![1.0; devices.len()],
            ts => ts.to_vec(),
        };
        let n_gpu_layers = (plan.n_gpu_layers() + usize::from(plan.tail_device().is_some())) as i32;
        BaselinePlacement { devices, n_gpu_layers, tensor_split, repack: !flags.no_repack }
    }

    /// The placement to load a libllama model with.
    pub fn llama(&self) -> LlamaPlacement<'_> {
        LlamaPlacement {
            devices: Some(&self.devices),
            n_gpu_layers: self.n_gpu_layers,
            tensor_split: &self.tensor_split,
            repack: self.repack,
        }
    }
}
