//! `hamburger-train draft --copy 2` on the tiny fixture: a draft head that
//! reads copy candidates (what followed the latest earlier occurrence of the
//! text's last 2 and last 1 tokens) learns the repeats of the tiny model's
//! answers, where a head without them cannot; the tool's drafts (each
//! looked up after the drafts before it) and its teacher-forced twin agree;
//! the copy matrix is exported, converted to `draft_copy.weight`, and the
//! runtime drafting with it keeps the base's output and accepts as the tool
//! measured, far above the head without copies.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use testing::testmodel::draft_head::with_draft_head;
use testing::testmodel::tiny_fixture;

use crate::draft::{fixture_work, history_of, run_ok, stage, SCHEDULE};
use crate::draft_head::{greedy_json, FORCED};

/// The last validation of the ungated rule (3 drafts at every verify forward) in `out`'s history.
fn last_val(out: &Path) -> Value {
    let h = history_of(out);
    h.into_iter().rev().find(|e| e["kind"] == "val" && e["rule"] == "n_max 3").unwrap()
}

/// The tiny fixture with the draft head `out/draft-head.safetensors`
/// (`draft_head.*`) beside its modules, converted to F32.
fn converted_with_head(out: &Path) -> PathBuf {
    let bytes = std::fs::read(out.join("draft-head.safetensors")).unwrap();
    let head = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<_> = head
        .tensors()
        .into_iter()
        .map(|(k, t)| (format!("micro_step_decoder.{}", k.strip_prefix("draft_head.").unwrap()), t))
        .collect();
    let head_dir = out.join("head");
    std::fs::create_dir_all(&head_dir).unwrap();
    safetensors::serialize_to_file(renamed, None, &head_dir.join("model.safetensors")).unwrap();
    let ck = with_draft_head(&out.join("ck"), &tiny_fixture(), &head_dir, None).unwrap();
    let gguf = out.join("model.gguf");
    let c = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
        .args([ck.to_str().unwrap(), "--outtype", "f32", "--no-progress", "-o", gguf.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    gguf
}

/// Greedy decoding of the token ids `prompt`, 24 tokens (`spec`: the speculative flags): the `--json` report.
fn decoded(model: &Path, prompt: &str, spec: &[&str]) -> Value {
    greedy_json(model, &[&["--prompt-ids", prompt, "-n", "24", "-t", "1"], spec].concat())
}

/// Accepted drafts per verify forward over the fixture's held-out golden
/// prompts (every third, as `fixture_work` splits them), with every output
/// checked against the base's own (one token per forward).
fn runtime_acceptance(model: &Path) -> f64 {
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny_fixture().join("golden.json")).unwrap()).unwrap();
    let (mut accepted, mut forwards) = (0, 0);
    for case in golden["cases"].as_array().unwrap().iter().step_by(3) {
        let ids: Vec<String> = case["prompt_ids"].as_array().unwrap().iter().map(|t| t.to_string()).collect();
        let prompt = ids.join(",");
        let (plain, drafted) = (decoded(model, &prompt, &["--confidence", "1.01"]), decoded(model, &prompt, &FORCED));
        assert_eq!(drafted["output_ids"], plain["output_ids"], "verification keeps the base's output");
        let steps = drafted["macro_steps"].as_array().unwrap();
        accepted += steps.iter().map(|s| s.as_array().unwrap().len() - 1).sum::<usize>();
        forwards += steps.len();
    }
    accepted as f64 / forwards as f64
}

#[test]
fn a_head_that_copies_learns_the_repeats_and_the_runtime_drafts_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, copying) = (dir.path().join("plain"), dir.path().join("copy"));
    fixture_work(&plain);
    fixture_work(&copying);
    run_ok(&mut stage("draft", &plain, &tiny_fixture(), &SCHEDULE));
    run_ok(&mut stage("draft", &copying, &tiny_fixture(), &[&SCHEDULE[..], &["--copy", "2"]].concat()));
    let (without, with) = (last_val(&plain.join("draft")), last_val(&copying.join("draft")));
    let per_row = |e: &Value| e["all_accepted"].as_f64().unwrap();
    // The walk looks each draft's candidates up after the drafts before it,
    // training reads the text's: on the base's own answers they agree.
    for e in history_of(&copying.join("draft")).iter().filter(|e| e["kind"] == "val" && e["rule"] == "n_max 3") {
        let (walked, forced) = (per_row(e), e["teacher_forced_accepted"].as_f64().unwrap());
        assert!((walked - forced).abs() < 1e-9, "{e}");
    }
    // (In 30 steps: 0.35 accepted per verify forward without, 0.60 with.)
    let per_verify = |e: &Value| e["accepted_per_verify_forward"].as_f64().unwrap();
    assert!(per_verify(&with) > per_verify(&without) + 0.15, "without copies {without}, with {with}");

    // The copy matrix [D, 2 D], exported beside the head.
    let head_file = copying.join("draft/draft-head.safetensors");
    let bytes = std::fs::read(&head_file).unwrap();
    let head = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(head.tensor("draft_head.copy.weight").unwrap().shape(), &[128, 256][..]);
    // A fresh work directory goes on from it: its verifier (the teacher that
    // tokenizes, converted to GGUF) leaves the copy matrix out, which the
    // original layout has no place for, and with no steps the head comes back.
    let again = dir.path().join("again");
    fixture_work(&again);
    let from_head = ["--prompts", "0", "--steps", "0", "--init-head", head_file.to_str().unwrap()];
    run_ok(&mut stage("draft", &again, &tiny_fixture(), &from_head));
    assert!(std::fs::read(again.join("draft/draft-head.safetensors")).unwrap() == bytes);

    // The runtime drafts with it, looking the candidates up in the text it
    // writes: on the same held-out answers it accepts what the tool measured
    // (its drafts are the tool's; it counts the prompt's forward, and drafts
    // less where the budget ends the answer: 0.33 and 0.50 here, the tool 0.35
    // and 0.60), and the head that copies far more.
    let runtime: Vec<f64> = [(&plain, &without), (&copying, &with)]
        .into_iter()
        .map(|(out, tool)| {
            let runtime = runtime_acceptance(&converted_with_head(&out.join("draft")));
            assert!((runtime - per_verify(tool)).abs() < 0.15, "{}: runtime {runtime}, the tool {tool}", out.display());
            runtime
        })
        .collect();
    assert!(runtime[1] > runtime[0] + 0.1, "runtime accepted per verify forward, without copies and with: {runtime:?}");
}
