//! The converter on real files: the tiny fixture from .ckpt and from
//! safetensors, SmolLM2-HAMburger's base-only export in libllama against the
//! reference implementation, and every kind of bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

use ggml::gguf::Gguf;
use ggml::llama::{LlamaContext, LlamaContextParams, LlamaModel};
use testing::near_tie::{assert_agree_measured, one_token_steps, top2_margin};
use testing::reference::Reference;
use testing::testmodel::{self, tiny_fixture};

/// The converter in a 4 GiB address space.
fn convert_bin() -> Command {
    testing::process::limited(env!("CARGO_BIN_EXE_hamburger-convert"))
}

/// Runs the converter; returns (success, stderr).
fn run(args: &[&str]) -> (bool, String) {
    let out = convert_bin().args(args).arg("--no-progress").output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn tensor_data(g: &Gguf) -> Vec<(String, ggml::Type, [i64; 4], Vec<u8>)> {
    let bytes = std::fs::read(&g.path).unwrap();
    g.tensors
        .iter()
        .map(|t| (t.name.clone(), t.ty, t.ne, bytes[t.offset as usize..(t.offset + t.size) as usize].to_vec()))
        .collect()
}

#[test]
fn ckpt_and_safetensors_give_the_same_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let f = tiny_fixture();
    let a = dir.path().join("a.gguf");
    let b = dir.path().join("b.gguf");
    for (src, out) in [(f.join("hamburger.ckpt"), &a), (f.join("model.safetensors"), &b)] {
        let (ok, err) = run(&[src.to_str().unwrap(), "--outfile", out.to_str().unwrap(), "--outtype", "f32"]);
        assert!(ok, "{err}");
    }
    let (ga, gb) = (Gguf::open(&a).unwrap(), Gguf::open(&b).unwrap());
    assert_eq!(ga.tensors.len(), 146 + 51 + 1, "146 base + 51 grafted + rope_freqs");
    assert_eq!(tensor_data(&ga), tensor_data(&gb));
    assert!(ga.tensors.iter().all(|t| t.ty == ggml::Type::F32));
    assert_eq!(ga.get_str("general.architecture").unwrap(), Some("hamburger"));
    let fl = ga.get("hamburger.feature_layers").unwrap();
    assert_eq!(fl, &ggml::gguf::Value::Array(ggml::gguf::Array::U32(vec![3, 7, 11, 15])));
}

#[test]
fn q8_0_and_f16_outputs_are_readable_and_smaller() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny_fixture().join("model.safetensors");
    let mut sizes = Vec::new();
    for ty in ["f32", "f16", "bf16", "q8_0"] {
        let out = dir.path().join(format!("{ty}.gguf"));
        let (ok, err) = run(&[src.to_str().unwrap(), "-o", out.to_str().unwrap(), "--outtype", ty]);
        assert!(ok, "{err}");
        let g = Gguf::open(&out).unwrap();
        let emb = g.tensor("token_embd.weight").unwrap();
        assert_eq!(emb.ty, ggml::Type::from_name(ty).unwrap());
        assert_eq!(g.tensor("blk.0.attn_norm.weight").unwrap().ty, ggml::Type::F32, "norms stay f32");
        sizes.push(std::fs::metadata(&out).unwrap().len());
    }
    assert!(sizes[1] < sizes[0] && sizes[3] < sizes[1]);
}

#[test]
fn hparam_flags_override_hamburger_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.gguf");
    let src = tiny_fixture().join("model.safetensors");
    let (ok, err) = run(&[
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--feature-layers",
        "1,5,15",
        "--merger-heads",
        "32",
    ]);
    assert!(ok, "{err}");
    let g = Gguf::open(&out).unwrap();
    assert_eq!(g.get("hamburger.merger.head_count").unwrap().as_int(), Some(32));
    // A flag that contradicts the weights is rejected, naming the tensor.
    let (ok, err) = run(&[src.to_str().unwrap(), "-o", out.to_str().unwrap(), "--max-steps", "3"]);
    assert!(!ok);
    assert!(err.contains("comp_embedder.merger.pos"), "{err}");
}

fn smollm2_prompts(model: &LlamaModel) -> Vec<Vec<i32>> {
    [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
        "The three primary colors are",
        "Water boils at a temperature of",
    ]
    .iter()
    .map(|p| model.tokenize(p, true, true).unwrap())
    .collect()
}

