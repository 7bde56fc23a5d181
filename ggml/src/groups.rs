//! Metadata contexts grouped by where their tensors will live, so that each
//! buffer allocated for a group holds exactly that group's tensors (the
//! weights by placement, a KV cache by the device of each layer).

use crate::{Context, Result};

/// Metadata contexts keyed by `K` (a buffer type, a placement), created on
/// first use, each with room for `capacity` tensor headers.
pub struct ContextGroups<K> {
    groups: Vec<(K, Context)>,
    capacity: usize,
}

impl<K: PartialEq + Copy> ContextGroups<K> {
    /// No groups yet; each will hold up to `capacity` tensors.
    pub fn new(capacity: usize) -> ContextGroups<K> {
        ContextGroups { groups: Vec::new(), capacity }
    }

    /// The context of group `key`, created if new.
    ///
    /// # Errors
    /// When ggml cannot allocate a new context.
    pub fn get(&mut self, key: K) -> Result<Context> {
        if let Some((_, c)) = self.groups.iter().find(|(k, _)| *k == key) {
            return Ok(c.clone());
        }
        let c = Context::new(self.capacity, 0)?;
        self.groups.push((key, c.clone()));
        Ok(c)
    }

    /// Every group, in order of creation.
    pub fn iter(&self) -> impl Iterator<Item = &(K, Context)> {
        self.groups.iter()
    }
}
