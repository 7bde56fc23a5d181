//! A GPU training window end to end at toy size on the CPU: `hamburger-train
//! pack` on ShareGPT-format chats (a file cut short, as the PyPI package's
//! is) mixed with the standard library's prompts, tokenized by
//! `hamburger-eval tokenize`; every folder staged as on the GPU machine and
//! `window.sh run` from the last (the base from its GGUF, its answers, two
//! training steps from the shipped modules, calibration, export); then the
//! returned parts joined into a model that converts and runs, and a second
//! window that scores the first one's answers instead of answering again;
//! and a draft head's window (`window.sh draft`) whose returned head joins,
//! converts and drafts, and whose answers come home as a corpus.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use testing::process::assert_one_line_error;
use testing::sharegpt::{self, chat};
use testing::testmodel::{self, from_gguf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_hamburger-eval")).parent().unwrap().to_path_buf()
}

/// Runs `c`, which must succeed; a failure shows the end of its output too (a window's log goes to stdout).
fn run_ok(c: &mut Command) -> String {
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut tail: Vec<&str> = stdout.lines().rev().take(20).collect();
    tail.reverse();
    assert!(out.status.success(), "{:?} failed: {}\n{}", c, String::from_utf8_lossy(&out.stderr), tail.join("\n"));
    String::from_utf8(out.stdout).unwrap()
}

/// `hamburger-train pack` of `entries` (as a ShareGPT file) and the
/// standard library's prompts, by `mix`, in folders of 40 MiB under `d/pack`.
fn pack_chats(d: &Path, entries: &[Value], mix: &[&str]) -> PathBuf {
    sharegpt::write_file(&d.join("sharegpt.json"), entries);
    let pack = d.join("pack");
    let mut c = Command::new(repo().join("train/hamburger-train"));
    c.args(["-t", "2", "pack", "--work"]).arg(d.join("work")).arg("--bin").arg(bin_dir());
    c.args(mix).arg("--sharegpt").arg(d.join("sharegpt.json"));
    c.arg("--out").arg(&pack).args(["--room-mib", "40"]);
    run_ok(&mut c);
    pack
}

/// `window.sh` from `folder` with the pack, work and output folders of `dir`.
fn window_sh(dir: &Path, folder: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("bash");
    c.arg(folder.join("window.sh")).args(args).current_dir(repo());
    c.env("HAMBURGER_PACK", dir.join("staged")).env("HAMBURGER_WORK", dir.join("device-work"));
    c.env("OUT", dir.join("out")).env("PYTHON", repo().join("train/.venv/bin/python"));
    c
}

/// The folders of `pack`, in the order they travel.
fn folders(pack: &Path) -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> =
        std::fs::read_dir(pack).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    folders.sort();
    folders
}

/// Stages every folder of `pack` as on the GPU machine, runs the window from
/// the last with the toy flags and `extra`, and returns its `window.json`.
fn stage_and_run(d: &Path, pack: &Path, extra: &[&str]) -> Value {
    let folders = folders(pack);
    for f in &folders[..folders.len() - 1] {
        run_ok(&mut window_sh(d, f, &["stage"]));
    }
    run_ok(&mut window_sh(d, folders.last().unwrap(), &[&["run"], &TOY[..], extra].concat()));
    serde_json::from_str(&std::fs::read_to_string(d.join("out/window.json")).unwrap()).unwrap()
}

