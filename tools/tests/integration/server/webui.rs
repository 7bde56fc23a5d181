//! The chat page at `/`: served with the right content types unless
//! `--no-webui`, and, in headless Chromium driven by selenium
//! (`webui_chat.py`; `scripts/install-deps.sh` installs both), a two-turn
//! conversation whose streamed text equals the API's answer to the same
//! messages (the second turn up to a near-tie), each macro step shaded.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use testing::testmodel::{converted, smollm2_checkpoint};

use super::{assert_text_up_to_a_tie, start_with, tiny, Killed};

/// The status and `Content-Type` of GET `path`.
fn get(addr: &str, path: &str) -> (u16, String, String) {
    let r = reqwest::blocking::get(format!("http://{addr}{path}")).unwrap();
    let kind = r.headers().get("content-type").map_or("", |v| v.to_str().unwrap()).to_string();
    (r.status().as_u16(), kind, r.text().unwrap())
}

#[test]
fn the_page_is_served_at_the_root_unless_no_webui() {
    let (child, addr) = start_with(&tiny(), &["-np", "1", "-c", "256"]);
    let _server = Killed(child);
    for (path, kind, has) in [
        ("/", "text/html; charset=utf-8", "<title>HAMburger chat</title>"),
        ("/webui/app.js", "text/javascript; charset=utf-8", "/v1/chat/completions"),
        ("/webui/style.css", "text/css; charset=utf-8", ".step.s1"),
    ] {
        let (status, got, body) = get(&addr, path);
        assert_eq!((status, got.as_str()), (200, kind), "{path}");
        assert!(body.contains(has), "{path}: {body}");
    }
    let (child, addr) = start_with(&tiny(), &["-np", "1", "-c", "256", "--no-webui"]);
    let _server = Killed(child);
    for path in ["/", "/webui/app.js"] {
        let (status, _, body) = get(&addr, path);
        assert_eq!(status, 404, "{path} with --no-webui: {body}");
    }
    assert_eq!(get(&addr, "/health").0, 200, "the API is served with --no-webui");
}

#[test]
fn a_two_turn_chat_in_chromium_shows_the_apis_answers_step_by_step() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-browser/bin/python");
    assert!(python.exists(), "{} is missing: run scripts/install-deps.sh", python.display());
    let model = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
    let (child, addr) = start_with(&model, &["-np", "2", "-c", "2048"]);
    let _server = Killed(child);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/server/webui_chat.py");
    let out = Command::new(python)
        .arg(script)
        .args(["--url", &format!("http://{addr}"), "--confidence", "0.3", "--max-tokens", "40"])
        .args(["--system", "You are a friendly assistant.", "--turn", "What is the capital of France?"])
        .args(["--turn", "And what is it famous for?"])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the browser script failed: {stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let turns = result["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2);
    for (n, turn) in turns.iter().enumerate() {
        let page = &turn["page"];
        assert_eq!(page["state"], "done", "turn {n}: {turn}");
        assert_eq!(page["error"], "", "turn {n}: {turn}");
        let api = &turn["api"];
        let api_text = api["message"]["content"].as_str().unwrap();
        assert!(!api_text.is_empty(), "turn {n}: {turn}");
        // The page's request read its prompt fresh (turn 1) or after its
        // conversation's cached cells (turn 2); the API's repeat reuses the
        // page's cells: turn 1 reads alike, bit for bit; turn 2's last prompt
        // token is read in a forward of another row count, so the answers
        // agree up to a near-tie (F32 logits move by up to 3e-2).
        assert_text_up_to_a_tie(page["text"].as_str().unwrap(), api, 0.05, &format!("turn {n}"));
        if n == 0 {
            assert_eq!(page["text"], api["message"]["content"], "turn {n}: the page shows the API's answer");
        }
        // The counts of the API's answer where it is the page's, else the page's own.
        let same = page["text"] == api["message"]["content"];
        let stat_tokens = page["stat_tokens"].as_u64().unwrap();
        let (api_tokens, api_steps) = match same {
            true => (turn["api_tokens"].as_u64().unwrap(), turn["api_steps"].as_u64().unwrap()),
            false => (stat_tokens, u64::MAX),
        };
        // Each chunk (a macro step's text) is its own shaded span, shades alternating.
        let steps = page["steps"].as_u64().unwrap();
        assert!(steps > 1, "turn {n}: {turn}");
        assert_eq!(page["shades"], serde_json::json!(["s0", "s1"]), "turn {n}");
        // The live counter ends at the server's count; the chunks' counts add up to
        // it but for an end-of-generation token, which has no text of its own.
        assert_eq!(stat_tokens, api_tokens, "turn {n}: {turn}");
        let counted: u64 = page["step_tokens"].as_array().unwrap().iter().map(|k| k.as_u64().unwrap()).sum();
        assert!(counted <= api_tokens && api_tokens - counted <= 1, "turn {n}: {counted} of {api_tokens}");
        // Each chunk covers at least one macro step, together at most the answer's.
        let chunk_steps: Vec<u64> =
            page["step_steps"].as_array().unwrap().iter().map(|k| k.as_u64().unwrap()).collect();
        assert!(chunk_steps.iter().all(|&s| s >= 1), "turn {n}: {chunk_steps:?}");
        assert!(chunk_steps.iter().sum::<u64>() <= api_steps, "turn {n}: {turn}");
        // Several tokens in one macro step somewhere, the point of the shading,
        // and those steps marked.
        assert!(counted > steps, "turn {n}: {counted} tokens in {steps} steps");
        assert!(page["multi"].as_u64().unwrap() > 0, "turn {n}: {turn}");
    }
}
