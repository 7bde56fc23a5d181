//! `hamburger-train` (train/, PyTorch on the CPU) on real files: its model
//! against the original implementation's golden outputs, a few training steps
//! on the tiny fixture lowering the loss, the export round-tripping through
//! `hamburger-convert` into a GGUF whose greedy tokens match the exported
//! weights decoded by the trainer, and the shipped SmolLM2-HAMburger
//! converting, loading and emitting multi-token macro steps.

use std::path::{Path, PathBuf};
use std::process::Command;

use hamburger::StepRule;
use serde_json::{json, Value};
use testing::near_tie::{assert_agree, decisions_of};
use testing::testmodel::{self, tiny_fixture};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The training tool (its launcher fails with one line when train/.venv is missing).
fn train_tool() -> Command {
    let mut c = Command::new(repo().join("train/hamburger-train"));
    c.args(["-t", "1"]);
    c
}

fn run_ok(c: &mut Command) -> String {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{:?} failed: {}", c, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `hamburger-convert CHECKPOINT --outfile OUT --outtype TYPE`, which must succeed.
fn convert(checkpoint: &Path, out: &Path, outtype: &str) {
    let st = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
        .arg(checkpoint)
        .arg("--outfile")
        .arg(out)
        .args(["--outtype", outtype, "--no-progress"])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "converting {}", checkpoint.display());
}

fn golden() -> Value {
    serde_json::from_str(&std::fs::read_to_string(tiny_fixture().join("golden.json")).unwrap()).unwrap()
}

/// One case's macro steps and each token's (top-2 logit margin, stop probability).
type Traced = (Vec<Vec<u64>>, Vec<(f32, f32)>);

/// The trainer's greedy macro steps (a check of the runtime's) of each
/// `(prompt, n, confidence)` case, with each token's top-2 logit margin and
/// stop probability: one `greedy --cases` process, one load of `ckpt`.
fn trainer_greedy_traced(ckpt: &Path, cases: &[(Vec<u64>, usize, f64)]) -> Vec<Traced> {
    let file = tempfile::NamedTempFile::new().unwrap();
    let lines: String = cases
        .iter()
        .map(|(ids, n, confidence)| format!("{}\n", json!({"ids": ids, "n": n, "confidence": confidence})))
        .collect();
    std::fs::write(file.path(), lines).unwrap();
    let out = run_ok(train_tool().args(["greedy", "--out"]).arg(ckpt).arg("--cases").arg(file.path()));
    let got: Vec<_> = out
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                serde_json::from_value(v["macro_steps"].clone()).unwrap(),
                serde_json::from_value(v["trace"].clone()).unwrap(),
            )
        })
        .collect();
    assert_eq!(got.len(), cases.len(), "one line per case: {out}");
    got
}

/// A golden case's `(prompt, n, confidence)`.
fn case_of(case: &Value) -> (Vec<u64>, usize, f64) {
    let prompt = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
    (prompt, case["max_new_tokens"].as_u64().unwrap() as usize, case["confidence"].as_f64().unwrap())
}

