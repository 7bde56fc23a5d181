//! Constrained decoding on multi-token macro steps: JSON schemas of real
//! projects' shapes, regular expressions and Lark grammars hold for every
//! token of a step (the base's and each micro token) on SmolLM2 with random
//! grafted modules at forced k = 4; forced tokens ride in steps; a schema that does not
//! compile, or a hostile one, is an error naming it.

use std::path::Path;
use std::time::Instant;

use hamburger::constraint::{ConstraintError, ConstraintSpec, Grammars, MicroPolicy};
use hamburger::tokenizer::Tokenizer;
use hamburger::{EngineParams, LoadOptions, Model, Session, SessionParams, StepParams};
use serde_json::json;
use testing::testmodel::{converted, smollm2_checkpoint, smollm2_trained_checkpoint};

fn open(checkpoint: &Path, stem: &str) -> Model {
    Model::open(&converted(checkpoint, stem, ggml::Type::Q8_0, false).unwrap(), &LoadOptions::default()).unwrap()
}

fn session<'m>(model: &'m Model, step: StepParams) -> Session<'m> {
    let engine = EngineParams { n_ctx: 1024, n_threads: 2, ..Default::default() };
    Session::new(model, SessionParams { engine, step, ..Default::default() }).unwrap()
}

/// Schemas shaped like real projects' documents: a package manifest
/// (pattern, enum, optional fields, bounded array), an issue tracker's issue
/// (`$ref` to a shared definition, nested objects, array of objects, bounded
/// integers), and a sensor reading (bounded numbers, nested array of objects).
fn schemas() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        (
            "package",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "version": {"type": "string", "pattern": "^[0-9]{1,2}\\.[0-9]{1,2}\\.[0-9]{1,2}$"},
                    "private": {"type": "boolean"},
                    "license": {"enum": ["MIT", "Apache-2.0", "GPL-3.0"]},
                    "keywords": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}
                },
                "required": ["name", "version", "license"],
                "additionalProperties": false
            }),
        ),
        (
            "issue",
            json!({
                "$defs": {
                    "user": {
                        "type": "object",
                        "properties": {
                            "login": {"type": "string", "maxLength": 16},
                            "id": {"type": "integer", "minimum": 1, "maximum": 99999}
                        },
                        "required": ["login", "id"],
                        "additionalProperties": false
                    }
                },
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 40},
                    "state": {"enum": ["open", "closed"]},
                    "author": {"$ref": "#/$defs/user"},
                    "assignees": {"type": "array", "items": {"$ref": "#/$defs/user"}, "maxItems": 2},
                    "comments": {"type": "integer", "minimum": 0, "maximum": 999}
                },
                "required": ["title", "state", "author"],
                "additionalProperties": false
            }),
        ),
        (
            "reading",
            json!({
                "type": "object",
                "properties": {
                    "station": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "maxLength": 20},
                            "elevation": {"type": "integer", "minimum": -400, "maximum": 9000}
                        },
                        "required": ["name"],
                        "additionalProperties": false
                    },
                    "latitude": {"type": "integer", "minimum": -90, "maximum": 90},
                    "longitude": {"type": "integer", "minimum": -180, "maximum": 180},
                    "readings": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"t": {"type": "integer", "minimum": -60, "maximum": 60}, "unit": {"enum": ["C", "F"]}},
                            "required": ["t", "unit"],
                            "additionalProperties": false
                        },
                        "minItems": 1,
                        "maxItems": 3
                    }
                },
                "required": ["station", "latitude", "longitude", "readings"],
                "additionalProperties": false
            }),
        ),
    ]
}

/// What one constrained generation gave: its text and figures.
struct Outcome {
    text: String,
    /// Base forwards the answer took (macro steps).
    forwards: usize,
    tokens_per_step: f64,
    tokens_per_second: f64,
    step_ms: f64,
    /// Mean cost of masking the logits and committing one token, replayed.
    mask_us: f64,
}

