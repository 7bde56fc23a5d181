//! Chat templates come from the GGUF, so a hostile one must fail instead of
//! hanging or exhausting memory: rendering is bounded in work (fuel) and in
//! output, and the error says which bound was hit.

use hamburger::chat::{ChatTemplate, Message};

fn render(source: &str) -> Result<String, String> {
    let t = ChatTemplate::new(source, "<s>", "</s>").map_err(|e| e.to_string())?;
    t.render(&[Message::new("user", "hi")], true).map_err(|e| e.to_string())
}

#[test]
fn an_ordinary_template_renders() {
    let src = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
    assert_eq!(render(src).unwrap(), "<|user|>hi<|assistant|>");
}

#[test]
fn an_endless_template_runs_out_of_fuel() {
    let src = "{% for a in range(10000) %}{% for b in range(10000) %}{% for c in range(10000) %}{% endfor %}{% endfor %}{% endfor %}";
    let err = render(src).unwrap_err();
    assert!(err.contains("fuel"), "{err}");
}

#[test]
fn a_template_that_writes_without_end_stops_at_the_output_bound() {
    let src = "{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}";
    let err = render(src).unwrap_err();
    assert!(err.contains("MiB"), "{err}");
}