fn steps_of(case: &Value) -> Vec<Vec<u64>> {
    case["macro_steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| serde_json::from_value(s["tokens"].clone()).unwrap())
        .collect()
}

#[test]
fn trainer_model_reproduces_the_original_golden_outputs() {
    let golden = golden();
    let cases = golden["cases"].as_array().unwrap();
    let got = trainer_greedy_traced(&tiny_fixture(), &cases.iter().map(case_of).collect::<Vec<_>>());
    for (case, (steps, _)) in cases.iter().zip(got) {
        assert_eq!(steps, steps_of(case), "case {}", case["prompt"]);
    }
}

/// A work directory whose segments are the fixture's own golden generations
/// (the macro steps the original implementation took); with `soft`, each
/// answer token also has soft targets as `segment` keeps them (the token
/// itself at 0.8, two neighbours at 0.15 and 0.05).
fn fixture_work(dir: &Path, soft: bool) {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny_fixture().join("config.json")).unwrap()).unwrap();
    let vocab = config["vocab_size"].as_u64().unwrap();
    let mut lines = String::new();
    for (i, case) in golden()["cases"].as_array().unwrap().iter().enumerate() {
        let prompt: Vec<u64> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        let steps = steps_of(case);
        let mut ids = prompt.clone();
        ids.extend(steps.iter().flatten());
        let lens: Vec<usize> = steps.iter().map(Vec::len).collect();
        let mut row =
            json!({"id": format!("case{i}"), "split": "train", "ids": ids, "n_prompt": prompt.len(), "steps": lens});
        if soft {
            let top: Vec<Value> = steps
                .iter()
                .flatten()
                .map(|&t| json!([[t, 0.8f64.ln()], [(t + 1) % vocab, 0.15f64.ln()], [(t + 2) % vocab, 0.05f64.ln()]]))
                .collect();
            row["top"] = json!(top);
        }
        lines.push_str(&format!("{row}\n"));
    }
    std::fs::write(dir.join("segments.jsonl"), lines).unwrap();
}

