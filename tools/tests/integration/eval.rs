//! `hamburger-eval` on the tiny fixture against its own base-only export in
//! libllama: at confidence > 1 HAMburger is its base (same tokens, no
//! log-likelihood loss, one token per step); at a low confidence it takes
//! several tokens per step, and where its outputs part from the base's the
//! base preferred its own token; `score` gives one entropy and log-probability
//! per answer token; bad prompt files get one line naming the file and line.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use testing::testmodel::tiny_fixture;

fn eval_bin() -> Command {
    testing::process::limited(env!("CARGO_BIN_EXE_hamburger-eval"))
}

/// The fixture as a HAMburger GGUF and as a base-only GGUF (f32).
fn fixture_ggufs(dir: &Path) -> (PathBuf, PathBuf) {
    let (ham, base) = (dir.join("tiny.gguf"), dir.join("tiny-base.gguf"));
    for (out, extra) in [(&ham, None), (&base, Some("--base-only"))] {
        let st = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
            .arg(tiny_fixture())
            .arg("--outfile")
            .arg(out)
            .args(["--outtype", "f32", "--no-progress"])
            .args(extra)
            .status()
            .unwrap();
        assert!(st.success());
    }
    (ham, base)
}

#[test]
fn eval_reports_the_base_at_confidence_above_one_and_several_tokens_per_step_below() {
    let dir = tempfile::tempdir().unwrap();
    let (ham, base) = fixture_ggufs(dir.path());
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"The license grants you\"}\n{\"prompt\": \"Once upon a time\"}\n").unwrap();
    let out = eval_bin()
        .args(["run", "-m"])
        .arg(&ham)
        .arg("--baseline")
        .arg(&base)
        .arg("--prompts")
        .arg(&prompts)
        .args(["-n", "24", "--confidence", "1.01,0.3", "-t", "1", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let (exact, fast) = (&rows[0], &rows[1]);
    assert_eq!(exact["prompts"], 2);
    assert_eq!(exact["tokens"], 48, "exactly -n tokens per prompt");
    assert_eq!(exact["tokens_per_step"], 1.0);
    assert_eq!(exact["kv_entries_per_token"], 1.0);
    assert_eq!(exact["identical"], 2, "confidence > 1 decodes exactly like the base: {exact}");
    assert!(exact["ll_loss"].as_f64().unwrap().abs() < 1e-9, "{exact}");
    assert!(exact["base_mean_ll"].as_f64().unwrap() < 0.0);
    assert_eq!(exact["divergence_gap_max"], 0.0, "no output parted: {exact}");
    assert!(fast["tokens_per_step"].as_f64().unwrap() > 1.2, "{fast}");
    // Merged steps take tokens the base ranks lower: where the outputs
    // part, the base preferred its own token by a margin.
    assert!(fast["identical"].as_u64().unwrap() < 2, "{fast}");
    assert!(fast["divergence_gap_median"].as_f64().unwrap() > 0.0, "{fast}");
    assert!(fast["divergence_gap_max"].as_f64().unwrap() >= fast["divergence_gap_median"].as_f64().unwrap());
    // libllama's greedy tokens are its own scoring forward's best, but for
    // rounding (F32 here): any disagreement is a tie to a few 1e-4.
    assert!(exact["base_flip_gap"].as_f64().unwrap() < 1e-3, "{exact}");
    assert!(fast["kv_entries_per_token"].as_f64().unwrap() < 0.85, "{fast}");
}

#[test]
fn score_gives_an_entropy_a_log_probability_and_the_top_tokens_per_answer_token() {
    let dir = tempfile::tempdir().unwrap();
    let (ham, base) = fixture_ggufs(dir.path());
    let mut child = eval_bin()
        .args(["score", "-t", "1", "--top", "4", "-m"])
        .arg(&ham)
        .arg("--baseline")
        .arg(&base)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"id\": \"a\", \"prompt\": \"Hello\", \"response\": \"The license\"}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    let (ids, n_prompt) = (v["ids"].as_array().unwrap(), v["n_prompt"].as_u64().unwrap() as usize);
    let answer = ids.len() - n_prompt;
    assert!(answer >= 2, "the answer's tokens and the end-of-turn token");
    assert_eq!(ids.last().unwrap(), 2, "answers end with the end-of-turn token (<|im_end|> = 2)");
    assert_eq!(v["entropy"].as_array().unwrap().len(), answer);
    assert_eq!(v["logprob"].as_array().unwrap().len(), answer);
    assert!(v["logprob"].as_array().unwrap().iter().all(|x| x.as_f64().unwrap() <= 0.0));
    assert!(v["entropy"].as_array().unwrap().iter().all(|x| x.as_f64().unwrap() >= 0.0));
    assert_eq!(v["id"], "a", "other fields are kept");
    // The top tokens: 4 per answer token, most likely first, the scored token's
    // log-probability among them whenever it is at least the 4th largest.
    let top = v["top"].as_array().unwrap();
    assert_eq!(top.len(), answer);
    for (i, t) in top.iter().enumerate() {
        let t: Vec<(u64, f64)> =
            t.as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap())).collect();
        assert_eq!(t.len(), 4);
        assert!(t.windows(2).all(|w| w[0].1 >= w[1].1), "not most likely first: {t:?}");
        let lp = v["logprob"][i].as_f64().unwrap();
        let token = ids[n_prompt + i].as_u64().unwrap();
        if lp >= t[3].1 {
            let found = t.iter().find(|p| p.0 == token).map(|p| p.1);
            assert!(found.is_some_and(|x| (x - lp).abs() < 1e-4), "token {token} ({lp}) not in {t:?}");
        }
        assert!(t[0].1 <= 0.0 && t.iter().map(|p| p.1.exp()).sum::<f64>() <= 1.0 + 1e-4);
    }
}

