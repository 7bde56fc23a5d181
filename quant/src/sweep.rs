//! Quantization sweeps (placeholder replaced below).
/// Sweep arguments.
#[derive(clap::Parser)]
pub struct SweepArgs {}
/// Runs a sweep.
pub fn main(_a: SweepArgs) -> anyhow::Result<()> { Ok(()) }
