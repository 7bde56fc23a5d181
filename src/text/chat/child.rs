//! Rendering a chat template in a child process with a limited address
//! space. minijinja bounds a template's instructions (fuel) and we bound what
//! it writes, but it keeps no account of memory: a template from a hostile
//! GGUF that doubles a string or list inside a loop asks for terabytes in a
//! few hundred instructions, and an allocation that fails aborts the process.
//! In a child, that abort is the child's; the parent reports one line.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::{ChatTemplate, Message};
use crate::error::{Error, Result};

/// Set in a child's environment: the executable serves one render request.
pub const CHILD_ENV: &str = "HAMBURGER_CHAT_TEMPLATE_CHILD";

/// How the child reports a template's own error on stderr.
const ERROR_PREFIX: &str = "chat template error: ";

/// Where templates render: `program` re-run with [`CHILD_ENV`] set (it must
/// call [`serve_if_child`] first thing), under an address-space limit.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// The executable to run.
    pub program: PathBuf,
    /// The child's address-space limit (`ulimit -v`), in KiB.
    pub address_space_kib: u64,
}

impl Isolation {
    /// The running executable, limited to `address_space_kib`.
    ///
    /// # Errors
    /// When the executable's path is unknown.
    pub fn current_exe(address_space_kib: u64) -> Result<Isolation> {
        let program = std::env::current_exe().map_err(|e| Error::Template(format!("cannot find this program: {e}")))?;
        Ok(Isolation { program, address_space_kib })
    }
}

/// One rendering, as the parent sends it to the child.
#[derive(Serialize, Deserialize)]
pub(super) struct Request {
    pub(super) source: String,
    pub(super) bos: String,
    pub(super) eos: String,
    pub(super) messages: Vec<Message>,
    pub(super) tools: Vec<serde_json::Value>,
    pub(super) add_generation_prompt: bool,
    pub(super) kwargs: serde_json::Map<String, serde_json::Value>,
}

/// Renders `request` in a child process of `isolation`.
pub(super) fn render(isolation: &Isolation, request: &Request) -> Result<String> {
    let failed = |why: String| Error::Template(format!("rendering in a child process: {why}"));
    let limit = format!("ulimit -v {} && exec \"$0\"", isolation.address_space_kib);
    let mut child = Command::new("sh")
        .args(["-c", &limit])
        .arg(&isolation.program)
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    let input = serde_json::to_vec(request).map_err(|e| failed(e.to_string()))?;
    // The child reads all of its input before it writes: no deadlock.
    child.stdin.take().map(|mut s| s.write_all(&input)).transpose().map_err(|e| failed(e.to_string()))?;
    let out = child.wait_with_output().map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        return String::from_utf8(out.stdout).map_err(|_| Error::Template("the rendered text is not UTF-8".into()));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    match stderr.lines().find_map(|l| l.strip_prefix(ERROR_PREFIX)) {
        Some(why) => Err(Error::Template(why.to_string())),
        None => Err(Error::Template(format!(
            "the template stopped its child process ({}): it needs more than {} MiB of memory",
            out.status,
            isolation.address_space_kib >> 10
        ))),
    }
}

/// The child's side: when [`CHILD_ENV`] is set, reads one render request on
/// stdin, writes the text to stdout (or the error to stderr) and returns the
/// exit status; `None` in an ordinary run. Programs that render with an
/// [`Isolation`] of themselves call it before anything else.
pub fn serve_if_child() -> Option<i32> {
    std::env::var_os(CHILD_ENV)?;
    let mut input = Vec::new();
    let rendered = std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| Error::Template(e.to_string()))
        .and_then(|_| serde_json::from_slice::<Request>(&input).map_err(|e| Error::Template(e.to_string())))
        .and_then(|r| {
            ChatTemplate::new(&r.source, &r.bos, &r.eos)?.render_with_kwargs(
                &r.messages,
                &r.tools,
                r.add_generation_prompt,
                &r.kwargs,
            )
        });
    Some(match rendered {
        Ok(text) => i32::from(std::io::stdout().write_all(text.as_bytes()).is_err()),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{ERROR_PREFIX}{}", e.to_string().replace('\n', " "));
            1
        }
    })
}