#[test]
fn training_lowers_the_loss_and_the_export_round_trips_through_the_converter() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    // Soft targets (distillation), as `segment` writes them; adapters on the
    // base layers not tuned, and the plain-input distillation beside.
    fixture_work(&work, true);
    let fx = tiny_fixture();
    let schedule = ["--steps", "12", "--batch", "4", "--lr", "2e-3", "--lora-rank", "2", "--plain-weight", "0.5"];
    run_ok(train_tool().arg("train").arg("--work").arg(&work).arg("--base").arg(&fx).args(schedule));
    let history: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(work.join("train/history.json")).unwrap()).unwrap();
    let ce: Vec<f64> = history.iter().filter(|h| h["kind"] == "train").map(|h| h["ce"].as_f64().unwrap()).collect();
    assert!(ce.len() >= 2 && ce.last().unwrap() < &(ce[0] * 0.95), "token CE did not fall: {ce:?}");
    let plain: Vec<f64> = history.iter().filter_map(|h| h["plain_ce"].as_f64()).collect();
    assert!(plain.len() >= 2 && plain.iter().all(|x| x.is_finite() && *x > 0.0), "no plain-input loss: {plain:?}");
    assert!(work.join("train/loss.png").metadata().unwrap().len() > 1000, "no loss curve");

    // Resuming a finished run does nothing; export writes the original layout.
    run_ok(train_tool().arg("train").arg("--work").arg(&work).arg("--base").arg(&fx).args(["--steps", "12"]));
    let out = dir.path().join("export");
    let export = ["--recommended-confidence", "0.9"];
    run_ok(
        train_tool().arg("export").arg("--work").arg(&work).arg("--base").arg(&fx).arg("--out").arg(&out).args(export),
    );
    for f in ["model.safetensors", "grafted.safetensors", "config.json", "tokenizer.json", "hamburger.json"] {
        assert!(out.join(f).exists(), "export lacks {f}");
    }
    // The adapters ship as factors beside the grafted modules; the full
    // checkpoint has them folded into the weights (the original layout).
    let keys = |f: &str| tensors(&out.join(f)).into_keys().collect::<Vec<_>>();
    assert!(keys("grafted.safetensors").iter().any(|k| k.ends_with(".lora_A")), "no adapters shipped");
    assert!(!keys("model.safetensors").iter().any(|k| k.contains(".lora_")), "adapters left unfolded");

    // A new run started from the export goes on from where this one ended
    // (here on the data's tokens alone: the hard-target path), with the
    // tuned layers and the adapters frozen as the export left them.
    let again = dir.path().join("again");
    std::fs::create_dir_all(&again).unwrap();
    fixture_work(&again, false);
    run_ok(
        train_tool()
            .arg("train")
            .arg("--work")
            .arg(&again)
            .arg("--base")
            .arg(&fx)
            .arg("--init")
            .arg(out.join("grafted.safetensors"))
            .args(["--steps", "5", "--batch", "4", "--lr", "2e-3", "--lora-rank", "2", "--base-lr-scale", "0"]),
    );
    let resumed: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(again.join("train/history.json")).unwrap()).unwrap();
    let first = resumed.iter().find(|h| h["kind"] == "train").unwrap()["ce"].as_f64().unwrap();
    assert!(first < ce[0] * 0.95, "--init did not start from the trained weights: CE {first} vs {}", ce[0]);
    let frozen = dir.path().join("frozen");
    run_ok(train_tool().arg("export").arg("--work").arg(&again).arg("--base").arg(&fx).arg("--out").arg(&frozen));
    let (before, after) = (tensors(&out.join("grafted.safetensors")), tensors(&frozen.join("grafted.safetensors")));
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    let (base, grafted): (Vec<_>, Vec<_>) = before.keys().partition(|k| k.starts_with("model.model.layers."));
    assert!(base.iter().any(|k| k.ends_with(".lora_A")) && base.iter().any(|k| k.ends_with("mlp.up_proj.weight")));
    for k in base {
        assert!(before[k] == after[k], "{k} moved under --base-lr-scale 0");
    }
    assert!(grafted.iter().any(|k| before[*k] != after[*k]), "the grafted modules did not learn");

    calibration_is_fitted_on_held_out_answers_and_folded_in(dir.path(), &work);
    diagnosis_gates_micro_tokens_by_the_stop_head(&dir.path().join("cal"));

    let gguf = dir.path().join("trained.gguf");
    convert(&out, &gguf, "f32");
    // The export's recommended confidence reaches the GGUF, the tools' default.
    assert_eq!(hamburger::model::recommended_confidence_of(&gguf).unwrap(), Some(0.9));
    let cases: Vec<_> = golden()["cases"]
        .as_array()
        .unwrap()
        .iter()
        .step_by(6)
        .map(|c| {
            let (prompt, _, confidence) = case_of(c);
            (prompt, 16, confidence)
        })
        .collect();
    for ((prompt, _, conf), (want, trace)) in cases.iter().zip(trainer_greedy_traced(&out, &cases)) {
        let conf = *conf;
        let ids: Vec<String> = prompt.iter().map(u64::to_string).collect();
        let cli = run_ok(
            Command::new(env!("CARGO_BIN_EXE_hamburger-cli"))
                .arg("-m")
                .arg(&gguf)
                .args(["--prompt-ids", &ids.join(","), "-n", "16", "--temp", "0", "--json", "-t", "1"])
                .args(["--confidence", &conf.to_string()]),
        );
        let v: Value = serde_json::from_str(cli.lines().last().unwrap()).unwrap();
        let got: Vec<Vec<u64>> = serde_json::from_value(v["macro_steps"].clone()).unwrap();
        // PyTorch in F32 and the runtime with its F16 cache round apart (by
        // less than the TF32 emulation's 5.1e-2 logit and 2.3e-3 stop
        // probability, testing::golden): the same decisions up to a near-tie
        // of twice those. The CLI cuts the last step at the budget; the
        // comparison ends with the shorter side.
        let rule = StepRule { max_steps: 4, confidence: conf as f32, forced: false, draft: None };
        let u32s = |s: &Vec<u64>| s.iter().map(|&t| t as u32).collect::<Vec<_>>();
        let (got_steps, want_steps) =
            (got.iter().map(u32s).collect::<Vec<_>>(), want.iter().map(u32s).collect::<Vec<_>>());
        let mut at = 0;
        let want_steps: Vec<(Vec<u32>, Vec<f32>, Vec<f32>)> = want_steps
            .into_iter()
            .map(|s| {
                let t = &trace[at..at + s.len()];
                at += s.len();
                (s, t.iter().map(|x| x.1).collect(), t.iter().map(|x| x.0).collect())
            })
            .collect();
        let w = decisions_of(want_steps.iter().map(|(s, p, m)| (&s[..], &p[..], m.clone())), &rule);
        let g = decisions_of(got_steps.iter().map(|s| (&s[..], &[][..], Vec::new())), &rule);
        assert_agree(&g, &w, 0.1, 5e-3, &format!("confidence {conf}"));
    }
}

