//! hamburger-server with every layer on a GPU (`--device cuda|metal|vulkan
//! -ngl 99`, its defaults otherwise: an F16 cache, flash attention) answers
//! the tiny fixture's golden cases over HTTP (the six of
//! `testing::golden::SAMPLED`; `tests/integration/gpu.rs` decodes all 18): the original
//! implementation's text, token count and macro steps. Ignored like
//! `tests/integration/gpu.rs`; CI runs it through Vulkan on Mesa's lavapipe.

use serde_json::json;

use super::served::Served;

#[test]
#[ignore = "needs a GPU: cargo test --release --features vulkan -p hamburger-tools --test integration -- --ignored server::gpu::"]
fn server_answers_the_golden_cases_on_the_gpu() {
    let device = testing::gpu::gpu_flag();
    let s = Served::tiny(&["--device", &device, "-ngl", "99", "-np", "2", "-c", "1024"]);
    let cases = testing::golden::cases();
    for ci in testing::golden::SAMPLED {
        let case = &cases[ci];
        let ids: Vec<u32> = case.steps.iter().map(|&(_, t)| t).collect();
        let (_, want) = s.post("/detokenize", &json!({ "tokens": ids }));
        let body = json!({"prompt": case.prompt_ids, "max_tokens": case.max_new_tokens, "temperature": 0,
                          "confidence": case.confidence, "ignore_eos": true});
        let (text, v) = s.complete(&body);
        assert_eq!(text, want["content"].as_str().unwrap(), "case {ci} on {device}: {v}");
        assert_eq!(v["usage"]["completion_tokens"], case.max_new_tokens, "case {ci}: {v}");
        let steps = case.steps.last().map_or(0, |&(si, _)| si + 1);
        assert_eq!(v["timings"]["macro_steps"], steps, "case {ci}: macro steps on {device}: {v}");
    }
}
