//! The test harness: hamburger-server on an ephemeral loopback port,
//! serving SmolLM2-HAMburger in F32 with an F32 cache and flash attention
//! (the server's default), and how to compare answers.
//!
//! A sequence's logits are the same bits whatever else its forwards hold
//! only while every forward keeps its row-count class (`hamburger::row_class`:
//! 1, 2..=7, 8..=63, 64 and more rows) and, for plain attention's softmax
//! or flash attention's tiled path (64 rows and more), its cells stay where
//! they were. So answers are compared exactly where both runs read alike (a
//! repeated request, a prompt whose cached cells a fresh read would compute
//! the same, choices of one request beside the same number of others), and
//! decision by decision up to a near-tie ([`assert_same_up_to_a_tie`])
//! where they do not (a request alone against the same in a batch).

use std::time::Duration;

use hamburger::{EngineParams, LoadOptions, StepParams};
use serde_json::Value;
use server::{Scheduler, SchedulerConfig};
use testing::testmodel::{converted, smollm2_checkpoint};

/// A server on an ephemeral loopback port, stopped on drop.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Starts a server of `n_slots` slots over a pool of 512 KV cells per slot and a queue of `queue`.
    pub fn start(n_slots: usize, queue: usize, api_key: Option<&str>) -> TestServer {
        let step = StepParams { confidence: 0.3, ..Default::default() };
        TestServer::start_with(n_slots, 512, queue, api_key, step, None)
    }

    /// Starts a server of `n_slots` slots over one pool of `n_ctx_slot` KV
    /// cells per slot (the slots share it),
    /// whose requests' stop rule defaults to `step`, with the Jinja
    /// `chat_template` instead of the model's when given.
    pub fn start_with(
        n_slots: usize,
        n_ctx_slot: usize,
        queue: usize,
        api_key: Option<&str>,
        step: StepParams,
        chat_template: Option<String>,
    ) -> TestServer {
        TestServer::from_config(TestServer::config(n_slots, n_ctx_slot, queue, step, chat_template), api_key)
    }

    /// The configuration [`TestServer::start_with`] serves (SmolLM2-HAMburger
    /// in F32, an F32 cache, flash attention, 2 threads).
    pub fn config(
        n_slots: usize,
        n_ctx_slot: usize,
        queue: usize,
        step: StepParams,
        chat_template: Option<String>,
    ) -> SchedulerConfig {
        let model = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
        let engine = EngineParams {
            n_ctx: n_ctx_slot * n_slots,
            n_seq: n_slots,
            kv_type: ggml::Type::F32,
            flash_attn: Some(true),
            n_threads: 2,
            ..Default::default()
        };
        SchedulerConfig {
            model,
            load: LoadOptions::default(),
            engine,
            step,
            queue,
            chat_template,
            no_jinja: false,
            template_isolation: None,
            alias: None,
            n_predict: None,
            defaults: Default::default(),
            draft: None,
        }
    }

    /// Starts a server of `cfg`, its HTTP side as [`TestServer::start_with`]'s.
    pub fn from_config(cfg: SchedulerConfig, api_key: Option<&str>) -> TestServer {
        let scheduler = Scheduler::start(cfg).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let key = api_key.map(str::to_string);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let shutdown = async move {
                    let _ = stopped.await;
                };
                let http = server::HttpOptions {
                    api_key: key,
                    timeout: Duration::from_secs(600),
                    cors: server::http::Cors::Any,
                    slots_endpoint: true,
                    metrics_endpoint: true,
                    aliases: Vec::new(),
                    tags: Vec::new(),
                    webui: true,
                    model_path: String::new(),
                    total_slots: 1,
                    // Vertex AI's routes, served beside the others.
                    vertex: Some(server::http::Vertex {
                        port: 0,
                        predict: "/predict".into(),
                        health: Some("/vertex/health".into()),
                    }),
                };
                server::serve(vec![listener], scheduler, http, shutdown).await.unwrap();
            });
        });
        let addr = addr_rx.recv().unwrap();
        TestServer { url: format!("http://{addr}"), stop: Some(stop), thread: Some(thread) }
    }

    /// POSTs `body` as JSON; the status and the JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = client().post(format!("{}{path}", self.url)).json(body).send().unwrap();
        let status = r.status().as_u16();
        (status, r.json().unwrap())
    }

    /// The value of metric `hamburger_NAME`.
    pub fn metric(&self, name: &str) -> f64 {
        let text = reqwest::blocking::get(format!("{}/metrics", self.url)).unwrap().text().unwrap();
        let line = text.lines().find(|l| l.starts_with(&format!("hamburger_{name} "))).unwrap();
        line.split(' ').nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.thread.take().unwrap().join();
    }
}

/// An HTTP client that waits as long as a generation may take: reqwest's
/// default of 30 s is shorter than eight requests on a loaded two-core
/// machine, and a test must fail on the server's answers, not on the load.
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(600)).build().unwrap()
}

/// How far apart two logits of one token may be where the runs compared
/// read in forwards of other row counts: F32 SmolLM2's logits move by up to
/// 3e-2 between a forward of one row and one of several (`hamburger::row_class`).
pub const NEAR_TIE: f64 = 0.05;

/// A choice's tokens, each with its log-probability's margin over the
/// runner-up (so its logit's), from the log-probabilities asked for with 2
/// or more alternatives: chat's `logprobs.content`, or a completion's
/// `logprobs.tokens` and `top_logprobs`.
pub fn token_margins(choice: &Value) -> Vec<(String, f64)> {
    let lp = &choice["logprobs"];
    let margin = |mut top: Vec<f64>| {
        top.sort_by(|a, b| b.total_cmp(a));
        top[0] - top.get(1).copied().unwrap_or(f64::NEG_INFINITY)
    };
    if let Some(content) = lp["content"].as_array() {
        return content
            .iter()
            .map(|c| {
                let top = c["top_logprobs"].as_array().unwrap().iter().map(|t| t["logprob"].as_f64().unwrap());
                (c["token"].as_str().unwrap().to_string(), margin(top.collect()))
            })
            .collect();
    }
    let tokens = lp["tokens"].as_array().unwrap_or_else(|| panic!("no log-probabilities: {choice}"));
    tokens
        .iter()
        .zip(lp["top_logprobs"].as_array().unwrap())
        .map(|(t, top)| {
            let top = top.as_object().unwrap().values().map(|l| l.as_f64().unwrap());
            (t.as_str().unwrap().to_string(), margin(top.collect()))
        })
        .collect()
}

/// Asserts that two choices (asked with log-probabilities) have the same
/// tokens, or the same up to one where either side's margin is below
/// [`NEAR_TIE`] (after which they are not compared); returns whether they
/// are the same throughout.
pub fn assert_same_up_to_a_tie(got: &Value, want: &Value, what: &str) -> bool {
    let (g, w) = (token_margins(got), token_margins(want));
    match g.iter().zip(&w).position(|(a, b)| a.0 != b.0) {
        None => {
            assert_eq!(g.len(), w.len(), "{what}: token counts");
            true
        }
        Some(i) => {
            let margin = g[i].1.min(w[i].1);
            eprintln!("{what}: token {i} differs ({:?} vs {:?}) where the margin is {margin:.2e}", g[i].0, w[i].0);
            assert!(margin < NEAR_TIE, "{what}: token {i} differs ({:?} vs {:?}), margin {margin:.3e}", g[i].0, w[i].0);
            false
        }
    }
}
