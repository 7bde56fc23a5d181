//! `hamburger-train draft` and `accept` (train/, PyTorch on the CPU) on the
//! tiny fixture: the micro decoder trained as a draft head on the base's
//! features cached once; an interrupted run resuming to the same weights as
//! one that was not; caches of another base or tokenizer refused by name;
//! the acceptance measure's walk and its teacher-forced twin agreeing;
//! ShareGPT's own replies as the training text (`--reference-answers`);
//! the base's answers kept in a corpus that seeds a new work directory;
//! `accept --head`, a draft head alone beside macro modules; `draft
//! --init-head`, a run going on from one; `--dtype bf16`, training under
//! bf16 autocast.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use testing::reference::Reference;
use testing::sharegpt::{self, chat};
use testing::testmodel::tiny_fixture;

/// The directory of the project's binaries (the teacher server, the scorer, the converter).
pub(crate) fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_hamburger-convert")).parent().unwrap().to_path_buf()
}

/// `hamburger-train -t 1 STAGE --work WORK --base BASE --bin BIN ARGS...`.
pub(crate) fn stage(name: &str, work: &Path, base: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../train/hamburger-train"));
    c.args(["-t", "1", name, "--work"]).arg(work).arg("--base").arg(base).arg("--bin").arg(bin_dir()).args(args);
    c
}

pub(crate) fn run_ok(c: &mut Command) -> String {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{:?} failed: {}", c, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The one-line error of a command that must fail.
fn one_line_error(c: &mut Command) -> String {
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "{c:?} succeeded: {err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    err
}

/// A work directory whose answers are the base's own greedy continuations
/// of the fixture's golden prompts (24 tokens, the f32 reference's),
/// tokenized as `draft` tokenizes them, every third held out, and no
/// prompts left to answer.
pub(crate) fn fixture_work(dir: &Path) {
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny_fixture().join("golden.json")).unwrap()).unwrap();
    let reference = Reference::load(&tiny_fixture().join("hamburger.ckpt"), &tiny_fixture()).unwrap();
    let mut lines = String::new();
    for (i, case) in golden["cases"].as_array().unwrap().iter().enumerate() {
        let prompt: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        let (answer, _) = reference.base_greedy(&prompt, 24);
        let split = if i % 3 == 0 { "heldout" } else { "train" };
        let ids: Vec<u32> = prompt.iter().chain(&answer).copied().collect();
        let row = json!({"id": format!("case{i}"), "split": split, "ids": ids, "n_prompt": prompt.len()});
        lines.push_str(&format!("{row}\n"));
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tokens.jsonl"), lines).unwrap();
    std::fs::write(dir.join("prompts.jsonl"), "").unwrap();
}

pub(crate) const SCHEDULE: [&str; 8] = ["--prompts", "0", "--steps", "30", "--batch", "16", "--lr", "1e-3"];

fn history(work: &Path) -> Vec<Value> {
    history_of(&work.join("draft"))
}

/// The history a run wrote into its `--out` directory.
pub(crate) fn history_of(out: &Path) -> Vec<Value> {
    serde_json::from_str(&std::fs::read_to_string(out.join("history.json")).unwrap()).unwrap()
}

/// The token loss at every training report of a history.
fn token_ce(h: &[Value]) -> Vec<f64> {
    h.iter().filter(|e| e["kind"] == "train").map(|e| e["ce"].as_f64().unwrap()).collect()
}

