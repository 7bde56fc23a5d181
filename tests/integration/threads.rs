//! The CPU workers between graphs: ggml's workers spin waiting for the next
//! graph (low decode latency), and `pause_threads` puts them to sleep at once
//! so that they leave the cores to other work (a benchmark's other engine).

use std::time::Duration;

use hamburger::{EngineParams, LoadOptions, Model, Session, SessionParams};
use testing::testmodel::{converted, tiny_fixture};

/// CPU time (user + system) this process has used, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name (which may hold spaces) start at state.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Ticks used over `d` of doing nothing on this thread.
fn idle_cost(d: Duration) -> u64 {
    let t0 = cpu_ticks();
    std::thread::sleep(d);
    cpu_ticks() - t0
}

#[test]
fn paused_workers_sleep_until_the_next_graph() {
    let ck = tiny_fixture().join("hamburger.ckpt");
    let gguf = converted(&ck, "tiny", ggml::Type::F32, false).unwrap();
    let model = Model::open(&gguf, &LoadOptions::default()).unwrap();
    let mut s = Session::new(
        &model,
        SessionParams { engine: EngineParams { n_threads: 2, n_ctx: 64, ..Default::default() }, ..Default::default() },
    )
    .unwrap();
    let prompt = [1u32, 5, 9, 13];
    s.feed(&prompt, false).unwrap();
    let spinning = idle_cost(Duration::from_millis(200));
    s.clear();
    s.feed(&prompt, false).unwrap();
    s.pause_threads();
    let paused = idle_cost(Duration::from_millis(200));
    eprintln!("CPU ticks over 200 ms after a graph: {spinning} spinning, {paused} paused");
    assert!(paused <= 2, "paused workers used {paused} ticks while the session was idle");
    // The next graph wakes them.
    s.clear();
    assert_eq!(s.feed(&prompt, true).unwrap().logits.map(|l| l.len()), Some(model.hp.n_vocab));
}