/// A safetensors file's tensors by name, as raw bytes.
fn tensors(path: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors().into_iter().map(|(k, v)| (k, v.data().to_vec())).collect()
}

/// `calibrate` on a copy of the trained state, with every other fixture
/// answer held out: it fits the stop logit's scale and shift, and folds them
/// into the stop head, so that fitting again finds nothing to change.
fn calibration_is_fitted_on_held_out_answers_and_folded_in(dir: &Path, trained: &Path) {
    let cal = dir.join("cal");
    std::fs::create_dir_all(cal.join("train")).unwrap();
    fixture_work(&cal, true);
    let rows: Vec<String> = std::fs::read_to_string(cal.join("segments.jsonl"))
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if i % 2 == 1 {
                v["split"] = json!("heldout");
            }
            format!("{v}\n")
        })
        .collect();
    std::fs::write(cal.join("segments.jsonl"), rows.concat()).unwrap();
    std::fs::copy(trained.join("train/state.pt"), cal.join("train/state.pt")).unwrap();
    for _ in 0..2 {
        run_ok(train_tool().arg("calibrate").arg("--work").arg(&cal).arg("--base").arg(tiny_fixture()));
    }
    let history: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(cal.join("train/history.json")).unwrap()).unwrap();
    let fits: Vec<(f64, f64)> = history
        .iter()
        .filter(|h| h["kind"] == "calibration")
        .map(|h| (h["scale"].as_f64().unwrap(), h["shift"].as_f64().unwrap()))
        .collect();
    assert_eq!(fits.len(), 2, "{history:?}");
    let moved = |(a, b): (f64, f64)| (a - 1.0).abs().max(b.abs());
    assert!(moved(fits[0]) > 0.01, "the first fit changed nothing: {fits:?}");
    assert!(moved(fits[1]) < 1e-3, "the fit was not folded into the stop head: {fits:?}");
}

/// `diagnose` on the calibrated work directory: at confidence 0 the stop
/// head lets every micro token of each macro step's window (the up to 3
/// tokens after its first) through, so their accuracy is the micro
/// decoder's, teacher-forced; above 1 none; a perfect stop head takes only
/// right ones, at no cost to the base.
fn diagnosis_gates_micro_tokens_by_the_stop_head(work: &Path) {
    let out = run_ok(train_tool().arg("diagnose").arg("--work").arg(work).arg("--base").arg(tiny_fixture()).args([
        "--confidence",
        "0,1.01",
        "--json",
    ]));
    let report: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let (mut steps, mut micros) = (0usize, 0usize);
    for line in std::fs::read_to_string(work.join("segments.jsonl")).unwrap().lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let lens: Vec<usize> = serde_json::from_value(row["steps"].clone()).unwrap();
        if row["split"] == "heldout" && lens.len() >= 2 {
            let total: usize = lens.iter().sum();
            let mut start = 0;
            for k in &lens {
                micros += (total - start).min(4) - 1;
                start += k;
            }
            steps += lens.len();
        }
    }
    let (all, none, perfect) = (&report["gate"][0], &report["gate"][1], &report["oracle"]);
    let f = |v: &Value| v.as_f64().unwrap();
    assert_eq!(report["answers"], json!(9), "{report}");
    assert!((f(&all["extra_per_step"]) - micros as f64 / steps as f64).abs() < 1e-9, "{report}");
    assert!((f(&all["micro_acc"]) - f(&report["teacher_forced"]["micro_acc"])).abs() < 1e-9, "{report}");
    assert_eq!(f(&none["extra_per_step"]), 0.0, "{report}");
    assert_eq!(f(&perfect["micro_acc"]), 1.0, "{report}");
    // A step ends at its first wrong micro token: fewer than all the right ones.
    let right = f(&all["extra_per_step"]) * f(&all["micro_acc"]);
    assert!(f(&perfect["extra_per_step"]) > 0.0 && f(&perfect["extra_per_step"]) < right - 1e-9, "{report}");
    assert!(f(&perfect["micro_regret"]).abs() < 1e-6 && f(&all["micro_regret"]) > 0.0, "{report}");
}