/// The base's scores in a window's `scored.jsonl`, in the packed form
/// `generate` writes (base64 arrays): at every answer token the entropy is
/// finite and not negative, the 8 most likely tokens come most likely first,
/// and the first of them is the answer's token (greedy answers, and earlier
/// answers scored teacher-forced), but for the end token that ends an answer
/// cut at `max_tokens`.
fn scores_pick_each_answer_token(work: &Path, max_tokens: usize) {
    use base64::Engine;
    let array = |v: &Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
    let f32s = |v: &Value| array(v).chunks(4).map(|b| f32::from_ne_bytes(b.try_into().unwrap())).collect::<Vec<_>>();
    let i32s = |v: &Value| array(v).chunks(4).map(|b| i32::from_ne_bytes(b.try_into().unwrap())).collect::<Vec<_>>();
    let text = std::fs::read_to_string(work.join("scored.jsonl")).unwrap();
    assert!(!text.is_empty());
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let ids: Vec<i32> = serde_json::from_value(v["ids"].clone()).unwrap();
        let answer = &ids[v["n_prompt"].as_u64().unwrap() as usize..];
        let (entropy, top, logp) = (f32s(&v["entropy"]), i32s(&v["top_ids"]), f32s(&v["top_logp"]));
        assert_eq!((entropy.len(), top.len(), logp.len()), (answer.len(), 8 * answer.len(), 8 * answer.len()), "{v}");
        for (i, &token) in answer.iter().enumerate() {
            let (top, logp) = (&top[8 * i..8 * i + 8], &logp[8 * i..8 * i + 8]);
            assert!(entropy[i].is_finite() && entropy[i] >= 0.0, "{v}");
            assert!(logp.windows(2).all(|w| w[0] >= w[1]) && logp[0] <= 0.0, "{v}");
            let cut = i == max_tokens && token == 2;
            assert!(top[0] == token || cut, "answer token {i} of {}: {token} against {top:?}", v["id"]);
        }
    }
}

/// Whether the window's returned history records a calibration of the stop head.
fn calibrated(out: &Path) -> bool {
    let history: Value = serde_json::from_str(&std::fs::read_to_string(out.join("history.json")).unwrap()).unwrap();
    history.as_array().unwrap().iter().any(|h| h["kind"] == "calibration")
}

