//! `scripts/device-check.sh`, the prepared check for a GPU machine, run here
//! on its CPU part at tiny sizes (`--quick --cpu-only -t 1,2`, the trained
//! SmolLM2-HAMburger and its draft head made from the cache as the script
//! makes them): every
//! stage ends, and the folder holds its tables, at most 8 files, as the
//! machine's way back allows.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

#[test]
fn the_device_checks_cpu_part_writes_its_tables() {
    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_hamburger-bench")).parent().unwrap();
    let out = dir.path().join("out");
    let status = Command::new("bash")
        .arg(repo().join("scripts/device-check.sh"))
        .args(["--quick", "--cpu-only", "--threads", "1,2", "--shapes", "smollm2", "--bin"])
        .arg(bin)
        .arg("--out")
        .arg(&out)
        .env("HAMBURGER_WORK", dir.path().join("work"))
        .status()
        .unwrap();
    assert!(status.success());
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    let log = read("check.log");
    assert!(!log.contains("failed") && !log.contains("limit"), "{log}");
    assert!(log.contains("check done"), "{log}");
    let cpu = read("cpu.md");
    for (threads, test) in [(1, "pp64"), (1, "tg16 k=1"), (1, "tg16 k=4"), (2, "pp64"), (2, "tg16 k=4")] {
        let row = cpu.lines().find(|l| l.contains(&format!("| {threads} | {test} |")));
        let row = row.unwrap_or_else(|| panic!("no row for -t {threads} {test} in\n{cpu}"));
        let ratio: f64 = row.split('|').nth(7).unwrap().trim().parse().unwrap();
        assert!(ratio > 0.0, "{row}: against libllama");
    }
    let spec = read("spec.md");
    assert!(spec.contains("verified n=3..3") && spec.contains("### cpu, gated drafts"), "{spec}");
    assert_eq!(read("gate.log").lines().filter(|l| l.contains("base forward ms by rows")).count(), 4);
    let trees = read("trees.md");
    for tree in [0, 5] {
        let heading = format!("### cpu, 3 drafts forced, --spec-draft-tree {tree}");
        let table = trees.split(&heading).nth(1).unwrap_or_else(|| panic!("no {heading} in\n{trees}"));
        assert!(table.contains("draft-mtp"), "{heading}: hamburger-eval's table\n{trees}");
    }
    let engine: Vec<serde_json::Value> =
        read("engine.json").lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(engine.len(), 2, "k=1 and k=4 on the CPU");
    // One token per step: one compute and one 4-byte read per macro step.
    assert_eq!(engine[0]["engine"]["graph_computes_per_macro_step"], 1.0);
    assert_eq!(engine[0]["engine"]["host_read_bytes_per_macro_step"], 4.0);
    assert_eq!(engine[1]["engine"]["graph_computes_per_macro_step"], 4.0, "a base forward and 3 micro steps");
    let files = std::fs::read_dir(&out).unwrap().count();
    assert!(files <= 8, "{files} files come back at most 8");
}
