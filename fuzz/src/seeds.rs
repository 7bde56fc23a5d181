//! Writes the seed corpora of every target into `fuzz/corpus/<target>/`, from
//! the tiny fixture and small hand-made files:
//! `cargo +nightly run --manifest-path fuzz/Cargo.toml --bin fuzz-seeds`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use ggml::gguf::{GgufBuilder, Value};
use hamburger::arch::{keys, TensorSet};
use hamburger::hparams::HParams;
use hamburger_fuzz::{small_safetensors, tiny_fixture, SHARD, TINY_VOCAB};

const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const LLAMA3: &str = "{{- bos_token }}{%- set ns = namespace(sys='') %}{%- for m in messages %}{%- if m.role == 'system' %}{%- set ns.sys = m.content | trim %}{%- else %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}{{ ns.sys | length }}{{ messages | map(attribute='role') | join(',') }}{% if messages[0]['content'].startswith('Be') %}x{% endif %}";

fn corpus(target: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    dir
}

fn seed(target: &str, name: &str, bytes: &[u8]) {
    std::fs::write(corpus(target).join(name), bytes).expect("seed written");
}

/// A complete HAMburger GGUF with tiny shapes and zero weights, the fixture's
/// tokenizer and a ChatML template: every check passes, so mutations start
/// from a file that loads and decodes.
fn mini_gguf() -> Vec<u8> {
    let hp = HParams {
        n_vocab: TINY_VOCAB,
        n_embd: 16,
        n_layer: 2,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 8,
        n_ff: 32,
        rms_eps: 1e-5,
        rope_freq_base: 10000.0,
        n_rot: 8,
        n_ctx_train: 64,
        max_steps: 4,
        n_micro_layer: 1,
        feature_layers: vec![0, 1],
        n_merger_head: 2,
    };
    let tokenizer = std::fs::read_to_string(tiny_fixture().join("tokenizer.json")).expect("fixture tokenizer");
    let shapes = hp.tensor_shapes(TensorSet { tied_output: true, ..Default::default() });
    let mut b = GgufBuilder::new(shapes.len()).expect("builder");
    let mut meta = vec![
        (keys::ARCHITECTURE.to_string(), Value::Str("hamburger".into())),
        (keys::TOKENIZER_HF_JSON.to_string(), Value::Str(tokenizer)),
        (keys::CHAT_TEMPLATE.to_string(), Value::Str(CHATML.into())),
        (keys::TOKENIZER_BOS_ID.to_string(), Value::U32(1)),
        (keys::TOKENIZER_EOS_ID.to_string(), Value::U32(2)),
        (keys::TOKENIZER_ADD_BOS.to_string(), Value::Bool(true)),
    ];
    meta.extend(hp.to_metadata("hamburger"));
    for (k, v) in &meta {
        b.set(k, v).expect("key set");
    }
    for (name, ne) in &shapes {
        b.add_tensor(&name.to_string(), ggml::Type::F32, ne).expect("tensor added");
    }
    let path = std::env::temp_dir().join(format!("hamburger-fuzz-seed-{}.gguf", std::process::id()));
    let mut w = b.write(&path).expect("writer");
    for (_, ne) in &shapes {
        w.write_data(&vec![0u8; 4 * ne.iter().product::<i64>() as usize]).expect("data written");
    }
    w.finish().expect("finished");
    let bytes = std::fs::read(&path).expect("seed read back");
    std::fs::remove_file(&path).ok();
    bytes
}

/// `{'state_dict': {'w': tensor(FloatStorage '0', offset 0, shape (2, 2), stride (2, 1))}}`
/// in pickle protocol 2, as torch.save writes it.
fn small_pickle() -> Vec<u8> {
    let mut p = b"\x80\x02}".to_vec();
    let s = |p: &mut Vec<u8>, text: &str| {
        p.push(b'X');
        p.extend((text.len() as u32).to_le_bytes());
        p.extend(text.as_bytes());
    };
    s(&mut p, "state_dict");
    p.push(b'}');
    s(&mut p, "w");
    p.extend(b"ctorch._utils\n_rebuild_tensor_v2\n((");
    s(&mut p, "storage");
    p.extend(b"ctorch\nFloatStorage\n");
    s(&mut p, "0");
    s(&mut p, "cpu");
    p.extend(b"K\x04tQK\x00K\x02K\x02\x86K\x02K\x01\x86\x89NtRss.");
    p
}

/// A torch zip: `archive/data.pkl`, its storage and byte order, stored.
fn torch_zip(pickle: &[u8], storages: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file("archive/data.pkl", stored).expect("entry");
    z.write_all(pickle).expect("pickle");
    z.start_file("archive/byteorder", stored).expect("entry");
    z.write_all(b"little").expect("byteorder");
    for (key, bytes) in storages {
        z.start_file(format!("archive/data/{key}"), stored).expect("entry");
        z.write_all(bytes).expect("storage");
    }
    z.finish().expect("zip").into_inner()
}

/// The fixture checkpoint's `data.pkl`.
fn fixture_pickle() -> Vec<u8> {
    let f = std::fs::File::open(tiny_fixture().join("hamburger.ckpt")).expect("fixture checkpoint");
    let mut z = zip::ZipArchive::new(f).expect("fixture zip");
    let name = z.file_names().filter_map(Result::ok).find(|n| n.ends_with("/data.pkl")).expect("data.pkl").into_owned();
    let mut out = Vec::new();
    z.by_name(&name).expect("data.pkl").read_to_end(&mut out).expect("data.pkl read");
    out
}

fn main() {
    seed("gguf", "mini.gguf", &mini_gguf());

    let (small, fixture) = (small_pickle(), fixture_pickle());
    seed("unpickle", "small.pkl", &small);
    seed("unpickle", "fixture.pkl", &fixture);

    let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    seed("checkpoint_zip", "small.ckpt", &torch_zip(&small, &[("0", data)]));

    let mut st = vec![0u8];
    st.extend(small_safetensors());
    seed("safetensors_index", "small.safetensors", &st);
    let index = format!("\x01{{\"metadata\": {{}}, \"weight_map\": {{\"w\": \"{SHARD}\", \"b\": \"{SHARD}\"}}}}");
    seed("safetensors_index", "index.json", index.as_bytes());

    for (i, text) in
        ["Hello world", "<|im_start|>user\nhi<|im_end|>\n", "wörld 123 \u{1f600}\t  x", ""].iter().enumerate()
    {
        seed("tokenizer", &format!("text{i}"), &[&[0u8][..], text.as_bytes()].concat());
    }
    let tok = std::fs::read(tiny_fixture().join("tokenizer.json")).expect("fixture tokenizer");
    seed("tokenizer", "tokenizer.json", &[&[1u8][..], &tok].concat());

    seed("chat_template", "chatml.jinja", CHATML.as_bytes());
    seed("chat_template", "llama3.jinja", LLAMA3.as_bytes());
    println!("seeds written under {}", corpus("").display());
}
