//! What an engine did, counted: graphs built, graphs computed, and reads of
//! results back to the host. A decode step that reuses its graph builds
//! nothing, and a backend that replays captured graphs (ggml-cuda's CUDA
//! graphs) can only replay a graph that was not rebuilt; every host read is
//! a synchronisation with the device. `hamburger-cli --json` reports them
//! per macro step.

use std::ops::Sub;

/// An engine's counts since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Graphs built (a shape not kept yet).
    pub graph_builds: u64,
    /// Graph computations (base forwards and micro steps).
    pub graph_computes: u64,
    /// Tensors read back to the host.
    pub host_reads: u64,
    /// Bytes those reads copied.
    pub host_read_bytes: u64,
}

impl EngineCounters {
    /// Counts one graph computation and the reads of its results.
    pub(crate) fn computed(&mut self, built: bool, (reads, bytes): (u64, u64)) {
        self.graph_builds += u64::from(built);
        self.graph_computes += 1;
        self.host_reads += reads;
        self.host_read_bytes += bytes;
    }
}

impl Sub for EngineCounters {
    type Output = EngineCounters;

    /// The counts between two readings of one engine.
    fn sub(self, earlier: EngineCounters) -> EngineCounters {
        EngineCounters {
            graph_builds: self.graph_builds - earlier.graph_builds,
            graph_computes: self.graph_computes - earlier.graph_computes,
            host_reads: self.host_reads - earlier.host_reads,
            host_read_bytes: self.host_read_bytes - earlier.host_read_bytes,
        }
    }
}
