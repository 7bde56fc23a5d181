//! Prompt-prefix reuse (`cache_prompt`) that changes no answer: a request
//! whose prompt starts with cells an earlier prompt left gets, bit for bit,
//! the log-probabilities and text the same request gets read fresh, whether
//! the prompt is short (forwards of 8..=63 rows) or long (64 and more, flash
//! attention's tiled path), repeated or sharing a system prompt. Before the
//! reuse rule of `hamburger::row_class`, a repeated prompt fed its last token
//! alone, a one-row forward whose sums run in another order than the fresh
//! read's, and its log-probabilities differed in the last places on every
//! machine (a near-tie flipped a greedy answer on AVX-512).

use serde_json::{json, Value};
use testing::testmodel::{converted, smollm2_checkpoint};

use super::{post, start_with, Killed};

/// A greedy completion of `prompt` with log-probabilities, reusing cached
/// cells when `cache`: the choice (text and log-probabilities) and the
/// prompt tokens it reused.
fn complete(addr: &str, prompt: &str, cache: bool) -> (Value, u64) {
    let body = json!({"prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 2, "cache_prompt": cache});
    let (status, v) = post(addr, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    (v["choices"][0].clone(), v["timings"]["cache_n"].as_u64().unwrap())
}

#[test]
fn a_cached_prompt_gets_the_fresh_answer_bit_for_bit() {
    let model = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
    let (child, addr) = start_with(&model, &["-np", "1", "-c", "1024", "--confidence", "0.3"]);
    let _server = Killed(child);
    let system = "You are a careful assistant. Answer in one short paragraph, name your sources when you \
                  can, prefer plain words to jargon, and say so when you do not know. The user is a student \
                  preparing for an examination in geography and history.";
    let long = format!("{system} Question: which rivers flow through Paris?");
    for prompt in ["Name three colors that appear in a rainbow, then say which is warmest:", long.as_str()] {
        let (fresh, _) = complete(&addr, prompt, false);
        let (cached, reused) = complete(&addr, prompt, true);
        assert!(reused > 0, "the repeated prompt reused its cells");
        assert_eq!(cached, fresh, "a repeated prompt of {} bytes", prompt.len());
    }
    // A system prompt shared with an earlier request, whose cells it reuses.
    let other = format!("{system} Question: which mountains stand between France and Spain?");
    complete(&addr, &long, false);
    let (shared, reused) = complete(&addr, &other, true);
    assert!(reused > 40, "the system prompt's cells were reused ({reused} tokens)");
    let (fresh, _) = complete(&addr, &other, false);
    assert_eq!(shared, fresh, "a prompt sharing a cached system prompt");
}
