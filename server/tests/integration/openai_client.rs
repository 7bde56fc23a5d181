//! The official `openai` Python client and lm-eval's `local-chat-completions`
//! request shape against a real hamburger-server (scripts/openai_compat.py;
//! `scripts/install-deps.sh` installs the client in `.venv-tests`).

use std::process::Command;

use crate::common::TestServer;

#[test]
fn openai_python_client_and_lm_eval_requests_work_unchanged() {
    let s = TestServer::start(2, 8, None);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/openai_compat.py");
    let out = Command::new(testing::registry::python()).arg(script).arg(&s.url).output().expect("python runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "openai_compat.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