#[test]
fn draft_trains_on_cached_features_and_an_interrupted_run_resumes_to_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, cut) = (dir.path().join("whole"), dir.path().join("cut"));
    fixture_work(&whole);
    fixture_work(&cut);
    run_ok(&mut stage("draft", &whole, &tiny_fixture(), &SCHEDULE));
    macro_modules_kept_and_the_trained_ones_beside_them(&whole.join("draft/grafted.safetensors"));
    // A new run from that head (`--init-head`) starts where it ended: given
    // no steps, it exports the same head.
    let (head, again) = (whole.join("draft/draft-head.safetensors"), whole.join("again"));
    let from_head = ["--out", again.to_str().unwrap(), "--init-head", head.to_str().unwrap()];
    run_ok(&mut stage(
        "draft",
        &whole,
        &tiny_fixture(),
        &[&["--prompts", "0", "--steps", "0"][..], &from_head].concat(),
    ));
    assert!(std::fs::read(again.join("draft-head.safetensors")).unwrap() == std::fs::read(&head).unwrap());
    macro_modules_kept_and_the_trained_ones_beside_them(&again.join("grafted.safetensors"));

    // The cache: one f16 feature row per answer token, 4 feature layers of 128.
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(whole.join("features/meta.json")).unwrap()).unwrap();
    assert_eq!(meta["feature_layers"], json!([3, 7, 11, 15]), "{meta}");
    let bytes = std::fs::read(whole.join("features/shard-00000.safetensors")).unwrap();
    let shard = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let feats = shard.tensor("features").unwrap();
    let answers: Vec<Value> = std::fs::read_to_string(whole.join("tokens.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let answer = |v: &Value| v["ids"].as_array().unwrap()[v["n_prompt"].as_u64().unwrap() as usize..].to_vec();
    let tokens: Vec<u64> = answers.iter().flat_map(answer).map(|t| t.as_u64().unwrap()).collect();
    assert_eq!((feats.dtype(), feats.shape()), (safetensors::Dtype::F16, &[tokens.len(), 4, 128][..]));
    // The base's 8 most likely tokens from the same forward: on its own
    // greedy answers the first is the answer's next token at every row.
    let top_ids = shard.tensor("top_ids").unwrap();
    assert_eq!(top_ids.shape(), &[tokens.len(), 8][..]);
    let top: Vec<i64> = top_ids.data().chunks(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
    let firsts: Vec<u64> = top.chunks(8).map(|row| row[0] as u64).collect();
    assert_eq!(firsts, tokens);

    // The token loss falls; the acceptance is measured before and after.
    let h = history(&whole);
    let ce = token_ce(&h);
    assert!(ce.len() == 6 && ce[5] < ce[0] * 0.8, "token CE did not fall: {ce:?}");
    // The same run under bf16 autocast (`--dtype bf16`) learns as well, in
    // other arithmetic: its head is not the f32 run's.
    let bf16 = whole.join("bf16");
    run_ok(&mut stage(
        "draft",
        &whole,
        &tiny_fixture(),
        &[&SCHEDULE[..], &["--dtype", "bf16", "--out", bf16.to_str().unwrap()]].concat(),
    ));
    let ce = token_ce(&history_of(&bf16));
    assert!(ce.len() == 6 && ce[5] < ce[0] * 0.8, "token CE did not fall under bf16: {ce:?}");
    assert!(std::fs::read(bf16.join("draft-head.safetensors")).unwrap() != std::fs::read(&head).unwrap());
    let val_steps: Vec<u64> = h.iter().filter(|e| e["kind"] == "val").map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(val_steps.first(), Some(&0));
    assert_eq!(val_steps.last(), Some(&30));

    // The same run stopped by SIGTERM while training, then run again.
    let mut child = stage("draft", &cut, &tiny_fixture(), &SCHEDULE).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let started = lines.by_ref().map(Result::unwrap).find(|l| l.starts_with("draft: 1/30"));
    assert!(started.is_some(), "no training progress");
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(!child.wait().unwrap().success(), "not stopped: {rest:?}");
    assert!(rest.iter().any(|l| l.contains("saved: run the same command to go on")), "{rest:?}");
    let stopped_at = history(&cut).iter().rev().find_map(|e| e["step"].as_u64()).unwrap();
    assert!(stopped_at < 30, "stopped at {stopped_at}");
    run_ok(&mut stage("draft", &cut, &tiny_fixture(), &SCHEDULE));
    let (a, b) = (whole.join("draft/grafted.safetensors"), cut.join("draft/grafted.safetensors"));
    assert!(std::fs::read(a).unwrap() == std::fs::read(b).unwrap(), "resumed weights differ from the whole run's");

    // Every row's acceptance: the measure's drafts (each from the one
    // before, as the runtime drafts) and the training's teacher-forced ones
    // agree at every validation.
    for e in history(&whole).iter().filter(|e| e["kind"] == "val" && e["rule"] == "n_max 3") {
        let (walked, forced) = (e["all_accepted"].as_f64().unwrap(), e["teacher_forced_accepted"].as_f64().unwrap());
        assert!((walked - forced).abs() < 1e-9, "{e}");
    }
    accept_measures_the_draft_head_on_the_verifiers_own_answers(&whole, dir.path());
}

/// The result holds the base's own micro decoder and stop head, which macro
/// steps keep, and the trained ones beside them as the draft head
/// (`draft_head.*`, the GGUF's `draft.blk.N.*` and `draft_stop.*`).
fn macro_modules_kept_and_the_trained_ones_beside_them(grafted: &Path) {
    let values = |t: safetensors::tensor::TensorView| -> Vec<f32> {
        match t.dtype() {
            safetensors::Dtype::F32 => t.data().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(),
            safetensors::Dtype::BF16 => {
                t.data().chunks(2).map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)).collect()
            }
            other => panic!("a {other:?} tensor"),
        }
    };
    let (out, base) =
        (std::fs::read(grafted).unwrap(), std::fs::read(tiny_fixture().join("model.safetensors")).unwrap());
    let (out, base) =
        (safetensors::SafeTensors::deserialize(&out).unwrap(), safetensors::SafeTensors::deserialize(&base).unwrap());
    let macro_keys: Vec<String> =
        out.names().into_iter().filter(|k| k.starts_with("micro_step_decoder.")).map(str::to_string).collect();
    assert!(!macro_keys.is_empty());
    for k in &macro_keys {
        assert_eq!(values(out.tensor(k).unwrap()), values(base.tensor(k).unwrap()), "{k} changed");
        let draft = format!("draft_head.{}", k.strip_prefix("micro_step_decoder.").unwrap());
        assert_eq!(out.tensor(&draft).unwrap().shape(), out.tensor(k).unwrap().shape(), "{draft}");
    }
    // The head alone beside it, as a repository ships it next to its modules.
    let alone = std::fs::read(grafted.with_file_name("draft-head.safetensors")).unwrap();
    let alone = safetensors::SafeTensors::deserialize(&alone).unwrap();
    let mut head_keys: Vec<&str> = out.names().into_iter().filter(|k| k.starts_with("draft_head.")).collect();
    let mut alone_keys = alone.names();
    head_keys.sort_unstable();
    alone_keys.sort_unstable();
    assert_eq!(alone_keys, head_keys);
    for k in head_keys {
        assert_eq!(alone.tensor(k).unwrap().data(), out.tensor(k).unwrap().data(), "{k}");
    }
}

