//! A draft head in the same GGUF (`draft.blk.N.*` and `draft_stop.*`, from a
//! checkpoint's `draft_head.*` tensors, as `hamburger-train draft` writes
//! them): self-verified decoding drafts with it, macro steps never read it,
//! and the output stays the base's. On the trained SmolLM2-HAMburger at Q8_0.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use testing::testmodel::draft_head::CopyMatrix;
use testing::testmodel::{converted, smollm2_checkpoint, smollm2_draft_head_checkpoint, smollm2_trained_checkpoint};

/// The trained checkpoint with a draft head copied from `head`'s macro
/// micro decoder and stop head (and `copy` as its copy matrix), converted to Q8_0.
fn with_draft_head(dir: &Path, ck: &Path, head: &Path, copy: Option<&CopyMatrix>) -> PathBuf {
    let src = testing::testmodel::draft_head::with_draft_head(dir, ck, head, copy).unwrap();
    let out = dir.join("draft-head-q8_0.gguf");
    let status = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
        .args([src.to_str().unwrap(), "--outtype", "q8_0", "--no-progress", "-o", out.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    out
}

/// A prompt of the kind the macro modules were trained on.
const PYTHON: &str = "Write a Python function `make_tarball(base_name, base_dir, compress, verbose, dry_run, owner, \
                      group)`. Create a (possibly compressed) tar file from all the files under 'base_dir'.";

/// Greedy decoding by `hamburger-cli -m model` with `args` (the prompt, the
/// budget, the threads and the speculative flags): the `--json` report.
pub(crate) fn greedy_json(model: &Path, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_hamburger-cli"))
        .args(["-m", model.to_str().unwrap(), "--temp", "0", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Greedy decoding of `prompt`, 48 tokens (`spec`: the speculative flags): the `--json` report.
fn decoded(model: &Path, prompt: &str, spec: &[&str]) -> Value {
    greedy_json(model, &[&["-p", prompt, "-n", "48", "-t", "2"], spec].concat())
}

/// Self-verified decoding with 3 drafts at every verify forward.
pub(crate) const FORCED: [&str; 6] = ["--spec-type", "draft-mtp", "--spec-draft-n-min", "3", "--spec-draft-n-max", "3"];

/// Drafts accepted over the whole answer.
fn accepted(report: &Value) -> usize {
    let steps = report["macro_steps"].as_array().unwrap();
    steps.iter().map(|s| s.as_array().unwrap().len() - 1).sum()
}

#[test]
fn self_verified_decoding_drafts_with_the_draft_head_and_macro_steps_ignore_it() {
    let ck = smollm2_trained_checkpoint().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plain = converted(&ck, "smollm2-trained", ggml::Type::Q8_0, false).unwrap();
    let (macro_steps, verified) = (decoded(&plain, PYTHON, &[]), decoded(&plain, PYTHON, &FORCED));
    assert!(accepted(&verified) >= 8, "the trained drafts are accepted: {verified}");

    // A draft head equal to the macro modules: the same drafts, accepted alike.
    let same = with_draft_head(&dir.path().join("same"), &ck, &ck, None);
    assert_eq!(decoded(&same, PYTHON, &FORCED)["macro_steps"], verified["macro_steps"]);

    // The untrained (random) modules as the draft head: the drafts are the
    // head's (hardly any accepted), the output the base's; macro steps run
    // the trained modules as before.
    let random = with_draft_head(&dir.path().join("random"), &ck, &smollm2_checkpoint().unwrap(), None);
    let drafted = decoded(&random, PYTHON, &FORCED);
    assert_eq!(drafted["output_ids"], verified["output_ids"], "verification keeps the base's output");
    assert!(accepted(&drafted) < accepted(&verified) / 2, "random drafts are rejected: {drafted}");
    let m = decoded(&random, PYTHON, &[]);
    assert_eq!((&m["output_ids"], &m["macro_steps"]), (&macro_steps["output_ids"], &macro_steps["macro_steps"]));

    // A copy matrix (`draft_copy.weight`): zero, the drafts are the head's
    // without one; otherwise the copy candidates change the drafts, and
    // still neither the output nor the macro steps.
    let zero = CopyMatrix::from_fn(576, 2, |_| 0.0);
    let zeroed = with_draft_head(&dir.path().join("zero"), &ck, &ck, Some(&zero));
    assert_eq!(decoded(&zeroed, PYTHON, &FORCED)["macro_steps"], verified["macro_steps"]);
    let noise = CopyMatrix::from_fn(576, 2, |i| 0.05 * ((i * 7919 % 1000) as f32 / 500.0 - 1.0));
    let noisy = with_draft_head(&dir.path().join("noise"), &ck, &ck, Some(&noise));
    let drafted = decoded(&noisy, PYTHON, &FORCED);
    assert_eq!(drafted["output_ids"], verified["output_ids"], "verification keeps the base's output");
    assert_ne!(drafted["macro_steps"], verified["macro_steps"], "the copy candidates change the drafts");
    let m = decoded(&noisy, PYTHON, &[]);
    assert_eq!((&m["output_ids"], &m["macro_steps"]), (&macro_steps["output_ids"], &macro_steps["macro_steps"]));
}

/// Everyday chat turns (none from the training data), as SmolLM2's chat
/// template renders them.
const CHATS: [&str; 3] = [
    "Give me three tips for sleeping better.",
    "Explain recursion to a ten-year-old.",
    "Write a haiku about autumn leaves.",
];

#[test]
fn the_shipped_draft_head_and_macro_modules_both_draft_everyday_chat() {
    // Both shipped files learned general chat (the macro modules, run 9, from
    // the draft head's micro decoder): each drafts everyday turns at 0.4
    // accepted per verify forward or more, where run 4's macro modules, trained
    // on Python's documentation alone, reached 0.25; the output stays the base's.
    let macro_only =
        converted(&smollm2_trained_checkpoint().unwrap(), "smollm2-trained", ggml::Type::Q8_0, false).unwrap();
    let head = smollm2_draft_head_checkpoint().unwrap();
    let with_head = converted(&head, "smollm2-draft-head", ggml::Type::Q8_0, false).unwrap();
    // Drafts accepted and verify forwards, summed over the turns: [macro modules, draft head].
    let (mut drafts_accepted, mut forwards) = ([0; 2], [0; 2]);
    for chat in CHATS {
        let prompt = format!("<|im_start|>user\n{chat}<|im_end|>\n<|im_start|>assistant\n");
        let (m, d) = (decoded(&macro_only, &prompt, &FORCED), decoded(&with_head, &prompt, &FORCED));
        assert_eq!(d["output_ids"], m["output_ids"], "verification keeps the base's output: {chat}");
        for (i, r) in [m, d].iter().enumerate() {
            drafts_accepted[i] += accepted(r);
            forwards[i] += r["macro_steps"].as_array().unwrap().len();
        }
    }
    let rate = |i: usize| drafts_accepted[i] as f64 / forwards[i] as f64;
    assert!(
        rate(0) >= 0.4 && rate(1) >= 0.4,
        "accepted per verify forward: macro modules {:.2}, draft head {:.2}",
        rate(0),
        rate(1)
    );
}
