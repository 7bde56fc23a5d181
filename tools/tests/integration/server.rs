//! The `hamburger-server` binary as an operator and real clients run it: it
//! listens on loopback by default, and SIGTERM / SIGINT stop it accepting
//! while the request in flight streams to its end; then it exits 0. Bad flags
//! fail before anything is loaded. What clients send and get back is in
//! `server/requests.rs` (llama-server's own flags and routes in
//! `server/llama_server.rs`; the running server they all drive in
//! `server/served.rs`), `echo`, prompt log-probabilities and lm-eval's API
//! models in `server/echo.rs`, the golden cases answered on a GPU in
//! `server/gpu.rs`, prompt-prefix reuse that changes no answer in
//! `server/prompt_cache.rs`, self-verified requests in
//! `server/speculative.rs`, the chat page in a browser in `server/webui.rs`,
//! against the same binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use testing::testmodel::{converted, tiny_fixture};

mod echo;
mod gpu;
mod llama_server;
mod prompt_cache;
mod requests;
mod served;
mod speculative;
mod webui;

/// The tiny fixture, converted to F32.
fn tiny() -> std::path::PathBuf {
    converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap()
}

/// Starts the server on the tiny fixture on an ephemeral port; returns it and
/// its address, read from its "listening on" log line.
fn start() -> (Child, String) {
    start_with(&tiny(), &["-np", "2", "-c", "1024"])
}

/// A server killed on drop, so a failed assertion leaves no process behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// POSTs `body` to the server at `addr`; the status and the JSON answer.
fn post(addr: &str, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    // No timeout (reqwest's blocking client waits 30 s by default): a loaded machine answers late.
    let client = reqwest::blocking::Client::builder().timeout(None).build().unwrap();
    let r = client.post(format!("http://{addr}{path}")).json(body).send().unwrap();
    (r.status().as_u16(), r.json().unwrap())
}

/// Starts the server on `model` with `args` on an ephemeral port.
fn start_with(model: &std::path::Path, args: &[&str]) -> (Child, String) {
    start_in(model, args, &[])
}

/// [`start_with`], with the variables `env` set in the server's environment.
fn start_in(model: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hamburger-server"))
        .args(["-m", model.to_str().unwrap(), "--port", "0", "-t", "2", "--metrics"])
        .args(args)
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the server logs where it listens").unwrap();
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep draining the log so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr)
}

/// Sends a streaming completion and reads up to its first event.
fn stream_request(addr: &str) -> BufReader<TcpStream> {
    let mut conn = TcpStream::connect(addr).unwrap();
    let body = r#"{"prompt": [1, 2, 3], "max_tokens": 400, "stream": true, "ignore_eos": true}"#;
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        reader.read_line(&mut line).unwrap();
    }
    reader
}

fn stop_with(signal: &str) {
    let (mut child, addr) = start();
    assert!(addr.starts_with("127.0.0.1:"), "listens on loopback by default: {addr}");
    let mut in_flight = stream_request(&addr);
    let status = Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let mut rest = String::new();
    in_flight.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("data: [DONE]"), "the request in flight ran to its end: {rest}");
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{signal}: {exit}");
    assert!(TcpStream::connect(&addr).is_err(), "nothing listens any more");
}

#[test]
fn sigterm_finishes_the_request_in_flight_and_exits_0() {
    stop_with("-TERM");
}

#[test]
fn sigint_finishes_the_request_in_flight_and_exits_0() {
    stop_with("-INT");
}

