//! `hamburger-cli`: completion and chat with a HAMburger GGUF, llama-cli style.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use hamburger::chat::{Chat, ChatTemplate};
use hamburger::draft_model::{DraftSession, DraftSessionParams, DraftStats};
use hamburger::tokenizer::Tokenizer;
use hamburger::{EngineParams, Generation, Model, Session, SessionParams, StepParams};
use tools::cli_output::{json_report, report, visible, StepPrinter};
use tools::decoder::Decoder;

/// Runs a HAMburger model: each macro step (one base forward, one KV entry)
/// emits up to --max-steps tokens.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The HAMburger GGUF file (with -md: the target, whose output it is;
    /// a llama GGUF too, decoded one token per forward).
    #[arg(short = 'm', long, required_unless_present = "list_devices")]
    model: Option<PathBuf>,
    #[command(flatten)]
    draft: tools::decode_flags::DraftModelArgs,
    #[command(flatten)]
    placement: tools::cli::PlacementArgs,
    /// List the devices of this build (and of the --rpc servers) and exit.
    #[arg(long)]
    list_devices: bool,
    /// Prompt text.
    #[arg(short = 'p', long, conflicts_with_all = ["file", "prompt_ids"])]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long, conflicts_with = "prompt_ids")]
    file: Option<PathBuf>,
    /// Prompt token ids, comma-separated (bypasses the tokenizer and template).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate (-1: until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Context size in KV entries (0, the default: the model's training
    /// context, as llama.cpp takes it).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    ctx_size: usize,
    /// Prompt tokens per base forward.
    #[arg(short = 'b', long = "batch-size", default_value_t = EngineParams::default().n_batch)]
    batch_size: usize,
    /// CPU threads (default: every core the system reports, the same in every tool; llama.cpp takes the physical cores).
    #[arg(short = 't', long, value_parser = tools::cli::thread_count)]
    threads: Option<usize>,
    #[command(flatten)]
    decode: tools::decode_flags::DecodeArgs,
    #[command(flatten)]
    spec: tools::decode_flags::SpecArgs,
    #[command(flatten)]
    sampling: tools::decode_flags::SamplingArgs,
    #[command(flatten)]
    grammar: tools::grammar::GrammarArgs,
    /// Interactive chat with the model's chat template (also -cnv); -p or -f
    /// is the first user turn.
    #[arg(long = "chat", visible_alias = "conversation", conflicts_with = "prompt_ids")]
    chat: bool,
    /// Completion, not chat (also -no-cnv; the default here).
    #[arg(long = "no-conversation", conflicts_with_all = ["chat", "single_turn"])]
    no_conversation: bool,
    /// Chat for one turn, then exit (also -st; implies --chat).
    #[arg(long = "single-turn", conflicts_with = "prompt_ids")]
    single_turn: bool,
    /// System prompt for chat mode (also -sys).
    #[arg(long = "system-prompt", conflicts_with = "system_prompt_file")]
    system_prompt: Option<String>,
    /// System prompt for chat mode, read from a file (also -sysf).
    #[arg(long = "system-prompt-file")]
    system_prompt_file: Option<PathBuf>,
    /// Stop generating when the text contains PROMPT (in chat mode: hand the
    /// turn back to the user); repeatable.
    #[arg(short = 'r', long = "reverse-prompt")]
    reverse_prompt: Vec<String>,
    /// Not supported: llama.cpp's interactive mode without a chat template;
    /// use --chat (-cnv).
    #[arg(short = 'i', long)]
    interactive: bool,
    #[command(flatten)]
    template: tools::cli::ChatTemplateArgs,
    #[command(flatten)]
    refused: tools::cli::RefusedArgs,
    /// Colour the output by macro step.
    #[arg(long)]
    color: bool,
    /// Print one JSON object with ids, macro steps, text and timings (no streaming).
    #[arg(long)]
    json: bool,
    /// Keep generating past end-of-generation tokens (until -n or a full context).
    #[arg(long)]
    ignore_eos: bool,
    /// Do not echo the prompt before the generation.
    #[arg(long)]
    no_display_prompt: bool,
    #[command(flatten)]
    kv: tools::cli::KvArgs,
}

fn main() -> ExitCode {
    tools::cli::run_tool("hamburger-cli", "warn", run)
}

fn session_params(args: &Args, model: &Model) -> Result<SessionParams> {
    let (kv_type, flash_attn) = args.kv.kv()?;
    let n_ctx = if args.ctx_size == 0 { model.hp.n_ctx_train } else { args.ctx_size };
    let d = EngineParams::default();
    let engine = EngineParams {
        n_ctx,
        n_batch: args.n_batch(),
        n_threads: args.threads.unwrap_or(d.n_threads),
        kv_type,
        flash_attn,
        ..d
    };
    Ok(SessionParams {
        engine,
        step: StepParams { draft: args.spec.draft(args.draft.model_draft.is_some())?, ..args.decode.step_params(None) },
        sampling: args.sampling.sampler_params()?,
        ignore_eog: args.ignore_eos,
        keep_logits: false,
    })
}

