//! Unique ids for responses (`chatcmpl-...`, `cmpl-...`) and tool calls
//! (`call_...`), and random seeds. An id is this process's random 64-bit
//! prefix and a process-wide counter: unique however many requests run at
//! once (a counter per id, never a count read after the fact), and not
//! guessable across restarts.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Ids handed out so far.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A random number, different at each call: std's per-map random keys,
/// hashed with the clock (as OpenAI and llama-server draw a seed a request
/// gives none of).
pub fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// A new id: 24 hex digits, never the same twice in this process.
pub fn unique() -> String {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    let prefix = *PREFIX.get_or_init(random_u64);
    format!("{prefix:016x}{:08x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_drawn_on_many_threads_at_once_are_all_different() {
        let ids: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|_| s.spawn(|| (0..1000).map(|_| unique()).collect::<Vec<_>>())).collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        assert!(ids.iter().all(|id| id.len() == 24));
    }
}