fn gz_lines(path: &Path) -> Vec<Value> {
    let text = run_ok(Command::new("gzip").arg("-dc").arg(path));
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `text` gzipped into `path`.
fn write_gz(path: &Path, text: &str) {
    let mut gz = Command::new("gzip")
        .arg("-c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut gz.stdin.take().unwrap(), text.as_bytes()).unwrap();
    std::fs::write(path, gz.wait_with_output().unwrap().stdout).unwrap();
}

/// The returned `parts` (under `out`, each at most 15 MiB) joined in order into `to`.
fn joined(out: &Path, parts: &[String], to: &Path) -> PathBuf {
    let paths: Vec<PathBuf> = parts.iter().map(|p| out.join(p)).collect();
    assert!(paths.iter().all(|p| p.metadata().unwrap().len() <= 15 << 20), "{paths:?}");
    std::fs::write(to, paths.iter().flat_map(|p| std::fs::read(p).unwrap()).collect::<Vec<u8>>()).unwrap();
    to.to_path_buf()
}

/// The PyPI SmolLM2 with the `grafted` files folded in (`d/name`), converted to
/// Q8_0 and decoding 8 tokens of "Hello" greedily with `extra` flags: the CLI's JSON report.
fn decoded(d: &Path, name: &str, grafted: &[&Path], extra: &[&str]) -> Value {
    let base = testmodel::smollm2_gguf(&testmodel::cache_dir()).unwrap();
    std::fs::create_dir_all(d.join(name)).unwrap();
    from_gguf::write(&base, &d.join(name), from_gguf::Grafted::Trained(grafted)).unwrap();
    let gguf = d.join(format!("{name}-q8_0.gguf"));
    run_ok(Command::new(env!("CARGO_BIN_EXE_hamburger-convert")).arg(d.join(name)).arg("--outfile").arg(&gguf).args([
        "--outtype",
        "q8_0",
        "--no-progress",
    ]));
    let mut cli = Command::new(env!("CARGO_BIN_EXE_hamburger-cli"));
    cli.arg("-m").arg(&gguf).args(["-p", "Hello", "-n", "8", "--temp", "0", "--json", "--ignore-eos"]).args(extra);
    serde_json::from_str(run_ok(&mut cli).lines().last().unwrap()).unwrap()
}

const TOY: [&str; 14] = [
    "--device",
    "cpu",
    "--minutes",
    "10",
    "--steps",
    "2",
    "--batch",
    "2",
    "--max-tokens",
    "8",
    "--answer-batch",
    "3",
    "-t",
    "2",
];

#[test]
fn a_packed_window_answers_trains_and_returns_a_model_that_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // `toy2` hashes into the held-out split.
    let entries = [
        chat("toy1", &["Give me three tips for sleeping better.", "Keep a schedule.", "Why a schedule?"]),
        chat("toy2", &["Explain recursion to a ten-year-old."]),
        chat("toy3", &["Write a haiku about autumn leaves."]),
        chat("toy4", &["give me three tips for sleeping   better."]), // a duplicate, folded
        chat("toy5", &["What is the capital of France?"]),
    ];
    let pack = pack_chats(d, &entries, &["--prompts", "8", "--sharegpt-share", "0.75"]);

    let prompts: Vec<Value> = std::fs::read_to_string(d.join("work/prompts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<&str> = prompts.iter().map(|p| p["id"].as_str().unwrap()).collect();
    // Five chats give 5 prompts: toy4 folds into toy1, the file's cut last entry is dropped;
    // toy1's second turn comes with its history.
    assert_eq!(ids.iter().filter(|i| i.starts_with("sharegpt:")).count(), 5, "{ids:?}");
    assert!(prompts.iter().any(|p| p["id"] == "sharegpt:toy1#2" && p["messages"].as_array().unwrap().len() == 3));
    assert!(prompts.iter().any(|p| p["id"] == "sharegpt:toy2#0" && p["split"] == "heldout"));
    assert_eq!(ids.len(), 8, "the rest from the standard library: {ids:?}");

    let steps = std::fs::read_to_string(pack.join("steps.txt")).unwrap();
    let folders = folders(&pack);
    assert!(folders.len() >= 4, "a 98 MB GGUF and a 59 MB init in folders of 40 MiB: {folders:?}");
    assert_eq!(steps.lines().filter(|l| !l.starts_with('#')).count(), folders.len(), "{steps}");
    assert!(
        steps.starts_with("# here: mv ") && steps.contains("grafted.safetensors"),
        "the shipped model, in the pack, leaves the tree for the calls: {steps}"
    );
    for f in &folders {
        let size: u64 = std::fs::read_dir(f).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert!(size <= 40 << 20 | 8192, "{} holds {size} bytes", f.display());
    }
    // The window's call runs the same at toy size first (`smoke run`), in folders of its own: nothing of it
    // comes back, and the window after it starts from nothing.
    assert!(steps.contains("window.sh smoke run && bash "), "{steps}");
    for f in &folders[..folders.len() - 1] {
        run_ok(&mut window_sh(d, f, &["stage"]));
    }
    run_ok(&mut window_sh(d, folders.last().unwrap(), &["smoke", "run", "--device", "cpu", "-t", "2"]));
    let smoke: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("out-smoke/window.json")).unwrap()).unwrap();
    assert_eq!(smoke["done"], true, "{smoke}");
    assert!(!d.join("out").exists() && !d.join("device-work").exists(), "the smoke run wrote the window's folders");
    let summary = stage_and_run(d, &pack, &[]);
    let out = d.join("out");
    assert_eq!(summary["done"], true, "{summary}");
    assert_eq!(summary["answered"], 8, "{summary}");
    assert_eq!(summary["steps"], 2, "{summary}");
    assert!(calibrated(&out), "calibrated on toy2's held-out answer");
    scores_pick_each_answer_token(&d.join("device-work"), 8);
    let answers = gz_lines(&out.join("answers.jsonl.gz"));
    assert_eq!(answers.len(), 8);
    for a in &answers {
        let toks = a["answer"].as_array().unwrap();
        assert!(toks.len() <= 9 && toks.last().unwrap() == 2, "an answer ends with the end token: {a}");
    }

    // The returned parts join into the trained modules, which convert and run.
    let parts: Vec<String> = summary["parts"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().into()).collect();
    assert!(parts.len() >= 4, "{parts:?}");
    let grafted = joined(&out, &parts, &d.join("grafted.safetensors"));
    let v = decoded(d, "trained", &[grafted.as_path()], &[]);
    assert_eq!(v["output_ids"].as_array().unwrap().len(), 8, "{v}");

    // A second window from a pack that carries the first one's answers scores them, teacher-forced,
    // and trains under bf16 autocast with a step's answers in one pass, as a GPU window runs
    // (`--dtype bf16 --micro-batch 2`).
    let mut c = Command::new(repo().join("train/hamburger-train"));
    c.args(["-t", "2", "pack", "--work"]).arg(d.join("work")).arg("--bin").arg(bin_dir());
    c.args(["--prompts", "8"])
        .arg("--answers")
        .arg(out.join("answers.jsonl.gz"))
        .arg("--out")
        .arg(&pack)
        .args(["--room-mib", "40"]);
    run_ok(&mut c);
    std::fs::remove_dir_all(d.join("staged")).unwrap();
    std::fs::remove_dir_all(d.join("device-work")).unwrap();
    let summary = stage_and_run(d, &pack, &["--answer-share", "0.5", "--dtype", "bf16", "--micro-batch", "2"]);
    assert_eq!((summary["done"].clone(), summary["steps"].clone()), (true.into(), 2.into()), "{summary}");
    scores_pick_each_answer_token(&d.join("device-work"), 8);
    let again = gz_lines(&out.join("answers.jsonl.gz"));
    let key = |v: &Vec<Value>| {
        let mut k: Vec<String> = v.iter().map(|a| format!("{}={}", a["id"], a["answer"])).collect();
        k.sort();
        k
    };
    assert_eq!(key(&again), key(&answers), "the earlier answers, scored, none answered anew");

    // A run that goes on from an earlier one (`--trained-on` its scored.jsonl) packs neither the prompts
    // nor the answers that one trained on.
    let scored = std::fs::read_to_string(d.join("device-work/scored.jsonl")).unwrap();
    let earlier: Vec<&str> = scored.lines().take(3).collect();
    std::fs::write(d.join("earlier-scored.jsonl"), earlier.join("\n") + "\n").unwrap();
    let trained: Vec<String> =
        earlier.iter().map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].as_str().unwrap().into()).collect();
    let mut c = Command::new(repo().join("train/hamburger-train"));
    c.args(["-t", "2", "pack", "--work"]).arg(d.join("work")).arg("--bin").arg(bin_dir());
    c.args(["--prompts", "8", "--answers"]).arg(out.join("answers.jsonl.gz"));
    c.arg("--trained-on").arg(d.join("earlier-scored.jsonl")).arg("--out").arg(&pack).args(["--room-mib", "40"]);
    run_ok(&mut c);
    let packed = |name: &str| {
        let mut dirs = std::fs::read_dir(&pack).unwrap().map(|e| e.unwrap().path().join(name));
        gz_lines(&dirs.find(|p| p.exists()).unwrap())
    };
    let ids = |v: Vec<Value>| -> Vec<String> { v.iter().map(|a| a["id"].as_str().unwrap().into()).collect() };
    let (left_prompts, left_answers) = (ids(packed("prompt-ids.jsonl.gz")), ids(packed("answers.jsonl.gz")));
    assert_eq!((left_prompts.len(), left_answers.len()), (5, 5), "{left_prompts:?} {left_answers:?}");
    assert!(left_answers.iter().chain(&left_prompts).all(|id| !trained.contains(id)), "{trained:?}");
}

