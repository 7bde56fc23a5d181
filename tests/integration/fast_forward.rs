//! Tokens a grammar forces join the next base forward as single-token rows,
//! in every mode and whether or not the step would have gone on: a JSON
//! schema whose every byte is fixed takes a few base forwards for the whole
//! document (at most a quarter as many as it has tokens) and gives the text
//! it gives without fast-forward. Self-verified decoding obeys a schema too
//! (drafts are masked, and the base's check sees the mask).

use hamburger::constraint::{Constraint, ConstraintSpec, Grammars, MicroPolicy};
use hamburger::tokenizer::Tokenizer;
use hamburger::{DraftParams, EngineParams, Generation, LoadOptions, Model, Session, SessionParams, StepParams};
use serde_json::json;
use testing::testmodel::{converted, smollm2_checkpoint, smollm2_trained_checkpoint};

fn open(checkpoint: &std::path::Path, stem: &str) -> Model {
    Model::open(&converted(checkpoint, stem, ggml::Type::Q8_0, false).unwrap(), &LoadOptions::default()).unwrap()
}

/// Generates under `c` with `step`, greedy.
fn generate(model: &Model, step: StepParams, c: &Constraint, prompt: &[u32]) -> Generation {
    let engine = EngineParams { n_ctx: 512, n_threads: 2, ..Default::default() };
    let mut s = Session::new(model, SessionParams { engine, step, ..Default::default() }).unwrap();
    s.set_constraint(Some(c.clone()));
    s.generate(prompt, 128, |_| true).unwrap()
}

/// The modes: one token per step, the stop head, forced k = 4, self-verified.
fn modes() -> Vec<(&'static str, StepParams)> {
    let d = StepParams::default();
    vec![
        ("one token per step", StepParams { confidence: 1.01, ..d }),
        ("confidence 0.8", d),
        ("forced k=4", StepParams { forced_steps: Some(4), ..d }),
        ("self-verified", StepParams { confidence: 1.01, draft: Some(DraftParams::default()), ..d }),
    ]
}

#[test]
fn a_fully_fixed_schema_takes_a_quarter_of_its_tokens_in_base_forwards() {
    let model = open(&smollm2_checkpoint().unwrap(), "smollm2");
    let tok = Tokenizer::from_model(&model).unwrap();
    let grammars = Grammars::new(&tok, &model.vocab.eog).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "favourite_colour": {"enum": ["ultramarine blue with a hint of green"]},
            "least_favourite_colour": {"enum": ["fluorescent pink, as on a highlighter"]}
        },
        "required": ["favourite_colour", "least_favourite_colour"],
        "additionalProperties": false
    });
    let spec = ConstraintSpec::JsonSchema(schema);
    let prompt = tok.encode("Colours as a JSON document:\n", true).unwrap();
    for (name, step) in modes() {
        let compile = |ff| grammars.compile(&spec, MicroPolicy::BestAllowed, ff).unwrap();
        let fast = generate(&model, step, &compile(true), &prompt);
        let slow = generate(&model, step, &compile(false), &prompt);
        // The document's text; which end-of-generation token closes it is the model's choice.
        let special = tok.special_ids();
        let text_of = |g: &Generation| {
            tok.decode(&g.output_ids.iter().copied().filter(|t| !special.contains(t)).collect::<Vec<_>>())
        };
        let text = text_of(&fast);
        assert_eq!(text, text_of(&slow), "{name}: the same text with and without fast-forward");
        assert!(text.starts_with("{\"favourite_colour\":\"ultramarine"), "{name}: {text:?}");
        let (tokens, forwards) = (fast.output_ids.len(), fast.timings.macro_steps);
        eprintln!(
            "{name}: {tokens} tokens in {forwards} base forwards ({} without fast-forward), {} KV entries",
            slow.timings.macro_steps, fast.timings.kv_entries
        );
        assert!(4 * forwards <= tokens, "{name}: {forwards} base forwards for {tokens} tokens");
    }
}

#[test]
fn self_verified_outputs_obey_a_schema_on_the_trained_model() {
    let model = open(&smollm2_trained_checkpoint().unwrap(), "smollm2-trained");
    let tok = Tokenizer::from_model(&model).unwrap();
    let grammars = Grammars::new(&tok, &model.vocab.eog).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
            "keywords": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}
        },
        "required": ["name", "version", "keywords"],
        "additionalProperties": false
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    let spec = ConstraintSpec::JsonSchema(schema);
    let prompt = tok
        .encode("<|im_start|>user\nDescribe a Python package as JSON.<|im_end|>\n<|im_start|>assistant\n", true)
        .unwrap();
    let one = StepParams { confidence: 1.01, ..Default::default() };
    let forced = DraftParams { n_max: Some(3), n_min: 3, ..DraftParams::default() };
    let mut rows_per_verify = Vec::new();
    for (name, draft) in
        [("gated", DraftParams::default()), ("k=3", forced), ("tree 5 k=3", DraftParams { tree: 5, ..forced })]
    {
        for ff in [true, false] {
            let c = grammars.compile(&spec, MicroPolicy::BestAllowed, ff).unwrap();
            let gen = generate(&model, StepParams { draft: Some(draft), ..one }, &c, &prompt);
            let special = tok.special_ids();
            let ids: Vec<u32> = gen.output_ids.iter().copied().filter(|t| !special.contains(t)).collect();
            let text = tok.decode(&ids);
            let value: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} ff={ff}: {e}: {text:?}"));
            assert!(validator.is_valid(&value), "{name} ff={ff}: {text}");
            let t = &gen.timings;
            rows_per_verify.push((name, ff, t.drafted as f64 / t.verify_forwards.max(1) as f64));
            eprintln!(
                "{name} ff={ff}: {} tokens in {} forwards, {} of {} drafts accepted: {text}",
                t.gen_tokens, t.macro_steps, t.draft_accepted, t.drafted
            );
        }
    }
    // A tree's siblings (tokens the mask allows) are rows beyond the chain's.
    for ff in [true, false] {
        let of = |n: &str| rows_per_verify.iter().find(|r| r.0 == n && r.1 == ff).unwrap().2;
        assert!(of("tree 5 k=3") > of("k=3") + 0.5, "ff={ff}: {rows_per_verify:?}");
    }
}
