//! Response assembly: a request's choices' events turned into OpenAI's JSON
//! objects, the whole answer at once or a stream of chunks (one per choice's
//! macro step, then each choice's finish, the usage, `[DONE]`), with the
//! `usage` and `timings` objects and tool calls in `tool_calls`. No HTTP
//! here: the HTTP layer sends what this builds.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use hamburger::{Timings, TokenLogprob};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::choices::Choices;
use crate::error::ApiError;
use crate::job::{End, Event, FinishReason, ModelInfo};
use crate::native;
use crate::plan::Echo;
use crate::tools::ToolRequest;

/// Payloads a stream holds before its reader takes them (the engine holds
/// text back meanwhile).
const STREAM_BUFFER: usize = 16;

/// `finish_reason` as OpenAI spells it.
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// The `usage` object of `prompt` and `completion` tokens, `cached` of the
/// prompt tokens reused (`prompt_tokens_details.cached_tokens`).
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// `system_fingerprint`: the build, as llama-server's `b<build>-<commit>` starts.
pub fn system_fingerprint() -> String {
    format!("b{}-hamburger", env!("CARGO_PKG_VERSION"))
}

/// The `timings` object: llama-server's fields (`prompt_n` the prompt tokens
/// processed, `cache_n` those whose KV entries were reused; `draft_n` the
/// drafted tokens checked, `draft_n_accepted` those accepted) plus
/// HAMburger's macro steps (base forwards) and, self-verified, the forwards
/// that checked drafts and the drafted tokens accepted per such forward.
pub fn timings(t: &Timings) -> Value {
    let per_second = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    let per_token = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    // As llama-server counts: the first generated token comes out of the
    // prompt's forward, so the generation's rate is over the tokens after it.
    let decoded = t.gen_tokens.saturating_sub(1);
    json!({
        "cache_n": t.cached_tokens,
        "prompt_n": t.prompt_tokens,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": per_token(t.prompt_ms, t.prompt_tokens),
        "prompt_per_second": per_second(t.prompt_tokens, t.prompt_ms),
        "predicted_n": t.gen_tokens,
        "predicted_ms": t.gen_ms,
        "predicted_per_token_ms": per_token(t.gen_ms, decoded),
        "predicted_per_second": if decoded == 0 { 0.0 } else { per_second(decoded, t.gen_ms) },
        "macro_steps": t.macro_steps,
        "tokens_per_step": t.tokens_per_step(),
        "kv_entries": t.kv_entries,
        "kv_bytes_per_entry": t.kv_bytes_per_entry,
        "draft_n": t.drafted,
        "draft_n_accepted": t.draft_accepted,
        "verify_forwards": t.verify_forwards,
        "accepted_per_verify": t.accepted_per_verify(),
    })
}

pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Which OpenAI object a generation answers as.
#[derive(Clone, Copy)]
pub enum Kind {
    /// `chat.completion` (chunks: `chat.completion.chunk`).
    Chat,
    /// `text_completion`.
    Completion,
    /// llama-server's native `/completion` object ([`native`]).
    Native,
}

