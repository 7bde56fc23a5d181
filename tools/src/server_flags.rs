//! llama-server's launch flags that `hamburger-server` takes besides its
//! own: the ones it honours as llama-server does (sampling defaults,
//! `--seed`, `--slots`, `--metrics`, `--kv-unified`, `--cors-origins`,
//! `--alias a,b`, `--tags`, ...), the ones that ask for what is already so
//! here (`--cont-batching`, `--offline`, ...), and the ones
//! refused by design, each refusal one line naming the flag and why.

use crate::cli::finite;

/// The flags llama-server's launch scripts pass, honoured or accepted.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LlamaServerArgs {
    /// Serve `/slots` (the default, as llama-server's).
    #[arg(long, overrides_with = "no_slots")]
    pub slots: bool,
    /// Answer `/slots` with 501.
    #[arg(long)]
    pub no_slots: bool,
    /// Serve `/metrics` (Prometheus; otherwise 501, as llama-server).
    #[arg(long)]
    pub metrics: bool,
    /// Give every request the whole KV pool as its context; without it, and
    /// with an explicit -np, a request's context is -c / -np cells, as
    /// llama-server's slots (with -np auto the pool is unified, as there).
    #[arg(long = "kv-unified", visible_alias = "kvu")]
    pub kv_unified: bool,
    /// Origins whose browsers may call the API, comma-separated (`localhost`:
    /// the loopback hosts on any port; default: any origin, as llama-server).
    #[arg(long)]
    pub cors_origins: Option<String>,
    /// Tags of the model in `/v1/models`, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub tags: Vec<String>,
    /// Answer every request's prompt, as the model reads it, in
    /// `__verbose` (llama-server's); RUST_LOG=debug logs more. Also -v.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Accepted: requests are always batched continuously. Also -cb.
    #[arg(long = "cont-batching")]
    pub cont_batching: bool,
    /// Accepted: nothing is ever downloaded.
    #[arg(long)]
    pub offline: bool,
    /// Render the chat template as the built-in template (chatml, llama2,
    /// llama3, command-r) llama.cpp detects it as, not as Jinja; a template
    /// that is none of them is refused.
    #[arg(long)]
    pub no_jinja: bool,
    /// Accepted: no model here has sliding-window attention.
    #[arg(long)]
    pub swa_full: bool,
    /// Accepted: prompt prefixes are always reused from the KV pool's
    /// cells (`cache_prompt`); shifted chunks are not.
    #[arg(long)]
    pub cache_reuse: Option<usize>,
    /// Accepted: cached prompts live in the KV pool's cells (-c), not in a
    /// separate host-memory cache.
    #[arg(long, allow_negative_numbers = true)]
    pub cache_ram: Option<i64>,
    /// Accepted: a full context ends a generation (no context shift), so
    /// no tokens are kept across one.
    #[arg(long, allow_negative_numbers = true)]
    pub keep: Option<i64>,
    /// Accepted: sampling runs on the CPU after each forward, from the same
    /// distribution llama-server's backend sampling draws from.
    #[arg(long = "backend_sampling", visible_alias = "backend-sampling")]
    pub backend_sampling: bool,
    /// Accepted: idle slots' prompts stay in the pool until it needs their cells.
    #[arg(long)]
    pub no_cache_idle_slots: bool,
    /// How reasoning is parsed: none, deepseek or auto. The chat models
    /// served here do not reason, so every value answers plain content.
    #[arg(long, value_parser = ["none", "deepseek", "deepseek-legacy", "auto"])]
    pub reasoning_format: Option<String>,
    /// Whether reasoning is on: on, off or auto (as --reasoning-format).
    #[arg(long, value_parser = ["on", "off", "auto"])]
    pub reasoning: Option<String>,
    /// -fa, -ctk, -ctv, -ub.
    #[command(flatten)]
    pub kv: crate::cli::KvArgs,
    /// Default temperature of requests that set none (0: greedy).
    #[arg(long, value_parser = finite, allow_negative_numbers = true)]
    pub temp: Option<f32>,
    /// Default top-k (0: off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Default top-p (1: off).
    #[arg(long, value_parser = finite)]
    pub top_p: Option<f32>,
    /// Default min-p (0: off).
    #[arg(long, value_parser = finite)]
    pub min_p: Option<f32>,
    /// Default repeat penalty (1: off).
    #[arg(long, value_parser = finite)]
    pub repeat_penalty: Option<f32>,
    /// Default tokens the penalties look back at.
    #[arg(long)]
    pub repeat_last_n: Option<usize>,
    /// Default presence penalty.
    #[arg(long, value_parser = finite, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Default frequency penalty.
    #[arg(long, value_parser = finite, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Seed of requests that set none (-1, the default: a random one each). Also -s.
    #[arg(long, short = 's', default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
    /// The flags refused by design.
    #[command(flatten)]
    pub refused: RefusedServerArgs,
}

