//! A draft vocabulary (`hamburger-convert --draft-vocab FILE` or
//! `hamburger.json`'s `draft_vocab`, stored as `hamburger.draft_vocab`) on the trained SmolLM2-HAMburger at
//! Q8_0: self-verified drafts come from the lm_head's rows of those tokens
//! alone, mapped back to token ids, and the output stays the base's.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use testing::testmodel::{converted, smollm2_trained_checkpoint};

/// The trained model converted to Q8_0 with the draft vocabulary `ids`:
/// given with `--draft-vocab FILE`, or else as `draft_vocab` in its hamburger.json.
fn with_draft_vocab(dir: &Path, ck: &Path, ids: &[u64], flag: bool) -> PathBuf {
    let src = dir.join("ck");
    std::fs::create_dir_all(&src).unwrap();
    for f in ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::os::unix::fs::symlink(ck.join(f), src.join(f)).unwrap();
    }
    let mut h: Value = serde_json::from_str(&std::fs::read_to_string(ck.join("hamburger.json")).unwrap()).unwrap();
    let list = dir.join("draft-vocab.json");
    if flag {
        std::fs::write(&list, Value::from(ids).to_string()).unwrap();
    } else {
        h["draft_vocab"] = ids.into();
    }
    std::fs::write(src.join("hamburger.json"), h.to_string()).unwrap();
    let out = dir.join("draft-vocab-q8_0.gguf");
    let status = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
        .args([src.to_str().unwrap(), "--outtype", "q8_0", "--no-progress", "-o", out.to_str().unwrap()])
        .args(if flag { vec!["--draft-vocab", list.to_str().unwrap()] } else { vec![] })
        .status()
        .unwrap();
    assert!(status.success());
    out
}

/// Greedy self-verified decoding with 3 drafts at every verify forward: the `--json` report.
fn drafted(model: &Path) -> Value {
    let prompt =
        "Write a Python function `make_tarball(base_name, base_dir, compress, verbose, dry_run, owner, group)`. \
                  Create a (possibly compressed) tar file from all the files under 'base_dir'.";
    let out = Command::new(env!("CARGO_BIN_EXE_hamburger-cli"))
        .args(["-m", model.to_str().unwrap(), "-p", prompt, "-n", "64", "--temp", "0", "-t", "2", "--json"])
        .args(["--spec-type", "draft-mtp", "--spec-draft-n-min", "3", "--spec-draft-n-max", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each verify forward's accepted drafts (a step's tokens but its last, the base's own).
fn accepted(report: &Value) -> Vec<u64> {
    let steps = report["macro_steps"].as_array().unwrap();
    steps
        .iter()
        .flat_map(|s| s.as_array().unwrap().split_last().unwrap().1.iter().map(|t| t.as_u64().unwrap()))
        .collect()
}

#[test]
fn drafts_come_from_the_draft_vocabulary_and_the_output_stays_the_bases() {
    let ck = smollm2_trained_checkpoint().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let whole = drafted(&converted(&ck, "smollm2-trained", ggml::Type::Q8_0, false).unwrap());
    let n_vocab = 49152u64;
    let drafts = accepted(&whole);
    assert!(drafts.len() >= 8, "the trained drafts are accepted: {whole}");

    // Every token, in reverse order: the head's rows are the lm_head's, so the
    // drafts are the whole vocabulary's, mapped back to their ids.
    let reversed: Vec<u64> = (0..n_vocab).rev().collect();
    let same = drafted(&with_draft_vocab(&dir.path().join("reversed"), &ck, &reversed, false));
    assert_eq!(same["output_ids"], whole["output_ids"]);
    assert_eq!(same["macro_steps"], whole["macro_steps"], "the same drafts, accepted alike");

    // The output's tokens but the most accepted draft: never drafted, the output unchanged.
    let most = *drafts.iter().max_by_key(|&&t| drafts.iter().filter(|&&d| d == t).count()).unwrap();
    let mut ids: Vec<u64> = whole["output_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.retain(|&t| t != most);
    let small = drafted(&with_draft_vocab(&dir.path().join("small"), &ck, &ids, true));
    assert_eq!(small["output_ids"], whole["output_ids"], "verification keeps the base's output");
    let small_drafts = accepted(&small);
    assert!(!small_drafts.is_empty(), "{small}");
    assert!(small_drafts.iter().all(|t| ids.contains(t)), "every accepted draft is in the draft vocabulary: {small}");
}
