//! Per-token log-probabilities in the OpenAI shapes: chat's
//! `choices[].logprobs.content[]` (token, logprob, bytes, top_logprobs) and
//! the legacy completions' `tokens` / `token_logprobs` / `top_logprobs` /
//! `text_offset`. A token's text is its own decoding (a piece of a
//! multi-byte character decodes to U+FFFD, as in llama-server).

use hamburger::tokenizer::Tokenizer;
use hamburger::TokenLogprob;
use serde_json::{json, Map, Value};

/// Chat's `logprobs` object.
pub fn chat(lps: &[TokenLogprob], tok: &Tokenizer) -> Value {
    let entry = |t: u32, logprob: f32| {
        let text = tok.decode(&[t]);
        json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(lp.token, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// The legacy completions' `logprobs` object; `text_offset` counts bytes
/// from the start of the completion's text, the first token's being `start`
/// (a stream's later chunk starts where the earlier ones' tokens end).
pub fn completion(lps: &[TokenLogprob], tok: &Tokenizer, start: usize) -> Value {
    let tokens: Vec<String> = lps.iter().map(|lp| tok.decode(&[lp.token])).collect();
    let offsets: Vec<usize> = tokens
        .iter()
        .scan(start, |at, t| {
            let o = *at;
            *at += t.len();
            Some(o)
        })
        .collect();
    let top: Vec<Value> = lps
        .iter()
        .map(|lp| Value::Object(lp.top.iter().map(|&(t, l)| (tok.decode(&[t]), json!(l))).collect::<Map<_, _>>()))
        .collect();
    let token_logprobs: Vec<f32> = lps.iter().map(|lp| lp.logprob).collect();
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}
