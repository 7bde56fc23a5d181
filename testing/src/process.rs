//! Running the tools as a hostile environment would: under a 4 GiB
//! address-space limit, and interrupted in the middle of writing their
//! output, as a user's Ctrl-C or a service manager's SIGTERM does.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The address space the tools get in tests: 4 GiB, the contract of
/// docs/reliability.md (no input may make a tool need more to fail cleanly).
pub const ADDRESS_SPACE_KIB: u64 = 4 << 20;

/// A command running `program` with its address space limited to
/// [`ADDRESS_SPACE_KIB`] (through the shell's `ulimit -v`), so an allocation
/// a hostile input asks for fails instead of swapping the machine to death.
pub fn limited(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", &format!("ulimit -v {ADDRESS_SPACE_KIB} && exec \"$0\" \"$@\"")]).arg(program);
    c
}

/// Runs `command` expecting it to refuse: a non-zero exit, no panic, and ONE
/// line on stderr naming each of `must_name` (the tools' contract for bad
/// input). Returns that line.
///
/// # Panics
/// When any of that does not hold.
pub fn assert_one_line_error(command: &mut Command, must_name: &[&str]) -> String {
    let out = command.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    assert!(!out.status.success(), "accepted {command:?}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    for n in must_name {
        assert!(err.contains(n), "error does not name {n}: {err}");
    }
    err
}

/// Waits until `child` has a partial GGUF (`*.part`) in `dir`, sends it
/// `signal` (`INT`, `TERM`...) and checks that it exits with status 130 and
/// leaves `dir` empty.
///
/// # Panics
/// When no partial file appears within two minutes, the tool exits some other
/// way, or anything is left in `dir`.
pub fn interrupt_while_writing(mut child: Child, dir: &Path, signal: &str) {
    let t0 = Instant::now();
    let has_part =
        || std::fs::read_dir(dir).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".part"));
    while !has_part() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the tool exited ({status}) before writing a partial file");
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no partial file after two minutes");
        std::thread::sleep(Duration::from_millis(2));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill").args([format!("-{signal}"), pid]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "SIG{signal}: {}", String::from_utf8_lossy(&out.stderr));
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "SIG{signal} left {left:?}");
}
