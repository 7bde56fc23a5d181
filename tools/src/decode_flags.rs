//! The decoding flags every tool that decodes shares, flattened into its
//! arguments: how macro steps end (`DecodeArgs`), self-verified and
//! draft-model speculative decoding as llama.cpp spells them (`SpecArgs`,
//! `DraftModelArgs`), and sampling (`SamplingArgs`).

use hamburger::draft::SpecType;
use hamburger::{DraftParams, ParamError, SamplerParams, StepParams};

use crate::cli::finite;

/// How macro steps end: the stop rule's flags every tool that decodes shares.
#[derive(clap::Args, Debug, Clone)]
pub struct DecodeArgs {
    /// Stop a macro step when 1 - p_stop < C; lower means more tokens per step
    /// (faster, further from the base), 1 or more one token per step, decoded
    /// as the base stored in the GGUF (tuned layers and adapters included).
    /// Default: the model's recommended confidence
    /// (hamburger.recommended_confidence) when it has one, else 0.8.
    #[arg(long, value_parser = finite, allow_negative_numbers = true)]
    pub confidence: Option<f32>,
    /// Most tokens per macro step (0: the model's).
    #[arg(long, default_value_t = StepParams::default().max_steps)]
    pub max_steps: usize,
}

impl DecodeArgs {
    /// Takes the model's `recommended` confidence when none was asked for.
    pub fn default_from_model(&mut self, recommended: Option<f32>) {
        self.confidence = self.confidence.or(recommended);
    }

    /// The confidence asked for, else the model's (see [`DecodeArgs::default_from_model`]), else the library's default.
    pub fn confidence(&self) -> f32 {
        self.confidence.unwrap_or(StepParams::default().confidence)
    }

    /// The stop rule's settings these flags ask for, with `forced_steps`
    /// (a tool's own flag: one value, or a benchmark's list) and checked when
    /// resolved against a model.
    pub fn step_params(&self, forced_steps: Option<usize>) -> StepParams {
        StepParams { confidence: self.confidence(), max_steps: self.max_steps, forced_steps, draft: None }
    }
}

/// Speculative decoding's flags, as llama.cpp spells them.
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// none: HAMburger's macro steps (one KV entry per step, the micro
    /// decoder's tokens kept as the stop head allows); draft-mtp:
    /// self-verified (the micro decoder drafts, the base checks every token:
    /// the base's output, one KV entry per token); draft-simple: a draft
    /// model (-md); ngram-simple,draft-mtp: self-verified, the context
    /// drafting first (the tokens that followed the last
    /// --spec-ngram-simple-size-n tokens where they occurred before), the
    /// micro decoder where it has no match. Other llama.cpp types are refused.
    #[arg(long, default_value = "none", value_parser = SpecType::parse)]
    pub spec_type: SpecType,
    /// ngram-simple: the context's last N tokens are looked up (default 2).
    #[arg(long, alias = "spec-ngram-size-n", value_name = "N")]
    pub spec_ngram_simple_size_n: Option<usize>,
    /// The most tokens drafted per verify forward (self-verified, default:
    /// the model's max_steps - 1, the most its micro decoder drafts; with
    /// -md, default 3, llama.cpp's).
    #[arg(long)]
    pub spec_draft_n_max: Option<usize>,
    /// Self-verified: tokens drafted at every step whatever the gate says;
    /// with -md: fewer drafted tokens than this are not verified (default 0).
    #[arg(long)]
    pub spec_draft_n_min: Option<usize>,
    /// A drafted token less likely than this under the drafter (the micro
    /// decoder, or -md's model) ends the draft (default 0).
    #[arg(long, alias = "draft-p-min", value_parser = finite, allow_negative_numbers = true)]
    pub spec_draft_p_min: Option<f32>,
    /// Self-verified: verify a tree of up to N drafts, the micro decoder's
    /// chain and the likeliest alternatives to its tokens (greedy or
    /// sampling, under a grammar too; more rows per verify forward, no
    /// more micro steps: worth it where rows are cheap; under the draft gate
    /// a sibling joins only where its row pays). 0: the chain alone
    /// (default).
    #[arg(long, value_name = "N")]
    pub spec_draft_tree: Option<usize>,
}

