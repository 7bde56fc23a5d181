//! Bad input to `hamburger-cli`: one clear line on stderr naming the file,
//! tensor or flag, a non-zero exit, never a panic, all within a 4 GiB
//! address space.

use std::path::{Path, PathBuf};
use std::process::Command;

use ggml::gguf::{Array, Gguf, GgufBuilder, Value};
use testing::testmodel::{converted, tiny_fixture};

fn tiny(base_only: bool) -> PathBuf {
    converted(&tiny_fixture().join("model.safetensors"), "tiny-st", ggml::Type::F32, base_only).unwrap()
}

/// Runs the CLI in a 4 GiB address space; returns (success, stdout, stderr).
fn cli(args: &[&str]) -> (bool, String, String) {
    let out = testing::process::limited(env!("CARGO_BIN_EXE_hamburger-cli")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn assert_clean_error(args: &[&str], must_name: &[&str]) {
    testing::process::assert_one_line_error(
        testing::process::limited(env!("CARGO_BIN_EXE_hamburger-cli")).args(args),
        must_name,
    );
}

/// A change to make to a copy of a GGUF.
enum Edit<'a> {
    Drop(&'a str),
    Reshape(&'a str, Vec<i64>),
    Set(&'a str, Value),
}

/// Copies `src` to `dst` with `edit` applied (a key set that `src` lacks is added).
fn rewrite(src: &Path, dst: &Path, edit: Edit) {
    let (drop, reshape) = match &edit {
        Edit::Drop(n) => (Some(*n), None),
        Edit::Reshape(n, ne) => (None, Some((*n, ne.clone()))),
        Edit::Set(..) => (None, None),
    };
    let g = Gguf::open(src).unwrap();
    let bytes = std::fs::read(src).unwrap();
    let mut b = GgufBuilder::new(g.tensors.len()).unwrap();
    for (k, v) in &g.metadata {
        match &edit {
            Edit::Set(key, value) if key == k => b.set(k, value).unwrap(),
            _ => b.set(k, v).unwrap(),
        }
    }
    if let Edit::Set(key, value) = &edit {
        if !g.metadata.iter().any(|(k, _)| k == key) {
            b.set(key, value).unwrap();
        }
    }
    let kept: Vec<_> = g.tensors.iter().filter(|t| Some(t.name.as_str()) != drop).collect();
    for t in &kept {
        let ne = match &reshape {
            Some((n, ne)) if *n == t.name => ne.clone(),
            _ => t.ne.to_vec(),
        };
        b.add_tensor(&t.name, t.ty, &ne).unwrap();
    }
    let mut w = b.write(dst).unwrap();
    for t in kept {
        w.write_data(&bytes[t.offset as usize..(t.offset + t.size) as usize]).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn missing_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("missing.gguf");
    rewrite(&tiny(false), &p, Edit::Drop("micro.blk.1.ffn_up.weight"));
    assert_clean_error(
        &["-m", p.to_str().unwrap(), "--prompt-ids", "1,2,3", "-n", "4"],
        &["missing.gguf", "micro.blk.1.ffn_up.weight"],
    );
}

#[test]
fn a_draft_head_missing_a_tensor_or_misshapen_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = tiny_fixture();
    let ck = testing::testmodel::draft_head::with_draft_head(dir.path(), &fixture, &fixture, None).unwrap();
    let whole = dir.path().join("draft-head.gguf");
    let c = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
        .args([ck.to_str().unwrap(), "--outtype", "f32", "--no-progress", "-o", whole.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    let run = |p: &Path| ["-m", p.to_str().unwrap(), "--prompt-ids", "1,2,3", "-n", "4"].map(String::from);
    let (ok, ..) = cli(&run(&whole).each_ref().map(String::as_str));
    assert!(ok, "the whole draft head loads");
    let missing = dir.path().join("missing.gguf");
    rewrite(&whole, &missing, Edit::Drop("draft.blk.1.ffn_up.weight"));
    assert_clean_error(&run(&missing).each_ref().map(String::as_str), &["missing.gguf", "draft.blk.1.ffn_up.weight"]);
    let shape = dir.path().join("shape.gguf");
    rewrite(&whole, &shape, Edit::Reshape("draft.blk.0.attn_k.weight", vec![64, 128]));
    assert_clean_error(
        &run(&shape).each_ref().map(String::as_str),
        &["shape.gguf", "draft.blk.0.attn_k.weight", "[128, 64]"],
    );
}

/// A draft head's copy matrix: `hamburger.draft_copy_ngram` and
/// `draft_copy.weight` go together, at the shape the key says; the
/// converter names a misshapen one in the checkpoint.
#[test]
fn a_copy_matrix_without_its_key_misshapen_or_missing_is_named() {
    use testing::testmodel::draft_head::{with_draft_head, CopyMatrix};
    let dir = tempfile::tempdir().unwrap();
    let fixture = tiny_fixture();
    let convert = |copy: &CopyMatrix, name: &str| {
        let ck = with_draft_head(&dir.path().join(name), &fixture, &fixture, Some(copy)).unwrap();
        let out = dir.path().join(format!("{name}.gguf"));
        let c = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
            .args([ck.to_str().unwrap(), "--outtype", "f32", "--no-progress", "-o", out.to_str().unwrap()])
            .output()
            .unwrap();
        (c, out)
    };
    let (c, whole) = convert(&CopyMatrix::from_fn(128, 2, |_| 0.0), "copy");
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    let run = |p: &Path| ["-m", p.to_str().unwrap(), "--prompt-ids", "1,2,3", "-n", "4"].map(String::from);
    let (ok, ..) = cli(&run(&whole).each_ref().map(String::as_str));
    assert!(ok, "the draft head with its copy matrix loads");
    let missing = dir.path().join("missing.gguf");
    rewrite(&whole, &missing, Edit::Drop("draft_copy.weight"));
    assert_clean_error(&run(&missing).each_ref().map(String::as_str), &["missing.gguf", "draft_copy.weight"]);
    let shape = dir.path().join("shape.gguf");
    rewrite(&whole, &shape, Edit::Reshape("draft_copy.weight", vec![128, 256]));
    assert_clean_error(&run(&shape).each_ref().map(String::as_str), &["shape.gguf", "draft_copy.weight", "[256, 128]"]);
    let keyless = dir.path().join("keyless.gguf");
    rewrite(&whole, &keyless, Edit::Set("hamburger.draft_copy_ngram", Value::U32(0)));
    assert_clean_error(&run(&keyless).each_ref().map(String::as_str), &["keyless.gguf", "draft_copy.weight"]);
    // In the checkpoint: [100, 100], not [D, M x D].
    let (c, out) = convert(&CopyMatrix::from_fn(100, 1, |_| 0.0), "odd");
    let err = String::from_utf8_lossy(&c.stderr);
    assert!(!c.status.success() && err.trim().lines().count() == 1, "{err}");
    assert!(err.contains("draft_head.copy.weight") && !out.exists(), "{err}");
}

#[test]
fn wrong_shape() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("shape.gguf");
    rewrite(&tiny(false), &p, Edit::Reshape("blk.2.attn_k.weight", vec![64, 128]));
    assert_clean_error(
        &["-m", p.to_str().unwrap(), "--prompt-ids", "1,2,3"],
        &["shape.gguf", "blk.2.attn_k.weight", "[128, 64]"],
    );
}

#[test]
fn hostile_hyper_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("layers.gguf");
    rewrite(&tiny(false), &p, Edit::Set("hamburger.block_count", Value::U32(1_000_000_000)));
    assert_clean_error(
        &["-m", p.to_str().unwrap(), "-p", "hi"],
        &["layers.gguf", "block count 1000000000 exceeds 512"],
    );
    let p = dir.path().join("features.gguf");
    rewrite(&tiny(false), &p, Edit::Set("hamburger.feature_layers", Value::Array(ggml::gguf::Array::U32(vec![3, 99]))));
    assert_clean_error(&["-m", p.to_str().unwrap(), "-p", "hi"], &["features.gguf", "feature layer"]);
}

#[test]
fn an_architecture_neither_hamburger_nor_llama() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("qwen.gguf");
    rewrite(&tiny(true), &p, Edit::Set("general.architecture", Value::Str("qwen2".into())));
    assert_clean_error(&["-m", p.to_str().unwrap(), "-p", "hi"], &["qwen.gguf", "qwen2", "hamburger", "llama"]);
}

#[test]
fn truncated_and_junk_files() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(tiny(false)).unwrap();
    let p = dir.path().join("trunc.gguf");
    std::fs::write(&p, &bytes[..bytes.len() - 4096]).unwrap();
    assert_clean_error(&["-m", p.to_str().unwrap(), "-p", "hi"], &["trunc.gguf"]);
    let p = dir.path().join("junk.gguf");
    std::fs::write(&p, b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff").unwrap();
    assert_clean_error(&["-m", p.to_str().unwrap(), "-p", "hi"], &["junk.gguf"]);
    assert_clean_error(&["-m", "/nonexistent/model.gguf", "-p", "hi"], &["/nonexistent/model.gguf"]);
}

#[test]
fn prompt_longer_than_the_context() {
    let p = tiny(false);
    let ids: Vec<String> = (3..40).map(|i| i.to_string()).collect();
    assert_clean_error(
        &["-m", p.to_str().unwrap(), "-c", "32", "--prompt-ids", &ids.join(","), "-n", "4"],
        &["context"],
    );
    // -n past the context is no error: llama.cpp stops at a full context, with a notice.
    let (ok, _, err) =
        cli(&["-m", p.to_str().unwrap(), "-c", "32", "--prompt-ids", "1,2,3", "-n", "40", "--ignore-eos"]);
    assert!(ok && err.contains("stopped at a full context (32 entries, -c)"), "{err}");
    assert_clean_error(&["-m", p.to_str().unwrap(), "-c", "2000000000", "--prompt-ids", "1,2,3"], &["KV cache", "-c"]);
}

#[test]
fn invalid_flags() {
    let p = tiny(false);
    let m = p.to_str().unwrap();
    assert_clean_error(&["-m", m, "--prompt-ids", "1,99999"], &["99999"]);
    assert_clean_error(&["-m", m, "-p", "hi", "--cache-type", "q4_0"], &["q4_0"]);
    assert_clean_error(&["-m", m, "-p", "hi", "--confidence", "abc"], &["confidence"]);
    // Numbers that are NaN, infinite or out of range are refused naming the flag.
    for (flag, value) in [
        ("--confidence", "inf"),
        ("--confidence", "-0.5"),
        ("--temp", "nan"),
        ("--temp", "-1"),
        ("--top-p", "1.5"),
        ("--min-p", "-0.1"),
        ("--repeat-penalty", "0"),
        ("--repeat-penalty", "NaN"),
    ] {
        assert_clean_error(&["-m", m, "-p", "hi", flag, value], &[flag, value]);
    }
    assert_clean_error(&["-m", m, "-p", "hi", "-fa", "off", "--cache-type", "q8_0"], &["flash attention"]);
    // Speculative decoding's flags, as llama.cpp spells them.
    let mtp = ["-m", m, "-p", "hi", "--spec-type", "draft-mtp"];
    for (extra, names) in [
        (&["--spec-draft-n-max", "4"][..], &["--spec-draft-n-max", "4"][..]),
        (&["--spec-draft-n-min", "3", "--spec-draft-n-max", "1"], &["--spec-draft-n-min", "--spec-draft-n-max"]),
        (&["--spec-draft-p-min", "1.5"], &["--spec-draft-p-min", "1.5"]),
        (&["--spec-draft-p-min", "nan"], &["--spec-draft-p-min"]),
        (&["--spec-draft-tree", "9"], &["--spec-draft-tree", "9"]),
    ] {
        assert_clean_error(&[&mtp[..], extra].concat(), names);
    }
    assert_clean_error(&["-m", m, "-p", "hi", "--spec-type", "ngram-mod"], &["--spec-type", "ngram-simple,draft-mtp"]);
    assert_clean_error(
        &["-m", m, "-p", "hi", "--spec-type", "ngram-simple"],
        &["--spec-type", "ngram-simple,draft-mtp"],
    );
    let size = ["--spec-ngram-simple-size-n", "0"];
    assert_clean_error(&["-m", m, "-p", "hi", "--spec-type", "ngram-simple,draft-mtp", size[0], size[1]], &size);
    assert_clean_error(
        &[&mtp[..], &["--spec-ngram-simple-size-n", "3"]].concat(),
        &[size[0], "ngram-simple,draft-mtp"],
    );
    assert_clean_error(&["-m", m, "-p", "hi", "--spec-type", "draft-simple"], &["draft-simple", "-md"]);
    // Draft flags without a drafter do nothing, as in llama.cpp's tools, and say so.
    let (ok, _, err) = cli(&["-m", m, "-p", "hi", "-n", "2", "--spec-draft-n-max", "2"]);
    assert!(ok && err.contains("--spec-draft-n-max has no effect"), "{err}");
    assert_clean_error(&["-m", m], &["prompt"]);
    assert_clean_error(&["-m", m, "-p", "hi", "--device", "tpu"], &["tpu", "cuda"]);
    if !cfg!(feature = "cuda") {
        assert_clean_error(&["-m", m, "-p", "hi", "--device", "cuda"], &["--features cuda"]);
    }
    if !cfg!(feature = "vulkan") {
        assert_clean_error(&["-m", m, "-p", "hi", "--device", "vulkan"], &["--device", "--features vulkan"]);
    }
}

#[test]
fn json_output_follows_the_schema() {
    let p = tiny(false);
    let (ok, out, err) = cli(&[
        "-m",
        p.to_str().unwrap(),
        "-p",
        "The license grants",
        "-n",
        "10",
        "--temp",
        "0",
        "--confidence",
        "0.3",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim_end().lines().last().unwrap()).unwrap();
    for k in ["prompt_ids", "output_ids", "macro_steps", "text", "timings"] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    // The server's names (llama-server's), not gen_ms/gen_tokens.
    for k in [
        "prompt_n",
        "prompt_ms",
        "predicted_n",
        "predicted_ms",
        "predicted_per_second",
        "macro_steps",
        "tokens_per_step",
        "kv_entries",
    ] {
        assert!(v["timings"].get(k).is_some(), "missing timings.{k}");
    }
    let steps: Vec<u64> = v["macro_steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()))
        .collect();
    let out_ids: Vec<u64> = v["output_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(steps, out_ids, "macro steps concatenate to the output");
    assert_eq!(out_ids.len(), 10);
    assert_eq!(v["timings"]["macro_steps"].as_u64().unwrap() as usize, v["macro_steps"].as_array().unwrap().len());
    // Self-verified: the one-token-per-step text, and what the drafts earned.
    let run = |extra: &[&str]| {
        let args =
            [&["-m", p.to_str().unwrap(), "-p", "The license grants", "-n", "10", "--temp", "0", "--json"][..], extra]
                .concat();
        let (ok, out, err) = cli(&args);
        assert!(ok, "{err}");
        serde_json::from_str::<serde_json::Value>(out.trim_end().lines().last().unwrap()).unwrap()
    };
    let plain = run(&["--confidence", "2"]);
    let verified = run(&["--spec-type", "draft-mtp", "--spec-draft-n-min", "2", "--spec-draft-n-max", "2"]);
    assert_eq!(verified["output_ids"], plain["output_ids"]);
    let t = &verified["timings"];
    for k in ["draft_n", "draft_n_accepted", "verify_forwards", "accepted_per_verify"] {
        assert!(t.get(k).is_some(), "missing timings.{k}");
    }
    assert!(t["draft_n"].as_u64().unwrap() > 0, "{t}");
}

#[test]
fn sizes_that_overflow() {
    let p = tiny(false);
    let m = p.to_str().unwrap();
    assert_clean_error(&["-m", m, "--prompt-ids", "1,2,3", "-t", "5000"], &["-t", "5000"]);
    assert_clean_error(
        &["-m", m, "--prompt-ids", "1,2,3", "-c", "4611686018427387904"],
        &["-c", "4611686018427387904"],
    );
    assert_clean_error(&["-m", m, "--prompt-ids", "1,2,3", "-b", "4000000", "-c", "4000000"], &["-b", "-c", "GiB"]);
    // -c 0 takes the file's training context, which is checked like a -c.
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("ctx.gguf");
    rewrite(&p, &huge, Edit::Set("hamburger.context_length", Value::U64(1 << 40)));
    assert_clean_error(&["-m", huge.to_str().unwrap(), "--prompt-ids", "1,2,3", "-c", "0"], &["KV cache", "-c"]);
}

#[test]
fn metadata_of_the_wrong_type_names_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    for (key, value) in [
        ("hamburger.context_length", Value::Str("4096".into())),
        ("hamburger.embedding_length", Value::I32(-128)),
        ("hamburger.attention.layer_norm_rms_epsilon", Value::Str("1e-5".into())),
        ("tokenizer.ggml.add_bos_token", Value::Str("yes".into())),
        ("tokenizer.ggml.eos_token_id", Value::F32(2.0)),
    ] {
        let p = dir.path().join("typed.gguf");
        rewrite(&tiny(false), &p, Edit::Set(key, value));
        assert_clean_error(&["-m", p.to_str().unwrap(), "-p", "hi"], &["typed.gguf", key]);
    }
    let p = dir.path().join("eps.gguf");
    rewrite(&tiny(false), &p, Edit::Set("hamburger.attention.layer_norm_rms_epsilon", Value::F32(f32::INFINITY)));
    assert_clean_error(&["-m", p.to_str().unwrap(), "-p", "hi"], &["eps.gguf", "rms epsilon"]);
}

#[test]
fn a_draft_vocabulary_that_does_not_fit_the_model_names_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = "hamburger.draft_vocab";
    for (value, why) in [
        (Value::Array(Array::U32(vec![3, 512])), "token id 512 is outside the vocabulary of 512"),
        (Value::Array(Array::U32(vec![3, 7, 3])), "token id 3 is listed twice"),
        (Value::Array(Array::U32(Vec::new())), "no token ids"),
        (Value::Str("0 1 2".into()), "expected an array of token ids"),
    ] {
        let p = dir.path().join("draft-vocab.gguf");
        rewrite(&tiny(false), &p, Edit::Set(key, value));
        assert_clean_error(&["-m", p.to_str().unwrap(), "-p", "hi"], &["draft-vocab.gguf", key, why]);
    }
}

#[test]
fn special_tokens_outside_the_vocabulary_are_ignored_with_a_warning() {
    // llama.cpp's rule: a bad special id is dropped (and said), not used.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bos.gguf");
    rewrite(&tiny(false), &p, Edit::Set("tokenizer.ggml.bos_token_id", Value::U32(99_999)));
    let (ok, out, err) = cli(&["-m", p.to_str().unwrap(), "-p", "The license", "-n", "4", "--temp", "0", "--json"]);
    assert!(ok, "{err}");
    assert!(err.contains("tokenizer.ggml.bos_token_id = 99999 is outside the vocabulary"), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim_end().lines().last().unwrap()).unwrap();
    assert!(v["prompt_ids"].as_array().unwrap().iter().all(|id| id.as_u64().unwrap() < 512), "{v}");
}

#[test]
fn tokenizer_ids_beyond_the_vocabulary() {
    let src = tiny(false);
    let g = Gguf::open(&src).unwrap();
    let mut json: serde_json::Value =
        serde_json::from_str(g.get_str("tokenizer.huggingface.json").unwrap().unwrap()).unwrap();
    json["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
        "id": 512, "content": "<|beyond|>", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true
    }));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tok.gguf");
    rewrite(&src, &p, Edit::Set("tokenizer.huggingface.json", Value::Str(json.to_string())));
    assert_clean_error(
        &["-m", p.to_str().unwrap(), "-p", "a <|beyond|> b", "-n", "2"],
        &["token 512", "vocabulary of 512"],
    );
}

#[test]
fn bench_flags_out_of_range() {
    let p = tiny(false);
    let m = p.to_str().unwrap();
    for (args, names) in [
        (vec!["-t", "0"], vec!["--threads", "0"]),
        (vec!["-t", "5000"], vec!["--threads", "5000"]),
        (vec!["--forced-steps", "0"], vec!["--forced-steps", "0"]),
        (vec!["--forced-steps", "99"], vec!["--forced-steps 99", "4 tokens per macro step"]),
    ] {
        testing::process::assert_one_line_error(
            testing::process::limited(env!("CARGO_BIN_EXE_hamburger-bench"))
                .args(["-m", m, "-p", "8", "-n", "4", "-r", "1"])
                .args(&args),
            &names,
        );
    }
}

#[test]
fn a_chat_template_that_exhausts_memory_fails_in_its_child() {
    // Fuel does not see it: 40 doublings are a few hundred instructions and 2^41 bytes.
    let doubling =
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}";
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("template.gguf");
    rewrite(&tiny(false), &p, Edit::Set("tokenizer.chat_template", Value::Str(doubling.into())));
    let mut child = testing::process::limited(env!("CARGO_BIN_EXE_hamburger-cli"))
        .args(["-m", p.to_str().unwrap(), "-cnv", "-n", "4"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"hi\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("template") && err.contains("MiB of memory"), "{err}");
}

/// A model path that is missing or a directory: one line that says so once.
#[test]
fn missing_or_directory_model_is_named_once() {
    let err = testing::process::assert_one_line_error(
        testing::process::limited(env!("CARGO_BIN_EXE_hamburger-cli")).args(["-m", "no-such.gguf", "-p", "hi"]),
        &["no-such.gguf", "No such file"],
    );
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    let dir = tempfile::tempdir().unwrap();
    assert_clean_error(&["-m", dir.path().to_str().unwrap(), "-p", "hi"], &["is a directory"]);
}

/// `-md` and its flags: out-of-range values name the flag, a draft of
/// another vocabulary names both sizes, and what does not combine says why.
#[test]
fn draft_model_flags_and_a_draft_of_another_vocabulary() {
    let (base, ham) = (tiny(true), tiny(false));
    let (b, h) = (base.to_str().unwrap(), ham.to_str().unwrap());
    let run = |extra: &[&str], must: &[&str]| {
        let args: Vec<&str> = ["-m", b, "--prompt-ids", "1,2,3", "-n", "4"].iter().chain(extra).copied().collect();
        assert_clean_error(&args, must);
    };
    run(&["--spec-type", "draft-mtp"], &["--spec-type", "micro decoder", "base-only"]);
    run(&["-md", h, "--spec-draft-n-max", "0"], &["--spec-draft-n-max 0"]);
    run(
        &["-md", h, "--spec-draft-n-max", "2", "--spec-draft-n-min", "3"],
        &["--spec-draft-n-min 3", "--spec-draft-n-max 2"],
    );
    run(&["-md", h, "--spec-draft-p-min", "1.5"], &["--spec-draft-p-min 1.5"]);
    run(&["-md", h, "--spec-draft-tree", "5"], &["--spec-draft-tree", "-md"]);
    run(&["-md", h, "--spec-draft-n-max", "600", "-b", "512"], &["--spec-draft-n-max 600", "-b 512"]);
    run(&["-md", h, "--grammar", "start: \"a\""], &["-md", "grammar"]);
    run(&["-md", "/nonexistent/draft.gguf"], &["-md", "/nonexistent/draft.gguf"]);
    let ck = testing::testmodel::smollm2_checkpoint().unwrap();
    let smol = converted(&ck, "smollm2", ggml::Type::F32, true).unwrap();
    run(&["-md", smol.to_str().unwrap()], &["49152", "512", "vocabulary"]);
}
