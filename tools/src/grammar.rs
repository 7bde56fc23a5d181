//! Structured-output flags (llama-cli's `--grammar`, `--grammar-file`,
//! `--json-schema`, `--json-schema-file`) and what they compile to.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use hamburger::constraint::{Constraint, ConstraintSpec, Grammars, MicroPolicy};
use hamburger::tokenizer::Tokenizer;

/// What a forbidden micro-decoder choice does (`--grammar-micro`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroChoice {
    /// Take the micro decoder's best allowed token.
    Best,
    /// End the macro step before the forbidden token.
    EndStep,
}

/// The constraint flags of the tools that generate.
#[derive(clap::Args, Debug, Clone)]
pub struct GrammarArgs {
    /// Constrain the output by a grammar: GBNF as llama.cpp takes it
    /// (`root ::= ...`) or llguidance's Lark-like syntax (`start: ...`).
    #[arg(long, conflicts_with_all = ["grammar_file", "json_schema", "json_schema_file"])]
    pub grammar: Option<String>,
    /// Read --grammar from a file.
    #[arg(long, conflicts_with_all = ["json_schema", "json_schema_file"])]
    pub grammar_file: Option<PathBuf>,
    /// Constrain the output to JSON matching this JSON schema (`{}`: any JSON object).
    #[arg(long, short = 'j', conflicts_with = "json_schema_file")]
    pub json_schema: Option<String>,
    /// Read --json-schema from a file (also -jf).
    #[arg(long)]
    pub json_schema_file: Option<PathBuf>,
    /// When the micro decoder picks a token the constraint forbids: take its
    /// best allowed token, or end the macro step there.
    #[arg(long, value_enum, default_value_t = MicroChoice::Best)]
    pub grammar_micro: MicroChoice,
    /// Do not append the tokens a constraint forces to the current macro step.
    #[arg(long)]
    pub no_grammar_fast_forward: bool,
}

impl GrammarArgs {
    /// Whether any constraint flag is given.
    pub fn is_set(&self) -> bool {
        self.grammar.is_some()
            || self.grammar_file.is_some()
            || self.json_schema.is_some()
            || self.json_schema_file.is_some()
    }

    /// The constraint these flags ask for, compiled for `tok`'s model
    /// (ending at `eog`); without one, a JSON object.
    ///
    /// # Errors
    /// Naming the flag: an unreadable file, a schema that is not JSON, or a
    /// schema or grammar that does not compile.
    pub fn constraint(&self, tok: &Tokenizer, eog: &[u32]) -> Result<Constraint> {
        let grammar =
            |text: &str, flag: &str| ConstraintSpec::of_grammar(text).map_err(|e| anyhow::anyhow!("{flag}: {e}"));
        let read =
            |p: &PathBuf, flag: &str| std::fs::read_to_string(p).with_context(|| format!("{flag} {}", p.display()));
        let (spec, flag) = match (&self.grammar, &self.grammar_file, &self.json_schema, &self.json_schema_file) {
            (Some(g), ..) => (grammar(g, "--grammar")?, "--grammar"),
            (_, Some(f), ..) => (grammar(&read(f, "--grammar-file")?, "--grammar-file")?, "--grammar-file"),
            (_, _, Some(s), _) => (schema(s, "--json-schema")?, "--json-schema"),
            (_, _, _, Some(f)) => {
                (schema(&read(f, "--json-schema-file")?, "--json-schema-file")?, "--json-schema-file")
            }
            _ => (ConstraintSpec::JsonObject, "--json-schema"),
        };
        let policy = match self.grammar_micro {
            MicroChoice::Best => MicroPolicy::BestAllowed,
            MicroChoice::EndStep => MicroPolicy::EndStep,
        };
        let grammars = Grammars::new(tok, eog)?;
        grammars.compile(&spec, policy, !self.no_grammar_fast_forward).with_context(|| flag.to_string())
    }
}

/// A JSON schema flag's value: `{}` is any JSON object, as in llama-cli.
fn schema(text: &str, flag: &str) -> Result<ConstraintSpec> {
    let value: serde_json::Value = serde_json::from_str(text).with_context(|| format!("{flag}: not JSON"))?;
    Ok(match value.as_object() {
        Some(o) if o.is_empty() => ConstraintSpec::JsonObject,
        _ => ConstraintSpec::JsonSchema(value),
    })
}
