//! Constrained decoding (structured output): a JSON schema, a regular
//! expression or a Lark-like grammar (llguidance's syntax) compiled once per
//! request into a [`Constraint`], and a [`SeqConstraint`] per sequence that
//! masks the logits of every token of a macro step (the base's and each micro
//! token) and reports the tokens the grammar forces.
//!
//! The engine is `llguidance` (with `toktrie`), the one llama.cpp and
//! mistral.rs use; its tokenizer interface is implemented here over the
//! model's own [`Tokenizer`] (the bytes of each token come from the same
//! embedded tokenizer JSON), so no second tokenizer is loaded.

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::text::tokenizer::Tokenizer;

/// What a constraint is written in, as a request or a flag gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (OpenAI's `{"type": "json_object"}`).
    JsonObject,
    /// A JSON schema (draft 2020-12 subset llguidance supports, `$ref` included).
    JsonSchema(serde_json::Value),
    /// A regular expression the whole output must match.
    Regex(String),
    /// A grammar in llguidance's Lark-like syntax (`start: ...`).
    Lark(String),
}

impl ConstraintSpec {
    /// A `grammar` as llama.cpp users and ours write it: GBNF (some line
    /// `name ::= ...`, see [`super::gbnf`]) rewritten into Lark, else Lark.
    ///
    /// # Errors
    /// GBNF that does not parse, saying where.
    pub fn of_grammar(text: &str) -> std::result::Result<ConstraintSpec, String> {
        if super::gbnf::is_gbnf(text) {
            super::gbnf::to_lark(text).map(ConstraintSpec::Lark).map_err(|e| format!("GBNF: {e}"))
        } else {
            Ok(ConstraintSpec::Lark(text.to_string()))
        }
    }

    /// What the user gave, for error messages: `json_schema`, `regex`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonObject => "json_object",
            ConstraintSpec::JsonSchema(_) => "json_schema",
            ConstraintSpec::Regex(_) => "regex",
            ConstraintSpec::Lark(_) => "grammar",
        }
    }

    /// llguidance's grammar for this spec. JSON is compact (no free
    /// whitespace between items) unless the schema's own `x-guidance` says
    /// otherwise: whitespace is then no place for a model to wander, and
    /// more punctuation is forced.
    fn grammar(&self) -> TopLevelGrammar {
        let compact = |mut schema: serde_json::Value| {
            if let Some(obj) = schema.as_object_mut() {
                obj.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
            }
            schema
        };
        match self {
            ConstraintSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            ConstraintSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            ConstraintSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            ConstraintSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// What happens when the micro decoder's choice for tokens 2..k of a macro
/// step is forbidden by the constraint (the base's token, the first of a
/// step, is always the best allowed one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MicroPolicy {
    /// Take the micro decoder's best allowed token and go on.
    #[default]
    BestAllowed,
    /// End the macro step before the forbidden token: the next base forward
    /// picks from the allowed tokens.
    EndStep,
}

/// A constraint that failed to compile or to run.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The schema, regex or grammar does not compile (or exceeds the limits).
    #[error("{kind} does not compile: {msg}")]
    Compile {
        /// What was given: `json_schema`, `regex`, `grammar`...
        kind: &'static str,
        /// llguidance's reason, on one line.
        msg: String,
    },
    /// The model's tokenizer cannot serve constraints (no byte form of its tokens).
    #[error("the model's tokenizer cannot be used for constrained decoding: {0}")]
    Tokenizer(String),
}

/// The bounds every constraint compiles and runs under, so that a hostile
/// schema (deep nesting, huge repetition counts) costs bounded time and memory.
fn limits() -> ParserLimits {
    ParserLimits {
        max_items_in_row: 2000,
        initial_lexer_fuel: 1_000_000,
        step_lexer_fuel: 200_000,
        step_max_items: 50_000,
        max_lexer_states: 100_000,
        max_grammar_size: 200_000,
        ..ParserLimits::default()
    }
}

/// The deepest JSON schema compiled (as deep as serde_json parses a request
/// body): llguidance's schema compiler recurses per level, and thousands of
/// levels overflow a thread's stack. Its regex and Lark parsers bound their
/// own nesting.
const MAX_SCHEMA_DEPTH: usize = 128;

/// How deeply `v` nests arrays and objects (iteratively: the value may be deep).
fn depth(v: &serde_json::Value) -> usize {
    let mut stack = vec![(v, 1)];
    let mut deepest = 0;
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            serde_json::Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            serde_json::Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// llguidance's view of our tokenizer: the byte trie of the vocabulary and
/// tokenization through the model's own tokenizer.
struct TokenizerBridge {
    tok: Tokenizer,
    trie: TokTrie,
}

impl TokenizerEnv for TokenizerBridge {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tok.encode(&String::from_utf8_lossy(s), false).unwrap_or_default()
    }
}

