//! `hamburger-train average-heads` on the shipped draft head: the mean of a
//! head with itself is that head, bit for bit; with its negation, zero in
//! every tensor; and fewer than two heads, a file that is not a draft head
//! alone, or heads of other names are refused in one line with nothing
//! written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/smollm2-hamburger").join(name)
}

fn average_heads(heads: &[&Path], out: &Path) -> Output {
    let mut c = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../train/hamburger-train"));
    c.args(["-t", "1", "average-heads"]);
    for h in heads {
        c.arg("--head").arg(h);
    }
    c.arg("--out").arg(out).output().unwrap()
}

/// The bytes of the mean of `heads`, written at `out` by a run that succeeded.
fn averaged(heads: &[&Path], out: &Path) -> Vec<u8> {
    let done = average_heads(heads, out);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    std::fs::read(out).unwrap()
}

/// The one-line error of a refused run that wrote nothing at `out`.
fn refused(done: &Output, out: &Path) -> String {
    let err = String::from_utf8_lossy(&done.stderr).trim().to_string();
    assert!(!done.status.success() && err.lines().count() == 1, "{err}");
    assert!(!out.exists() && !out.with_extension("part").exists(), "{err}: something was written");
    err
}

/// The shipped head with every f16 value's sign flipped, and without the
/// tensors `leave_out` names, written to `path`.
fn negated(head: &SafeTensors, leave_out: &[&str], path: &Path) {
    let data: Vec<(String, Vec<u8>, Vec<usize>)> = head
        .tensors()
        .into_iter()
        .filter(|(k, _)| !leave_out.contains(&k.as_str()))
        .map(|(k, t)| {
            assert_eq!(t.dtype(), Dtype::F16, "{k}");
            let bytes = t.data().chunks(2).flat_map(|b| [b[0], b[1] ^ 0x80]).collect();
            (k, bytes, t.shape().to_vec())
        })
        .collect();
    let views = data.iter().map(|(k, b, s)| (k.clone(), TensorView::new(Dtype::F16, s.clone(), b).unwrap()));
    safetensors::serialize_to_file(views, None, path).unwrap();
}

#[test]
fn the_mean_of_draft_heads_is_taken_tensor_by_tensor_and_mismatches_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let head_file = shipped("draft-head.safetensors");
    let bytes = std::fs::read(&head_file).unwrap();
    let head = SafeTensors::deserialize(&bytes).unwrap();

    let out_bytes = averaged(&[&head_file, &head_file], &dir.path().join("same.safetensors"));
    let out = SafeTensors::deserialize(&out_bytes).unwrap();
    assert_eq!(out.len(), head.len());
    for (k, t) in head.tensors() {
        let o = out.tensor(&k).unwrap();
        assert!((o.dtype(), o.shape()) == (t.dtype(), t.shape()) && o.data() == t.data(), "{k}: not the head's bytes");
    }

    let minus = dir.path().join("minus.safetensors");
    negated(&head, &[], &minus);
    let zero_bytes = averaged(&[&head_file, &minus], &dir.path().join("zero.safetensors"));
    let zeros = SafeTensors::deserialize(&zero_bytes).unwrap();
    assert_eq!(zeros.len(), head.len());
    for (k, t) in zeros.tensors() {
        assert_eq!(t.shape(), head.tensor(&k).unwrap().shape(), "{k}");
        // +0 or -0 in f16: every bit but the sign clear.
        assert!(t.data().chunks(2).all(|b| b[0] == 0 && b[1] & 0x7f == 0), "{k}: not zero");
    }

    let not_written = dir.path().join("refused.safetensors");
    let err = refused(&average_heads(&[&head_file], &not_written), &not_written);
    assert!(err.contains("--head") && err.contains("at least two"), "{err}");
    let grafted = shipped("grafted.safetensors");
    let err = refused(&average_heads(&[&head_file, &grafted], &not_written), &not_written);
    assert!(err.contains("grafted.safetensors") && err.contains("not a draft head alone"), "{err}");
    let short = dir.path().join("short.safetensors");
    negated(&head, &["draft_head.copy.weight"], &short);
    let err = refused(&average_heads(&[&head_file, &short], &not_written), &not_written);
    assert!(err.contains("short.safetensors") && err.contains("draft_head.copy.weight: missing"), "{err}");
    let err = refused(&average_heads(&[&short, &head_file], &not_written), &not_written);
    assert!(err.contains("draft_head.copy.weight: not in"), "{err}");
}