impl LlamaServerArgs {
    /// The sampling defaults these flags ask for, over the library's.
    ///
    /// # Errors
    /// A value out of range ([`hamburger::SamplerParams::validate`]), or a seed below -1.
    pub fn sampler(&self) -> anyhow::Result<(hamburger::SamplerParams, Option<u64>)> {
        let d = hamburger::SamplerParams::default();
        let p = hamburger::SamplerParams {
            temp: self.temp.unwrap_or(d.temp),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: self.repeat_last_n.unwrap_or(d.repeat_last_n),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            seed: 0,
        };
        p.validate()?;
        let seed = match self.seed {
            -1 => None,
            s => {
                Some(u64::try_from(s).map_err(|_| anyhow::anyhow!("--seed {s}: expected -1 (random) or a seed >= 0"))?)
            }
        };
        Ok((p, seed))
    }

    /// The variables every chat template render gets: `enable_thinking`,
    /// false with `--reasoning off`, else true (as llama-server sets it).
    pub fn template_kwargs(&self) -> serde_json::Map<String, serde_json::Value> {
        let thinking = self.reasoning.as_deref() != Some("off");
        serde_json::Map::from_iter([("enable_thinking".to_string(), serde_json::Value::Bool(thinking))])
    }
}

/// llama-server flags for features this server does not have: parsed so
/// that the error says why in one line.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RefusedServerArgs {
    /// Not supported: requests are always batched continuously. Also -nocb.
    #[arg(long = "no-cont-batching", hide = true)]
    pub no_cont_batching: bool,
    /// Not supported: a full context ends a generation "length".
    #[arg(long, hide = true)]
    pub context_shift: bool,
    /// Not supported: embeddings.
    #[arg(long, visible_alias = "embeddings", hide = true)]
    pub embedding: bool,
    /// Not supported: reranking.
    #[arg(long, visible_alias = "rerank", hide = true)]
    pub reranking: bool,
    /// Not supported: embeddings' pooling.
    #[arg(long, hide = true)]
    pub pooling: Option<String>,
    /// Not supported: LoRA adapters.
    #[arg(long, hide = true)]
    pub lora: Vec<String>,
    /// Not supported: multimodal projectors.
    #[arg(long, hide = true)]
    pub mmproj: Option<String>,
    /// Not supported: the router of several models.
    #[arg(long, hide = true)]
    pub models_dir: Option<String>,
    /// Not supported: saving slots to files.
    #[arg(long, hide = true)]
    pub slot_save_path: Option<String>,
    /// Not supported: group attention (self-extend).
    #[arg(long, hide = true)]
    pub grp_attn_n: Option<String>,
    /// Not supported: unloading the model when idle.
    #[arg(long, hide = true)]
    pub sleep_idle_seconds: Option<String>,
    /// Not supported: downloads (nothing leaves this machine).
    #[arg(long, hide = true)]
    pub hf_repo: Option<String>,
    /// Not supported: built-in server tools and MCP.
    #[arg(long, hide = true)]
    pub tools: Option<String>,
}

impl RefusedServerArgs {
    /// Fails, in one line naming the flag and why, when one was given.
    ///
    /// # Errors
    /// The first such flag.
    pub fn check(&self) -> anyhow::Result<()> {
        let refused: [(bool, &str, &str); 13] = [
            (self.no_cont_batching, "--no-cont-batching", "requests are always batched continuously"),
            (self.context_shift, "--context-shift", "a generation ends \"length\" when its context is full"),
            (self.embedding, "--embedding", "HAMburger models generate text; embeddings are not served"),
            (self.reranking, "--reranking", "reranking is not served"),
            (self.pooling.is_some(), "--pooling", "embeddings (and their pooling) are not served"),
            (!self.lora.is_empty(), "--lora", "LoRA adapters are not supported: merge them into the GGUF"),
            (self.mmproj.is_some(), "--mmproj", "HAMburger models take text only"),
            (self.models_dir.is_some(), "--models-dir", "one server serves one model (no router)"),
            (self.slot_save_path.is_some(), "--slot-save-path", "slots are not saved to files"),
            (self.grp_attn_n.is_some(), "--grp-attn-n", "group attention (self-extend) is not supported"),
            (self.sleep_idle_seconds.is_some(), "--sleep-idle-seconds", "the model stays loaded"),
            (self.hf_repo.is_some(), "--hf-repo", "nothing is downloaded: give a local GGUF with -m"),
            (self.tools.is_some(), "--tools", "built-in server tools are not supported"),
        ];
        match refused.iter().find(|(given, ..)| *given) {
            Some((_, flag, why)) => anyhow::bail!("{flag} is not supported: {why}"),
            None => Ok(()),
        }
    }
}
