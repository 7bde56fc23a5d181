//! Command-line plumbing shared by every binary: the logger, llama.cpp's
//! multi-letter short flags, argument errors in one line, the one-line error
//! report at exit, and the flag parsers several tools take.

use std::process::ExitCode;

use hamburger::{DeviceChoice, Param, ParamError};
use quant::Mix;

/// Runs a tool: starts the logger at `default_log` (`RUST_LOG` wins), parses
/// the process arguments into `T` (see [`parse_or_exit`], after
/// [`llama_style_args`]), then `run`; an error is reported once, in one line
/// prefixed by `program`, with exit status 1.
pub fn run_tool<T: clap::Parser>(
    program: &str,
    default_log: &str,
    run: impl FnOnce(T) -> anyhow::Result<()>,
) -> ExitCode {
    if let Some(code) = hamburger::chat::serve_if_child() {
        return ExitCode::from(code as u8);
    }
    init_logger(default_log);
    ggml::exit_on_ggml_abort(program);
    let args: T = parse_or_exit(program, llama_style_args(std::env::args()));
    report(program, run(args))
}

/// The address space a chat template's child process may use: far more than
/// any real template needs, far less than a hostile one asks for.
pub const TEMPLATE_ADDRESS_SPACE_KIB: u64 = 1 << 20;

/// Chat templates from a model file render in a child process of this
/// program, limited to [`TEMPLATE_ADDRESS_SPACE_KIB`] (see
/// `hamburger::chat::Isolation`); [`run_tool`] serves such children.
///
/// # Errors
/// When this program's path is unknown.
pub fn template_isolation() -> anyhow::Result<hamburger::chat::Isolation> {
    Ok(hamburger::chat::Isolation::current_exe(TEMPLATE_ADDRESS_SPACE_KIB)?)
}

/// Makes SIGINT and SIGTERM (and SIGHUP) delete the partial GGUF files being
/// written before the program exits with status 130, as a shell expects of an
/// interrupted command: a stopped conversion or quantization leaves nothing.
///
/// # Errors
/// When a handler is already installed.
pub fn remove_partial_files_on_interrupt() -> anyhow::Result<()> {
    ctrlc::set_handler(|| {
        ggml::gguf::remove_partial_files();
        std::process::exit(130);
    })?;
    Ok(())
}

/// Parses a thread count (`-t`): at least one, at most ggml's limit.
///
/// # Errors
/// Outside `1..=MAX_THREADS`.
pub fn thread_count(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if n == 0 || n > hamburger::budget::MAX_THREADS {
        return Err(format!("expected 1 to {} threads", hamburger::budget::MAX_THREADS));
    }
    Ok(n)
}

/// Starts the logger: `RUST_LOG` if set, else `default` (`warn` for the
/// tools, `info` for the server).
pub fn init_logger(default: &str) {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default)).init();
}