#[test]
fn a_missing_or_broken_data_package_or_answers_file_is_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = |source: &Path| {
        let mut c = Command::new(repo().join("train/hamburger-train"));
        c.args(["-t", "1", "data", "--work"]).arg(d.join("work")).arg("--base").arg(testmodel::tiny_fixture());
        c.arg("--bin").arg(bin_dir()).args(["--prompts", "4", "--sharegpt"]).arg(source);
        c
    };
    assert_one_line_error(&mut data(&d.join("missing.json")), &["missing.json"]);
    std::fs::write(d.join("cut.whl"), b"PK\x03\x04 not a whole wheel").unwrap();
    assert_one_line_error(&mut data(&d.join("cut.whl")), &["cut.whl", "delete it"]);
    std::fs::write(d.join("empty.json"), b"[{\"id\": \"x\", \"conversations\": [{\"from\"").unwrap();
    assert_one_line_error(&mut data(&d.join("empty.json")), &["empty.json", "no whole conversation"]);
    assert!(!d.join("work/prompts.jsonl").exists(), "nothing half-made is kept");

    std::fs::write(d.join("answers.jsonl.gz"), b"not gzip").unwrap();
    let pack = |flag: &str, file: &str| {
        let mut c = Command::new(repo().join("train/hamburger-train"));
        c.args(["-t", "1", "pack", "--work"]).arg(d.join("work")).arg("--base").arg(testmodel::tiny_fixture());
        c.arg("--bin").arg(bin_dir()).arg(flag).arg(d.join(file)).arg("--out").arg(d.join("pack"));
        c
    };
    assert_one_line_error(&mut pack("--answers", "answers.jsonl.gz"), &["--answers", "answers.jsonl.gz"]);
    assert_one_line_error(&mut pack("--trained-on", "scored.jsonl"), &["--trained-on", "scored.jsonl"]);
    assert_one_line_error(&mut pack("--verifier-answers", "answers.jsonl.gz"), &["answers.jsonl.gz", "not a whole"]);
    assert_one_line_error(&mut pack("--init-head", "head.safetensors"), &["--init-head", "head.safetensors"]);
    assert!(!d.join("pack").exists(), "nothing half-made is kept");
}