/// `accept` on three prompts: the verifier answers them (the teacher server
/// at confidence > 1), the answers are tokenized and their features cached, and
/// each rule's walk is reported; with no draft allowed (p_min 1) every
/// draftable row is a verify forward and nothing is accepted. With
/// `--runtime` the runtime decodes the same prompts self-verified with the
/// trained head (hamburger-cli, Q8_0): one measure, two tools that agree.
/// Trees of drafts (`--tree`) are taken best-first, so a larger tree holds
/// a smaller one and accepts at least as much at every row; the runtime's
/// trees (`--spec-draft-tree`) agree with the tool's on the texts it wrote.
fn accept_measures_the_draft_head_on_the_verifiers_own_answers(work: &Path, dir: &Path) {
    let prompts = dir.join("few.jsonl");
    let rows: Vec<String> = ["Tell me a story.", "Write a function.", "What is a list?"]
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}\n", json!({"id": format!("p{i}"), "prompt": p})))
        .collect();
    std::fs::write(&prompts, rows.concat()).unwrap();
    let args = [
        "--prompts",
        prompts.to_str().unwrap(),
        "--max-tokens",
        "24",
        "--confidence",
        "0.5",
        "--p-min",
        "1",
        "--ngram",
        "2",
        "--tree",
        "1,3,8",
        "--runtime",
    ];
    let report: Value =
        serde_json::from_str(&run_ok(&mut stage("accept", work, &tiny_fixture(), &[&args[..], &["--json"]].concat())))
            .unwrap();
    assert_eq!(report["answers"], json!(3), "{report}");
    let rule = |name: &str| report["rules"].as_array().unwrap().iter().find(|r| r["rule"] == name).unwrap().clone();
    let none = rule("n_max 3, p >= 1");
    assert_eq!((none["accepted_per_forward"].as_f64(), none["drafted_per_forward"].as_f64()), (Some(0.0), Some(0.0)));
    assert_eq!(none["forwards"], none["rows"], "{none}");
    let all = rule("n_max 3");
    assert!(all["forwards"].as_u64() <= none["forwards"].as_u64(), "{all}");
    assert!(all["drafted_per_forward"].as_f64().unwrap() > 2.0, "{all}");
    assert!(work.join("accept/few/features/meta.json").exists());
    let every = |v: &Value| v["all_accepted"].as_f64().unwrap();
    let trees = ["tree of 1, n_max 3", "tree of 3, n_max 3", "tree of 8, n_max 3"].map(rule);
    assert!(every(&trees[0]) <= every(&all) && every(&trees[0]) <= every(&trees[1]), "{trees:?} {all}");
    assert!(every(&trees[1]) <= every(&trees[2]), "{trees:?}");
    let sizes = trees.each_ref().map(|t| t["all_drafted"].as_f64().unwrap());
    assert!(sizes[0] <= 1.0 && sizes[1] <= 3.0 && sizes[2] <= 8.0 && sizes[2] > 6.0, "{sizes:?}");

    // The runtime drafting 3 at every verify forward, and the tool walking
    // the texts the runtime wrote with the same rule: the same base forwards
    // and drafts, and the same acceptance within the noise of some hundred
    // verify forwards (their drafts come from Q8_0 and from PyTorch f32).
    let ours = report["runtime"].as_array().unwrap().iter().find(|r| r["rule"] == "n_max 3").unwrap().clone();
    let tool = &report["runtime_texts"];
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap();
    assert!((f(&ours, "forwards") - f(tool, "forwards")).abs() <= 0.05 * f(tool, "forwards"), "{ours} {tool}");
    assert!(f(&ours, "verify_forwards") > 0.9 * f(&ours, "forwards"), "{ours}");
    assert!((f(&ours, "drafted_per_forward") - f(tool, "drafted_per_forward")).abs() < 0.2, "{ours} {tool}");
    let accepted = (f(&ours, "accepted_per_verify_forward"), f(tool, "accepted_per_verify_forward"));
    assert!((accepted.0 - accepted.1).abs() < 0.1, "{ours} {tool}");
    // Trees of drafts: the runtime's (`--spec-draft-tree`) and the tool's
    // walk of the texts it wrote take the same base forwards and tree sizes.
    let runtime_trees = report["runtime_trees"].as_array().unwrap();
    assert_eq!(runtime_trees.len(), 3, "{report}");
    for t in runtime_trees {
        let (ours, tool) = (&t["runtime"], &t["tool"]);
        assert!((f(ours, "forwards") - f(tool, "forwards")).abs() <= 0.05 * f(tool, "forwards"), "{t}");
        assert!((f(ours, "drafted_per_forward") - f(tool, "drafted_per_forward")).abs() < 0.2, "{t}");
        let accepted = (f(ours, "accepted_per_verify_forward"), f(tool, "accepted_per_verify_forward"));
        assert!((accepted.0 - accepted.1).abs() < 0.1, "{t}");
    }
    let tree8 = &runtime_trees[2]["runtime"];
    assert!(f(tree8, "drafted_per_forward") > f(&ours, "drafted_per_forward") + 2.0, "{tree8} {ours}");
    // With p_min 1 the runtime drafts nothing, as the tool's rule does.
    let never = report["runtime"].as_array().unwrap().iter().find(|r| r["p_min"] == json!(1.0)).unwrap().clone();
    assert_eq!((never["verify_forwards"].as_u64(), never["drafted_per_forward"].as_f64()), (Some(0), Some(0.0)));
    // The context drafting first (`--ngram 2`, ngram-simple,draft-mtp): the
    // tiny model's answers repeat themselves, and there its drafts are
    // accepted where the random micro decoder's are not, in both tools.
    let context = rule("n_max 3, ngram-simple n 2 first");
    let per_verify = |v: &Value| v["accepted_per_verify_forward"].as_f64().unwrap();
    assert!(per_verify(&context) > per_verify(&all) + 0.2, "{context} {all}");
    let runtime =
        |name: &str| report["runtime"].as_array().unwrap().iter().find(|r| r["rule"] == name).unwrap().clone();
    let ours_context = runtime("n_max 3, ngram-simple n 2 first");
    assert!(per_verify(&ours_context) > per_verify(&ours) + 0.2, "{ours_context} {ours}");
    assert!(runtime("gate, ngram-simple n 2 first")["forwards"].as_u64() > Some(0));

    // The head alone (`--head`, as a draft window returns it) beside macro modules
    // without one measures as the file that holds both; the macro modules alone draft otherwise.
    let both = std::fs::read(work.join("draft/grafted.safetensors")).unwrap();
    let both = safetensors::SafeTensors::deserialize(&both).unwrap();
    let macro_only: Vec<_> = both.tensors().into_iter().filter(|(k, _)| !k.starts_with("draft_head.")).collect();
    let macro_file = dir.join("macro.safetensors");
    safetensors::serialize_to_file(macro_only, None, &macro_file).unwrap();
    let head = work.join("draft/draft-head.safetensors");
    let measured = |grafted: &Path, head: Option<&Path>| -> Value {
        let mut c = stage("accept", work, &tiny_fixture(), &args[..args.len() - 1]);
        c.arg("--json").arg("--grafted").arg(grafted);
        if let Some(h) = head {
            c.arg("--head").arg(h);
        }
        serde_json::from_str::<Value>(&run_ok(&mut c)).unwrap()["rules"].clone()
    };
    let merged = measured(&work.join("draft/grafted.safetensors"), None);
    assert_eq!(measured(&macro_file, Some(&head)), merged);
    assert_ne!(measured(&macro_file, None), merged);
    let err = one_line_error(&mut stage(
        "accept",
        work,
        &tiny_fixture(),
        &["--prompts", prompts.to_str().unwrap(), "--head", macro_file.to_str().unwrap()],
    ));
    assert!(err.contains("not a draft head") && err.contains("macro.safetensors"), "{err}");
    for (flag, sizes) in [("--ngram", "2,0"), ("--tree", "3,0")] {
        let err = one_line_error(&mut stage(
            "accept",
            work,
            &tiny_fixture(),
            &["--prompts", prompts.to_str().unwrap(), flag, sizes],
        ));
        assert!(err.contains(&format!("{flag} {sizes}")), "{err}");
    }
}