/// The budget of one generation: -n, or what the context has left when
/// that is less (llama.cpp stops at a full context rather than refusing).
struct Budget {
    /// Tokens to generate at most.
    n_predict: usize,
    /// Whether the context, not -n, set `n_predict`.
    by_context: bool,
    /// The context's size, for the notice.
    n_ctx: usize,
}

impl Budget {
    /// The budget for `prompt_len` more prompt tokens.
    ///
    /// # Errors
    /// When the prompt itself does not fit the context.
    fn new(args: &Args, decoder: &Decoder, prompt_len: usize) -> Result<Budget> {
        let n_ctx = decoder.n_ctx();
        let used = decoder.n_slots() + prompt_len + 1;
        if used > n_ctx {
            bail!("the prompt ({prompt_len} tokens, {} in context before it) does not fit the context of {n_ctx} entries: raise -c", decoder.n_slots());
        }
        let room = n_ctx - used;
        let n_predict = usize::try_from(args.n_predict).map_or(room, |n| n.min(room));
        Ok(Budget { n_predict, by_context: args.n_predict < 0 || n_predict < args.n_predict as usize, n_ctx })
    }

    /// Tells on stderr, in one line, that `gen` stopped at a full context.
    fn notice(&self, gen: &Generation) {
        if self.by_context && gen.output_ids.len() >= self.n_predict {
            eprintln!(
                "hamburger-cli: stopped at a full context ({} entries, -c) after {} tokens; raise -c for a longer answer",
                self.n_ctx,
                gen.output_ids.len()
            );
        }
    }
}

/// Refuses, before the model loads, what this tool cannot do as asked.
fn check(args: &Args) -> Result<()> {
    args.refused.check()?;
    if args.interactive {
        bail!("-i/--interactive (raw text without a chat template) is not supported: use -cnv for chat");
    }
    if args.json && args.chat_mode() {
        bail!("--json prints one completion; chat mode (-cnv/-st) streams turns: drop one of them");
    }
    if args.draft.model_draft.is_some() && args.grammar.is_set() {
        bail!("-md with a grammar or JSON schema is not supported: the draft model's tokens are not constrained");
    }
    args.draft.params(&args.spec, args.n_batch())?;
    Ok(())
}

impl Args {
    /// Whether the tool chats (-cnv or -st) rather than completes.
    fn chat_mode(&self) -> bool {
        self.chat || self.single_turn
    }

    /// Prompt tokens per base forward: -b, or -ub when smaller.
    fn n_batch(&self) -> usize {
        self.kv.n_batch(self.batch_size)
    }

    /// The text of -p or -f, if either was given.
    fn prompt_text(&self) -> Result<Option<String>> {
        Ok(match (&self.prompt, &self.file) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(f)) => Some(std::fs::read_to_string(f).with_context(|| format!("-f {}", f.display()))?),
            (None, None) => None,
        })
    }

    /// The system prompt of -sys or -sysf (a file's final newline dropped).
    fn system_prompt(&self) -> Result<Option<String>> {
        match &self.system_prompt_file {
            Some(f) => {
                let text = std::fs::read_to_string(f).with_context(|| format!("-sysf {}", f.display()))?;
                Ok(Some(text.trim_end_matches(['\n', '\r']).to_string()))
            }
            None => Ok(self.system_prompt.clone()),
        }
    }
}

/// Whether `text` (a turn's generated text so far) contains a reverse prompt.
fn reverse_prompt_seen(args: &Args, text: &str) -> bool {
    args.reverse_prompt.iter().any(|r| !r.is_empty() && text.contains(r.as_str()))
}

