//! Every golden case of the tiny fixture (computed by the ORIGINAL
//! implementation) reproduced by the ggml runtime in f32: tokens and macro-step
//! boundaries exact for the first `max_new_tokens`, top-5 logits within 1e-3,
//! stop probabilities within 1e-4.

use hamburger::{EngineParams, LoadOptions, Model, SessionParams};
use testing::testmodel::{converted, tiny_fixture};

fn check_all_cases(params: SessionParams, logit_tol: f32, stop_tol: f32) {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap();
    testing::golden::check_golden(&Model::open(&gguf, &LoadOptions::default()).unwrap(), params, logit_tol, stop_tol);
}

/// The golden cases' settings: an F32 cache, every micro step's logits kept.
fn f32_session(flash_attn: bool) -> SessionParams {
    let engine = EngineParams {
        n_ctx: 256,
        kv_type: ggml::Type::F32,
        flash_attn: Some(flash_attn),
        n_threads: 2,
        ..Default::default()
    };
    SessionParams { engine, keep_logits: true, ..Default::default() }
}

#[test]
fn golden_cases_in_f32_plain_attention() {
    check_all_cases(f32_session(false), 1e-3, 1e-4);
}

#[test]
fn golden_cases_in_f32_flash_attention() {
    check_all_cases(f32_session(true), 1e-3, 1e-4);
}

/// TF32's arithmetic on the CPU (`testing::golden::tf32_emulation`): the
/// golden tokens hold, the logits move measurably, and `tests/integration/gpu.rs` takes
/// its tolerances from these departures.
#[test]
fn golden_cases_in_tf32_precision() {
    let (logit, stop) = testing::golden::tf32_emulation();
    assert!(logit.diff > 1e-4, "10-bit operands must move the logits: {}", logit.at);
    assert!(stop.diff > 0.0);
}
