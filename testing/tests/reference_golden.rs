//! The reference implementation reproduces the original implementation's
//! golden outputs on the tiny fixture: it is a valid oracle.

use testing::reference::Reference;
use testing::testmodel::tiny_fixture;

#[test]
fn reference_matches_golden_file() {
    let dir = tiny_fixture();
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let r = Reference::load(&dir.join("hamburger.ckpt"), &dir).unwrap();
    let eos = golden["eos_id"].as_u64().unwrap() as u32;
    for (ci, case) in golden["cases"].as_array().unwrap().iter().enumerate() {
        let prompt: Vec<u32> =
            case["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let conf = case["confidence"].as_f64().unwrap() as f32;
        let max_new = case["max_new_tokens"].as_u64().unwrap() as usize;
        let steps = r.generate(&prompt, conf, max_new, &[eos]);
        let want = case["macro_steps"].as_array().unwrap();
        assert_eq!(steps.len(), want.len(), "case {ci}: number of macro steps");
        for (si, (got, w)) in steps.iter().zip(want).enumerate() {
            let wt: Vec<u32> = w["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            assert_eq!(got.tokens, wt, "case {ci} step {si}: tokens");
            for (mi, p) in w["p_stop"].as_array().unwrap().iter().enumerate() {
                let p = p.as_f64().unwrap() as f32;
                assert!(
                    (got.p_stop[mi] - p).abs() < 1e-4,
                    "case {ci} step {si}.{mi}: p_stop {} vs {p}",
                    got.p_stop[mi]
                );
            }
            for (mi, top5) in w["top5"].as_array().unwrap().iter().enumerate() {
                for pair in top5.as_array().unwrap() {
                    let (id, logit) = (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
                    let g = got.logits[mi][id];
                    assert!((g - logit).abs() < 1e-3, "case {ci} step {si}.{mi}: logit[{id}] {g} vs {logit}");
                }
            }
        }
    }
}