/// Each stage takes its own flags: `draft` refuses `export`'s `--snapshot`
/// and `accept` refuses `draft`'s `--steps`, in one line naming them.
#[test]
fn draft_and_accept_refuse_another_stages_flag() {
    let dir = tempfile::tempdir().unwrap();
    let err = one_line_error(&mut stage("draft", dir.path(), &tiny_fixture(), &["--snapshot", "3"]));
    assert!(err.contains("--snapshot"), "{err}");
    let err = one_line_error(&mut stage("accept", dir.path(), &tiny_fixture(), &["--prompts", "x", "--steps", "5"]));
    assert!(err.contains("--steps"), "{err}");
}

/// A copy of the fixture whose `edit` changed it.
fn fixture_copy(dir: &Path, edit: impl FnOnce(&Path)) -> PathBuf {
    let copy = dir.join("base");
    std::fs::create_dir_all(&copy).unwrap();
    for f in ["config.json", "hamburger.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tiny_fixture().join(f), copy.join(f)).unwrap();
    }
    edit(&copy);
    copy
}

#[test]
fn a_feature_cache_of_another_base_or_tokenizer_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    fixture_work(&work);
    run_ok(&mut stage("draft", &work, &tiny_fixture(), &["--prompts", "0", "--steps", "1", "--batch", "4"]));

    // Another chat template: the answers' token ids would differ.
    let other_template = fixture_copy(&dir.path().join("t"), |d| {
        let path = d.join("tokenizer_config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let changed = text.replace("<|im_start|>assistant", "<|im_start|>Assistant");
        assert_ne!(text, changed);
        std::fs::write(path, changed).unwrap();
    });
    let err = one_line_error(&mut stage("draft", &work, &other_template, &["--prompts", "0", "--steps", "2"]));
    assert!(err.contains("tokenizer") && err.contains(&*work.join("features").to_string_lossy()), "{err}");

    // One base weight changed: the cached features are another base's.
    let other_base = fixture_copy(&dir.path().join("b"), |d| {
        let path = d.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let key = "model.model.layers.0.mlp.down_proj.weight";
        let mut changed = st.tensor(key).unwrap().data().to_vec();
        changed[1] ^= 0x40;
        let views: Vec<(String, safetensors::tensor::TensorView)> = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                if name == key {
                    (name, safetensors::tensor::TensorView::new(view.dtype(), view.shape().to_vec(), &changed).unwrap())
                } else {
                    (name, view)
                }
            })
            .collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
    });
    let err = one_line_error(&mut stage("draft", &work, &other_base, &["--prompts", "0", "--steps", "2"]));
    assert!(err.contains("another base") && err.contains(&*work.join("features").to_string_lossy()), "{err}");
}

