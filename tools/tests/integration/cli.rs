//! hamburger-cli as a user runs it, on SmolLM2-HAMburger F32 (quantized, this
//! 135M model answers chat prompts with nonsense in llama.cpp too): a completion
//! streams sensible text, colour marks macro steps, and a two-turn chat keeps
//! the first turn in the KV cache; and the 18 golden cases of the tiny
//! fixture, exact through `hamburger-cli --temp 0 --json`.

use std::io::Write;
use std::process::{Command, Stdio};

use testing::testmodel::{converted, smollm2_checkpoint, tiny_fixture};

fn model() -> String {
    let ck = smollm2_checkpoint().unwrap();
    converted(&ck, "smollm2", ggml::Type::F32, false).unwrap().to_string_lossy().into_owned()
}

fn cli(args: &[&str], stdin: &str) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hamburger-cli"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The number after `label` in the stderr report.
fn stat(report: &str, label: &str) -> usize {
    let rest = &report[report.find(label).unwrap_or_else(|| panic!("no {label:?} in {report}")) + label.len()..];
    rest.trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn completion_streams_sensible_text_and_reports() {
    let m = model();
    let (out, err) = cli(
        &["-m", &m, "-p", "The capital of France is", "-n", "24", "--temp", "0", "--confidence", "1.01", "-t", "2"],
        "",
    );
    assert!(out.starts_with("The capital of France is") && out.contains("Paris"), "{out}");
    assert!(err.contains("tok/s") && err.contains("tokens per step") && err.contains("micro-step positions reached"));
    let (out, _) =
        cli(&["-m", &m, "-p", "Hello", "-n", "8", "--color", "--confidence", "0.3", "--temp", "0", "-t", "2"], "");
    assert!(out.contains("\x1b[38;5;"), "macro steps are coloured");
}

#[test]
fn two_turn_chat_keeps_history() {
    let m = model();
    let args = ["-m", &m, "-cnv", "--temp", "0", "--confidence", "1.01", "-n", "32", "-t", "2"];
    let (out, err) = cli(&args, "What is the capital of France?\nAnd of Germany?\n");
    assert_eq!(out.matches("> ").count(), 3, "two turns, then the prompt that reads end of input: {out}");
    let replies: Vec<&str> = out.split("> ").skip(1).take(2).collect();
    assert!(replies[0].contains("Paris"), "{out}");
    assert!(replies[1].trim().len() > 3, "{out}");
    // The second turn continues the first in the cache: more entries than one turn.
    let (_, one_turn) = cli(&args, "What is the capital of France?\n");
    let (one, two) = (stat(&one_turn, "KV cache:"), stat(&err, "KV cache:"));
    assert!(two > one + 10, "{one} entries after one turn, {two} after two");
}

#[test]
fn golden_cases_through_the_cli_at_temp_0() {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap();
    let cases = testing::golden::cases();
    assert_eq!(cases.len(), 18);
    for (ci, case) in cases.iter().enumerate() {
        let mut args = vec!["-m".to_string(), gguf.to_string_lossy().into_owned(), "-t".into(), "2".into()];
        args.extend(testing::golden::cli_args(case));
        let (out, _) = cli(&args.iter().map(String::as_str).collect::<Vec<_>>(), "");
        let got = testing::golden::cli_steps(&out);
        assert_eq!(got, case.steps, "case {ci}: (macro step, token) sequence through hamburger-cli");
    }
}

/// llama-cli's chat mode: -p is the first user turn, -st ends after it, and
/// -r hands the turn back as soon as the reply contains the reverse prompt.
#[test]
fn chat_takes_p_as_first_turn_single_turn_and_reverse_prompt() {
    let m = model();
    let base = ["-m", &m, "--temp", "0", "--confidence", "1.01", "-n", "32", "-t", "2"];
    let with = |extra: &[&str], stdin: &str| cli(&[&base[..], extra].concat(), stdin);
    let (out, _) = with(&["-cnv", "-p", "What is the capital of France?", "-st"], "And of Germany?\n");
    assert_eq!(out.matches("> ").count(), 1, "one turn, stdin unread: {out}");
    assert!(out.contains("> What is the capital of France?\n") && out.contains("Paris"), "{out}");
    let (out, _) = with(&["-cnv", "-p", "What is the capital of France?"], "");
    assert!(out.contains("Paris") && out.matches("> ").count() == 2, "the -p turn, then end of input: {out}");
    let (out, _) = with(&["-st", "-p", "What is the capital of France?", "-r", "Paris"], "");
    let reply = out.split("France?\n").nth(1).unwrap();
    assert!(reply.contains("Paris") && reply.trim().len() < 40, "stops at the reverse prompt: {out}");
}

/// Runs the CLI expecting failure: (stdout, stderr).
fn cli_fails(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hamburger-cli")).args(args).stdin(Stdio::null()).output().unwrap();
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    (String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// llama.cpp's defaults: the context is the model's (SmolLM2: 8192), -n past
/// the context stops at a full context with a notice, as -n -1 does, and a
/// prompt that does not fit is refused before anything is echoed.
#[test]
fn context_defaults_to_the_model_and_a_full_context_ends_with_a_notice() {
    let m = model();
    let ids = vec!["1"; 9000].join(",");
    let (out, err) = cli_fails(&["-m", &m, "--prompt-ids", &ids, "-t", "2"]);
    assert!(out.is_empty() && err.contains("does not fit the context of 8192 entries: raise -c"), "{err}");
    let (out, err) = cli_fails(&["-m", &m, "-c", "4", "-p", "The capital of France is", "-t", "2"]);
    assert!(out.is_empty() && err.contains("raise -c"), "no echo before the error: {out}");
    let notice = "stopped at a full context (64 entries, -c)";
    for n in ["500", "-1"] {
        let args =
            ["-m", &m, "-c", "64", "-n", n, "--ignore-eos", "-p", "The capital of France is", "--temp", "0", "-t", "2"];
        let (out, err) = cli(&args, "");
        assert!(out.starts_with("The capital of France is") && err.contains(notice), "-n {n}: {err}");
    }
    let (_, err) = cli(&["-m", &m, "-c", "64", "-n", "4", "-p", "Hi", "--temp", "0", "-t", "2"], "");
    assert!(!err.contains("full context"), "-n within the context: no notice: {err}");
}

/// `-m` a llama GGUF (the tiny fixture's base-only export), alone and with
/// the tiny HAMburger drafting for it (`-md`): the same greedy tokens. A
/// verify forward computes several rows, whose kernels sum in another order
/// than one row's, so equality holds where no two best logits are within
/// rounding: checked first, on the target's own run (every margin above
/// 1e-3, where F32 rounding moves logits by about 1e-5).
#[test]
fn a_draft_model_gives_the_targets_greedy_output() {
    use hamburger::{EngineParams, LoadOptions, Model, Session, SessionParams, StepParams};
    let ckpt = tiny_fixture().join("hamburger.ckpt");
    let (base, ham) = (
        converted(&ckpt, "tiny", ggml::Type::F32, true).unwrap(),
        converted(&ckpt, "tiny", ggml::Type::F32, false).unwrap(),
    );
    let case = &testing::golden::cases()[1];
    let n = 24;
    let target = Model::open(&base, &LoadOptions::default()).unwrap();
    let engine = EngineParams { n_ctx: 256, kv_type: ggml::Type::F32, flash_attn: Some(false), ..Default::default() };
    let p = SessionParams {
        engine: EngineParams { n_threads: 2, ..engine },
        step: StepParams { confidence: 1.01, ..Default::default() },
        keep_logits: true,
        ..Default::default()
    };
    let gen = Session::new(&target, p).unwrap().generate(&case.prompt_ids, n, |_| true).unwrap();
    for (i, step) in gen.macro_steps.iter().enumerate() {
        let mut l = step.logits[0].clone();
        l.sort_by(|a, b| b.total_cmp(a));
        assert!(l[0] - l[1] > 1e-3, "token {i} is a near tie: pick another prompt");
    }
    let ids: Vec<String> = case.prompt_ids.iter().map(u32::to_string).collect();
    let common = [
        "--prompt-ids",
        &ids.join(","),
        "-n",
        &n.to_string(),
        "--temp",
        "0",
        "--json",
        "-c",
        "256",
        "-fa",
        "off",
        "--cache-type",
        "f32",
        "-t",
        "2",
    ];
    let run = |extra: &[&str]| -> serde_json::Value {
        let args: Vec<&str> = ["-m", base.to_str().unwrap()].iter().chain(extra).chain(&common).copied().collect();
        serde_json::from_str(&cli(&args, "").0).unwrap()
    };
    let alone = run(&[]);
    let want: Vec<u64> = gen.output_ids.iter().map(|&t| t as u64).collect();
    assert_eq!(alone["output_ids"], serde_json::json!(want), "a llama GGUF decodes one token per forward");
    // One token per draft step (the draft's base is the target: high
    // acceptance) and the golden cases' confidence (random micro decoders: low).
    for (confidence, n_max) in [("1.01", "1"), ("1.01", "3"), ("0.3", "3")] {
        let md = ["-md", ham.to_str().unwrap(), "--confidence", confidence, "--spec-draft-n-max", n_max];
        let drafted = run(&md);
        assert_eq!(drafted["output_ids"], alone["output_ids"], "confidence {confidence}, n_max {n_max}");
        let d = &drafted["draft"];
        assert!(d["drafted"].as_u64().unwrap() > 0 && d["accepted"].as_u64() <= d["drafted"].as_u64(), "{d}");
        if confidence == "1.01" {
            assert!(d["target_forwards"].as_u64().unwrap() < n as u64, "drafted tokens save target forwards: {d}");
        }
    }
}

/// A chat with the trained SmolLM2-HAMburger drafting for SmolLM2: the second
/// turn goes on from the first in both models' caches.
#[test]
fn a_chat_with_a_draft_model_keeps_history() {
    let target = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, true).unwrap();
    let draft = converted(
        &testing::testmodel::smollm2_trained_checkpoint().unwrap(),
        "smollm2-trained",
        ggml::Type::F32,
        false,
    )
    .unwrap();
    let args = [
        "-m",
        target.to_str().unwrap(),
        "-md",
        draft.to_str().unwrap(),
        "-cnv",
        "--temp",
        "0",
        "-n",
        "32",
        "-t",
        "2",
        "-c",
        "512",
    ];
    let (out, err) = cli(&args, "What is the capital of France?\nAnd of Germany?\n");
    let replies: Vec<&str> = out.split("> ").skip(1).take(2).collect();
    assert!(replies[0].contains("Paris"), "{out}");
    assert!(replies[1].trim().len() > 3, "{out}");
    assert!(err.contains("draft model:") && err.contains("accepted"), "{err}");
}