/// The compiler of constraints for one model's tokenizer. Building it (the
/// vocabulary trie and llguidance's token slices) takes ~0.4 s for a 49k
/// vocabulary on two cores: build it once per model, when first needed.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl Grammars {
    /// A compiler over `tok`, whose generations end at any of `eog`.
    ///
    /// # Errors
    /// When the tokenizer's JSON gives no byte form of its tokens.
    pub fn new(tok: &Tokenizer, eog: &[u32]) -> Result<Grammars, ConstraintError> {
        let json: serde_json::Value =
            serde_json::from_str(tok.json()).map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
        // Ids the weights have and the tokenizer does not name: special, never allowed.
        let unnamed = |id: usize| [&[TokTrie::SPECIAL_TOKEN_MARKER][..], format!("<[{id}]>").as_bytes()].concat();
        let n_vocab = tok.n_vocab().max(words.len());
        for (id, w) in words.iter_mut().enumerate().filter(|(_, w)| w.is_empty()) {
            *w = unnamed(id);
        }
        words.extend((words.len()..n_vocab).map(unnamed));
        let eos = *eog
            .first()
            .ok_or_else(|| ConstraintError::Tokenizer("the model has no end-of-generation token".into()))?;
        let info = TokRxInfo::new(n_vocab as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eog);
        let env: TokEnv = Arc::new(TokenizerBridge { tok: tok.clone(), trie });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Grammars { factory: Arc::new(factory) })
    }

    /// Compiles `spec` into a constraint whose sequences resolve forbidden
    /// micro choices by `policy` and append forced tokens when `fast_forward`.
    ///
    /// # Errors
    /// [`ConstraintError::Compile`] naming the spec's kind, with llguidance's reason.
    pub fn compile(
        &self,
        spec: &ConstraintSpec,
        policy: MicroPolicy,
        fast_forward: bool,
    ) -> Result<Constraint, ConstraintError> {
        let kind = spec.kind();
        let one_line = |e: &dyn std::fmt::Display| ConstraintError::Compile {
            kind,
            msg: e.to_string().lines().next().unwrap_or_default().to_string(),
        };
        if let ConstraintSpec::JsonSchema(schema) = spec {
            if depth(schema) > MAX_SCHEMA_DEPTH {
                // llguidance's schema compiler recurses without a bound of its own.
                return Err(one_line(&format!("the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels")));
            }
        }
        let parser = self.factory.create_parser(spec.grammar()).map_err(|e| one_line(&e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(one_line(&e));
        }
        Ok(Constraint { matcher, policy, fast_forward, kind })
    }
}

/// A compiled constraint in its initial state: each sequence constrained by
/// it gets its own [`SeqConstraint`] from [`Constraint::start`].
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    policy: MicroPolicy,
    fast_forward: bool,
    kind: &'static str,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("kind", &self.kind).field("policy", &self.policy).finish()
    }
}

impl Constraint {
    /// A matcher for one sequence, at the start of its output.
    pub fn start(&self) -> SeqConstraint {
        SeqConstraint {
            matcher: self.matcher.deep_clone(),
            policy: self.policy,
            fast_forward: self.fast_forward,
            consumed: 0,
        }
    }
}

/// One sequence's matcher: which tokens may come next, given those committed.
pub struct SeqConstraint {
    matcher: Matcher,
    policy: MicroPolicy,
    fast_forward: bool,
    /// Tokens the matcher consumed (what a [`SeqConstraint::rollback_to`] counts back).
    consumed: usize,
}

impl SeqConstraint {
    /// Sets the logits of forbidden tokens to minus infinity. A matcher that
    /// stopped (the grammar is complete) or failed allows end-of-generation only.
    pub fn mask(&mut self, logits: &mut [f32]) {
        let mask = match self.matcher.compute_mask_or_eos() {
            Ok(m) => m,
            Err(e) => {
                log::warn!("constraint failed, ending the output: {e}");
                self.matcher.tok_env().map(|env| env.tok_trie().eos_token_set()).unwrap_or_default()
            }
        };
        for (i, l) in logits.iter_mut().enumerate() {
            if !mask.get(i) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Whether `token` may come next.
    pub fn allows(&mut self, token: u32) -> bool {
        self.matcher.compute_mask_or_eos().is_ok_and(|m| m.get(token as usize))
    }

    /// Records `token` as the output's next one (the end-of-generation token
    /// after a complete output, the only one then allowed, changes nothing).
    pub fn commit(&mut self, token: u32) {
        if self.matcher.is_stopped() {
            return;
        }
        match self.matcher.consume_token(token) {
            Ok(()) => self.consumed += 1,
            Err(e) => log::warn!("constraint rejected token {token}: {e}"),
        }
    }

    /// A mark of the tokens committed so far, to roll back to (drafted
    /// tokens are committed to compute the masks of the tokens after them,
    /// and taken back before the base checks them).
    pub fn mark(&self) -> usize {
        self.consumed
    }

    /// Takes back the tokens committed since `mark`.
    pub fn rollback_to(&mut self, mark: usize) {
        let n = self.consumed.saturating_sub(mark);
        if n == 0 {
            return;
        }
        match self.matcher.rollback(n) {
            Ok(()) => self.consumed = mark,
            Err(e) => log::warn!("constraint could not take back {n} drafted tokens: {e}"),
        }
    }

    /// The tokens the grammar forces next (the only ones allowed), already
    /// committed; empty when fast-forward is off or nothing is forced.
    pub fn take_forced(&mut self, room: usize) -> Vec<u32> {
        if !self.fast_forward || room == 0 || self.matcher.is_stopped() {
            return Vec::new();
        }
        let mut forced = self.matcher.compute_ff_tokens();
        forced.truncate(room);
        if self.matcher.consume_tokens(&forced).is_err() {
            return Vec::new();
        }
        self.consumed += forced.len();
        forced
    }

    /// What happens when the micro decoder's choice is forbidden.
    pub fn policy(&self) -> MicroPolicy {
        self.policy
    }
}
