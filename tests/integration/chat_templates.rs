//! Chat templates as the models' authors wrote them (llama.cpp's collection,
//! taken at test time from the llama-cpp-python source distribution on PyPI)
//! rendered by the runtime and by Python's jinja2 set up as transformers sets
//! it up (`testing/render_chat_template.py`): the same text, byte for byte,
//! on several conversations, with today's date where a template asks for it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use hamburger::chat::{ChatTemplate, Message};
use serde_json::json;

const BOS: &str = "<|begin_of_text|>";
const EOS: &str = "<|eot_id|>";

fn msg(role: &str, content: &str) -> Message {
    Message::new(role, content)
}

/// The conversations every template is rendered on, with or without the
/// assistant's header at the end.
fn conversations() -> Vec<(Vec<Message>, bool)> {
    vec![
        (vec![msg("user", "Hello!")], true),
        (vec![msg("system", "You are terse."), msg("user", "Name a prime.")], true),
        (
            vec![
                msg("system", "Answer in French."),
                msg("user", "What is 2 + 2?"),
                msg("assistant", "Quatre."),
                msg("user", "And {{ 3 }} + 3?\nThink  twice."),
            ],
            true,
        ),
        (vec![msg("user", "Über straße — ok? 日本語"), msg("assistant", "Ja.")], false),
    ]
}

/// What transformers' jinja2 setup renders of each template in `dir` on
/// every conversation, in order; `None` where the template raises (some
/// refuse a system message, or need variables of their own). One Python
/// process renders them all.
fn python_renders(dir: &Path, names: &[String]) -> Vec<Option<String>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("testing/render_chat_template.py");
    let jobs: Vec<_> = names
        .iter()
        .flat_map(|n| conversations().into_iter().map(move |(messages, g)| (n, messages, g)))
        .map(|(n, messages, g)| {
            json!({"template": dir.join(n), "messages": messages, "add_generation_prompt": g, "bos_token": BOS, "eos_token": EOS})
        })
        .collect();
    let mut child = Command::new(testing::registry::python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python (scripts/install-deps.sh makes .venv-tests with jinja2)");
    child.stdin.take().unwrap().write_all(serde_json::to_string(&jobs).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "jinja2: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Where the runtime's rendering of each template departs from jinja2's.
fn departures(dir: &Path, names: &[String]) -> Vec<String> {
    let mut expected = python_renders(dir, names).into_iter();
    let mut found = Vec::new();
    for name in names {
        let source = std::fs::read_to_string(dir.join(name)).unwrap();
        let ours = ChatTemplate::new(&source, BOS, EOS);
        for (messages, add_generation_prompt) in conversations() {
            let turns = messages.len();
            let got = ours
                .as_ref()
                .map_err(ToString::to_string)
                .and_then(|t| t.render(&messages, add_generation_prompt).map_err(|e| e.to_string()));
            match (expected.next().unwrap(), got) {
                (Some(expected), Ok(got)) if got != expected => {
                    found.push(format!("{name} ({turns} turns): {got:?}\n  expected {expected:?}"))
                }
                (Some(_), Err(e)) => found.push(format!("{name} ({turns} turns): fails here only: {e}")),
                (None, Ok(_)) => found.push(format!("{name} ({turns} turns): renders here, raises in jinja2")),
                _ => {}
            }
        }
    }
    found
}

#[test]
fn llama_3_2_renders_as_transformers_does_with_todays_date() {
    let dir = testing::registry::llama_cpp_templates().unwrap();
    let name = "meta-llama-Llama-3.2-3B-Instruct.jinja";
    assert_eq!(departures(&dir, &[name.to_string()]), Vec::<String>::new());
    let source = std::fs::read_to_string(dir.join(name)).unwrap();
    let text = ChatTemplate::new(&source, BOS, EOS).unwrap().render(&[msg("user", "Hi")], true).unwrap();
    let today = chrono::Local::now().format("%d %b %Y").to_string();
    assert!(text.contains(&format!("Today Date: {today}\n")), "{text}");
}

/// Templates whose jinja2 behaviour the runtime does not reproduce, and why.
const KNOWN_DEPARTURES: [&str; 1] = [
    // `tools|length` on an undefined `tools`: 0 in jinja2, an error in minijinja.
    "unsloth-Apriel-1.5.jinja",
];

#[test]
fn every_template_of_llama_cpp_renders_as_transformers_does() {
    let dir = testing::registry::llama_cpp_templates().unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert!(names.len() >= 50, "only {} templates in {}", names.len(), dir.display());
    names.retain(|n| !KNOWN_DEPARTURES.contains(&n.as_str()));
    let found = departures(&dir, &names);
    assert!(found.is_empty(), "{} departures:\n{}", found.len(), found.join("\n"));
}
