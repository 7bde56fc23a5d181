//! Command-line plumbing shared by every binary: the logger, llama.cpp's
//! multi-letter short flags, argument errors in one line, the one-line error
//! report at exit, and the flag parsers several tools take.

use std::process::ExitCode;

use hamburger::DeviceChoice;
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

/// Prints an error in one line prefixed by `program` and returns the exit code.
pub fn report(program: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes in one line, each cause once: library errors
/// often print their source in their own message too ("file: No such file"),
/// and repeating it ("...: No such file: No such file") reads as two errors.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// Where a model runs: the flags every tool that loads one shares (flattened
/// into its arguments).
#[derive(clap::Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Device: auto (the first GPU, else the CPU), cpu, cuda or metal.
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

/// Rewrites llama.cpp's multi-letter short flags (`-cnv`, `-sys`, `-fa`,
/// `-ctk`/`-ctv`, `-ngl`, `-ts`, `-np`) into the long ones our tools define.
pub fn llama_style_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    args.into_iter()
        .map(|a| match a.as_str() {
            "-cnv" => "--chat".into(),
            "-sys" => "--system-prompt".into(),
            "-fa" => "--flash-attn".into(),
            "-ctk" | "-ctv" => "--cache-type".into(),
            "-ngl" => "--n-gpu-layers".into(),
            "-ts" => "--tensor-split".into(),
            "-np" => "--parallel".into(),
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

/// `--device`: auto, cpu, cuda or metal.
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

fn finite(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err(format!("'{s}' is not a finite number")),
    }
}

/// A finite number >= 0 (`--temp`, `--confidence`).
///
/// # Errors
/// NaN, an infinity, a negative number or no number.
pub fn non_negative(s: &str) -> Result<f32, String> {
    finite(s).and_then(|x| if x >= 0.0 { Ok(x) } else { Err(format!("{x} is negative")) })
}

/// A finite number from 0 to 1 (`--top-p`, `--min-p`).
///
/// # Errors
/// NaN, a number outside [0, 1] or no number.
pub fn unit_interval(s: &str) -> Result<f32, String> {
    finite(s).and_then(|x| if (0.0..=1.0).contains(&x) { Ok(x) } else { Err(format!("{x} is not between 0 and 1")) })
}

/// A finite number > 0 (`--repeat-penalty`, which divides logits).
///
/// # Errors
/// NaN, an infinity, zero, a negative number or no number.
pub fn positive(s: &str) -> Result<f32, String> {
    finite(s).and_then(|x| if x > 0.0 { Ok(x) } else { Err(format!("{x} is not above 0")) })
}

/// A whole number >= 1 (`--forced-steps`: tokens per macro step).
///
/// # Errors
/// Zero or no whole number.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("'{s}' is not a whole number >= 1")),
    }
}