fn run(mut args: Args) -> Result<()> {
    check(&args)?;
    if args.list_devices {
        for endpoint in &args.placement.rpc {
            ggml::rpc::add_server(endpoint)?;
        }
        print!("{}", tools::devices::describe_devices());
        return Ok(());
    }
    let path = args.model.as_deref().context("-m MODEL is required")?;
    let model = hamburger::Model::open(path, &args.placement.load_options())?;
    let draft = match &args.draft.model_draft {
        Some(p) => Some(hamburger::Model::open(p, &args.placement.load_options()).context("-md")?),
        None => None,
    };
    // The stop rule's flags apply to the model that runs macro steps: the draft, if any.
    args.decode.default_from_model(draft.as_ref().unwrap_or(&model).recommended_confidence);
    let params = session_params(&args, &model)?;
    let mut decoder = match (&draft, args.draft.params(&args.spec, args.n_batch())?) {
        (Some(d), Some(drafting)) => {
            let SessionParams { engine, step, sampling, ignore_eog, .. } = params;
            let p = DraftSessionParams { engine, step, sampling, draft: drafting, ignore_eog };
            Decoder::Drafted(Box::new(DraftSession::new(&model, d, p)?))
        }
        _ => {
            let mut session = Session::new(&model, params)?;
            if args.grammar.is_set() {
                let tok = Tokenizer::from_model(&model)?;
                session.set_constraint(Some(args.grammar.constraint(&tok, &model.vocab.eog)?));
            }
            Decoder::Macro(Box::new(session))
        }
    };
    if args.chat_mode() {
        return chat(&args, &model, &mut decoder);
    }
    let (prompt_ids, tokenizer) = match &args.prompt_ids {
        Some(ids) => {
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= model.hp.n_vocab) {
                bail!("--prompt-ids: token {bad} is outside the vocabulary of {}", model.hp.n_vocab);
            }
            (ids.clone(), Tokenizer::from_model(&model).ok())
        }
        None => {
            let Some(text) = args.prompt_text()? else {
                bail!("no prompt: give -p, -f, --prompt-ids or --chat");
            };
            let tok = Tokenizer::from_model(&model)?;
            (tok.encode(&text, true)?, Some(tok))
        }
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty");
    }
    let budget = Budget::new(&args, &decoder, prompt_ids.len())?;
    let mut out = std::io::stdout().lock();
    if !args.json && !args.no_display_prompt {
        if let Some(t) = &tokenizer {
            write!(out, "{}", t.decode(&prompt_ids))?;
        }
    }
    let mut printer = StepPrinter::new(tokenizer.as_ref(), args.color);
    let counted = decoder.counters();
    let (gen, drafted) = decoder.generate(&prompt_ids, budget.n_predict, |tokens| {
        let text = printer.text(&model, tokens);
        if !args.json {
            printer.print(&mut out, &text);
        }
        !reverse_prompt_seen(&args, &printer.turn)
    })?;
    if args.json {
        let text = tokenizer.as_ref().map(|t| t.decode(&visible(&model, &gen.output_ids))).unwrap_or_default();
        let engine = decoder.counters() - counted;
        writeln!(out, "{}", json_report(&prompt_ids, &gen, drafted.as_ref(), engine, &text))?;
    } else {
        writeln!(out)?;
        eprint!("{}", report(&gen, drafted.as_ref()));
    }
    budget.notice(&gen);
    Ok(())
}

fn chat(args: &Args, model: &Model, decoder: &mut Decoder) -> Result<()> {
    let tok = Tokenizer::from_model(model)?;
    let template = match args.template.source()? {
        Some(source) => ChatTemplate::for_model(&source, model, &tok).context("--chat-template")?,
        None => ChatTemplate::of_model(model, &tok)?
            .context("the model has no chat template: give one with --chat-template")?,
    }
    .isolated(tools::cli::template_isolation()?);
    let mut chat = Chat::new(template, args.system_prompt()?.as_deref());
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut first = true;
    let mut last: Option<(Generation, Option<DraftStats>)> = None;
    // llama-cli's -p (or -f) is the first user turn.
    let mut given = args.prompt_text()?;
    loop {
        write!(out, "\n> ")?;
        let line = match given.take() {
            Some(p) => {
                writeln!(out, "{p}")?;
                p
            }
            None => {
                out.flush()?;
                let mut line = String::new();
                if stdin.lock().read_line(&mut line)? == 0 || line.trim() == "/exit" {
                    break;
                }
                line.trim_end_matches(['\n', '\r']).to_string()
            }
        };
        let delta = chat.user(&line)?;
        let ids = tok.encode(&delta, first)?;
        first = false;
        let budget = Budget::new(args, decoder, ids.len())?;
        let mut printer = StepPrinter::new(Some(&tok), args.color);
        let (gen, drafted) = decoder.generate(&ids, budget.n_predict, |tokens| {
            let text = printer.text(model, tokens);
            printer.print(&mut out, &text);
            !reverse_prompt_seen(args, &printer.turn)
        })?;
        budget.notice(&gen);
        writeln!(out)?;
        let reply = tok.decode(&visible(model, &gen.output_ids));
        chat.assistant(&tok.decode(&gen.output_ids), &reply);
        last = Some((gen, drafted));
        if args.single_turn {
            break;
        }
    }
    writeln!(out)?;
    if let Some((gen, drafted)) = last {
        eprint!("{}", report(&gen, drafted.as_ref()));
    }
    Ok(())
}