/// The tokens a step's window holds: its first and the up to 3 after it,
/// whatever the data's cut (`--micro-windows`), summed over the fixture's answers.
fn window_tokens(work: &Path) -> f64 {
    let mut n = 0;
    for line in std::fs::read_to_string(work.join("segments.jsonl")).unwrap().lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let lens: Vec<usize> = serde_json::from_value(row["steps"].clone()).unwrap();
        if lens.len() >= 2 {
            let total: usize = lens.iter().sum();
            let mut start = 0;
            for k in &lens {
                n += (total - start).min(4);
                start += k;
            }
        }
    }
    n as f64
}

#[test]
fn micro_windows_teach_every_token_after_a_steps_first_and_a_resumed_run_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    fixture_work(dir.path(), true);
    let rows = std::fs::read_to_string(dir.path().join("segments.jsonl")).unwrap().lines().count().to_string();
    let train = |steps: &str, windows: bool| {
        let mut c = train_tool();
        c.arg("train").arg("--work").arg(dir.path()).arg("--base").arg(tiny_fixture());
        c.args(["--steps", steps, "--batch", &rows, "--lr", "1e-3", "--tune-layers", "0"]);
        if windows {
            c.arg("--micro-windows");
        }
        run_ok(&mut c);
    };
    // One step of every answer, then a second one resumed without the flag.
    train("1", true);
    train("2", false);
    let history: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("train/history.json")).unwrap()).unwrap();
    let tokens: Vec<f64> =
        history.iter().filter(|h| h["kind"] == "train").map(|h| h["tokens"].as_f64().unwrap()).collect();
    assert_eq!(tokens, vec![window_tokens(dir.path()); 2], "{history:?}");
}

/// Answers padded into one pass (`--micro-batch`, what fills a GPU) train as
/// answers one at a time do: a first step of every answer (taken in another
/// order: padded passes group answers by length) gives the same counts and,
/// up to rounding, the same losses (micro windows on, passes of 4 and the
/// rest); 0 is refused in one line naming the flag.
#[test]
fn answers_in_one_padded_pass_train_as_answers_one_at_a_time() {
    let first_step = |micro: &str| -> Value {
        let dir = tempfile::tempdir().unwrap();
        fixture_work(dir.path(), true);
        let rows = std::fs::read_to_string(dir.path().join("segments.jsonl")).unwrap().lines().count().to_string();
        let mut c = train_tool();
        c.arg("train").arg("--work").arg(dir.path()).arg("--base").arg(tiny_fixture());
        c.args(["--steps", "1", "--batch", &rows, "--lr", "1e-3", "--micro-windows", "--micro-batch", micro]);
        run_ok(&mut c);
        let history: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("train/history.json")).unwrap()).unwrap();
        history.into_iter().find(|h| h["kind"] == "train").unwrap()
    };
    let (one, padded) = (first_step("1"), first_step("4"));
    for key in ["tokens", "first_acc", "merged_first_acc", "micro_acc", "stop_acc"] {
        assert_eq!(one[key], padded[key], "{key}: {one} vs {padded}");
    }
    for key in ["ce", "bce", "micro_regret", "merged_first_regret"] {
        let (a, b) = (one[key].as_f64().unwrap(), padded[key].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{key}: {a} vs {b}");
    }
    let mut c = train_tool();
    let out = c.args(["train", "--work", "unused", "--micro-batch", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.trim().lines().count() == 1 && err.contains("--micro-batch"), "{err}");
}

/// A work directory without one training answer of two macro steps or more
/// (a window whose clock left no time to answer) is refused in one line
/// naming its segments, not a division by zero.
#[test]
fn train_refuses_a_work_directory_without_training_answers_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let one_step = json!({"id": "a", "split": "train", "ids": [1, 2, 3], "n_prompt": 2, "steps": [1]});
    std::fs::write(dir.path().join("segments.jsonl"), format!("{one_step}\n")).unwrap();
    let mut c = train_tool();
    c.arg("train").arg("--work").arg(dir.path()).arg("--base").arg(tiny_fixture()).args(["--steps", "1"]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.trim().lines().count() == 1 && err.contains("segments.jsonl"), "{err}");
}