/// Prints an error in one line prefixed by `program` (the library's
/// parameters named as our flags, see [`flag`]) and returns the exit code.
pub fn report(program: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes in one line, each cause once (library errors
/// often print their source in their own message too, "file: No such file",
/// and repeating it, "...: No such file: No such file", reads as two
/// errors), refused parameters named by their flags.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = in_flags(cause);
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// One cause of an error, a refused parameter named by its flag.
fn in_flags(cause: &(dyn std::error::Error + 'static)) -> String {
    let param = match cause.downcast_ref::<hamburger::Error>() {
        Some(hamburger::Error::Param(p)) => Some(p),
        _ => cause.downcast_ref::<ParamError>(),
    };
    param.map_or_else(|| cause.to_string(), |p| p.naming(|p| flag(p).to_string()))
}

/// The flag that sets the library's parameter `p` (llama.cpp's short
/// spellings for the sizes, as our tools take them).
pub fn flag(p: Param) -> &'static str {
    match p {
        Param::NCtx => "-c",
        Param::NSeq => "-np",
        Param::NBatch => "-b",
        Param::NThreads => "-t",
        Param::NPredict => "-n",
        Param::Confidence => "--confidence",
        Param::MaxSteps => "--max-steps",
        Param::ForcedSteps => "--forced-steps",
        Param::Temp => "--temp",
        Param::TopP => "--top-p",
        Param::MinP => "--min-p",
        Param::RepeatPenalty => "--repeat-penalty",
        Param::FrequencyPenalty => "--frequency-penalty",
        Param::PresencePenalty => "--presence-penalty",
        Param::SpecType => "--spec-type",
        Param::DraftNMax => "--spec-draft-n-max",
        Param::DraftNMin => "--spec-draft-n-min",
        Param::DraftPMin => "--spec-draft-p-min",
        Param::DraftTree => "--spec-draft-tree",
        Param::NgramSizeN => "--spec-ngram-simple-size-n",
        Param::Device => "--device",
        Param::TensorSplit => "--tensor-split",
    }
}

/// Flash attention as llama.cpp's tools take it: on, off or auto, and
/// llama-bench's 1 and 0.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashAttn {
    /// Fused flash attention (also 1).
    #[value(alias = "1")]
    On,
    /// Separate softmax and products (also 0).
    #[value(alias = "0")]
    Off,
    /// Where it is faster: on a GPU and for a quantized cache; off on the
    /// CPU alone, unless the context is too large for the separate scores.
    Auto,
}

impl FlashAttn {
    /// The engine's setting: `None` lets it choose for the model's placement
    /// ([`hamburger::EngineParams::fused_attention`]).
    pub fn choice(self) -> Option<bool> {
        match self {
            FlashAttn::On => Some(true),
            FlashAttn::Off => Some(false),
            FlashAttn::Auto => None,
        }
    }
}

/// The KV cache and attention flags, as llama.cpp's tools take them.
#[derive(clap::Args, Debug, Clone)]
pub struct KvArgs {
    /// Flash attention: on, off or auto (on a GPU or for a quantized cache,
    /// else off: ggml's fused CPU kernel decodes slower); also 1 and 0. Also -fa.
    #[arg(long = "flash-attn", short = 'F', value_enum, default_value_t = FlashAttn::Auto)]
    pub flash_attn: FlashAttn,
    /// KV cache type of K: f16, f32 or q8_0 (q8_0 needs flash attention).
    /// Also -ctk and --cache-type.
    #[arg(long = "cache-type-k", visible_alias = "cache-type", default_value = "f16", value_parser = ["f16", "f32", "q8_0"])]
    pub cache_type_k: String,
    /// KV cache type of V: K's (one type for both here). Also -ctv.
    #[arg(long = "cache-type-v", value_parser = ["f16", "f32", "q8_0"])]
    pub cache_type_v: Option<String>,
    /// llama.cpp's physical batch (also -ub): the smaller of -b and -ub is
    /// the prompt tokens per base forward.
    #[arg(long = "ubatch-size")]
    pub ubatch_size: Option<usize>,
}

impl Default for KvArgs {
    fn default() -> KvArgs {
        KvArgs { flash_attn: FlashAttn::Auto, cache_type_k: "f16".into(), cache_type_v: None, ubatch_size: None }
    }
}

impl KvArgs {
    /// The KV cache type and whether attention is fused (`None`: auto).
    ///
    /// # Errors
    /// -ctv unlike -ctk, or a quantized cache with flash attention off.
    pub fn kv(&self) -> anyhow::Result<(ggml::Type, Option<bool>)> {
        if let Some(v) = self.cache_type_v.as_ref().filter(|v| **v != self.cache_type_k) {
            anyhow::bail!("-ctv {v}: K and V are cached in one type here; give -ctk {v} too, or drop -ctv");
        }
        let kv = ggml::Type::from_name(&self.cache_type_k).expect("clap checked the name");
        let fa = self.flash_attn.choice();
        if kv.is_quantized() && fa == Some(false) {
            anyhow::bail!("-ctk {} needs flash attention (-fa on or auto)", self.cache_type_k);
        }
        Ok((kv, fa))
    }

    /// Prompt tokens per base forward: -b, or -ub when smaller (llama.cpp's
    /// physical batch, which never exceeds its logical one).
    pub fn n_batch(&self, batch_size: usize) -> usize {
        self.ubatch_size.map_or(batch_size, |ub| ub.min(batch_size))
    }
}

/// llama.cpp flags that have no meaning here: accepted by the parser so that
/// the error says why in one line instead of "unexpected argument".
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RefusedArgs {
    /// Not supported: weights are always read from the memory-mapped GGUF
    /// (--no-repack keeps every CPU weight there).
    #[arg(long)]
    pub no_mmap: bool,
    /// Not supported: the model's pages are not locked in memory.
    #[arg(long)]
    pub mlock: bool,
}

impl RefusedArgs {
    /// Fails, in one line saying why, when a flag without a meaning here was given.
    ///
    /// # Errors
    /// The first such flag.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.no_mmap {
            anyhow::bail!(
                "--no-mmap is not supported: weights are always read from the memory-mapped GGUF (drop the flag)"
            );
        }
        if self.mlock {
            anyhow::bail!("--mlock is not supported: the model's pages are not locked in memory (drop the flag)");
        }
        Ok(())
    }
}

