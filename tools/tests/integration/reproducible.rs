//! One greedy self-verified command, run five times, gives the same text
//! and drafts alike every time: the draft gate's prices are fixed once per
//! engine, timed by the first run and read from the price cache by the next
//! (`hamburger::engine::calibration`), so no run's drafting follows the
//! clock. A damaged cache file is timed again and rewritten.

use std::process::Command;

use testing::testmodel::{converted, smollm2_checkpoint};

/// One run's output ids, its steps' lengths (each a verify forward: its
/// accepted drafts and the verified token), and its debug log.
fn run(model: &str, cache: &std::path::Path) -> (Vec<u64>, Vec<usize>, String) {
    let prompt = "Explain the Python class `asyncio.trsock.TransportSocket`. \
                  Its documentation says: A socket-like wrapper for exposing real transport sockets.";
    let out = Command::new(env!("CARGO_BIN_EXE_hamburger-cli"))
        .args(["-m", model, "-p", prompt, "-n", "48", "--temp", "0", "--spec-type", "draft-mtp", "-t", "2", "--json"])
        .env("HAMBURGER_CACHE", cache)
        .env("RUST_LOG", "hamburger=debug")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids = v["output_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    let steps = v["macro_steps"].as_array().unwrap().iter().map(|s| s.as_array().unwrap().len()).collect();
    (ids, steps, log)
}

#[test]
fn one_greedy_self_verified_command_gives_the_same_text_five_times() {
    let ck = smollm2_checkpoint().unwrap();
    let model = converted(&ck, "smollm2", ggml::Type::F32, false).unwrap().to_string_lossy().into_owned();
    let cache = tempfile::tempdir().unwrap();
    let runs: Vec<_> = (0..5).map(|_| run(&model, cache.path())).collect();
    let (ids, steps, log) = &runs[0];
    assert_eq!(ids.len(), 48, "{log}");
    assert!(log.contains("draft prices timed"), "the first run times the prices: {log}");
    for (i, (other_ids, other_steps, other_log)) in runs.iter().enumerate().skip(1) {
        assert!(other_log.contains("draft prices read from the cache"), "run {}: {other_log}", i + 1);
        assert_eq!((other_ids, other_steps), (ids, steps), "run {} against the first", i + 1);
    }
    let files: Vec<_> =
        std::fs::read_dir(cache.path().join("draft-prices")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "one model, one setting: {files:?}");
    std::fs::write(&files[0], "forward one 1ms\n").unwrap();
    let (_, _, log) = run(&model, cache.path());
    assert!(log.contains("draft prices timed"), "a damaged file is timed again: {log}");
    let rewritten = std::fs::read_to_string(&files[0]).unwrap();
    assert!(rewritten.starts_with("forward 1 "), "{rewritten}");
}
