//! A context's size changes nothing it computes: the same prompt answered in
//! a cache whose last window is not a whole number of tiles (100 cells) and
//! in a large one gives the same tokens and bit for bit the same logits and
//! stop probabilities, with attention fused or not. (A window cut at the
//! cache's end is summed in another order, which at Q8_0 parted greedy
//! answers from those of a larger context.)

use hamburger::{EngineParams, Generation, LoadOptions, Model, Session, SessionParams, StepParams};
use testing::testmodel::{converted, tiny_fixture};

fn answer(model: &Model, n_ctx: usize, flash_attn: bool, prompt: &[u32], n: usize) -> Generation {
    let params = SessionParams {
        engine: EngineParams {
            n_ctx,
            kv_type: ggml::Type::F32,
            n_threads: 2,
            flash_attn: Some(flash_attn),
            ..Default::default()
        },
        step: StepParams { confidence: 0.3, ..Default::default() },
        keep_logits: true,
        ignore_eog: true,
        ..Default::default()
    };
    Session::new(model, params).unwrap().generate(prompt, n, |_| true).unwrap()
}

fn bits(g: &Generation) -> Vec<u32> {
    g.macro_steps.iter().flat_map(|s| s.logits.iter().flatten().chain(&s.p_stop).map(|x| x.to_bits())).collect()
}

#[test]
fn an_answer_to_the_last_cell_of_a_small_cache_is_bit_for_bit_a_large_caches() {
    let gguf = converted(&tiny_fixture().join("hamburger.ckpt"), "tiny", ggml::Type::F32, false).unwrap();
    let model = Model::open(&gguf, &LoadOptions::default()).unwrap();
    // 77 prompt entries and 20 tokens: every window reaches past cell 64,
    // so a window padded to 128 cells is cut at 100 unless the tensors
    // hold a whole last tile.
    let prompt: Vec<u32> = (3..80).collect();
    let n = 20;
    for flash_attn in [false, true] {
        let small = answer(&model, 100, flash_attn, &prompt, n);
        let large = answer(&model, 512, flash_attn, &prompt, n);
        assert_eq!(small.output_ids, large.output_ids, "flash attention {flash_attn}");
        assert!(!bits(&large).is_empty() && bits(&small) == bits(&large), "flash attention {flash_attn}: logits");
    }
}
