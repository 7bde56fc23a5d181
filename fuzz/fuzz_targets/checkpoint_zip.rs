//! A `.ckpt` (torch zip) as `hamburger-convert` opens it: the zip directory,
//! `data.pkl` through the unpickler, storages located and bounds-checked, and
//! the first elements of each tensor read.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = hamburger_fuzz::scratch("model.ckpt", data);
    hamburger_fuzz::read_checkpoint(&path);
});