#[test]
fn base_only_smollm2_runs_in_libllama_like_the_original_layout() {
    let ck = testmodel::smollm2_checkpoint().unwrap();
    let gguf = testmodel::converted(&ck, "smollm2", ggml::Type::F32, true).unwrap();
    let g = Gguf::open(&gguf).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), Some("llama"));
    assert!(g.tensors.iter().all(|t| !t.name.starts_with("merger") && !t.name.starts_with("micro")));

    let model = LlamaModel::load(&gguf, 0).unwrap();
    let params =
        LlamaContextParams { n_ctx: 256, flash_attn: Some(false), kv_type: ggml::Type::F32, ..Default::default() };
    let mut ctx = LlamaContext::new(&model, params).unwrap();
    let reference = Reference::load(&ck, &ck).unwrap();
    for prompt in smollm2_prompts(&model) {
        let (got, got_logits) = ctx.greedy_with_logits(&prompt, 32, None).unwrap();
        let p: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
        // The reference's tokens and its logits at each (its own tokens fed).
        let (want, want_logits) = reference.base_greedy(&p, 32);
        // Two implementations round apart: the same tokens up to a near-tie
        // within twice their measured departure.
        let got: Vec<u32> = got.into_iter().map(|t| t as u32).collect();
        let margins = |l: &[Vec<f32>]| l.iter().map(|l| top2_margin(l)).collect::<Vec<_>>();
        let (g, w) = (one_token_steps(&got, &margins(&got_logits)), one_token_steps(&want, &margins(&want_logits)));
        assert_agree_measured(&g, &got_logits, &w, &want_logits, 0.0, &format!("prompt {prompt:?}"));
    }
}

#[test]
fn embedded_tokenizer_matches_llama_cpp_on_the_original_gguf() {
    // The rebuilt tokenizer.json (SmolLM2's digit-splitting pre-tokenizer) must
    // tokenize like llama.cpp does on the GGUF the package ships.
    let original = LlamaModel::load(&testmodel::smollm2_gguf(&testmodel::cache_dir()).unwrap(), 0).unwrap();
    let ck = testmodel::smollm2_checkpoint().unwrap();
    let gguf = testmodel::converted(&ck, "smollm2", ggml::Type::F32, true).unwrap();
    let ours = LlamaModel::load(&gguf, 0).unwrap();
    for text in ["Hello world! 12345 apples cost $3.50.", "<|im_start|>user\nHi<|im_end|>\n", "  spaced\ttabs\nlines  "]
    {
        assert_eq!(
            ours.tokenize(text, false, true).unwrap(),
            original.tokenize(text, false, true).unwrap(),
            "{text:?}"
        );
    }
}

// ----- bad input -----