/// The chat template to use instead of the model's, as llama.cpp's tools
/// take it: a built-in name or Jinja source, or a file of Jinja source.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ChatTemplateArgs {
    /// Chat template instead of the model's: a built-in name (chatml, llama2, llama3, command-r) or
    /// Jinja source (templates always render as Jinja; --jinja is implied).
    #[arg(long, conflicts_with = "chat_template_file")]
    pub chat_template: Option<String>,
    /// Chat template instead of the model's, read from a Jinja file.
    #[arg(long)]
    pub chat_template_file: Option<std::path::PathBuf>,
    /// Accepted for llama.cpp's scripts: templates always render as Jinja.
    #[arg(long)]
    pub jinja: bool,
}

impl ChatTemplateArgs {
    /// The Jinja source these flags ask for (`None`: the model's template).
    ///
    /// # Errors
    /// An unreadable file, or a name that is neither built in nor Jinja.
    pub fn source(&self) -> anyhow::Result<Option<String>> {
        if let Some(path) = &self.chat_template_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--chat-template-file {}: {e}", path.display()))?;
            return Ok(Some(text));
        }
        let Some(t) = self.chat_template.as_deref() else { return Ok(None) };
        if let Some(source) = hamburger::chat::built_in(t) {
            return Ok(Some(source.to_string()));
        }
        if t.contains("{%") || t.contains("{{") {
            return Ok(Some(t.to_string()));
        }
        anyhow::bail!(
            "--chat-template {t}: not a built-in template ({}) nor Jinja source",
            hamburger::chat::built_in_names()
        )
    }
}

/// Where a model runs: the flags every tool that loads one shares (flattened
/// into its arguments).
#[derive(clap::Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Device: auto (the first GPU, else the CPU), cpu, cuda, metal or vulkan.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: hamburger::DeviceChoice,
    /// RPC servers (HOST:PORT,...) whose devices take base layers, before the
    /// local GPU (see docs/distributed.md; the protocol is unauthenticated).
    #[arg(long, value_delimiter = ',')]
    pub rpc: Vec<String>,
    /// Base layers offloaded to the GPU and RPC devices (the last ones; the
    /// micro decoder, merger and heads follow the last offloaded layer). Also -ngl.
    #[arg(long = "n-gpu-layers", default_value_t = 999)]
    pub n_gpu_layers: usize,
    /// The share of the offloaded layers each offload device takes, in order
    /// (RPC devices, then the local GPU), e.g. 3,1. Also -ts.
    #[arg(long = "tensor-split", value_delimiter = ',', value_parser = non_negative, allow_negative_numbers = true)]
    pub tensor_split: Vec<f32>,
    /// Keep the merger, micro decoder and heads on this machine, not on the
    /// device of the last base layer (saves a round trip per micro step when
    /// that device is remote).
    #[arg(long)]
    pub micro_local: bool,
    /// Keep every CPU weight on the memory-mapped file (no repacked copies of
    /// Q4_0/Q4_K/IQ4_NL matrices): less memory, slower matrix products.
    #[arg(long)]
    pub no_repack: bool,
}

