//! Every binary's `--help` opens with what THAT tool does (clap took the
//! crate's description for all of them but one), and exits 0.

use std::process::Command;

#[test]
fn each_binary_help_opens_with_its_own_summary() {
    let binaries = [
        ("hamburger-cli", env!("CARGO_BIN_EXE_hamburger-cli"), "Runs a HAMburger model"),
        ("hamburger-bench", env!("CARGO_BIN_EXE_hamburger-bench"), "Measures prompt processing"),
        ("hamburger-convert", env!("CARGO_BIN_EXE_hamburger-convert"), "Packs a HAMburger checkpoint"),
        ("hamburger-quantize", env!("CARGO_BIN_EXE_hamburger-quantize"), "Quantizes a GGUF"),
        ("hamburger-server", env!("CARGO_BIN_EXE_hamburger-server"), "An OpenAI-compatible server"),
        ("hamburger-eval", env!("CARGO_BIN_EXE_hamburger-eval"), "Evaluates a HAMburger GGUF"),
        ("hamburger-rpc-server", env!("CARGO_BIN_EXE_hamburger-rpc-server"), "Serves this machine's CPU or GPU"),
    ];
    let mut firsts = Vec::new();
    for (name, path, opens) in binaries {
        let out = Command::new(path).arg("--help").output().unwrap();
        assert!(out.status.success(), "{name} --help");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let first = text.lines().next().unwrap_or_default().to_string();
        assert!(first.starts_with(opens), "{name}: {first}");
        firsts.push(first);
    }
    let mut distinct = firsts.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), firsts.len(), "two binaries open --help alike: {firsts:#?}");
}
