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

/// The binary a row's short name (docs/tools.md's llama.cpp table) stands for.
fn binary(name: &str) -> &'static str {
    match name {
        "cli" => env!("CARGO_BIN_EXE_hamburger-cli"),
        "server" => env!("CARGO_BIN_EXE_hamburger-server"),
        "bench" => env!("CARGO_BIN_EXE_hamburger-bench"),
        other => panic!("unknown binary {other} in docs/tools.md's llama.cpp table"),
    }
}

/// docs/tools.md's "Coming from llama.cpp" table stays true: every spelling of
/// every row parses with each binary it names (the flag, its example value,
/// then `--help`, which only a known flag reaches), and every refusal fails
/// in one line with its reason instead of "unexpected argument".
#[test]
fn the_readme_llama_cpp_table_parses_with_each_binary() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/tools.md")).unwrap();
    let section = readme.split("## Coming from llama.cpp").nth(1).unwrap().split("\n## ").next().unwrap();
    let rows: Vec<Vec<String>> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    assert!(rows.len() > 40, "{} rows", rows.len());
    for row in rows {
        let value = row[1].trim_matches('`').trim_matches('"');
        let flags: Vec<&str> = row[0].split(", ").filter_map(|f| f.split('`').nth(1)).collect();
        for bin in row[2].split(", ") {
            for flag in &flags {
                let mut args = vec![*flag];
                args.extend(Some(value).filter(|v| !v.is_empty()));
                if row[3].starts_with("refused") {
                    if *flag == "--json" {
                        args.push("-cnv");
                    }
                    let out = Command::new(binary(bin)).args(["-m", "/nonexistent.gguf"]).args(&args).output().unwrap();
                    let err = String::from_utf8_lossy(&out.stderr);
                    assert!(!out.status.success() && err.lines().count() == 1, "{bin} {args:?}: {err}");
                    assert!(err.contains(flag) && !err.contains("unexpected"), "{bin} {args:?}: {err}");
                } else {
                    let out = Command::new(binary(bin)).args(&args).arg("--help").output().unwrap();
                    let err = String::from_utf8_lossy(&out.stderr);
                    assert!(out.status.success(), "{bin} {args:?}: {err}");
                }
            }
        }
    }
}

/// Every tool's thread default is the same: the cores the system reports.
#[test]
fn every_tool_defaults_to_the_same_threads() {
    let cores = std::thread::available_parallelism().unwrap().get().to_string();
    let tools: [(&str, &[&str]); 4] = [
        (env!("CARGO_BIN_EXE_hamburger-server"), &[]),
        (env!("CARGO_BIN_EXE_hamburger-bench"), &[]),
        (env!("CARGO_BIN_EXE_hamburger-eval"), &["run"]),
        (env!("CARGO_BIN_EXE_hamburger-quantize"), &["sweep"]),
    ];
    for (path, sub) in tools {
        let out = Command::new(path).args(sub).arg("--help").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let threads = text.split("--threads").nth(1).unwrap_or_else(|| panic!("{path}: no --threads"));
        let default = threads.split("[default: ").nth(1).unwrap().split(']').next().unwrap();
        assert_eq!(default, cores, "{path} {sub:?}");
    }
}
