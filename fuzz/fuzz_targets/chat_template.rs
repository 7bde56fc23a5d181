//! A chat template from a GGUF: compiled and rendered under the runtime's
//! fuel and output bounds. It may fail; it may not panic, hang or exhaust memory.
#![no_main]

use hamburger::chat::{ChatTemplate, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let source = String::from_utf8_lossy(data);
    let Ok(t) = ChatTemplate::new(&source, "<|im_start|>", "<|im_end|>") else { return };
    let messages = [
        Message { role: "system".into(), content: "Be brief.".into() },
        Message { role: "user".into(), content: "Hi {{ there }}".into() },
        Message { role: "assistant".into(), content: "Hello.".into() },
    ];
    let _ = t.render(&messages, true);
});
