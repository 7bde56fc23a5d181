//! Per-token log-probabilities in the OpenAI shapes: chat's
//! `choices[].logprobs.content[]` (token, logprob, bytes, top_logprobs) and
//! the legacy completions' `tokens` / `token_logprobs` / `top_logprobs` /
//! `text_offset`. A token's text is its own decoding (a piece of a
//! multi-byte character decodes to U+FFFD, as in llama-server).

use hamburger::tokenizer::Tokenizer;
use hamburger::TokenLogprob;
use serde_json::{json, Map, Value};

/// Chat's `logprobs` object: the native entries ([`native`]) as `content`
/// (llama-server's chat entries carry the token `id` too).
pub fn chat(lps: &[TokenLogprob], tok: &Tokenizer) -> Value {
    json!({ "content": native(lps, tok, false) })
}

/// llama-server's native `completion_probabilities`: chat's entries, each
/// with its token `id`, its alternatives' too; `post_sampling` (the
/// log-probabilities are the sampler's): as probabilities, `prob` and
/// `top_probs`, as llama-server answers `post_sampling_probs`.
pub fn native(lps: &[TokenLogprob], tok: &Tokenizer, post_sampling: bool) -> Value {
    let (value, top_key) = if post_sampling { ("prob", "top_probs") } else { ("logprob", "top_logprobs") };
    let entry = |t: u32, logprob: f32| {
        let text = tok.decode(&[t]);
        let v = if post_sampling { logprob.exp() } else { logprob };
        json!({"id": t, "token": text, value: v, "bytes": text.as_bytes()})
    };
    lps.iter()
        .map(|lp| {
            let mut e = entry(lp.token, lp.logprob);
            e[top_key] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
            e
        })
        .collect()
}

/// The legacy completions' `logprobs` object; `text_offset` counts bytes
/// from the start of the completion's text, the first token's being `start`
/// (a stream's later chunk starts where the earlier ones' tokens end). With
/// `echo`, `first` is the prompt's first token, which comes first with a null
/// log-probability and null alternatives (nothing predicts it: OpenAI's and
/// vLLM's shape), and `lps` starts with the other prompt tokens'.
pub fn completion(first: Option<u32>, lps: &[TokenLogprob], tok: &Tokenizer, start: usize) -> Value {
    let tokens: Vec<String> = first.iter().chain(lps.iter().map(|lp| &lp.token)).map(|&t| tok.decode(&[t])).collect();
    let offsets: Vec<usize> = tokens
        .iter()
        .scan(start, |at, t| {
            let o = *at;
            *at += t.len();
            Some(o)
        })
        .collect();
    let none = first.map(|_| Value::Null);
    let top: Vec<Value> = none
        .clone()
        .into_iter()
        .chain(lps.iter().map(|lp| {
            // Keyed by text: of alternatives that decode alike (pieces of
            // multi-byte characters), the most likely one is kept.
            let mut top = Map::new();
            for &(t, l) in &lp.top {
                top.entry(tok.decode(&[t])).or_insert(json!(l));
            }
            Value::Object(top)
        }))
        .collect();
    let token_logprobs: Vec<Value> = none.into_iter().chain(lps.iter().map(|lp| json!(lp.logprob))).collect();
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}
