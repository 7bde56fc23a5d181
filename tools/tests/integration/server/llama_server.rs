//! What llama-server's users rely on, kept by `hamburger-server`: its launch
//! flags' meanings, `/props`, `/apply-template`, the `llamacpp:` metrics and
//! `/slots`.

use std::io::BufReader;

use serde_json::{json, Value};

use super::served::{client, eventually, read_until, Served};
use super::{post, start_in, tiny, Killed};

/// llama-server's launch flags mean what they mean there: `-n` is the
/// default token budget of a request (not the slot count, which is `-np`),
/// `-a` names the model, `--jinja` and `--metrics` are accepted.
#[test]
fn llama_server_flags_keep_their_meaning() {
    let s = Served::tiny(&["-np", "1", "-c", "512", "-n", "5", "-a", "my-model", "--jinja"]);
    let models = client().get(s.url("/v1/models")).send().unwrap().json::<Value>().unwrap();
    assert_eq!(models["data"][0]["id"], "my-model", "{models}");
    let (_, v) = s.complete(&json!({"prompt": [1, 2, 3], "ignore_eos": true}));
    assert_eq!(v["usage"]["completion_tokens"], 5, "-n bounds a request without max_tokens: {v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["model"], "my-model", "{v}");
    let (_, v) = s.complete(&json!({"prompt": [1, 2, 3], "ignore_eos": true, "max_tokens": 9}));
    assert_eq!(v["usage"]["completion_tokens"], 9, "a request's max_tokens wins: {v}");
}

/// `--no-jinja` (which llama-server's suite starts every server with)
/// renders the template as the built-in one llama.cpp detects it as:
/// SmolLM2's ChatML without the default system message its Jinja adds, a
/// message's text parts joined with a newline, as llama-server renders it.
#[test]
fn no_jinja_renders_the_built_in_template_llama_cpp_detects() {
    let s = Served::smollm2(&["-np", "1", "-c", "512", "--no-jinja"]);
    let parts = json!([{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]);
    let (status, v) = s.post("/apply-template", &json!({"messages": [{"role": "user", "content": parts}]}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["prompt"], "<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n", "{v}");
}

/// llama.cpp gives Llama 3.x's templates the day's date (`date_string`),
/// and transformers gives them `strftime_now`: `SOURCE_DATE_EPOCH` fixes
/// both (llama-server's suite renders its recordings' day so), and a
/// malformed one stops the server at start in one line naming it.
#[test]
fn source_date_epoch_fixes_the_date_templates_render() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("dated.jinja");
    let source = "{{ date_string }}|{{ strftime_now('%Y-%m-%d') }}|{% for m in messages %}{{ m.content }}{% endfor %}";
    std::fs::write(&template, source).unwrap();
    let args = ["-np", "1", "-c", "512", "--jinja", "--chat-template-file", template.to_str().unwrap()];
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}]});
    let rendered = |env: &[(&str, &str)]| {
        let (child, addr) = start_in(&tiny(), &args, env);
        let _server = Killed(child);
        let (status, v) = post(&addr, "/apply-template", &chat);
        assert_eq!(status, 200, "{v}");
        v["prompt"].as_str().unwrap().to_string()
    };
    // 2025-11-30 12:00 UTC.
    assert_eq!(rendered(&[("SOURCE_DATE_EPOCH", "1764504000")]), "30 Nov 2025|2025-11-30|Hi");
    // Unset, the day's (read before and after, for a run across midnight).
    let day = || chrono::Local::now().format("%d %b %Y|%Y-%m-%d|Hi").to_string();
    let (before, today, after) = (day(), rendered(&[]), day());
    assert!(today == before || today == after, "{today}");
    testing::process::assert_one_line_error(
        testing::process::limited(env!("CARGO_BIN_EXE_hamburger-server")).env("SOURCE_DATE_EPOCH", "yesterday").args([
            "-m",
            tiny().to_str().unwrap(),
            "--port",
            "0",
        ]),
        &["SOURCE_DATE_EPOCH", "yesterday"],
    );
}

