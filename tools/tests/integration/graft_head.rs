//! `hamburger-train graft-head` on the shipped files: the draft head's micro
//! decoder and stop head become the macro steps' own, everything else stays
//! the grafted file's, and a file that is not a draft head alone, or a head
//! that copies (as the shipped one does, and macro steps cannot), is
//! refused in one line with nothing written.

use std::path::{Path, PathBuf};
use std::process::Command;

use safetensors::SafeTensors;

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/smollm2-hamburger").join(name)
}

fn graft_head(grafted: &Path, head: &Path, out: &Path) -> std::process::Output {
    Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../train/hamburger-train"))
        .args(["-t", "1", "graft-head", "--grafted"])
        .arg(grafted)
        .arg("--head")
        .arg(head)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn a_draft_head_becomes_the_macro_steps_micro_decoder_and_nothing_else_changes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("grafted.safetensors");
    let grafted = shipped("grafted.safetensors");
    // The shipped head without its copy matrix.
    let bytes = std::fs::read(shipped("draft-head.safetensors")).unwrap();
    let copying = SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<_> = copying.tensors().into_iter().filter(|(k, _)| k != "draft_head.copy.weight").collect();
    assert_eq!(tensors.len() + 1, copying.names().len(), "the shipped head copies");
    let head = dir.path().join("head.safetensors");
    safetensors::serialize_to_file(tensors, None, &head).unwrap();
    let done = graft_head(&grafted, &head, &out);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let bytes = [std::fs::read(&out).unwrap(), std::fs::read(&grafted).unwrap(), std::fs::read(&head).unwrap()];
    let [out, grafted, head] = bytes.each_ref().map(|b| SafeTensors::deserialize(b).unwrap());
    let mut names = out.names();
    let mut before = grafted.names();
    names.sort_unstable();
    before.sort_unstable();
    assert_eq!(names, before, "the same tensors as the grafted file");
    let mut swapped = 0;
    for k in names {
        let t = out.tensor(k).unwrap();
        let source = match k.strip_prefix("micro_step_decoder.") {
            Some(rest) => {
                swapped += 1;
                head.tensor(&format!("draft_head.{rest}")).unwrap()
            }
            None => grafted.tensor(k).unwrap(),
        };
        assert_eq!((t.dtype(), t.shape(), t.data()), (source.dtype(), source.shape(), source.data()), "{k}");
    }
    assert_eq!(swapped, head.names().len(), "every tensor of the head in the macro steps");

    // The grafted file given as the head: one line naming it, nothing written.
    let refused = dir.path().join("refused.safetensors");
    let failed = graft_head(&shipped("grafted.safetensors"), &shipped("grafted.safetensors"), &refused);
    let err = String::from_utf8_lossy(&failed.stderr).trim().to_string();
    assert!(!failed.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("--head") && err.contains("not a draft head alone"), "{err}");
    assert!(!refused.exists() && !refused.with_extension("part").exists());
    // The shipped head, which copies.
    let failed = graft_head(&shipped("grafted.safetensors"), &shipped("draft-head.safetensors"), &refused);
    let err = String::from_utf8_lossy(&failed.stderr).trim().to_string();
    assert!(!failed.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("draft_head.copy.weight") && err.contains("macro steps"), "{err}");
    assert!(!refused.exists() && !refused.with_extension("part").exists());
}
