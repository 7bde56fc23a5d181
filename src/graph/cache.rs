//! The built graphs an engine keeps, by shape, and how many runs each has
//! had: a graph is built once per shape and reused every step, and only a
//! warm graph's runs are timed for the draft gate's prices
//! ([`crate::engine::forward_cost`]).

use crate::error::Result;

/// Built graphs kept per kind (base, micro).
const GRAPHS_KEPT: usize = 16;

/// Runs of a graph before its times count as its cost: the first builds and
/// allocates, and on CUDA the second captures a CUDA graph (ggml captures a
/// graph on its second run with unchanged properties, and replays it after).
const WARM_UP_RUNS: u32 = 2;

/// What one run of a kept graph is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The graph was built for this run.
    pub built: bool,
    /// Its warm-up is over ([`WARM_UP_RUNS`]): this run's time is what the
    /// graph costs, to be recorded.
    pub warm: bool,
}

/// Built graphs by shape, most recently used first, with the runs each has had.
pub struct GraphCache<K, G> {
    entries: Vec<(K, G, u32)>,
}

impl<K: PartialEq, G> Default for GraphCache<K, G> {
    fn default() -> Self {
        GraphCache::new()
    }
}

impl<K: PartialEq, G> GraphCache<K, G> {
    /// An empty cache.
    pub fn new() -> GraphCache<K, G> {
        GraphCache { entries: Vec::new() }
    }

    /// The graph of `key`, built by `build` if it is not kept, with what
    /// this run of it is ([`Run`]).
    ///
    /// # Errors
    /// What `build` returns.
    pub fn get(&mut self, key: K, build: impl FnOnce(&K) -> Result<G>) -> Result<(&mut G, Run)> {
        let built = match self.entries.iter().position(|(k, _, _)| *k == key) {
            Some(i) => {
                let e = self.entries.remove(i);
                self.entries.insert(0, e);
                false
            }
            None => {
                let g = build(&key)?;
                self.entries.insert(0, (key, g, 0));
                self.entries.truncate(GRAPHS_KEPT);
                true
            }
        };
        let (_, graph, runs) = &mut self.entries[0];
        let warm = *runs >= WARM_UP_RUNS;
        *runs = runs.saturating_add(1);
        Ok((graph, Run { built, warm }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_is_built_once_and_warm_from_its_third_run() {
        let mut cache: GraphCache<usize, String> = GraphCache::new();
        let mut builds = 0;
        let mut run = |cache: &mut GraphCache<usize, String>, key| {
            let before = builds;
            let (g, run) = cache
                .get(key, |k| {
                    builds += 1;
                    Ok(format!("graph {k}"))
                })
                .unwrap();
            assert_eq!(run.built, builds > before);
            (g.clone(), run.warm)
        };
        let warm: Vec<bool> = (0..4).map(|_| run(&mut cache, 1).1).collect();
        assert_eq!(warm, [false, false, true, true]);
        assert_eq!(run(&mut cache, 2), ("graph 2".to_string(), false), "another shape warms up on its own");
        assert_eq!(run(&mut cache, 1), ("graph 1".to_string(), true), "kept, still warm");
        for k in 3..3 + GRAPHS_KEPT {
            run(&mut cache, k);
        }
        assert!(!run(&mut cache, 1).1, "dropped as least recently used, built again");
        assert_eq!(builds, 2 + GRAPHS_KEPT + 1);
    }
}