/// `--reference-answers`: ShareGPT's own replies are the training prompts'
/// answers (a long one cut at a space near 4 characters per token asked
/// for), while the held-out prompt and the prompt without a reply are
/// answered by the base; training runs on them, and the work directory is
/// refused, naming its prompts, to a run that asks for the base's answers.
#[test]
fn reference_answers_train_on_sharegpts_replies_and_keep_the_base_for_held_out_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let long = "Keep a regular schedule, even on weekends, and get some daylight in the morning. \
                Avoid caffeine late in the day and keep the bedroom cool, dark and quiet.";
    let source = dir.path().join("sharegpt.json");
    sharegpt::write_file(
        &source,
        &[
            chat(
                "toy1",
                &["Give me three tips for sleeping better.", long, "Why a schedule?", "Your body likes rhythm."],
            ),
            chat("toy2", &["Explain recursion to a ten-year-old.", "A function that calls itself."]), // held out
            chat("toy3", &["Write a haiku about autumn leaves."]),
            chat("toy5", &["What is the capital of France?", "Paris."]),
        ],
    );
    let work = dir.path().join("work");
    let mut flags = vec!["--sharegpt", source.to_str().unwrap(), "--sharegpt-share", "1", "--prompts", "5"];
    flags.extend(["--max-tokens", "16", "--slots", "2", "--steps", "2", "--batch", "4"]);
    run_ok(&mut stage("draft", &work, &tiny_fixture(), &[&flags[..], &["--reference-answers"]].concat()));

    let responses = responses(&work);
    let by_id = |id: &str| responses.iter().find(|r| r["id"] == id).unwrap_or_else(|| panic!("no {id}")).clone();
    let cut = by_id("sharegpt:toy1#0");
    let text = cut["response"].as_str().unwrap();
    assert!(text.len() <= 4 * 16 && long.starts_with(text) && long[text.len()..].starts_with(' '), "{cut}");
    assert_eq!(cut["finish_reason"], "reference");
    assert_eq!(by_id("sharegpt:toy1#2")["response"], "Your body likes rhythm.");
    assert_eq!(by_id("sharegpt:toy5#0")["response"], "Paris.");
    for id in ["sharegpt:toy2#0", "sharegpt:toy3#0"] {
        let answered = by_id(id);
        assert!(answered["finish_reason"] != "reference" && answered["response"] != "A function that calls itself.");
    }
    assert_eq!(responses.len(), 5);
    assert!(work.join("draft/draft-head.safetensors").exists());
    let trained = history(&work).iter().filter(|h| h["kind"] == "train").count();
    assert!(trained >= 1);

    let err = one_line_error(&mut stage("draft", &work, &tiny_fixture(), &flags));
    assert!(
        err.contains("--reference-answers") && err.contains(&*work.join("prompts.jsonl").to_string_lossy()),
        "{err}"
    );
}

