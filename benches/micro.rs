//! Regression benchmarks of HAMburger's own pieces on SmolLM2-HAMburger Q8_0
//! (built and cached on first use): the merger alone for k = 2..4 tokens, and
//! one micro step (s = 0 with the features, s = 1 from the micro cache).
//! Run with `cargo bench --bench micro`.
#![allow(missing_docs)] // criterion_group! generates an undocumented function

use criterion::{criterion_group, criterion_main, Criterion};
use hamburger::{EngineParams, LoadOptions, Model, Session, SessionParams};
use testing::merger::StandaloneMerger;
use testing::testmodel::{converted, smollm2_checkpoint};

fn model() -> Model {
    let ck = smollm2_checkpoint().expect("SmolLM2 test checkpoint");
    Model::open(&converted(&ck, "smollm2", ggml::Type::Q8_0, false).expect("conversion"), &LoadOptions::default())
        .expect("load")
}

fn benches(c: &mut Criterion) {
    let model = model();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    for k in 2..=4 {
        let mut merger = StandaloneMerger::new(&model, k, threads).unwrap();
        let tokens: Vec<u32> = (0..k as u32).map(|i| 100 + 7 * i).collect();
        c.bench_function(&format!("merger k={k}"), |b| b.iter(|| merger.run(&tokens).unwrap()));
    }
    let p = SessionParams {
        engine: EngineParams { n_ctx: 256, n_threads: threads, ..Default::default() },
        ..Default::default()
    };
    let mut session = Session::new(&model, p).unwrap();
    session.feed(&[1, 504, 3575, 282, 4649, 314], false).unwrap();
    c.bench_function("micro step s=0 (features + t0)", |b| b.iter(|| session.micro_step(0, 7042, false).unwrap()));
    c.bench_function("micro step s=1 (cached)", |b| b.iter(|| session.micro_step(1, 30, false).unwrap()));
}

criterion_group! {
    name = micro;
    config = Criterion::default().sample_size(20);
    targets = benches
}
criterion_main!(micro);