/// Generates under `c` after `prompt`.
fn generate(s: &mut Session, tok: &Tokenizer, c: hamburger::constraint::Constraint, prompt: &str) -> Outcome {
    s.clear();
    s.set_constraint(Some(c.clone()));
    let ids = tok.encode(prompt, true).unwrap();
    let gen = s.generate(&ids, 240, |_| true).unwrap();
    let special = tok.special_ids();
    let ids: Vec<u32> = gen.output_ids.iter().copied().filter(|t| !special.contains(t)).collect();
    let mut replay = c.start();
    let mut logits = vec![0.0f32; tok.n_vocab()];
    let started = Instant::now();
    for &t in &gen.output_ids {
        replay.mask(&mut logits);
        replay.commit(t);
    }
    let t = &gen.timings;
    Outcome {
        text: tok.decode(&ids),
        forwards: t.macro_steps,
        tokens_per_step: gen.output_ids.len() as f64 / gen.macro_steps.len() as f64,
        tokens_per_second: t.gen_tokens as f64 / (t.gen_ms / 1e3),
        step_ms: t.gen_ms / t.macro_steps as f64,
        mask_us: started.elapsed().as_secs_f64() * 1e6 / gen.output_ids.len() as f64,
    }
}

/// Every schema's outputs parse and validate, under both micro policies and
/// with and without forced-token fast-forward.
fn json_outputs_validate(model: &Model, step: StepParams) {
    let tok = Tokenizer::from_model(model).unwrap();
    let grammars = Grammars::new(&tok, &model.vocab.eog).unwrap();
    let mut s = session(model, step);
    for (name, schema) in schemas() {
        let validator = jsonschema::validator_for(&schema).unwrap();
        for policy in [MicroPolicy::BestAllowed, MicroPolicy::EndStep] {
            for ff in [true, false] {
                let c = grammars.compile(&ConstraintSpec::JsonSchema(schema.clone()), policy, ff).unwrap();
                let prompt = format!("A {name} as a JSON document:\n");
                let o = generate(&mut s, &tok, c, &prompt);
                let text = o.text;
                let value: serde_json::Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} {policy:?} ff={ff}: {e}: {text:?}"));
                let errors: Vec<String> = validator.iter_errors(&value).map(|e| e.to_string()).collect();
                assert!(errors.is_empty(), "{name} {policy:?} ff={ff}: {text} violates {errors:?}");
                eprintln!(
                    "{name} {policy:?} ff={ff}: {} base forwards, {:.2} tokens/step, {:.1} tok/s, {:.1} ms/step, mask {:.0} us/token: {text}",
                    o.forwards, o.tokens_per_step, o.tokens_per_second, o.step_ms, o.mask_us
                );
            }
        }
    }
}

/// The trained SmolLM2-HAMburger (the shipped grafted modules) at the
/// confidence its GGUF recommends: the micro decoder's own choices, not
/// forced ones, meet the mask.
#[test]
fn json_schemas_hold_on_the_trained_model_at_its_recommended_confidence() {
    let path = converted(&smollm2_trained_checkpoint().unwrap(), "smollm2-trained", ggml::Type::Q8_0, false).unwrap();
    let confidence = hamburger::model::recommended_confidence_of(&path).unwrap().expect("a recommended confidence");
    let model = Model::open(&path, &LoadOptions::default()).unwrap();
    json_outputs_validate(&model, StepParams { confidence, ..Default::default() });
}

#[test]
fn json_schemas_hold_on_random_grafted_modules_at_forced_k4() {
    let model = open(&smollm2_checkpoint().unwrap(), "smollm2");
    json_outputs_validate(&model, StepParams { forced_steps: Some(4), ..Default::default() });
}

#[test]
fn regex_and_lark_outputs_match_at_forced_k4() {
    let model = open(&smollm2_checkpoint().unwrap(), "smollm2");
    let tok = Tokenizer::from_model(&model).unwrap();
    let grammars = Grammars::new(&tok, &model.vocab.eog).unwrap();
    let mut s = session(&model, StepParams { forced_steps: Some(4), ..Default::default() });
    let date = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])";
    let c = grammars.compile(&ConstraintSpec::Regex(date.into()), MicroPolicy::BestAllowed, true).unwrap();
    let text = generate(&mut s, &tok, c, "The date of the meeting is ").text;
    assert!(regex::Regex::new(&format!("^{date}$")).unwrap().is_match(&text), "{text:?}");
    let lark = r#"start: answer " because " reason
answer: "yes" | "no"
reason: /[a-z ]{1,30}/ "."
"#;
    let c = grammars.compile(&ConstraintSpec::Lark(lark.into()), MicroPolicy::EndStep, true).unwrap();
    let text = generate(&mut s, &tok, c, "Is the sky blue? Answer:").text;
    assert!(regex::Regex::new(r"^(yes|no) because [a-z ]{1,30}\.$").unwrap().is_match(&text), "{text:?}");
}

