//! A `.safetensors` file (first byte even) or a `model.safetensors.index.json`
//! (first byte odd, next to a real shard) as `hamburger-convert` opens them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let path = if mode % 2 == 0 {
        hamburger_fuzz::scratch("model.safetensors", rest)
    } else {
        hamburger_fuzz::shard();
        hamburger_fuzz::scratch("model.safetensors.index.json", rest)
    };
    hamburger_fuzz::read_checkpoint(&path);
});
