//! The engine thread through its handles, on SmolLM2-HAMburger in F32 with
//! an F32 cache: a request that panics on the engine thread fails alone,
//! and a reader that stops reading gets its text paced into a bounded
//! channel while every other request goes on.

use std::time::{Duration, Instant};

use hamburger::{EngineParams, LoadOptions, SamplerParams, StepParams};
use testing::testmodel::{converted, smollm2_checkpoint};
use tokio::sync::mpsc::Receiver;

use super::{Scheduler, SchedulerConfig};
use crate::job::{event_channel, Event, FinishReason, Job, JobParams, EVENTS_PER_JOB};

fn scheduler() -> Scheduler {
    let model = converted(&smollm2_checkpoint().unwrap(), "smollm2", ggml::Type::F32, false).unwrap();
    let engine = EngineParams {
        n_ctx: 1024,
        n_seq: 2,
        kv_type: ggml::Type::F32,
        flash_attn: Some(false),
        n_threads: 2,
        ..Default::default()
    };
    let step = StepParams { confidence: 0.3, ..Default::default() };
    let cfg = SchedulerConfig {
        model,
        load: LoadOptions::default(),
        engine,
        step,
        queue: 8,
        chat_template: None,
        no_jinja: false,
        template_isolation: None,
        alias: None,
        n_predict: None,
        defaults: Default::default(),
        draft: None,
    };
    Scheduler::start(cfg).unwrap()
}

/// A greedy job of `prompt` for `n` tokens, one per macro step, past end of generation.
fn job(s: &Scheduler, prompt: &[u32], n: usize, stream: bool) -> (Job, Receiver<Event>) {
    let rule = StepParams { max_steps: 1, ..s.info.step }.rule(s.info.max_steps).unwrap();
    let params = JobParams {
        n_predict: n,
        sampler: SamplerParams::greedy(),
        logit_bias: Vec::new(),
        logprobs: None,
        post_sampling: false,
        prompt_logprobs: None,
        rule,
        stop: Vec::new(),
        ignore_eos: true,
        cache_prompt: false,
        stream,
        timings_per_token: false,
        return_progress: false,
        constraint: None,
    };
    let (events, rx) = event_channel();
    (Job { prompt: prompt.to_vec(), params, events, deadline: Instant::now() + Duration::from_secs(600) }, rx)
}

/// Every event of a job, to its end.
fn all_events(rx: &mut Receiver<Event>) -> Vec<Event> {
    let mut events = Vec::new();
    while let Some(e) = rx.blocking_recv() {
        let end = !matches!(e, Event::Text { .. });
        events.push(e);
        if end {
            break;
        }
    }
    events
}

/// The text of `events`.
fn text(events: &[Event]) -> String {
    events.iter().filter_map(|e| if let Event::Text { text, .. } = e { Some(text.as_str()) } else { None }).collect()
}

#[test]
fn a_request_that_panics_on_the_engine_thread_fails_alone() {
    let s = scheduler();
    let (faulty, ok) = ([1u32, 2, 3, 4, 5], [1u32, 2, 3, 6, 7]);
    super::fault::inject_panic(faulty.to_vec());
    let (a, mut a_rx) = job(&s, &faulty, 8, false);
    let (b, mut b_rx) = job(&s, &ok, 8, false);
    s.submitter.submit(vec![a, b]).unwrap();
    match all_events(&mut a_rx).last() {
        Some(Event::Failed(why)) => assert!(why.contains("injected fault"), "{why}"),
        other => panic!("the faulty request did not fail: {other:?}"),
    }
    let b_events = all_events(&mut b_rx);
    assert!(matches!(b_events.last(), Some(Event::Done { .. })), "the other request runs to its end");
    // The engine thread goes on serving.
    let (c, mut c_rx) = job(&s, &ok, 8, false);
    s.submitter.submit(vec![c]).unwrap();
    let c_events = all_events(&mut c_rx);
    assert!(matches!(c_events.last(), Some(Event::Done { .. })));
    assert_eq!(text(&c_events), text(&b_events));
    assert!(*s.alive.borrow());
    s.shutdown().unwrap();
}

#[test]
fn a_reader_that_stops_reading_gets_its_text_paced_into_a_bounded_channel() {
    let s = scheduler();
    let prompt = [1u32, 504, 1045, 314];
    let n = 96;
    // A stream of 96 macro steps whose reader takes nothing until the end.
    let (slow, mut slow_rx) = job(&s, &prompt, n, true);
    s.submitter.submit(vec![slow]).unwrap();
    // Meanwhile another request is served to its end.
    let (other, mut other_rx) = job(&s, &[1, 2, 3], 16, true);
    s.submitter.submit(vec![other]).unwrap();
    assert!(matches!(all_events(&mut other_rx).last(), Some(Event::Done { .. })));
    let deadline = Instant::now() + Duration::from_secs(300);
    // Its generation ends (nothing decodes any more) while it is still unread.
    while s.metrics.processing.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        assert!(Instant::now() < deadline, "the unread request did not end");
        assert!(slow_rx.len() <= EVENTS_PER_JOB, "the channel stays bounded");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(slow_rx.len() <= EVENTS_PER_JOB, "{} events wait", slow_rx.len());
    // Read at last: the text held back came in fewer events, whole.
    let events = all_events(&mut slow_rx);
    let Some(Event::Done { end, timings, .. }) = events.last() else { panic!("no end: {events:?}") };
    assert_eq!((end.reason, timings.gen_tokens, end.ids.len()), (FinishReason::Length, n, n));
    let texts = events.iter().filter(|e| matches!(e, Event::Text { .. })).count();
    assert!(texts < n, "{texts} text events for {n} macro steps: the text was held back and paced");
    let steps: usize = events.iter().map(|e| if let Event::Text { steps, .. } = e { *steps } else { 0 }).sum();
    assert!(steps <= n, "{steps} macro steps' text for {n}");

    let (whole, mut whole_rx) = job(&s, &prompt, n, false);
    s.submitter.submit(vec![whole]).unwrap();
    assert_eq!(text(&events), text(&all_events(&mut whole_rx)), "the paced stream is the whole answer");
    s.shutdown().unwrap();
}
