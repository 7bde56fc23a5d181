//! CPU thread pools shared by the engines of a thread: ggml's workers spin
//! between graph runs, so one set of workers per size however many engines
//! (sessions, benchmarks, sweeps) are open.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use ggml::ThreadPool;

use crate::error::Result;

thread_local! {
    /// CPU thread pools by size, alive while some backend holds them.
    static POOLS: RefCell<Vec<(usize, Weak<ThreadPool>)>> = const { RefCell::new(Vec::new()) };
}

/// The thread pool of `n` threads this thread's backends share (created on first use).
///
/// # Errors
/// When ggml cannot create the pool.
pub fn shared_pool(n: usize) -> Result<Rc<ThreadPool>> {
    POOLS.with(|pools| {
        let mut pools = pools.borrow_mut();
        pools.retain(|(_, w)| w.strong_count() > 0);
        if let Some(p) = pools.iter().find(|(k, _)| *k == n).and_then(|(_, w)| w.upgrade()) {
            return Ok(p);
        }
        let p = Rc::new(ThreadPool::new(n)?);
        pools.push((n, Rc::downgrade(&p)));
        Ok(p)
    })
}