#[test]
fn bad_flags_fail_in_one_line() {
    for args in [
        &["-m", "/nonexistent.gguf"][..],
        &["-m", "x.gguf", "-np", "0"],
        &["-m", "x.gguf", "-np", "8", "-c", "10"],
        &["-m", "x.gguf", "--confidence", "nan"],
        &["-m", "x.gguf", "--forced-steps", "0"],
        &["-m", "x.gguf", "--spec-synth-rates", "1,1,1"],
        &["-m", "x.gguf", "-md", "x.gguf", "--spec-synth-rates", "1,1"],
        &["-m", "x.gguf", "-md", "x.gguf", "--spec-synth-rates", "0.5,1,1"],
        &["-m", "x.gguf", "-md", "x.gguf", "--spec-type", "draft-mtp"],
        &["-m", "x.gguf", "--spec-synth-len", "2"],
        &["-m", "x.gguf", "-md", "x.gguf", "--spec-synth-len", "9"],
        &["-m", "x.gguf", "-md", "x.gguf", "--spec-synth-len", "2", "--spec-synth-rates", "1,1,1"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_hamburger-server")).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("hamburger-server: "), "{args:?}: {err}");
        if args.contains(&"10") {
            assert!(last.contains("-c 10") && last.contains("-np 8"), "a pool too small for its slots: {err}");
        }
        for flag in ["--spec-synth-rates", "--spec-synth-len"] {
            if args.contains(&flag) {
                assert!(last.contains(flag), "{args:?}: {err}");
            }
        }
    }
}

#[test]
fn llama_server_flags_refused_by_design_say_why_in_one_line() {
    for (args, names) in [
        (&["--embedding"][..], &["--embedding"][..]),
        (&["--lora", "a.gguf"], &["--lora", "merge"]),
        (&["--context-shift"], &["--context-shift"]),
    ] {
        testing::process::assert_one_line_error(
            Command::new(env!("CARGO_BIN_EXE_hamburger-server")).args(["-m", "x.gguf"]).args(args),
            names,
        );
    }
}

#[test]
fn slots_and_context_beyond_the_machine_are_refused_before_allocating() {
    let gguf = tiny();
    for (args, names) in [
        (vec!["-np", "10000000", "-c", "20000000"], vec!["-np", "-c", "GiB"]),
        (vec!["-t", "5000"], vec!["--threads", "5000"]),
    ] {
        testing::process::assert_one_line_error(
            testing::process::limited(env!("CARGO_BIN_EXE_hamburger-server"))
                .args(["-m", gguf.to_str().unwrap(), "--port", "0"])
                .args(&args),
            &names,
        );
    }
}

/// `--no-jinja` with a template that is none of llama.cpp's built-in ones
/// (it would render it as nothing llama-server renders) stops the server at
/// start in one line naming the flag.
#[test]
fn no_jinja_with_a_template_llama_cpp_cannot_render_without_jinja_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("plain.jinja");
    std::fs::write(&template, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    testing::process::assert_one_line_error(
        testing::process::limited(env!("CARGO_BIN_EXE_hamburger-server")).args([
            "-m",
            tiny().to_str().unwrap(),
            "--port",
            "0",
            "--no-jinja",
            "--chat-template-file",
            template.to_str().unwrap(),
        ]),
        &["--no-jinja", "built-in"],
    );
}

/// A draft model (`-md`) that cannot draft for the model stops the server
/// at start in one line: a missing file named, one of another vocabulary
/// with both sizes.
#[test]
fn a_draft_model_that_cannot_draft_is_refused_in_one_line() {
    let gguf = tiny();
    let smol = converted(&testing::testmodel::smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, true).unwrap();
    for (draft, names) in [
        ("/nonexistent/draft.gguf", vec!["/nonexistent/draft.gguf"]),
        (smol.to_str().unwrap(), vec!["49152", "512", "vocabulary"]),
    ] {
        testing::process::assert_one_line_error(
            testing::process::limited(env!("CARGO_BIN_EXE_hamburger-server")).args([
                "-m",
                gguf.to_str().unwrap(),
                "--port",
                "0",
                "-md",
                draft,
            ]),
            &names,
        );
    }
}

/// What an operator reads: a summary of the model at load, then one line per
/// request with its prompt and generated tokens, tokens per step and times.
#[test]
fn the_log_has_a_model_summary_and_a_line_per_request() {
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_hamburger-server"))
            .args(["-m", tiny().to_str().unwrap(), "--port", "0", "-t", "2", "-np", "1", "-c", "512"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stderr.take().unwrap()).lines().map(Result::unwrap);
    let mut before = Vec::new();
    let addr = loop {
        let line = lines.next().expect("the server logs where it listens");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
        before.push(line);
    };
    assert!(
        before.iter().any(|l| l.contains("up to 4 tokens per macro step")
            && l.contains("1 slots drawing on one pool of 512 KV cells")),
        "{before:?}"
    );
    let complete = |body: serde_json::Value| {
        let r = reqwest::blocking::Client::new().post(format!("http://{addr}/v1/completions")).json(&body).send();
        assert_eq!(r.unwrap().status().as_u16(), 200);
    };
    // The lines before request `task`'s, and its line.
    let mut until = |task: &str| {
        let mut before = Vec::new();
        for l in lines.by_ref() {
            if l.contains(task) {
                return (before, l);
            }
            before.push(l);
        }
        panic!("no line for {task}: {before:?}");
    };
    complete(serde_json::json!({"prompt": [1, 2, 3], "max_tokens": 6, "ignore_eos": true}));
    let (before, line) = until("task 1 ");
    for part in ["prompt 3 tokens", "6 tokens in", "macro steps", "per step", "Length"] {
        assert!(line.contains(part), "{part}: {line}");
    }
    // The structured-output compiler (~0.4 s on SmolLM2) is built for the
    // first request that needs it, not for every request.
    let built = |lines: &[String]| lines.iter().any(|l| l.contains("built the structured-output compiler"));
    assert!(!built(&before), "{before:?}");
    complete(serde_json::json!({"prompt": [1, 2, 3], "max_tokens": 6, "json_schema": {"type": "integer"}}));
    let (before, _) = until("task 2 ");
    assert!(built(&before), "{before:?}");
}

/// The server's confidence is the model's recommended one when neither its
/// `--confidence` nor a request sets one (`/props` reports it), and the
/// flag's when given.
#[test]
fn the_default_confidence_is_the_models_recommended_one() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("recommends.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
        .arg(tiny_fixture().join("model.safetensors"))
        .args(["-o", model.to_str().unwrap(), "--confidence", "0.9", "--no-progress"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let props_confidence = |args: &[&str]| {
        let (mut child, addr) = start_with(&model, args);
        let props: serde_json::Value = reqwest::blocking::get(format!("http://{addr}/props")).unwrap().json().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        props["default_generation_settings"]["params"]["confidence"].clone()
    };
    assert_eq!(props_confidence(&["-np", "1", "-c", "512"]), 0.9);
    assert_eq!(props_confidence(&["-np", "1", "-c", "512", "--confidence", "0.5"]), 0.5);
}

/// Asserts that `text` is `choice`'s answer (asked with 2 alternatives per
/// token), or starts like it up to a token whose margin over its runner-up
/// is below `tie`: where the two were computed in forwards of other row
/// counts (`hamburger::row_class`), a near-tie may flip, and only there.
fn assert_text_up_to_a_tie(text: &str, choice: &serde_json::Value, tie: f64, what: &str) {
    let lp = &choice["logprobs"];
    let tokens: Vec<(String, f64)> = match lp["content"].as_array() {
        Some(content) => content
            .iter()
            .map(|c| {
                let top = c["top_logprobs"].as_array().unwrap();
                let margin = top[0]["logprob"].as_f64().unwrap() - top[1]["logprob"].as_f64().unwrap();
                (c["token"].as_str().unwrap().to_string(), margin)
            })
            .collect(),
        None => lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .zip(lp["top_logprobs"].as_array().unwrap())
            .map(|(t, top)| {
                let mut l: Vec<f64> = top.as_object().unwrap().values().map(|x| x.as_f64().unwrap()).collect();
                l.sort_by(|a, b| b.total_cmp(a));
                (t.as_str().unwrap().to_string(), l[0] - l.get(1).copied().unwrap_or(f64::NEG_INFINITY))
            })
            .collect(),
    };
    let mut rest = text;
    for (i, (token, margin)) in tokens.iter().enumerate() {
        match rest.strip_prefix(token.as_str()) {
            Some(r) => rest = r,
            // An end-of-generation token is not part of the text.
            None if rest.is_empty() && i + 1 == tokens.len() => return,
            None => {
                let at = format!("{what}: {text:?} parts from the answer at token {i} ({token:?})");
                assert!(*margin < tie, "{at}, margin {margin:.2e}");
                eprintln!("{at}, a near-tie ({margin:.2e})");
                return;
            }
        }
    }
    assert!(rest.is_empty(), "{what}: {text:?} goes on past the answer ({rest:?} left)");
}