/// llama.cpp's spellings parse to their llama.cpp meanings; flags that have
/// none here are refused in one line saying why.
#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        let all = ["hamburger-cli", "-m", "m.gguf"].iter().chain(args).map(|a| a.to_string());
        Args::try_parse_from(tools::cli::llama_style_args(all))
    }

    fn refusal(args: &[&str]) -> String {
        check(&parse(args).unwrap()).unwrap_err().to_string()
    }

    #[test]
    fn conversation_flags() {
        let a = parse(&["-no-cnv", "-p", "x"]).unwrap();
        assert!(a.no_conversation && !a.chat_mode());
        assert!(parse(&["-no-cnv", "-cnv"]).is_err(), "-no-cnv conflicts with -cnv");
        let a = parse(&["-st", "-p", "q"]).unwrap();
        assert!(a.single_turn && a.chat_mode());
        assert_eq!(a.prompt_text().unwrap().as_deref(), Some("q"), "-p is the first turn");
        assert!(parse(&["-cnv"]).unwrap().chat_mode());
        assert!(refusal(&["-cnv", "--json"]).starts_with("--json"));
        assert!(refusal(&["-st", "--json"]).starts_with("--json"));
    }

    #[test]
    fn system_prompt_flags() {
        assert_eq!(parse(&["-sys", "be brief"]).unwrap().system_prompt().unwrap().as_deref(), Some("be brief"));
        let file = std::env::temp_dir().join(format!("sysf-{}.txt", std::process::id()));
        std::fs::write(&file, "from a file\n").unwrap();
        let f = file.to_str().unwrap();
        assert_eq!(parse(&["-sysf", f]).unwrap().system_prompt().unwrap().as_deref(), Some("from a file"));
        assert!(parse(&["-sys", "a", "-sysf", f]).is_err(), "-sys conflicts with -sysf");
        std::fs::remove_file(&file).unwrap();
        let missing = parse(&["-sysf", "/nonexistent/sys.txt"]).unwrap().system_prompt().unwrap_err();
        assert!(format!("{missing:#}").starts_with("-sysf /nonexistent/sys.txt"), "{missing:#}");
    }

    #[test]
    fn batch_and_reverse_prompt_flags() {
        assert_eq!(parse(&["-ub", "64"]).unwrap().n_batch(), 64);
        assert_eq!(parse(&["-b", "32", "-ub", "64"]).unwrap().n_batch(), 32);
        assert_eq!(parse(&["-b", "32"]).unwrap().n_batch(), 32);
        let a = parse(&["-r", "User:", "--reverse-prompt", "###"]).unwrap();
        assert_eq!(a.reverse_prompt, ["User:", "###"]);
        assert!(reverse_prompt_seen(&a, "Sure.\nUser: hi") && !reverse_prompt_seen(&a, "Sure."));
    }

    #[test]
    fn chat_template_flags() {
        let a = parse(&["--chat-template", "chatml", "--jinja"]).unwrap();
        assert_eq!(a.template.source().unwrap().as_deref(), Some(hamburger::chat::CHATML));
        let jinja = "{{ messages[0]['content'] }}";
        assert_eq!(parse(&["--chat-template", jinja]).unwrap().template.source().unwrap().as_deref(), Some(jinja));
        let e = parse(&["--chat-template", "vicuna-x"]).unwrap().template.source().unwrap_err();
        assert!(e.to_string().starts_with("--chat-template vicuna-x"), "{e}");
        assert!(parse(&["--chat-template", "chatml", "--chat-template-file", "t.jinja"]).is_err());
    }

    #[test]
    fn flags_without_a_meaning_here_are_refused_saying_why() {
        assert!(refusal(&["-i"]).contains("use -cnv"));
        assert!(refusal(&["--interactive"]).contains("use -cnv"));
        assert!(refusal(&["--no-mmap"]).starts_with("--no-mmap is not supported"));
        assert!(refusal(&["--mlock"]).starts_with("--mlock is not supported"));
    }

    #[test]
    fn presence_and_frequency_penalties_reach_the_sampler() {
        let a = parse(&["--presence-penalty", "0.5", "--frequency-penalty", "-1", "-p", "x"]).unwrap();
        check(&a).unwrap();
        let p = a.sampling.sampler_params().unwrap();
        assert_eq!((p.presence_penalty, p.frequency_penalty), (0.5, -1.0));
        let e = parse(&["--presence-penalty", "3", "-p", "x"]).unwrap().sampling.sampler_params().unwrap_err();
        assert!(e.to_string().contains("presence_penalty"), "{e}");
    }
}