impl SpecArgs {
    /// The self-verified drafts these flags ask for (`None`: macro steps);
    /// checked against a model when the step rule is resolved.
    ///
    /// # Errors
    /// `draft-simple` without a draft model (`draft_model`: whether `-md`
    /// was given). Draft flags with neither `--spec-type draft-mtp` nor a
    /// draft model are accepted with a warning, as llama.cpp's tools take them.
    pub fn draft(&self, draft_model: bool) -> anyhow::Result<Option<DraftParams>> {
        match self.spec_type {
            SpecType::SelfVerified { ngram: false } if self.spec_ngram_simple_size_n.is_some() => {
                anyhow::bail!(
                    "--spec-ngram-simple-size-n applies where the context drafts: --spec-type ngram-simple,draft-mtp"
                )
            }
            SpecType::SelfVerified { ngram } => Ok(Some(DraftParams {
                n_max: self.spec_draft_n_max,
                n_min: self.spec_draft_n_min.unwrap_or(0),
                p_min: self.spec_draft_p_min.unwrap_or(0.0),
                ngram: ngram.then(|| self.spec_ngram_simple_size_n.unwrap_or(hamburger::ngram::DEFAULT_SIZE)),
                tree: self.spec_draft_tree.unwrap_or(0),
            })),
            SpecType::DraftModel if !draft_model => {
                anyhow::bail!("--spec-type draft-simple needs a draft model (-md, --model-draft)")
            }
            _ if draft_model => Ok(None),
            _ => {
                let given = [
                    ("--spec-draft-n-max", self.spec_draft_n_max.is_some()),
                    ("--spec-draft-n-min", self.spec_draft_n_min.is_some()),
                    ("--spec-draft-p-min", self.spec_draft_p_min.is_some()),
                    ("--spec-draft-tree", self.spec_draft_tree.is_some()),
                    ("--spec-ngram-simple-size-n", self.spec_ngram_simple_size_n.is_some()),
                ];
                // Accepted with a warning, as llama.cpp's tools take them
                // without a drafter (a launch script that turns drafting off).
                for (flag, _) in given.iter().filter(|g| g.1) {
                    log::warn!(
                        "{flag} has no effect: macro steps draft nothing (drafts come with --spec-type draft-mtp, or a draft model)"
                    );
                }
                Ok(None)
            }
        }
    }
}

/// Speculative decoding with a draft model: llama.cpp's `-md` (its
/// `--spec-draft-*` flags are [`SpecArgs`]'s, shared with self-verified
/// decoding).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DraftModelArgs {
    /// A draft model (also -md, --spec-draft-model): a HAMburger (or llama)
    /// GGUF of -m's vocabulary whose macro steps -m verifies, several rows
    /// per forward; the output is -m's own (greedy token for token, sampled
    /// in distribution).
    #[arg(long = "model-draft", alias = "spec-draft-model")]
    pub model_draft: Option<std::path::PathBuf>,
}

impl DraftModelArgs {
    /// The draft model's settings (`None`: no draft model), from `spec`'s
    /// `--spec-draft-*` flags with llama.cpp's defaults (3, 0, 0), for
    /// forwards of `n_batch` inputs.
    ///
    /// # Errors
    /// A value out of range, or `--spec-type draft-mtp` beside `-md`.
    pub fn params(
        &self,
        spec: &SpecArgs,
        n_batch: usize,
    ) -> anyhow::Result<Option<hamburger::draft_model::DraftModelParams>> {
        if self.model_draft.is_none() {
            return Ok(None);
        }
        if matches!(spec.spec_type, SpecType::SelfVerified { .. }) {
            anyhow::bail!(
                "--spec-type draft-mtp drafts with -m's own micro decoder, -md with a draft model: give one of them"
            );
        }
        if spec.spec_draft_tree.is_some() {
            anyhow::bail!("--spec-draft-tree verifies the micro decoder's drafts (--spec-type draft-mtp), not -md's");
        }
        let d = hamburger::draft_model::DraftModelParams::default();
        let p = hamburger::draft_model::DraftModelParams {
            n_max: spec.spec_draft_n_max.unwrap_or(d.n_max),
            n_min: spec.spec_draft_n_min.unwrap_or(d.n_min),
            p_min: spec.spec_draft_p_min.unwrap_or(d.p_min),
        };
        p.validate(n_batch)?;
        Ok(Some(p))
    }
}

/// Sampling: the flags of the tools that sample (llama-cli's names and defaults).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature (0: greedy).
    #[arg(long, default_value_t = SamplerParams::default().temp, value_parser = finite, allow_negative_numbers = true)]
    pub temp: f32,
    /// Top-k sampling (0: off).
    #[arg(long, default_value_t = SamplerParams::default().top_k)]
    pub top_k: usize,
    /// Top-p sampling, 0 to 1 (1: off; 0: the most likely token).
    #[arg(long, default_value_t = SamplerParams::default().top_p, value_parser = finite, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Min-p sampling (0: off).
    #[arg(long, default_value_t = SamplerParams::default().min_p, value_parser = finite, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repeat penalty (1: off).
    #[arg(long, default_value_t = SamplerParams::default().repeat_penalty, value_parser = finite, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// Tokens the repeat penalty looks back.
    #[arg(long, default_value_t = SamplerParams::default().repeat_last_n)]
    pub repeat_last_n: usize,
    /// Presence penalty, -2 to 2 (0: off), over the last --repeat-last-n
    /// tokens, on every token of a macro step.
    #[arg(long, default_value_t = SamplerParams::default().presence_penalty, value_parser = finite, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Frequency penalty, -2 to 2 (0: off), as --presence-penalty.
    #[arg(long, default_value_t = SamplerParams::default().frequency_penalty, value_parser = finite, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Sampling seed (default: random).
    #[arg(long, short = 's')]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler settings these flags ask for (a random seed unless given).
    ///
    /// # Errors
    /// A value out of range ([`SamplerParams::validate`]).
    pub fn sampler_params(&self) -> Result<SamplerParams, ParamError> {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        });
        let p = SamplerParams {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
        };
        p.validate()?;
        Ok(p)
    }
}
