//! The tools on a GPU (`--device cuda|metal|vulkan`, the first GPU of this
//! build; ignored by default like `tests/integration/gpu.rs`, CI runs them through
//! Vulkan on Mesa's lavapipe): `--list-devices` shows it; hamburger-cli
//! decodes golden cases with half the base layers on it; hamburger-bench and
//! hamburger-eval run both engines there, libllama placed as we are. The
//! server's GPU test is `server/gpu.rs`. A Vulkan build with no Vulkan device
//! refuses `--device vulkan` in one line.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;
use testing::testmodel::{converted, tiny_fixture};

/// The tiny fixture in F32, whole or its base alone (libllama's baseline).
fn tiny(base_only: bool) -> PathBuf {
    converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, base_only).unwrap()
}

/// Runs `bin` with `args`, which must succeed.
fn run(bin: &str, args: &[&str]) -> Output {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(out.status.success(), "{bin} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
#[ignore = "needs a GPU: cargo test --release --features vulkan -p hamburger-tools --test integration -- --ignored gpu::"]
fn the_tools_run_on_the_gpu() {
    let device = testing::gpu::gpu_flag();
    let (model, base) = (tiny(false), tiny(true));
    let (m, b) = (model.to_str().unwrap(), base.to_str().unwrap());

    let listed = run(env!("CARGO_BIN_EXE_hamburger-cli"), &["--list-devices"]).stdout;
    let listed = String::from_utf8_lossy(&listed);
    assert!(listed.to_ascii_lowercase().contains(&format!("({device})")), "{listed}");

    for case in testing::golden::cases().iter().step_by(5) {
        let mut args = vec!["-m", m, "--device", &device, "-ngl", "8", "-fa", "off", "-t", "2"];
        let golden = testing::golden::cli_args(case);
        args.extend(golden.iter().map(String::as_str));
        let out = run(env!("CARGO_BIN_EXE_hamburger-cli"), &args);
        assert_eq!(testing::golden::cli_steps(&String::from_utf8_lossy(&out.stdout)), case.steps, "{args:?}");
    }

    let bench = ["-m", m, "--baseline", b, "--device", &device, "-p", "16", "-n", "8", "-r", "1", "-o", "json"];
    let out = run(env!("CARGO_BIN_EXE_hamburger-bench"), &bench);
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let engines: Vec<&str> = rows.iter().map(|r| r["engine"].as_str().unwrap()).collect();
    assert_eq!(engines, ["hamburger", "llama.cpp", "hamburger", "llama.cpp"], "pp16 and tg8, both engines");
    assert!(rows.iter().all(|r| r["avg_ts"].as_f64().unwrap() > 0.0));
    let placement = String::from_utf8_lossy(&out.stderr);
    assert!(placement.contains(": 16 layers; micro steps on ") && !placement.contains("on CPU"), "{placement}");

    // At a confidence above 1 HAMburger decodes exactly like its base.
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"The license grants you\"}\n").unwrap();
    let p = prompts.to_str().unwrap();
    let eval = ["run", "-m", m, "--baseline", b, "--prompts", p, "-n", "16", "--confidence", "1.01", "-o", "json"];
    let out = run(env!("CARGO_BIN_EXE_hamburger-eval"), &[&eval[..], &["--device", &device]].concat());
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&rows[0]["tokens"], &rows[0]["tokens_per_step"]), (&Value::from(16), &Value::from(1.0)));
}

#[cfg(feature = "vulkan")]
#[test]
#[ignore = "a Vulkan build: cargo test --release --features vulkan -p hamburger-tools --test integration -- --ignored gpu::"]
fn vulkan_without_a_vulkan_device_is_one_line() {
    // The Vulkan loader with no driver to load: no device at all.
    let mut cli = Command::new(env!("CARGO_BIN_EXE_hamburger-cli"));
    cli.args(["-m", tiny(false).to_str().unwrap(), "-p", "hi", "--device", "vulkan"]);
    cli.env("VK_ICD_FILENAMES", "/nonexistent.json").env("VK_DRIVER_FILES", "/nonexistent.json");
    testing::process::assert_one_line_error(&mut cli, &["--device", "Vulkan backend found no GPU"]);
}
