//! `hamburger-cli --list-devices`: every device of this build, one line each.

use ggml::Device;

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