impl PlacementArgs {
    /// The load options these flags ask for.
    pub fn load_options(&self) -> hamburger::LoadOptions {
        hamburger::LoadOptions {
            device: self.device,
            rpc: self.rpc.clone(),
            n_gpu_layers: self.n_gpu_layers,
            tensor_split: self.tensor_split.clone(),
            micro_local: self.micro_local,
            repack: !self.no_repack,
        }
    }
}

/// Rewrites llama.cpp's multi-letter short flags (`-cnv`, `-no-cnv`, `-st`,
/// `-sys`, `-sysf`, `-ub`, `-fa`, `-ctk`/`-ctv`, `-cb`/`-nocb`, `-kvu`, `-ngl`, `-ts`, `-np`, `-jf`)
/// into the long ones our tools define.
pub fn llama_style_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    args.into_iter()
        .map(|a| match a.as_str() {
            "-cnv" => "--chat".into(),
            "-no-cnv" => "--no-conversation".into(),
            "-st" => "--single-turn".into(),
            "-sys" => "--system-prompt".into(),
            "-sysf" => "--system-prompt-file".into(),
            "-ub" => "--ubatch-size".into(),
            "-fa" => "--flash-attn".into(),
            "-ctk" => "--cache-type-k".into(),
            "-ctv" => "--cache-type-v".into(),
            "-cb" => "--cont-batching".into(),
            "-nocb" => "--no-cont-batching".into(),
            "-kvu" => "--kv-unified".into(),
            "-ngl" => "--n-gpu-layers".into(),
            "-ts" => "--tensor-split".into(),
            "-np" => "--parallel".into(),
            "-jf" => "--json-schema-file".into(),
            "-md" => "--model-draft".into(),
            _ => a,
        })
        .collect()
}

/// Parses `args` into `T`; on a usage error prints ONE line (clap's message
/// with its hints folded in) prefixed by the program name and exits with 2.
/// Help and version requests print normally and exit 0.
pub fn parse_or_exit<T: clap::Parser>(program: &str, args: impl IntoIterator<Item = String>) -> T {
    match T::try_parse_from(args) {
        Ok(t) => t,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let text = e.render().to_string();
            let line: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .collect();
            eprintln!("{program}: {}", line.join(" "));
            std::process::exit(2);
        }
    }
}

/// `--device`: auto, cpu, cuda, metal or vulkan.
///
/// # Errors
/// On another name.
pub fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    s.parse::<DeviceChoice>().map_err(|e| e.to_string())
}

/// A quantization mix by llama.cpp's name (`Q4_K_M`), case-insensitively.
///
/// # Errors
/// On an unknown name; the message lists the valid ones.
pub fn parse_mix(s: &str) -> Result<Mix, String> {
    Mix::from_name(s).ok_or_else(|| format!("unknown type '{s}' (valid: {})", Mix::names()))
}

/// A finite number: the range is the library's to check (it names the
/// parameter, [`report`] the flag), NaN and infinities no number at all.
///
/// # Errors
/// NaN, an infinity or no number.
pub fn finite(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err(format!("'{s}' is not a finite number")),
    }
}

/// A finite number >= 0 (`--tensor-split`'s shares).
///
/// # Errors
/// NaN, an infinity, a negative number or no number.
pub fn non_negative(s: &str) -> Result<f32, String> {
    finite(s).and_then(|x| if x >= 0.0 { Ok(x) } else { Err(format!("{x} is negative")) })
}

/// A whole number >= 1 (a count of tokens or prompts).
///
/// # Errors
/// Zero or no whole number.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("'{s}' is not a whole number >= 1")),
    }
}
