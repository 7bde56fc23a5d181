//! A GGUF file as `hamburger-cli -m` meets it: ggml's reader, the
//! hyper-parameter, vocabulary and tensor-directory checks of `Model::open`,
//! and, for a file that passes, a two-token decode, its tokenizer and its
//! chat template. Nothing may panic or abort; errors are fine.
#![no_main]

use hamburger::chat::{ChatTemplate, Message};
use hamburger::tokenizer::Tokenizer;
use hamburger::{EngineParams, LoadOptions, Model, Session, SessionParams};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = hamburger_fuzz::scratch("model.gguf", data);
    if let Ok(g) = ggml::gguf::Gguf::open(&path) {
        let _ = hamburger::hparams::HParams::from_gguf(&g, "llama");
    }
    let options = LoadOptions { repack: false, ..Default::default() };
    let Ok(model) = Model::open(&path, &options) else { return };
    let params = SessionParams {
        engine: EngineParams { n_ctx: 32, n_batch: 8, n_threads: 1, ..Default::default() },
        ..Default::default()
    };
    if let Ok(mut s) = Session::new(&model, params) {
        let _ = s.generate(&[0, 0], 2, |_| true);
    }
    if let Ok(tok) = Tokenizer::from_model(&model) {
        if let Ok(ids) = tok.encode("Hello <|im_end|> world", true) {
            tok.decode(&ids);
        }
    }
    if let Some(Ok(t)) = model.vocab.chat_template.as_deref().map(|s| ChatTemplate::new(s, "<s>", "</s>")) {
        let _ = t.render(&[Message { role: "user".into(), content: "hi".into() }], true);
    }
});