/// A scratch copy of the fixture's side files, so a broken checkpoint can be
/// placed next to them.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "hamburger.json"] {
        std::fs::copy(tiny_fixture().join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// Rewrites the fixture's safetensors with `edit` applied to the tensor list.
fn edited_safetensors(
    dir: &Path,
    edit: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> PathBuf {
    let bytes = std::fs::read(tiny_fixture().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut list: Vec<_> =
        st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    edit(&mut list);
    let views: Vec<(String, safetensors::tensor::TensorView)> = list
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path).unwrap();
    path
}

/// Converts `src` expecting failure: one line naming `must_name`, no output, no leftovers.
fn assert_rejected(src: &Path, must_name: &[&str]) {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("out.gguf");
    let (ok, err) = run(&[src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(!ok, "accepted {}", src.display());
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in must_name {
        assert!(err.contains(n), "error does not name {n}: {err}");
    }
    assert_eq!(std::fs::read_dir(out_dir.path()).unwrap().count(), 0, "output left behind");
}

#[test]
fn truncated_checkpoints_are_rejected() {
    let dir = scratch();
    let ckpt = std::fs::read(tiny_fixture().join("hamburger.ckpt")).unwrap();
    let p = dir.path().join("hamburger.ckpt");
    std::fs::write(&p, &ckpt[..ckpt.len() / 2]).unwrap();
    assert_rejected(&p, &["hamburger.ckpt"]);
    let st = std::fs::read(tiny_fixture().join("model.safetensors")).unwrap();
    let p = dir.path().join("model.safetensors");
    std::fs::write(&p, &st[..st.len() - 1000]).unwrap();
    assert_rejected(&p, &["model.safetensors"]);
}

#[test]
fn junk_is_rejected() {
    let dir = scratch();
    let p = dir.path().join("junk.ckpt");
    std::fs::write(&p, (0..10_000u32).map(|i| (i * 7919 % 251) as u8).collect::<Vec<_>>()).unwrap();
    assert_rejected(&p, &["junk.ckpt"]);
    let p = dir.path().join("junk.safetensors");
    std::fs::write(&p, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
    assert_rejected(&p, &["junk.safetensors"]);
}

#[test]
fn missing_tensor_is_rejected() {
    let dir = scratch();
    let p = edited_safetensors(dir.path(), |l| l.retain(|t| t.0 != "micro_step_decoder.decoders.2.mlp.up_proj.weight"));
    assert_rejected(&p, &["model.safetensors", "micro_step_decoder.decoders.2.mlp.up_proj.weight"]);
}

#[test]
fn wrong_shape_is_rejected() {
    let dir = scratch();
    let name = "model.model.layers.5.self_attn.k_proj.weight";
    let p = edited_safetensors(dir.path(), |l| {
        let t = l.iter_mut().find(|t| t.0 == name).unwrap();
        t.2 = vec![t.2[1], t.2[0]];
    });
    assert_rejected(&p, &["model.safetensors", name]);
}

#[test]
fn integer_and_unknown_dtypes_are_rejected() {
    let dir = scratch();
    let name = "comp_embedder.merger.q_proj.bias";
    let p = edited_safetensors(dir.path(), |l| {
        let t = l.iter_mut().find(|t| t.0 == name).unwrap();
        t.1 = safetensors::Dtype::I16;
    });
    assert_rejected(&p, &[name, "I16"]);
    let p = edited_safetensors(dir.path(), |l| {
        let t = l.iter_mut().find(|t| t.0 == name).unwrap();
        t.1 = safetensors::Dtype::F8_E5M2;
        t.3.truncate(t.3.len() / 2);
    });
    assert_rejected(&p, &[name, "F8_E5M2"]);
}

#[test]
fn config_that_does_not_match_the_weights_is_rejected() {
    let dir = scratch();
    let cfg = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        cfg.replace("\"intermediate_size\": 256", "\"intermediate_size\": 512"),
    )
    .unwrap();
    std::fs::copy(tiny_fixture().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    assert_rejected(&dir.path().join("model.safetensors"), &["mlp"]);
}

#[test]
fn a_draft_vocabulary_outside_the_vocabulary_is_rejected() {
    let dir = scratch();
    std::fs::copy(tiny_fixture().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let json = dir.path().join("hamburger.json");
    let mut h: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for (ids, why) in [(serde_json::json!([1, 512]), "token id 512"), (serde_json::json!([4, 4]), "listed twice")] {
        h["draft_vocab"] = ids;
        std::fs::write(&json, h.to_string()).unwrap();
        assert_rejected(&dir.path().join("model.safetensors"), &["hamburger.json", "draft_vocab", why]);
    }
}

#[test]
fn missing_config_and_bad_flags_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(tiny_fixture().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    assert_rejected(&dir.path().join("model.safetensors"), &["config.json", "tokenizer.json", "--base-dir"]);
    let (ok, err) =
        run(&[tiny_fixture().join("model.safetensors").to_str().unwrap(), "-o", "x.gguf", "--outtype", "q3_k"]);
    assert!(!ok && err.contains("q3_k"), "{err}");
}

/// What users mistype most: a missing checkpoint, a missing output folder.
/// Each is one line that says it once, naming what the user named.
#[test]
fn missing_paths_are_named_once() {
    let err = testing::process::assert_one_line_error(
        convert_bin().args(["no-such.ckpt", "-o", "x.gguf", "--no-progress"]),
        &["no-such.ckpt", "No such file"],
    );
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    let ck = tiny_fixture().join("hamburger.ckpt");
    let err = testing::process::assert_one_line_error(
        convert_bin().arg(&ck).args(["-o", "/no-such-dir/a.gguf", "--no-progress"]),
        &["/no-such-dir/a.gguf", "the folder /no-such-dir does not exist"],
    );
    assert!(!err.contains(".part"), "{err}");
}

#[test]
fn sharded_index_and_ignored_entries() {
    let dir = scratch();
    let bytes = std::fs::read(tiny_fixture().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    // Two shards plus the entries a real checkpoint carries and the format ignores.
    let extra = vec![0u8; 64];
    let mut weight_map = serde_json::Map::new();
    for (i, part) in names.chunks(names.len() / 2 + 1).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let mut views: Vec<(String, safetensors::tensor::TensorView)> =
            part.iter().map(|n| (n.clone(), st.tensor(n).unwrap())).collect();
        if i == 0 {
            for n in ["teacher.lm_head.weight", "model.model.layers.0.self_attn.rotary_emb.inv_freq"] {
                views.push((
                    n.into(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![16], &extra).unwrap(),
                ));
            }
        }
        for (n, _) in &views {
            weight_map.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
        safetensors::serialize_to_file(views, None, &dir.path().join(&file)).unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let out = dir.path().join("sharded.gguf");
    let (ok, err) = run(&[dir.path().to_str().unwrap(), "-o", out.to_str().unwrap(), "--outtype", "f32"]);
    assert!(ok, "{err}");
    let reference = dir.path().join("single.gguf");
    let (ok, err) = run(&[
        tiny_fixture().join("model.safetensors").to_str().unwrap(),
        "-o",
        reference.to_str().unwrap(),
        "--outtype",
        "f32",
    ]);
    assert!(ok, "{err}");
    assert_eq!(tensor_data(&Gguf::open(&out).unwrap()), tensor_data(&Gguf::open(&reference).unwrap()));
}

#[test]
fn config_values_that_make_non_finite_tensors_are_rejected() {
    for (from, to, names) in [
        ("\"factor\": 8.0", "\"factor\": 0.0", "rope_scaling.factor"),
        ("\"low_freq_factor\": 1.0", "\"low_freq_factor\": 4.0", "high_freq_factor"),
        ("\"original_max_position_embeddings\": 64", "\"original_max_position_embeddings\": 0", "original_max"),
        ("\"rope_theta\": 10000.0", "\"rope_theta\": 1e300", "rope_theta"),
        ("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e-60", "rms_norm_eps"),
        ("\"head_dim\": 32", "\"head_dim\": 1000000", "head dim"),
    ] {
        let dir = scratch();
        let cfg = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        assert!(cfg.contains(from), "{from}");
        std::fs::write(dir.path().join("config.json"), cfg.replace(from, to)).unwrap();
        std::fs::copy(tiny_fixture().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
        assert_rejected(&dir.path().join("model.safetensors"), &["config.json", names]);
    }
}

#[test]
fn output_equal_to_the_input_is_refused() {
    let dir = scratch();
    let p = dir.path().join("model.safetensors");
    std::fs::copy(tiny_fixture().join("model.safetensors"), &p).unwrap();
    let before = std::fs::read(&p).unwrap();
    // The same file under another name too.
    let alias = dir.path().join("sub/../model.safetensors");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    for out in [&p, &alias] {
        let (ok, err) = run(&[p.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert!(!ok && err.contains("refusing to overwrite") && err.lines().count() == 1, "{err}");
    }
    assert_eq!(std::fs::read(&p).unwrap(), before, "input changed");
}

#[test]
fn interrupted_conversion_leaves_nothing() {
    let src = testmodel::smollm2_checkpoint().unwrap();
    for signal in ["INT", "TERM"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.gguf");
        let child = convert_bin()
            .args([src.to_str().unwrap(), "-o", out.to_str().unwrap(), "--outtype", "f32", "--no-progress"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        testing::process::interrupt_while_writing(child, dir.path(), signal);
    }
}

/// `--confidence` stores the model's recommended confidence
/// (`hamburger.recommended_confidence`, read back by the library); none is
/// stored without it; a negative one is refused naming the flag.
#[test]
fn confidence_flag_stores_the_recommended_confidence() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny_fixture().join("model.safetensors");
    let (with, without) = (dir.path().join("with.gguf"), dir.path().join("without.gguf"));
    let (ok, err) = run(&[src.to_str().unwrap(), "-o", with.to_str().unwrap(), "--confidence", "0.9"]);
    assert!(ok, "{err}");
    assert_eq!(hamburger::model::recommended_confidence_of(&with).unwrap(), Some(0.9));
    let (ok, err) = run(&[src.to_str().unwrap(), "-o", without.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(hamburger::model::recommended_confidence_of(&without).unwrap(), None);
    let (ok, err) = run(&[src.to_str().unwrap(), "-o", without.to_str().unwrap(), "--confidence", "-1"]);
    assert!(!ok && err.contains("--confidence") && err.lines().count() == 1, "{err}");
}