#[test]
fn a_prompt_file_without_prompts_is_one_line_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let (ham, base) = fixture_ggufs(dir.path());
    let prompts = dir.path().join("bad.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"ok\"}\n{\"text\": \"no prompt\"}\n").unwrap();
    let mut c = eval_bin();
    c.args(["run", "-m"]).arg(&ham).arg("--baseline").arg(&base).arg("--prompts").arg(&prompts);
    testing::process::assert_one_line_error(&mut c, &["bad.jsonl:2", "prompt"]);
}

/// `hamburger-eval SUB -m ham [--baseline base]` fed `input` on standard input; its standard output.
fn eval_with_input(args: &[&str], ham: &Path, base: Option<&Path>, input: &str) -> String {
    use std::io::Write;
    let mut c = eval_bin();
    c.args(args).arg("-m").arg(ham);
    if let Some(b) = base {
        c.arg("--baseline").arg(b);
    }
    let mut child = c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{c:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_chats_messages_are_scored_and_tokenized_after_the_whole_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let (ham, base) = fixture_ggufs(dir.path());
    let chat = r#"{"id": "c", "messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "The license?"}], "response": "The license"}"#;
    let one = r#"{"id": "u", "prompt": "The license?", "response": "The license"}"#;
    let input = format!("{chat}\n{one}\n");
    let scored: Vec<Value> = eval_with_input(&["score", "-t", "1"], &ham, Some(&base), &input)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Tokenized with their answers (what `hamburger-train draft` reads) and without (what `pack` ships).
    let prompt_only: String = input.lines().map(|l| l.replace("\"response\"", "\"reply\"") + "\n").collect();
    let [tokenized, prompts]: [Vec<Value>; 2] = [&input, &prompt_only].map(|i| {
        eval_with_input(&["tokenize"], &ham, None, i).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    });
    assert_eq!((scored.len(), tokenized.len(), prompts.len()), (2, 2, 2));
    for ((s, t), p) in scored.iter().zip(&tokenized).zip(&prompts) {
        let n = s["n_prompt"].as_u64().unwrap() as usize;
        assert_eq!((&s["ids"], &s["n_prompt"]), (&t["ids"], &t["n_prompt"]), "the same prompt and answer ids");
        assert_eq!(s["ids"].as_array().unwrap()[..n], p["ids"].as_array().unwrap()[..], "the same prompt ids");
        assert!(t.get("entropy").is_none() && p.get("n_prompt").is_none(), "tokenized, not scored: {t} {p}");
    }
    let (chat_n, one_n) = (scored[0]["n_prompt"].as_u64().unwrap(), scored[1]["n_prompt"].as_u64().unwrap());
    assert!(chat_n > one_n, "the earlier turns come before the last: {chat_n} vs {one_n}");
    let (chat_ids, one_ids) = (scored[0]["ids"].as_array().unwrap(), scored[1]["ids"].as_array().unwrap());
    assert_eq!(chat_ids[chat_n as usize..], one_ids[one_n as usize..], "the same answer tokens");
    let mut c = eval_bin();
    c.args(["tokenize", "-m"])
        .arg(&ham)
        .stdin(std::fs::File::open(write_lines(dir.path(), "{\"messages\": 3}")).unwrap());
    testing::process::assert_one_line_error(&mut c, &["input line 1", "messages"]);
}

fn write_lines(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("lines.jsonl");
    std::fs::write(&p, format!("{text}\n")).unwrap();
    p
}
