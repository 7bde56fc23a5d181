//! The embedded tokenizer: text (first byte 0) through the fixture's
//! tokenizer, or a tokenizer JSON (otherwise) built and used, as a GGUF's
//! `tokenizer.huggingface.json` would be. Every id must be in the vocabulary
//! and streaming must agree with decoding.
#![no_main]

use std::sync::OnceLock;

use hamburger::tokenizer::{TextStream, Tokenizer};
use hamburger_fuzz::TINY_VOCAB;
use libfuzzer_sys::fuzz_target;

fn fixture() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let json = std::fs::read_to_string(hamburger_fuzz::tiny_fixture().join("tokenizer.json")).unwrap();
        Tokenizer::from_json(&json, TINY_VOCAB, Some(1), true).unwrap()
    })
}

fn exercise(tok: &Tokenizer, text: &str) {
    let Ok(ids) = tok.encode(text, true) else { return };
    assert!(ids.iter().all(|&id| (id as usize) < TINY_VOCAB));
    let whole = tok.decode(&ids);
    let mut stream = TextStream::new(tok);
    let streamed: String = ids.chunks(3).map(|c| stream.push(c)).collect();
    assert!(whole.starts_with(&streamed) || streamed.starts_with(&whole) || whole.contains('\u{fffd}'));
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    if mode == 0 {
        exercise(fixture(), &text);
    } else if let Ok(tok) = Tokenizer::from_json(&text, TINY_VOCAB, Some(1), true) {
        exercise(&tok, "Hello <|im_start|>user\nwörld 123 \u{1f600}<|im_end|>");
    }
});