/// The plain-input loss trains only the tuned layers and adapters, so with
/// them frozen it is refused in one line naming both flags.
#[test]
fn train_refuses_the_plain_loss_with_the_base_frozen_naming_both_flags() {
    let dir = tempfile::tempdir().unwrap();
    fixture_work(dir.path(), true);
    let mut c = train_tool();
    c.arg("train").arg("--work").arg(dir.path()).arg("--base").arg(tiny_fixture());
    let out = c.args(["--steps", "1", "--plain-weight", "1", "--base-lr-scale", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {err}");
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
    assert!(err.contains("--plain-weight") && err.contains("--base-lr-scale 0"), "{err}");
    assert!(!dir.path().join("train/state.pt").exists(), "a refused run saved a state");
}

#[test]
fn diagnose_refuses_a_grafted_file_that_is_not_safetensors_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    fixture_work(dir.path(), true);
    let segments = dir.path().join("segments.jsonl");
    let held = std::fs::read_to_string(&segments).unwrap().replace(r#""split":"train""#, r#""split":"heldout""#);
    std::fs::write(&segments, held).unwrap();
    let bad = dir.path().join("grafted.safetensors");
    std::fs::write(&bad, b"not a safetensors file at all").unwrap();
    let out = train_tool()
        .arg("diagnose")
        .arg("--work")
        .arg(dir.path())
        .arg("--base")
        .arg(tiny_fixture())
        .arg("--grafted")
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted a broken file: {err}");
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
    assert!(err.contains("diagnose:") && err.contains(&*bad.to_string_lossy()), "{err}");
}

/// `draft-vocab` counts the training answers' tokens (after each
/// prompt), most frequent first, reports each size's coverage of the
/// held-out answers, and writes the list `hamburger-convert --draft-vocab`
/// stores in a GGUF that loads.
#[test]
fn draft_vocab_counts_the_answers_tokens_and_the_converter_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let scored = [
        r#"{"id": "a", "split": "train", "ids": [9, 9, 5, 5, 5, 7], "n_prompt": 2}"#,
        r#"{"id": "b", "split": "train", "ids": [1, 7, 7, 5, 3], "n_prompt": 1}"#,
        r#"{"id": "c", "split": "heldout", "ids": [2, 5, 7, 4], "n_prompt": 1}"#,
    ];
    // A draft work directory's `tokens.jsonl`, or a training one's `scored.jsonl`.
    let list = dir.path().join("draft-vocab.json");
    for name in ["tokens.jsonl", "scored.jsonl"] {
        let work = dir.path().join(name.replace(".jsonl", ""));
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join(name), scored.join("\n") + "\n").unwrap();
        let mut c = train_tool();
        c.arg("draft-vocab").arg("--work").arg(&work).arg("--base").arg(tiny_fixture()).args(["--k", "2"]);
        let report = run_ok(c.arg("--out").arg(&list));
        assert!(report.contains("K =     2: 0.667"), "5 and 7 cover two of the three held-out tokens: {report}");
        let ids: Vec<u32> = serde_json::from_str(&std::fs::read_to_string(&list).unwrap()).unwrap();
        assert_eq!(ids, [5, 7], "5 four times, 7 three times, 3 once; prompts not counted");
    }
    let gguf = dir.path().join("tiny.gguf");
    let src = tiny_fixture().join("model.safetensors");
    let st = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
        .arg(&src)
        .args(["--no-progress", "--outtype", "f32", "--draft-vocab"])
        .arg(&list)
        .arg("--outfile")
        .arg(&gguf)
        .status()
        .unwrap();
    assert!(st.success());
    let model = hamburger::model::Model::open(&gguf, &Default::default()).unwrap();
    assert_eq!(model.draft_vocab.unwrap().ids, [5, 7]);
}