/// A window whose held-out answers are all evaluation prompts (which
/// calibration never fits on) still exports its trained modules,
/// uncalibrated; then a draft head's window from the same pack.
#[test]
fn a_window_with_only_evaluation_prompts_held_out_exports_uncalibrated() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // `ltqfPQc_0#0` is the first prompt of train/sharegpt-heldout.jsonl, the general evaluation set.
    let entries = [
        chat("ltqfPQc_0", &["please help me plan a 5-day Kyoto trip."]),
        chat("toy3", &["Write a haiku about autumn leaves."]),
        chat("toy5", &["What is the capital of France?"]),
    ];
    let pack = pack_chats(d, &entries, &["--prompts", "3", "--sharegpt-share", "1"]);
    let prompts = std::fs::read_to_string(d.join("work/prompts.jsonl")).unwrap();
    assert!(prompts.contains(r#""id": "sharegpt:ltqfPQc_0#0""#) && prompts.contains("heldout"), "{prompts}");

    let summary = stage_and_run(d, &pack, &[]);
    assert_eq!(summary["done"], true, "{summary}");
    assert!(!calibrated(&d.join("out")), "nothing to calibrate on");
    let log = std::fs::read_to_string(d.join("out/window.log")).unwrap();
    assert!(log.contains("not calibrated"), "{log}");

    // The same pack's draft window: the verifier's answers, their features and a draft
    // head that copies (`--copy 2`, as the shipped one) trained from the packed modules,
    // returned in parts that join into a head the runtime drafts with.
    let last = folders(&pack).pop().unwrap();
    let toy =
        ["--device", "cpu", "--minutes", "10", "--steps", "2", "--batch", "8", "--max-tokens", "8", "--copy", "2"];
    run_ok(&mut window_sh(d, &last, &[&["draft"], &toy[..], &["--answer-batch", "3", "-t", "2"]].concat()));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("out/draft-window.json")).unwrap()).unwrap();
    assert_eq!((&summary["done"], &summary["answered"], &summary["steps"]), (&json!(true), &json!(3), &json!(2)));
    // The features pass took the three answers in one padded pass: at every cached row the verifier's most
    // likely token is the answer's own (greedy answers), but for the end token ending an answer cut at 8.
    let shard = std::fs::read(d.join("device-work/draft-window/features/shard-00000.safetensors")).unwrap();
    let shard = safetensors::SafeTensors::deserialize(&shard).unwrap();
    let i64s = |k: &str| -> Vec<i64> {
        shard.tensor(k).unwrap().data().chunks(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect()
    };
    let (next, top) = (i64s("next"), i64s("top_ids"));
    let k = top.len() / next.len();
    let missed: Vec<i64> = (0..next.len()).filter(|&r| top[r * k] != next[r]).map(|r| next[r]).collect();
    assert!(next.len() > 3 && missed.len() <= 3 && missed.iter().all(|&t| t == 2), "{missed:?} of {next:?}");
    let parts: Vec<String> = summary["parts"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().into()).collect();
    assert!(parts.len() >= 2, "{parts:?}");
    let head = joined(&d.join("out"), &parts, &d.join("draft-head.safetensors"));
    let shipped = repo().join("models/smollm2-hamburger/draft-head.safetensors");
    let (ours, theirs) = (std::fs::read(&head).unwrap(), std::fs::read(&shipped).unwrap());
    let (ours, theirs) = (
        safetensors::SafeTensors::deserialize(&ours).unwrap(),
        safetensors::SafeTensors::deserialize(&theirs).unwrap(),
    );
    let (mut a, mut b) = (ours.names(), theirs.names());
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b, "every tensor of a draft head");
    assert!(a.iter().all(|k| ours.tensor(k).unwrap().shape() == theirs.tensor(k).unwrap().shape()));
    assert!(a.iter().any(|k| ours.tensor(k).unwrap().data() != theirs.tensor(k).unwrap().data()), "it trained");
    brought_home(d, &summary);
    let grafted = repo().join("models/smollm2-hamburger/grafted.safetensors");
    let forced = ["--spec-type", "draft-mtp", "--spec-draft-n-min", "3"];
    let v = decoded(d, "drafting", &[grafted.as_path(), head.as_path()], &forced);
    assert_eq!(v["output_ids"].as_array().unwrap().len(), 8, "{v}");
    goes_on_from_the_corpus_and_the_head(d, &entries, &head);
}

