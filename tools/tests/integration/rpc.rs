//! Layers on other machines through ggml's RPC backend, on loopback: two
//! `hamburger-rpc-server`s and this process's CPU share the tiny fixture's
//! layers and decode the golden cases exactly; a server that dies in the
//! middle of a generation, and an address nobody answers, end the client in
//! one clear line instead of a hang or an abort.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hamburger::{EngineParams, LoadOptions, Model, SessionParams};
use testing::testmodel::{converted, tiny_fixture};

/// A running `hamburger-rpc-server`, killed on drop.
struct RpcServer {
    child: Child,
    endpoint: String,
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a server on a free loopback port and waits until it accepts connections.
fn rpc_server() -> RpcServer {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(env!("CARGO_BIN_EXE_hamburger-rpc-server"))
        .args(["--port", &port.to_string(), "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let endpoint = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    while TcpStream::connect(&endpoint).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the RPC server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    RpcServer { child, endpoint }
}

fn tiny() -> std::path::PathBuf {
    converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap()
}

#[test]
fn golden_cases_with_layers_on_two_servers_and_the_cpu() {
    let (a, b) = (rpc_server(), rpc_server());
    // 16 base layers: 6 on the CPU, then 5 on each server; the tail follows the last layer.
    // --device auto: the servers' devices are not taken for a local GPU.
    let options = LoadOptions {
        device: hamburger::DeviceChoice::Auto,
        rpc: vec![a.endpoint.clone(), b.endpoint.clone()],
        n_gpu_layers: 10,
        tensor_split: vec![1.0, 1.0],
        ..Default::default()
    };
    let model = Model::open(&tiny(), &options).unwrap();
    let counts: Vec<usize> = model.plan.layer_counts().into_iter().map(|(_, n)| n).collect();
    assert_eq!(counts, [6, 5, 5], "{}", model.plan.describe());
    let p = SessionParams {
        engine: EngineParams {
            n_ctx: 256,
            kv_type: ggml::Type::F32,
            flash_attn: Some(false),
            n_threads: 1,
            ..Default::default()
        },
        keep_logits: true,
        ..Default::default()
    };
    testing::golden::check_golden(&model, p.clone(), 1e-3, 1e-4);
    // With the tail kept local, each micro step stays on this machine.
    let local = Model::open(&tiny(), &LoadOptions { micro_local: true, ..options }).unwrap();
    assert!(local.plan.describe().ends_with("micro steps on CPU"), "{}", local.plan.describe());
    testing::golden::check_golden(&local, p, 1e-3, 1e-4);
}

fn cli(extra: &[&str]) -> Command {
    let mut c = testing::process::limited(env!("CARGO_BIN_EXE_hamburger-cli"));
    c.args(["-m", tiny().to_str().unwrap(), "-t", "1", "--temp", "0"]).args(extra);
    c
}

#[test]
fn a_server_that_dies_mid_generation_ends_the_client_with_one_line() {
    let server = rpc_server();
    let mut child =
        cli(&["--rpc", &server.endpoint, "--prompt-ids", "1,2,3", "-n", "8000", "-c", "8192", "--ignore-eos"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
    // Wait for generated text, then kill the server under the client.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = Vec::new();
    out.read_until(b' ', &mut first).unwrap();
    drop(server);
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("hamburger-cli: error: ggml:") && last.contains("RPC"), "{err}");
}

#[test]
fn an_address_nobody_answers_fails_naming_it() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("127.0.0.1:{port}");
    for endpoint in [endpoint.as_str(), "no-port-here"] {
        testing::process::assert_one_line_error(&mut cli(&["--rpc", endpoint, "-p", "hi"]), &[endpoint]);
    }
}

#[test]
fn a_server_on_a_non_loopback_address_warns_that_the_protocol_is_open() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hamburger-rpc-server"))
        .args(["--host", "0.0.0.0", "--port", &port.to_string(), "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let warning = lines.next().unwrap().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(warning.contains("WARN") && warning.contains("no authentication"), "{warning}");
}