/// A schema of arrays nested `depth` deep.
fn nested(depth: usize) -> serde_json::Value {
    (0..depth).fold(json!({"type": "integer"}), |inner, _| json!({"type": "array", "items": inner}))
}

#[test]
fn bad_and_hostile_constraints_are_errors_naming_them() {
    let model = open(&smollm2_checkpoint().unwrap(), "smollm2");
    let tok = Tokenizer::from_model(&model).unwrap();
    let grammars = Grammars::new(&tok, &model.vocab.eog).unwrap();
    let compile = |spec: ConstraintSpec| grammars.compile(&spec, MicroPolicy::BestAllowed, true);
    let cases = [
        (ConstraintSpec::JsonSchema(json!({"type": "nonsense"})), "json_schema does not compile"),
        (ConstraintSpec::Regex("(unclosed".into()), "regex does not compile"),
        (ConstraintSpec::Lark("start: missing_rule".into()), "grammar does not compile"),
        // Nesting: llguidance's regex and Lark parsers bound it, our schema check too.
        (ConstraintSpec::JsonSchema(nested(2000)), "json_schema does not compile"),
        (ConstraintSpec::Regex(format!("{}a{}", "(".repeat(2000), ")".repeat(2000))), "regex does not compile"),
        (
            ConstraintSpec::Lark(format!("start: {}\"a\"{}", "(".repeat(2000), ")".repeat(2000))),
            "grammar does not compile",
        ),
    ];
    for (spec, want) in cases {
        match compile(spec.clone()) {
            Err(e @ ConstraintError::Compile { .. }) => {
                let text = e.to_string();
                assert!(text.starts_with(want) && !text.contains('\n'), "{spec:?}: {text}");
            }
            other => panic!("{spec:?}: expected a compile error, got {:?}", other.map(|_| ())),
        }
    }
    // Hostile ones: refused by the limits, or compiled lazily (llguidance's
    // regexes are derivatives, built as the output goes) and then masked
    // within the per-token fuel.
    let wide = json!({"type": "object", "properties": (0..5000).map(|i| (format!("k{i}"), json!({"type": "string"}))).collect::<serde_json::Map<_, _>>(), "required": (0..5000).map(|i| format!("k{i}")).collect::<Vec<_>>()});
    for spec in [
        ConstraintSpec::JsonSchema(nested(60)),
        ConstraintSpec::JsonSchema(wide),
        ConstraintSpec::Regex("(a{1000}){1000}".into()),
        ConstraintSpec::Regex("((a|b)*c{1,100000}){1,100000}".into()),
        ConstraintSpec::Lark(format!(
            "start: {}",
            (0..3000).map(|i| format!("\"w{i}\"")).collect::<Vec<_>>().join(" | ")
        )),
    ] {
        let started = Instant::now();
        match compile(spec.clone()) {
            Err(e) => eprintln!("{}: refused in {:?}: {e}", spec.kind(), started.elapsed()),
            Ok(c) => {
                let mut logits = vec![0.0f32; model.hp.n_vocab];
                c.start().mask(&mut logits);
                let allowed = logits.iter().filter(|l| l.is_finite()).count();
                eprintln!("{}: compiled and masked in {:?}: {allowed} tokens allowed", spec.kind(), started.elapsed());
            }
        }
    }
}

/// An end-of-generation token committed after the output is complete (what
/// the mask then allows, again and again) leaves the matcher usable: it
/// still allows ending, instead of failing (and logging a rejected token).
#[test]
fn end_tokens_after_a_complete_output_keep_the_matcher_usable() {
    let path = converted(&smollm2_trained_checkpoint().unwrap(), "smollm2-trained", ggml::Type::Q8_0, false).unwrap();
    let model = Model::open(&path, &LoadOptions::default()).unwrap();
    let tok = Tokenizer::from_model(&model).unwrap();
    let grammars = Grammars::new(&tok, &model.vocab.eog).unwrap();
    let mut s =
        grammars.compile(&ConstraintSpec::Regex("yes".into()), MicroPolicy::BestAllowed, false).unwrap().start();
    for t in tok.encode("yes", false).unwrap() {
        assert!(s.allows(t));
        s.commit(t);
    }
    let eog = model.vocab.eog[0];
    for _ in 0..3 {
        assert!(s.allows(eog), "the end token is refused after a complete output");
        s.commit(eog);
    }
}
