//! A test's independent generations spread over every core.
//!
//! The test binaries run one test at a time (`RUST_TEST_THREADS=1` in
//! `.cargo/config.toml`: ggml's spinning thread pools make side-by-side model
//! tests about ten times slower on two cores), and the tests that compare
//! runs row for row run ggml on one thread. Such a test's prompts or seeds
//! are independent, so each core here takes its own share on a thread of its
//! own, one ggml thread each, and the whole machine works. A `Model` is not
//! shared between threads (its ggml handles are not `Sync`): each share
//! opens its own, as a second process would.

/// `work` applied to each core's share of `items` (contiguous, in order),
/// each share on its own thread; the results in the items' order. A panic
/// in `work` (a failed assertion) fails the test as it would in a plain loop.
///
/// # Panics
/// When `work` panics, or returns another number of results than its share
/// has items.
pub fn on_every_core<T: Sync, R: Send>(items: &[T], work: impl Fn(&[T]) -> Vec<R> + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = items.len().div_ceil(cores).max(1);
    std::thread::scope(|s| {
        let work = &work;
        let shares: Vec<_> = items.chunks(share).map(|c| (c.len(), s.spawn(move || work(c)))).collect();
        let mut out = Vec::with_capacity(items.len());
        for (n, handle) in shares {
            let results = handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            assert_eq!(results.len(), n, "one result per item");
            out.extend(results);
        }
        out
    })
}