/// Each subcommand takes its own flags: `export` refuses `train`'s `--steps`
/// in one line naming it, before it reads anything; `all` runs every stage,
/// `calibrate` among them, and says so.
#[test]
fn a_stage_refuses_another_stages_flag_and_all_runs_every_stage() {
    let dir = tempfile::tempdir().unwrap();
    let mut export = train_tool();
    export.arg("export").arg("--work").arg(dir.path()).arg("--out").arg(dir.path()).args(["--steps", "5"]);
    let out = export.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "export accepted --steps: {err}");
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
    assert!(err.contains("--steps"), "{err}");
    let help = run_ok(train_tool().args(["all", "--help"])).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("(data, segment, train, calibrate, diagnose, export)"), "{help}");
}

#[test]
fn the_shipped_smollm2_hamburger_converts_loads_and_takes_multi_token_steps() {
    let grafted = repo().join("models/smollm2-hamburger/grafted.safetensors");
    let gguf_base = testmodel::smollm2_gguf(&testmodel::cache_dir()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    testmodel::cached_dir(&ckpt, |d| {
        testmodel::from_gguf::write(&gguf_base, d, testmodel::from_gguf::Grafted::Trained(&[grafted.as_path()]))
    })
    .unwrap();
    let gguf = dir.path().join("trained-q8_0.gguf");
    convert(&ckpt, &gguf, "q8_0");
    let cli = run_ok(
        Command::new(env!("CARGO_BIN_EXE_hamburger-cli"))
            .arg("-m")
            .arg(&gguf)
            .args(["-p", "Write a Python function that reverses a list.", "-n", "48", "--temp", "0", "--json"])
            .args(["--confidence", "0.5", "--ignore-eos"]),
    );
    let v: Value = serde_json::from_str(cli.lines().last().unwrap()).unwrap();
    let tps = v["timings"]["tokens_per_step"].as_f64().unwrap();
    // Seeded random modules take one token per step at any confidence in
    // (0, 1): their stop head says stop; the trained one goes on when sure.
    assert!(tps > 1.1, "the trained stop head should continue some macro steps at confidence 0.5, got {tps}");
}

#[test]
fn a_grafted_file_with_a_misshapen_tensor_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("grafted.safetensors");
    // A float tensor under a grafted key with the wrong shape.
    let data = vec![0u8; 4 * 3];
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3], &data).unwrap();
    safetensors::serialize_to_file([("comp_embedder.merger.pos", view)], None, &bad).unwrap();
    let gguf_base = testmodel::smollm2_gguf(&testmodel::cache_dir()).unwrap();
    let err =
        testmodel::from_gguf::write(&gguf_base, dir.path(), testmodel::from_gguf::Grafted::Trained(&[bad.as_path()]))
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("grafted.safetensors") && (err.contains("comp_embedder") || err.contains("micro_step_decoder")),
        "{err}"
    );
}

#[test]
fn a_further_trained_file_that_is_not_a_draft_head_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/smollm2-hamburger/grafted.safetensors");
    let stray = dir.path().join("stray.safetensors");
    let data = vec![0u8; 4 * 3];
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3], &data).unwrap();
    safetensors::serialize_to_file([("micro_step_decoder.extra.weight", view)], None, &stray).unwrap();
    let gguf_base = testmodel::smollm2_gguf(&testmodel::cache_dir()).unwrap();
    let write = |files: &[&Path]| {
        testmodel::from_gguf::write(&gguf_base, &dir.path().join("ck"), testmodel::from_gguf::Grafted::Trained(files))
            .unwrap_err()
            .to_string()
    };
    let err = write(&[&shipped, &stray]);
    assert!(
        err.contains("stray.safetensors") && err.contains("micro_step_decoder.extra") && err.contains("draft_head"),
        "{err}"
    );
    // The same file twice: every tensor in it repeated.
    let err = write(&[&shipped, &shipped]);
    assert!(err.contains("grafted.safetensors") && err.contains("two"), "{err}");
    assert!(!dir.path().join("ck").exists(), "nothing written");
}