/// A work directory's `responses.jsonl`, one record per answer.
fn responses(work: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(work.join("responses.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `hamburger-train answers --work WORK --into CORPUS --max-tokens N`.
fn keep_answers(work: &Path, corpus: &Path, max_tokens: &str) -> Command {
    let mut c = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../train/hamburger-train"));
    c.args(["answers", "--work"]).arg(work).arg("--into").arg(corpus).args(["--max-tokens", max_tokens]);
    c
}

/// The answers corpus (`train/answers/`): the base's answers of one draft
/// run, kept with `answers`, seed another work directory (`draft
/// --answers`), whose server then answers only what the corpus does not
/// hold for the very chat asked; keeping them again adds nothing, and a
/// corpus of another budget, or one cut short, is refused naming it.
#[test]
fn answers_kept_in_a_corpus_are_not_answered_again_in_a_new_work_directory() {
    let dir = tempfile::tempdir().unwrap();
    let sharegpt_file = |name: &str, first: &str| {
        let path = dir.path().join(name);
        let chats = [first, "Explain recursion to a ten-year-old.", "Write a haiku about autumn leaves."];
        let entries: Vec<Value> = chats.iter().enumerate().map(|(i, t)| chat(&format!("toy{i}"), &[t])).collect();
        sharegpt::write_file(&path, &entries);
        path
    };
    let draft = |work: &Path, source: &Path, extra: &[&str]| {
        let mut flags = vec!["--sharegpt", source.to_str().unwrap(), "--sharegpt-share", "1", "--prompts", "3"];
        flags.extend(["--max-tokens", "16", "--slots", "2", "--steps", "1", "--batch", "4"]);
        let out = stage("draft", work, &tiny_fixture(), &[&flags[..], extra].concat()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "draft failed: {err}");
        err
    };
    let source = sharegpt_file("sharegpt.json", "Give me three tips for sleeping better.");
    let first = dir.path().join("first");
    draft(&first, &source, &[]);
    let corpus = dir.path().join("answers/verifier.jsonl.gz");
    run_ok(&mut keep_answers(&first, &corpus, "16"));
    let kept = run_ok(Command::new("gzip").arg("-dc").arg(&corpus));
    let kept: Vec<Value> = kept.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(first.join("verifier/meta.json")).unwrap()).unwrap();
    assert_eq!((&kept[0]["teacher"], &kept[0]["max_tokens"]), (&meta["base"], &json!(16)), "{}", kept[0]);
    assert_eq!(kept.len(), 4, "a header and 3 answers");
    let answers = |rs: &[Value]| -> Vec<(String, String)> {
        let mut v: Vec<_> = rs.iter().map(|r| (r["id"].to_string(), r["response"].to_string())).collect();
        v.sort();
        v
    };
    assert_eq!(answers(&kept[1..]), answers(&responses(&first)));

    // A new work directory takes all three from the corpus: no server answers.
    let second = dir.path().join("second");
    let log = draft(&second, &source, &["--answers", corpus.to_str().unwrap()]);
    assert!(log.contains("answers: 3 of 3 prompts answered from") && log.contains("data: all 3 prompts answered"));
    assert_eq!(answers(&responses(&second)), answers(&responses(&first)));
    // A shorter run in a work directory that answered more caches the
    // features of its own prompts only, and trains on them.
    let shorter = dir.path().join("shorter");
    run_ok(Command::new("cp").arg("-r").arg(&first).arg(&shorter));
    for made in ["features", "draft"] {
        std::fs::remove_dir_all(shorter.join(made)).unwrap();
    }
    draft(&shorter, &source, &["--prompts", "2"]);
    let rows = |file: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(shorter.join(file)).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let mut cached: Vec<Value> =
        rows("features/index.jsonl").iter().flat_map(|r| r["ids"].as_array().unwrap().clone()).collect();
    let mut asked: Vec<Value> = rows("prompts.jsonl").iter().take(2).map(|r| r["id"].clone()).collect();
    cached.sort_by_key(Value::to_string);
    asked.sort_by_key(Value::to_string);
    assert_eq!(cached, asked, "the answers of the first 2 prompts (in the order answered)");
    // One chat changed under the same id: that one is answered anew.
    let changed = sharegpt_file("changed.json", "Give me three tips for waking up early.");
    let third = dir.path().join("third");
    let log = draft(&third, &changed, &["--answers", corpus.to_str().unwrap()]);
    assert!(log.contains("answers: 2 of 3 prompts answered from") && !log.contains("data: all 3"), "{log}");
    assert_eq!(responses(&third).len(), 3);
    // --answered-only: the changed chat is left out, not answered.
    let only = dir.path().join("only");
    let log = draft(&only, &changed, &["--answers", corpus.to_str().unwrap(), "--answered-only"]);
    assert!(log.contains("1 of 3 prompts left out") && log.contains("data: all 2 prompts answered"), "{log}");
    assert_eq!(responses(&only).len(), 2);
    let err = one_line_error(&mut stage("draft", &dir.path().join("5"), &tiny_fixture(), &["--answered-only"]));
    assert!(err.contains("--answered-only") && err.contains("--answers"), "{err}");

    // Kept again: nothing new, the same bytes.
    let before = std::fs::read(&corpus).unwrap();
    run_ok(&mut keep_answers(&second, &corpus, "16"));
    assert_eq!(std::fs::read(&corpus).unwrap(), before);
    // Another budget, and a corpus cut short: refused naming the file.
    let err = one_line_error(&mut keep_answers(&first, &corpus, "32"));
    assert!(err.contains(&*corpus.to_string_lossy()) && err.contains("--max-tokens"), "{err}");
    std::fs::write(&corpus, &before[..before.len() / 2]).unwrap();
    let mut fourth = stage("draft", &dir.path().join("4"), &tiny_fixture(), &["--answers", corpus.to_str().unwrap()]);
    let err = one_line_error(&mut fourth);
    assert!(err.contains(&*corpus.to_string_lossy()) && err.contains("not a whole answers corpus"), "{err}");
}