impl Kind {
    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion | Kind::Native, _) => "text_completion",
        }
    }

    /// Choice `index` carrying `text` (a delta when streaming).
    fn choice(self, index: usize, text: Option<&str>, finish: Option<&str>, chunk: bool) -> Value {
        match (self, chunk) {
            (Kind::Chat, false) => {
                json!({"index": index, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
            }
            (Kind::Chat, true) => {
                let delta = text.map_or(json!({}), |t| json!({"content": t}));
                json!({"index": index, "delta": delta, "finish_reason": finish})
            }
            (Kind::Completion | Kind::Native, _) => {
                json!({"index": index, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
        }
    }
}

/// The statistics of a request's finished choices added up.
struct Totals {
    /// Choices per prompt.
    n: usize,
    /// Token and step counts summed over the choices (the prompt's
    /// processed and reused tokens as often as it ran), times the longest
    /// choice's: the choices ran together.
    timings: Timings,
    /// `usage.prompt_tokens`: each prompt counted once, however many choices
    /// it has (as OpenAI counts).
    prompt_tokens: usize,
    /// Of those, the tokens whose KV entries were reused.
    cached_tokens: usize,
}

impl Totals {
    fn new(n: usize) -> Totals {
        Totals { n, timings: Timings::default(), prompt_tokens: 0, cached_tokens: 0 }
    }

    /// Adds the statistics of choice `index`.
    fn add(&mut self, index: usize, t: &Timings) {
        if index.is_multiple_of(self.n) {
            self.prompt_tokens += t.cached_tokens + t.prompt_tokens;
            self.cached_tokens += t.cached_tokens;
        }
        let sum = &mut self.timings;
        sum.prompt_tokens += t.prompt_tokens;
        sum.cached_tokens += t.cached_tokens;
        sum.prompt_ms = sum.prompt_ms.max(t.prompt_ms);
        sum.gen_tokens += t.gen_tokens;
        sum.gen_ms = sum.gen_ms.max(t.gen_ms);
        sum.macro_steps += t.macro_steps;
        sum.kv_entries += t.kv_entries;
        sum.context_tokens += t.context_tokens;
        sum.kv_bytes_per_entry = t.kv_bytes_per_entry;
        if sum.reached.len() < t.reached.len() {
            sum.reached.resize(t.reached.len(), 0);
        }
        sum.reached.iter_mut().zip(&t.reached).for_each(|(s, r)| *s += r);
        sum.drafted += t.drafted;
        sum.draft_accepted += t.draft_accepted;
        sum.verify_forwards += t.verify_forwards;
    }

    /// The `usage` object: the prompts once each, the completion tokens of every choice.
    fn usage(&self) -> Value {
        usage(self.prompt_tokens, self.timings.gen_tokens, self.cached_tokens)
    }

    /// The `timings` object of the choices together.
    fn timings(&self) -> Value {
        timings(&self.timings)
    }
}

/// What a native answer ([`Kind::Native`]) needs besides the events.
pub(crate) struct NativeOptions {
    /// `generation_settings` ([`native::generation_settings`]).
    pub(crate) settings: Value,
    /// Whether the answer lists the generated ids (`return_tokens`).
    pub(crate) return_tokens: bool,
    /// The fields to answer (`response_fields`; none: all).
    pub(crate) fields: Option<Vec<String>>,
    /// Each prompt's ids.
    pub(crate) prompts: Vec<Vec<u32>>,
    /// Whether the log-probabilities are the sampler's (`post_sampling_probs`).
    pub(crate) post_sampling: bool,
}

/// A generation answered as `kind`: its id and model name for every chunk.
pub(crate) struct Answer {
    kind: Kind,
    /// Each prompt, when the answers start with it (`echo`; empty otherwise).
    echoes: Vec<Echo>,
    /// Choices per prompt (`n`): choice `i` answers prompt `i / n`.
    n: usize,
    /// The model (its tokenizer spells the tokens of `logprobs`).
    info: Arc<ModelInfo>,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
    /// The tools of a chat request that uses them: a call answers as `tool_calls`.
    tools: Option<ToolRequest>,
    /// A native answer's settings (`Some` exactly for [`Kind::Native`]).
    native: Option<NativeOptions>,
    /// The prompt as the model reads it, answered in `__verbose` (llama-server's `verbose`).
    verbose: Option<String>,
    id: String,
    model: String,
    created: u64,
}

impl Answer {
    /// The answer of a request of `kind` with `n` choices per prompt, each
    /// choice starting with its prompt's echo when given, with
    /// log-probabilities when asked, its calls of `tools` as `tool_calls`:
    /// a new unique id ([`crate::ids::unique`]).
    pub(crate) fn new(
        kind: Kind,
        echoes: Vec<Echo>,
        n: usize,
        info: Arc<ModelInfo>,
        logprobs: bool,
        tools: Option<ToolRequest>,
    ) -> Answer {
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion | Kind::Native => "cmpl",
        };
        let model = info.name.clone();
        let id = format!("{prefix}-{}", crate::ids::unique());
        Answer { kind, echoes, n, info, logprobs, tools, native: None, verbose: None, id, model, created: now() }
    }

    /// The same answer with `prompt` in `__verbose` (not streamed).
    pub(crate) fn verbose(self, prompt: String) -> Answer {
        Answer { verbose: Some(prompt), ..self }
    }

    /// The same answer in llama-server's native shape.
    pub(crate) fn native(self, options: NativeOptions) -> Answer {
        Answer { kind: Kind::Native, native: Some(options), ..self }
    }

    /// The native object ending choice `i` (its whole `text` unless streamed).
    fn native_end(&self, i: usize, text: &str, end: &End, t: &Timings, lps: &[TokenLogprob]) -> Value {
        let Some(o) = &self.native else { return Value::Null };
        let f = native::Finished {
            text,
            end,
            prompt: o.prompts.get(i / self.n).map_or(&[], Vec::as_slice),
            timings: timings(t),
            cached: t.cached_tokens,
        };
        let mut v = native::finished(&f, &self.info, &o.settings, o.return_tokens);
        v["index"] = json!(i);
        v["id"] = json!(self.id);
        if self.logprobs && !lps.is_empty() {
            v["completion_probabilities"] = crate::logprobs::native(lps, &self.info.tokenizer, o.post_sampling);
        }
        native::only_fields(v, o.fields.as_deref())
    }

    fn object(&self, choice: Value, chunk: bool) -> Value {
        self.with_choices(json!([choice]), chunk)
    }

    fn with_choices(&self, choices: Value, chunk: bool) -> Value {
        json!({
            "id": self.id,
            "object": self.kind.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "choices": choices,
        })
    }

    /// The chunk that ends a stream with `stream_options.include_usage`: no
    /// choice, the usage and (as llama-server) the timings.
    fn usage_chunk(&self, totals: &Totals) -> Value {
        let mut v = self.with_choices(json!([]), true);
        v["usage"] = totals.usage();
        v["timings"] = totals.timings();
        v
    }

    /// The prompt choice `i` starts with, when echoed.
    fn echo_of(&self, i: usize) -> Option<&Echo> {
        self.echoes.get(i / self.n)
    }

    /// Sets `choice`'s `logprobs` to those of `lps` when the request asked
    /// (a completion's led by `first`, an echoed prompt's first token, which
    /// has none); a completion's `text_offset` starts at `offset`, which
    /// moves past the tokens.
    fn set_logprobs(&self, choice: &mut Value, first: Option<u32>, lps: &[TokenLogprob], offset: &mut usize) {
        if !self.logprobs {
            return;
        }
        let tok = &self.info.tokenizer;
        choice["logprobs"] = match self.kind {
            Kind::Chat => crate::logprobs::chat(lps, tok),
            Kind::Completion => crate::logprobs::completion(first, lps, tok, *offset),
            Kind::Native => crate::logprobs::native(lps, tok, self.native.as_ref().is_some_and(|o| o.post_sampling)),
        };
        let tokens = first.iter().chain(lps.iter().map(|lp| &lp.token));
        *offset += tokens.map(|&t| tok.decode(&[t]).len()).sum::<usize>();
    }

    /// The chunk ending `choice`, and when the request has no choice left
    /// (`totals` complete), its usage and timings.
    fn finished(&self, choice: Value, totals: Option<&Totals>) -> Value {
        let mut v = self.object(choice, true);
        if let Some(t) = totals {
            v["usage"] = t.usage();
            v["timings"] = t.timings();
        }
        v
    }

    /// Waits for every choice and answers them in one object, in index order.
    ///
    /// # Errors
    /// When a choice failed or the engine stopped ([`Choices::next`]).
    pub(crate) async fn collect(self, mut choices: Choices) -> Result<Value, ApiError> {
        let n = choices.len();
        let mut texts: Vec<String> =
            (0..n).map(|i| self.echo_of(i).map_or_else(String::new, |e| e.text.clone())).collect();
        let (mut lps, mut ends) = (vec![Vec::new(); n], vec![None; n]);
        let (mut prompt_lps, mut each) = (vec![Vec::new(); n], vec![Timings::default(); n]);
        let mut totals = Totals::new(choices.per_prompt());
        while !choices.all_done() {
            match choices.next().await? {
                (i, Event::Text { text, logprobs, .. }) => {
                    texts[i].push_str(&text);
                    lps[i].extend(logprobs);
                }
                (i, Event::Done { end, timings, logprobs, prompt_logprobs }) => {
                    lps[i].extend(logprobs);
                    prompt_lps[i] = prompt_logprobs;
                    ends[i] = Some(end);
                    totals.add(i, &timings);
                    each[i] = timings;
                }
                (_, Event::Progress { .. }) => {}
                (_, Event::Failed(_)) => unreachable!("Choices::next turns failures into errors"),
            }
        }
        let ends: Vec<End> = ends.into_iter().map(|e| e.expect("every choice is done")).collect();
        if matches!(self.kind, Kind::Native) {
            let mut list: Vec<Value> =
                (0..n).map(|i| self.native_end(i, &texts[i], &ends[i], &each[i], &lps[i])).collect();
            return Ok(if n == 1 { list.remove(0) } else { Value::Array(list) });
        }
        if matches!(self.kind, Kind::Chat) {
            // A chat answer drops an incomplete character at its end, as
            // llama-server's do (its completions keep it as U+FFFD).
            texts.iter_mut().for_each(drop_incomplete_end);
        }
        let list: Vec<Value> = (0..n)
            .map(|i| {
                let mut c = self.kind.choice(i, Some(&texts[i]), Some(finish_reason(ends[i].reason)), false);
                if let Some(calls) = self.tools.as_ref().and_then(|t| t.calls(&texts[i])) {
                    c["message"] = json!({"role": "assistant", "content": null, "tool_calls": calls});
                    c["finish_reason"] = json!("tool_calls");
                }
                let all: Vec<TokenLogprob> = prompt_lps[i].drain(..).chain(lps[i].drain(..)).collect();
                self.set_logprobs(&mut c, self.echo_of(i).and_then(|e| e.first), &all, &mut 0);
                c
            })
            .collect();
        let mut v = self.with_choices(Value::Array(list), false);
        v["usage"] = totals.usage();
        v["timings"] = totals.timings();
        if let Some(prompt) = &self.verbose {
            v["__verbose"] = json!({"prompt": prompt});
        }
        Ok(v)
    }

    /// Streams the choices: a task forwards each choice's events as chunks
    /// carrying its `index` (an echoed prompt first, in a chunk of its own;
    /// each text chunk with its tokens' `logprobs` when asked, and a
    /// non-standard `hamburger` object: the `tokens` and `macro_steps` it
    /// covers, so a client sees the steps), one chunk with each choice's
    /// finish reason, the last of them with the request's usage and timings
    /// (then a chunk of no choice with `usage` when `include_usage`), or an
    /// error, then `[DONE]`. Returns the payloads, in order; when their
    /// receiver is dropped (the client left), the task ends at once and the
    /// jobs' channels close.
    pub(crate) fn stream(self, mut choices: Choices, include_usage: bool) -> mpsc::Receiver<String> {
        let (tx, out) = mpsc::channel::<String>(STREAM_BUFFER);
        tokio::spawn(async move {
            let a = self;
            let send = |v: Value| tx.send(v.to_string());
            if matches!(a.kind, Kind::Chat) {
                for i in 0..choices.len() {
                    let role =
                        json!({"index": i, "delta": {"role": "assistant", "content": null}, "finish_reason": null});
                    if send(a.object(role, true)).await.is_err() {
                        return;
                    }
                }
            }
            for i in 0..choices.len() {
                if let Some(echo) = a.echo_of(i) {
                    if send(a.object(a.kind.choice(i, Some(&echo.text), None, true), true)).await.is_err() {
                        return;
                    }
                }
            }
            let mut offsets = vec![0; choices.len()];
            let mut predicted = vec![0; choices.len()];
            // With tools, each choice's text is held to its end: it may be a call.
            let mut held = vec![String::new(); choices.len()];
            let mut totals = Totals::new(choices.per_prompt());
            loop {
                let mut event = tokio::select! {
                    e = choices.next() => e,
                    () = tx.closed() => return,
                };
                // An incomplete character ending an answer (only an answer's
                // last text can end in U+FFFD) is not streamed, as llama-server streams.
                if let Ok((_, Event::Text { text, .. })) = &mut event {
                    drop_incomplete_end(text);
                }
                let (v, last, usage) = match event {
                    Ok((i, Event::Text { text, tokens, logprobs, ids, timings: so_far, .. }))
                        if matches!(a.kind, Kind::Native) =>
                    {
                        predicted[i] += tokens;
                        let evaluated = a.native.as_ref().and_then(|o| o.prompts.get(i / a.n)).map_or(0, Vec::len);
                        let mut v = native::partial(&text, &ids, predicted[i], evaluated);
                        v["index"] = json!(i);
                        if let Some(t) = so_far {
                            v["timings"] = timings(&t);
                        }
                        if a.logprobs {
                            let post = a.native.as_ref().is_some_and(|o| o.post_sampling);
                            v["completion_probabilities"] = crate::logprobs::native(&logprobs, &a.info.tokenizer, post);
                        }
                        (v, false, None)
                    }
                    Ok((i, Event::Done { end, timings, logprobs, .. })) if matches!(a.kind, Kind::Native) => {
                        totals.add(i, &timings);
                        (a.native_end(i, "", &end, &timings, &logprobs), choices.all_done(), None)
                    }
                    Ok((i, Event::Text { text, .. })) if a.tools.is_some() => {
                        held[i].push_str(&text);
                        continue;
                    }
                    Ok((i, Event::Text { text, tokens, steps, logprobs, timings: so_far, .. })) => {
                        let mut c = a.kind.choice(i, Some(&text), None, true);
                        a.set_logprobs(&mut c, None, &logprobs, &mut offsets[i]);
                        let mut v = a.object(c, true);
                        v["hamburger"] = json!({"tokens": tokens, "macro_steps": steps});
                        if let Some(t) = so_far {
                            v["timings"] = timings(&t);
                        }
                        (v, false, None)
                    }
                    Ok((i, Event::Done { end, timings, logprobs, .. })) => {
                        totals.add(i, &timings);
                        let mut c = a.kind.choice(i, None, Some(finish_reason(end.reason)), true);
                        if let Some(tools) = &a.tools {
                            let text = std::mem::take(&mut held[i]);
                            let delta = match tools.calls(&text) {
                                Some(mut calls) => {
                                    calls[0]["index"] = json!(0);
                                    c["finish_reason"] = json!("tool_calls");
                                    json!({"tool_calls": calls})
                                }
                                None => json!({"content": text}),
                            };
                            let whole = json!({"index": i, "delta": delta, "finish_reason": null});
                            if send(a.object(whole, true)).await.is_err() {
                                return;
                            }
                        }
                        a.set_logprobs(&mut c, None, &logprobs, &mut offsets[i]);
                        let last = choices.all_done();
                        let usage = (last && include_usage).then(|| a.usage_chunk(&totals));
                        (a.finished(c, last.then_some(&totals)), last, usage)
                    }
                    Ok((i, Event::Progress { total, cache, processed, timings: so_far })) => {
                        let mut v = match a.kind {
                            Kind::Native => json!({"index": i, "content": "", "tokens": [], "stop": false}),
                            Kind::Chat | Kind::Completion => a.with_choices(json!([]), true),
                        };
                        v["prompt_progress"] = json!({"total": total, "cache": cache, "processed": processed, "time_ms": so_far.prompt_ms});
                        v["timings"] = timings(&so_far);
                        (v, false, None)
                    }
                    Ok((_, Event::Failed(_))) => unreachable!("Choices::next turns failures into errors"),
                    Err(e) => (e.body(), true, None),
                };
                for v in std::iter::once(v).chain(usage) {
                    if send(v).await.is_err() {
                        return;
                    }
                }
                if last {
                    // llama-server's native stream ends with its last object.
                    if !matches!(a.kind, Kind::Native) {
                        let _ = tx.send("[DONE]".to_string()).await;
                    }
                    return;
                }
            }
        });
        out
    }
}

/// Drops the U+FFFD that an incomplete UTF-8 character at the end of an
/// answer decodes to (one, as a lossy decode makes one of an incomplete
/// sequence; others stand for invalid bytes the model wrote, and stay).
fn drop_incomplete_end(text: &mut String) {
    if let Some(rest) = text.strip_suffix('\u{FFFD}') {
        text.truncate(rest.len());
    }
}