/// A second draft window, packed with the first one's answers as they came
/// home (`pack --verifier-answers`) and its head (`--init-head`), answers
/// nothing again: it takes the very ids the first one answered, and with no
/// step to train returns the head it started from. Answers of another
/// verifier are refused, naming the file.
fn goes_on_from_the_corpus_and_the_head(d: &Path, entries: &[Value], head: &Path) {
    let first = std::fs::read_to_string(d.join("device-work/draft-window/scored.jsonl")).unwrap();
    std::fs::remove_dir_all(d.join("device-work/draft-window")).unwrap();
    std::fs::remove_dir_all(d.join("out")).unwrap();
    let corpus = d.join("answers/verifier.jsonl.gz");
    let mix = ["--prompts", "3", "--sharegpt-share", "1", "--verifier-answers", corpus.to_str().unwrap()];
    let pack = pack_chats(d, entries, &[&mix[..], &["--init-head", head.to_str().unwrap()]].concat());
    let toy = ["--device", "cpu", "--minutes", "10", "--steps", "0", "--batch", "8", "--max-tokens", "8", "-t", "2"];
    let folders = folders(&pack);
    for f in &folders[..folders.len() - 1] {
        run_ok(&mut window_sh(d, f, &["stage"]));
    }
    run_ok(&mut window_sh(d, folders.last().unwrap(), &[&["draft"], &toy[..]].concat()));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("out/draft-window.json")).unwrap()).unwrap();
    let counts = [&summary["init_head"], &summary["carried"], &summary["answered"], &summary["kept"]];
    assert_eq!(counts, [&json!(true), &json!(3), &json!(0), &json!(0)], "{summary}");
    assert_eq!((&summary["features"], &summary["done"]), (&json!(3), &json!(true)), "{summary}");
    let again = std::fs::read_to_string(d.join("device-work/draft-window/scored.jsonl")).unwrap();
    let ids = |text: &str| -> Vec<(Value, Value)> {
        let mut v: Vec<(Value, Value)> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|r| (r["id"].clone(), r["ids"].clone()))
            .collect();
        v.sort_by_key(|a| a.0.to_string());
        v
    };
    assert_eq!(ids(&again), ids(&first), "the first window's answers, as they came home");
    let parts: Vec<String> = summary["parts"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().into()).collect();
    let returned = joined(&d.join("out"), &parts, &d.join("draft-head-again.safetensors"));
    let (a, b) = (std::fs::read(&returned).unwrap(), std::fs::read(head).unwrap());
    let (a, b) =
        (safetensors::SafeTensors::deserialize(&a).unwrap(), safetensors::SafeTensors::deserialize(&b).unwrap());
    let mut names = a.names();
    names.sort_unstable();
    assert_eq!(names.len(), b.names().len());
    assert!(names.iter().all(|k| a.tensor(k).unwrap().data() == b.tensor(k).unwrap().data()), "the packed head");

    // The carried answers' header names another verifier: refused, naming the file.
    let staged = d.join("staged/answered.jsonl.gz");
    let mut lines = gz_lines(&staged);
    lines[0]["teacher"] = json!("0".repeat(64));
    write_gz(&staged, &lines.iter().map(|l| format!("{l}\n")).collect::<String>());
    let mut c = Command::new(repo().join("train/hamburger-train"));
    c.args(["-t", "2", "draft-window", "--device", "cpu", "--pack"]).arg(d.join("staged"));
    c.arg("--work").arg(d.join("device-work-other")).arg("--out").arg(d.join("out-other"));
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("Traceback"), "{err}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(last.contains("answered.jsonl.gz") && last.contains("another base"), "{err}");
}

