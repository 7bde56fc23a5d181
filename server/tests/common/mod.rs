//! The test harness: hamburger-server on an ephemeral loopback port,
//! serving SmolLM2-HAMburger in F32 with an F32 cache.

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
        let model = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
        let engine = EngineParams {
            n_ctx: n_ctx_slot * n_slots,
            n_seq: n_slots,
            kv_type: ggml::Type::F32,
            flash_attn: false,
            n_threads: 2,
            ..Default::default()
        };
        let cfg = SchedulerConfig {
            model,
            load: LoadOptions::default(),
            engine,
            step,
            queue,
            chat_template,
            template_isolation: None,
            alias: None,
            n_predict: None,
        };
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
                    cors: false,
                    webui: true,
                    model_path: String::new(),
                    total_slots: 1,
                };
                server::serve(listener, scheduler, http, shutdown).await.unwrap();
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
