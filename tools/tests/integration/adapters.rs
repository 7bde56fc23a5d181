//! Low-rank adapters in a shipped `grafted.safetensors` (what `hamburger-train
//! train --lora-rank` adds beside the grafted modules): `hamburger-testmodel`
//! folds `W + B A` into the base weights it writes, and refuses an adapter
//! that does not fit, naming it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use convert::checkpoint::Checkpoint;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use testing::testmodel::{self, from_gguf};

fn shipped_grafted() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/smollm2-hamburger/grafted.safetensors")
}

/// Every tensor of a safetensors file as f32 values with its shape (torch order).
fn read_all(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let ck = Checkpoint::open(path).unwrap();
    ck.tensors.iter().map(|(k, t)| (k.clone(), (t.shape.clone(), ck.read_f32(t, 0, t.n_elements())))).collect()
}

/// Writes `tensors` (f32) as a safetensors file.
fn write_all(path: &Path, tensors: &BTreeMap<String, (Vec<usize>, Vec<f32>)>) {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(k, (shape, v))| (k.clone(), shape.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(&str, TensorView)> =
        bytes.iter().map(|(k, s, b)| (k.as_str(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The f32 values of `key` in a checkpoint directory's `model.safetensors`.
fn weight(dir: &Path, key: &str) -> Vec<f32> {
    let ck = Checkpoint::open(&dir.join("model.safetensors")).unwrap();
    let t = &ck.tensors[key];
    ck.read_f32(t, 0, t.n_elements())
}

#[test]
fn adapters_are_folded_into_the_base_weights_and_misfits_are_refused() {
    let gguf_base = testmodel::smollm2_gguf(&testmodel::cache_dir()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut tensors = read_all(&shipped_grafted());
    tensors.retain(|k, _| !k.contains(".lora_"));
    let plain = dir.path().join("plain.safetensors");
    write_all(&plain, &tensors);

    // A rank-2 adapter on layer 10's q_proj ([576, 576]): B A has a known value everywhere.
    let key = "model.model.layers.10.self_attn.q_proj";
    let (out, inp, rank) = (576usize, 576usize, 2usize);
    let a: Vec<f32> = (0..rank * inp).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let b: Vec<f32> = (0..out * rank).map(|i| ((i % 5) as f32 - 2.0) * 0.1).collect();
    tensors.insert(format!("{key}.lora_A"), (vec![rank, inp], a.clone()));
    tensors.insert(format!("{key}.lora_B"), (vec![out, rank], b.clone()));
    let adapted = dir.path().join("adapted.safetensors");
    write_all(&adapted, &tensors);

    let (ck_plain, ck_adapted) = (dir.path().join("ck-plain"), dir.path().join("ck-adapted"));
    for d in [&ck_plain, &ck_adapted] {
        std::fs::create_dir_all(d).unwrap();
    }
    from_gguf::write(&gguf_base, &ck_plain, from_gguf::Grafted::Trained(&[plain.as_path()])).unwrap();
    from_gguf::write(&gguf_base, &ck_adapted, from_gguf::Grafted::Trained(&[adapted.as_path()])).unwrap();
    let (w0, w1) = (weight(&ck_plain, &format!("{key}.weight")), weight(&ck_adapted, &format!("{key}.weight")));
    for o in 0..out {
        for i in 0..inp {
            let delta: f32 = (0..rank).map(|r| b[o * rank + r] * a[r * inp + i]).sum();
            let got = w1[o * inp + i] - w0[o * inp + i];
            assert!((got - delta).abs() < 1e-5, "W[{o}][{i}] moved by {got}, B A is {delta}");
        }
    }
    // Weights without an adapter are untouched.
    let other = "model.model.layers.10.self_attn.k_proj.weight";
    assert_eq!(weight(&ck_plain, other), weight(&ck_adapted, other));

    // Half an adapter, factors that do not fit the weight, and an adapter of
    // a weight the model lacks: refused, naming the tensor.
    let mut half = tensors.clone();
    half.remove(&format!("{key}.lora_B"));
    let mut misfit = tensors.clone();
    misfit.insert(format!("{key}.lora_B"), (vec![out, rank + 1], vec![0.0; out * (rank + 1)]));
    let mut stray = tensors.clone();
    let layer99 = "model.model.layers.99.self_attn.q_proj";
    stray.insert(format!("{layer99}.lora_A"), (vec![rank, inp], a.clone()));
    for (name, bad, named) in [("half", half, key), ("misfit", misfit, key), ("stray", stray, layer99)] {
        let path = dir.path().join(format!("{name}.safetensors"));
        write_all(&path, &bad);
        let err = from_gguf::write(
            &gguf_base,
            &dir.path().join(format!("ck-{name}")),
            from_gguf::Grafted::Trained(&[path.as_path()]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(&format!("{name}.safetensors")) && err.contains(named), "{name}: {err}");
    }
}