/// The draft window's answers, returned as a corpus of its verifier, added
/// to a corpus here (`hamburger-train answers --from`, once: again adds
/// nothing); their texts, tokenized as a CPU draft run tokenizes answers,
/// are the very ids the window answered.
fn brought_home(d: &Path, summary: &Value) {
    let returned = gz_lines(&d.join("out/verifier-answers.jsonl.gz"));
    assert_eq!((&returned[0]["teacher"], &returned[0]["max_tokens"]), (&summary["verifier"], &json!(8)));
    assert_eq!((returned.len(), &summary["kept"]), (4, &json!(3)), "a header and 3 answers");
    let home = d.join("answers/verifier.jsonl.gz");
    let add_into = |into: &Path| {
        let mut c = Command::new(repo().join("train/hamburger-train"));
        c.args(["answers", "--from"]).arg(d.join("out/verifier-answers.jsonl.gz")).arg("--into").arg(into);
        c
    };
    let merge = || {
        let out = add_into(&home).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert!(merge().contains("3 of"), "all three added");
    let before = std::fs::read(&home).unwrap();
    assert!(merge().contains("0 of"));
    assert_eq!(std::fs::read(&home).unwrap(), before, "nothing new, the same bytes");
    assert_eq!(gz_lines(&home), returned);
    // An answer holding a line separator that JSON keeps raw (U+2028) is read as one answer.
    let odd = json!({"id": "odd#0", "asked": "0", "response": "a\u{2028}b\u{85}c", "finish_reason": "stop"});
    write_gz(&d.join("odd.jsonl.gz"), &format!("{}\n{odd}\n", returned[0]));
    let mut c = Command::new(repo().join("train/hamburger-train"));
    c.args(["answers", "--from"]).arg(d.join("odd.jsonl.gz")).arg("--into").arg(&home);
    assert!(String::from_utf8_lossy(&c.output().unwrap().stderr).contains("1 of"));
    assert_eq!(gz_lines(&home).last().unwrap(), &odd);
    // Into a corpus of another budget (the repository's, 192 tokens): refused, naming it.
    let kept = std::fs::read_dir(repo().join("train/answers")).unwrap().next().unwrap().unwrap().path();
    std::fs::copy(&kept, d.join("kept.jsonl.gz")).unwrap();
    assert_one_line_error(&mut add_into(&d.join("kept.jsonl.gz")), &["verifier-answers.jsonl.gz", "--max-tokens"]);

    let chats: Vec<Value> = std::fs::read_to_string(d.join("work/prompts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let input: String = returned[1..]
        .iter()
        .map(|a| {
            let mut chat = chats.iter().find(|c| c["id"] == a["id"]).unwrap().clone();
            chat["response"] = a["response"].clone();
            format!("{chat}\n")
        })
        .collect();
    std::fs::write(d.join("brought-home.jsonl"), input).unwrap();
    let mut tokenize = Command::new(env!("CARGO_BIN_EXE_hamburger-eval"));
    tokenize.args(["tokenize", "-m"]).arg(d.join("work/teacher-q8_0.gguf"));
    let tokens = run_ok(tokenize.stdin(std::fs::File::open(d.join("brought-home.jsonl")).unwrap()));
    let answered = std::fs::read_to_string(d.join("device-work/draft-window/scored.jsonl")).unwrap();
    let ids_of = |text: &str| -> Vec<(String, Value)> {
        let mut v: Vec<_> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|r| (r["id"].to_string(), r["ids"].clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    assert_eq!(ids_of(&tokens), ids_of(&answered));
}
