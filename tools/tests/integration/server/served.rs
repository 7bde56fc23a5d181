//! A `hamburger-server` binary that the server tests run and what they ask
//! of it over loopback HTTP: posts, completions, streams, metrics, raw
//! connections.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;
use testing::testmodel::{converted, smollm2_checkpoint};

use super::{start_with, tiny};

/// A running server, killed on drop.
pub(super) struct Served {
    child: Child,
    addr: String,
}

impl Served {
    pub(super) fn tiny(args: &[&str]) -> Served {
        let (child, addr) = start_with(&tiny(), args);
        Served { child, addr }
    }

    /// SmolLM2-HAMburger in F32: a real tokenizer, chat template and text,
    /// with macro steps of several tokens.
    pub(super) fn smollm2(args: &[&str]) -> Served {
        let model = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
        let (child, addr) = start_with(&model, &[args, &["--confidence", "0.3"]].concat());
        Served { child, addr }
    }

    pub(super) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// POSTs `body`; the status and the JSON answer.
    pub(super) fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = client().post(self.url(path)).json(body).send().unwrap();
        (r.status().as_u16(), r.json().unwrap())
    }

    /// A completion's text and whole answer, which must succeed.
    pub(super) fn complete(&self, body: &Value) -> (String, Value) {
        let (status, v) = self.post("/v1/completions", body);
        assert_eq!(status, 200, "{body}: {v}");
        (v["choices"][0]["text"].as_str().unwrap().to_string(), v)
    }

    /// The `data:` payloads of a streamed request.
    pub(super) fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let text = client().post(self.url(path)).json(body).send().unwrap().text().unwrap();
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
    }

    /// The value of metric `hamburger_NAME`.
    pub(super) fn metric(&self, name: &str) -> f64 {
        let text = reqwest::blocking::get(self.url("/metrics")).unwrap().text().unwrap();
        let line = text.lines().find(|l| l.starts_with(&format!("hamburger_{name} "))).unwrap();
        line.split(' ').nth(1).unwrap().parse().unwrap()
    }

    /// Opens a raw streaming completion; the connection, before any answer is read.
    pub(super) fn open_stream(&self, body: &Value) -> TcpStream {
        let mut conn = TcpStream::connect(&self.addr).unwrap();
        let body = body.to_string();
        let addr = &self.addr;
        write!(
            conn,
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        conn
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client without a timeout: a slow machine is no failure.
pub(super) fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(None).build().unwrap()
}

/// Polls `cond` until it holds, failing after a generous deadline.
pub(super) fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads the response's lines up to the first one that starts with `prefix`.
pub(super) fn read_until(reader: &mut BufReader<TcpStream>, prefix: &str) -> String {
    let mut line = String::new();
    while !line.starts_with(prefix) {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended before '{prefix}'");
    }
    line
}
