//! Fingerprints the converter's sources, so the test cache of converted GGUFs
//! (`testmodel::converted`) is keyed on the converter that made them: a change
//! to the converter, the quantizer or the GGUF writer is never hidden by a
//! stale cached file.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// What the converter is made of, relative to this crate.
const SOURCES: &[&str] = &[
    "../convert/src",
    "../quant/src",
    "../ggml/src/gguf",
    "../src/model/hparams.rs",
    "../src/model/arch.rs",
    "../src/model/arch",
];

fn files(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut entries: Vec<_> =
            std::fs::read_dir(p).expect("source directory").map(|e| e.expect("entry").path()).collect();
        entries.sort();
        for e in entries {
            files(&e, out);
        }
    } else {
        out.push(p.to_path_buf());
    }
}

fn main() {
    let mut all = Vec::new();
    for s in SOURCES {
        println!("cargo:rerun-if-changed={s}");
        files(Path::new(s), &mut all);
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in all {
        f.hash(&mut h);
        std::fs::read(&f).expect("source file").hash(&mut h);
    }
    println!("cargo:rustc-env=HAMBURGER_CONVERTER_FINGERPRINT={:016x}", h.finish());
}