/// llama-server's operations routes: `/props` tells the settings, slots,
/// model path and template; `/apply-template` renders a chat; `/completion`
/// answers in llama-server's native shape; the metrics are also under
/// llama-server's names, counting what ours count.
#[test]
fn llama_server_props_apply_template_and_metrics() {
    let s = Served::smollm2(&["-np", "2", "-c", "1024", "-n", "7"]);
    let props: Value = client().get(s.url("/props")).send().unwrap().json().unwrap();
    assert_eq!(props["total_slots"], 2, "{props}");
    // The slots share one pool; an explicit -np gives each request llama-server's slot context, -c / -np.
    assert_eq!(props["default_generation_settings"]["n_ctx"], 512, "{props}");
    assert_eq!(props["default_generation_settings"]["params"]["n_predict"], 7, "{props}");
    assert_eq!(props["default_generation_settings"]["params"]["confidence"], 0.3, "{props}");
    assert!(props["model_path"].as_str().unwrap().ends_with(".gguf"), "{props}");
    assert!(props["chat_template"].as_str().unwrap().contains("im_start"), "{props}");
    let (status, v) = s.post("/apply-template", &json!({"messages": [{"role": "user", "content": "Hi"}]}));
    assert_eq!(status, 200, "{v}");
    assert!(v["prompt"].as_str().unwrap().ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), "{v}");
    let (status, v) = s.post("/apply-template", &json!({"messages": []}));
    assert_eq!(status, 400, "{v}");
    let (_, answer) = s.complete(&json!({"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0}));
    let llama = |name: &str| -> f64 {
        let text = reqwest::blocking::get(s.url("/metrics")).unwrap().text().unwrap();
        let line =
            text.lines().find(|l| l.starts_with(&format!("llamacpp:{name} "))).unwrap_or_else(|| panic!("{name}"));
        line.split(' ').nth(1).unwrap().parse().unwrap()
    };
    assert_eq!(llama("prompt_tokens_total"), answer["usage"]["prompt_tokens"].as_f64().unwrap());
    assert_eq!(llama("tokens_predicted_total"), answer["usage"]["completion_tokens"].as_f64().unwrap());
    // The gauge follows the engine thread's next iteration after the answer.
    eventually("no request processing", || llama("requests_processing") == 0.0);
    assert_eq!(llama("requests_deferred"), 0.0);
    assert!(llama("n_decode_total") >= 1.0);
    assert!((0.0..=1.0).contains(&llama("kv_cache_usage_ratio")));
    // The native completion answers in llama-server's shape, HAMburger's fields added to `timings`.
    let (status, v) = s.post("/completion", &json!({"prompt": "Hi", "n_predict": 4, "return_tokens": true}));
    assert_eq!(status, 200, "{v}");
    assert!(v["content"].is_string() && v["stop"] == true && v["stop_type"] == "limit", "{v}");
    assert_eq!((v["tokens_predicted"].as_u64(), v["tokens"].as_array().map(Vec::len)), (Some(4), Some(4)), "{v}");
    assert_eq!(v["generation_settings"]["n_predict"], 4, "{v}");
    assert!(v["timings"]["macro_steps"].as_u64().unwrap() >= 1 && v["timings"]["predicted_n"] == 4, "{v}");
}

/// llama-server's `/slots`: a slot shows its request (task, prompt and
/// generated tokens so far, settings) while it runs, and is idle again after
/// the answer; the other slot stays idle throughout.
#[test]
fn slots_show_the_running_request_and_are_idle_after() {
    let s = Served::smollm2(&["-np", "2", "-c", "2048"]);
    let slots = || client().get(s.url("/slots")).send().unwrap().json::<Value>().unwrap();
    let idle = slots();
    assert_eq!(idle.as_array().unwrap().len(), 2, "{idle}");
    assert!(idle.as_array().unwrap().iter().all(|s| s["is_processing"] == false && s["n_ctx"] == 1024), "{idle}");
    let body = json!({"prompt": [1, 2, 3, 4], "max_tokens": 300, "stream": true, "ignore_eos": true, "temperature": 0, "confidence": 0.7});
    let mut reader = BufReader::new(s.open_stream(&body));
    read_until(&mut reader, "data: ");
    // The answer is far from its 300 tokens: its slot shows it running.
    let mut busy = Value::Null;
    eventually("a slot processing after the first chunk", || {
        busy = slots();
        busy.as_array().unwrap().iter().any(|s| s["is_processing"] == true && s["n_decoded"].as_u64() > Some(0))
    });
    let running: Vec<&Value> = busy.as_array().unwrap().iter().filter(|s| s["is_processing"] == true).collect();
    assert_eq!(running.len(), 1, "{busy}");
    let slot = running[0];
    assert_eq!(slot["id_task"], 1, "{busy}");
    assert_eq!(slot["n_prompt_tokens"], 4, "{busy}");
    assert!(slot["n_decoded"].as_u64().unwrap() < 300, "{busy}");
    assert_eq!(slot["params"]["n_predict"], 300, "{busy}");
    assert_eq!(slot["params"]["confidence"], 0.7, "{busy}");
    assert_eq!(slot["params"]["ignore_eos"], true, "{busy}");
    read_until(&mut reader, "data: [DONE]");
    eventually("every slot idle after the answer", || {
        slots()
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["is_processing"] == false && s["id_task"] == -1 && s["params"].is_null())
    });
}
