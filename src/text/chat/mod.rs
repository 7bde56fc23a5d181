//! Chat templates (the GGUF's Jinja `tokenizer.chat_template`, rendered with
//! minijinja and Python-compatible string methods) and the bookkeeping of a
//! multi-turn chat whose history stays in the KV cache; `tool_call`: the
//! format a template's model calls tools in, its grammar and its parser.

mod built_in;
mod child;
pub mod tool_call;

use std::io;

use minijinja::{context, Environment};
use serde::{Deserialize, Serialize};

pub use built_in::{built_in, built_in_names, without_jinja, CHATML};
pub use child::{serve_if_child, Isolation, CHILD_ENV};
pub use tool_call::{CallFormat, CallRule, ToolCall, ToolSpec};

use crate::error::{Error, Result};

/// Template instructions one rendering may execute (minijinja's fuel): chat
/// templates over long conversations use a few hundred thousand; a hostile
/// template's endless loop stops here, well under a second.
const TEMPLATE_FUEL: u64 = 20_000_000;

/// Bytes one rendering may produce: far more than any context holds, and
/// bounded before a hostile template can exhaust memory.
const MAX_RENDERED_BYTES: usize = 16 << 20;

/// An error and its causes, in one line.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text = format!("{text}: {c}");
        cause = c.source();
    }
    text
}

/// The rendered text, refusing to grow past [`MAX_RENDERED_BYTES`].
struct BoundedOutput(Vec<u8>);

impl io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED_BYTES {
            return Err(io::Error::other(format!("the output passes {} MiB", MAX_RENDERED_BYTES >> 20)));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One chat message, as templates see it (OpenAI's message shape): a tool
/// call's fields are present only on the messages that carry them, since
/// templates test `'tool_calls' in message`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant's tool calls: `{id, type, function: {name, arguments}}`,
    /// the arguments an object (templates print them with `tojson`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool message: the function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant's reasoning before its answer (templates of thinking
    /// models render it, as `<think>` blocks for example).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    /// A message of `role` holding the text `content`.
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.into(), content: content.into(), ..Message::default() }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
    /// Render in a child process instead of here (see [`Isolation`]).
    isolation: Option<Isolation>,
}

fn raise_exception(msg: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
}

/// The environment variable that fixes the time chat templates render as
/// now: seconds since 1970 (UTC), the reproducible-builds convention for the
/// dates a tool prints. Llama 3.x's templates print "Today Date", so without
/// it the same chat is another prompt, and another answer, from one day to
/// the next (llama-server's suite compares answers recorded on one day).
pub const TEMPLATE_CLOCK_ENV: &str = "SOURCE_DATE_EPOCH";

/// The time chat templates render as now: [`TEMPLATE_CLOCK_ENV`]'s, in UTC,
/// when it is set, else the local time now.
///
/// # Errors
/// When [`TEMPLATE_CLOCK_ENV`] is set but not a whole number of seconds
/// that a date can hold (the message names it).
pub fn template_now() -> Result<chrono::DateTime<chrono::FixedOffset>> {
    clock_now().map_err(Error::Template)
}

fn clock_now() -> std::result::Result<chrono::DateTime<chrono::FixedOffset>, String> {
    let Ok(value) = std::env::var(TEMPLATE_CLOCK_ENV) else {
        return Ok(chrono::Local::now().fixed_offset());
    };
    let at = value.trim().parse::<i64>().ok().and_then(|secs| chrono::DateTime::from_timestamp(secs, 0));
    at.map(|t| t.fixed_offset())
        .ok_or_else(|| format!("{TEMPLATE_CLOCK_ENV} {value:?}: expected the seconds since 1970-01-01 UTC"))
}

/// [`template_now`] in C's `strftime` format `fmt`.
fn format_now(fmt: &str) -> std::result::Result<String, String> {
    use chrono::format::{Item, StrftimeItems};
    use std::fmt::Write;
    let invalid = || format!("strftime_now: invalid format {fmt:?}");
    let items: Vec<Item> = StrftimeItems::new(fmt).collect();
    if items.contains(&Item::Error) {
        return Err(invalid());
    }
    let mut out = String::new();
    write!(out, "{}", clock_now()?.format_with_items(items.into_iter())).map_err(|_| invalid())?;
    Ok(out)
}

/// Templates' `strftime_now`, as transformers gives it (Llama 3.x print
/// "Today Date" with it): [`template_now`] formatted, the date of the day
/// unless [`TEMPLATE_CLOCK_ENV`] fixes it.
fn strftime_now(fmt: String) -> std::result::Result<String, minijinja::Error> {
    format_now(&fmt).map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e))
}

/// [`template_now`]'s date in C's `strftime` format (`%d %b %Y`), for the
/// variables llama.cpp gives templates (`date_string`).
///
/// # Errors
/// As [`template_now`]; a format `strftime` does not know.
pub fn template_date(fmt: &str) -> Result<String> {
    format_now(fmt).map_err(Error::Template)
}

/// `source` with transformers' `{% generation %}` / `{% endgeneration %}`
/// tags (they mark the assistant's tokens for training masks and render
/// their body unchanged) as `{% if true %}` / `{% endif %}`, keeping each
/// tag's whitespace control, so that templates using them compile here.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else { break };
        let inner = &tag[2..end];
        let (open, body) = inner.strip_prefix('-').map_or(("", inner), |b| ("-", b));
        let (body, close) = body.strip_suffix('-').map_or((body, ""), |b| (b, "-"));
        let statement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match statement {
            Some(st) => out.push_str(&format!("{{%{open} {st} {close}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the texts templates may insert.
    ///
    /// # Errors
    /// When the template does not parse.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        // Whitespace control as transformers' `apply_chat_template` has it,
        // the environment templates are written and tested against.
        let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
        env.set_syntax(syntax.map_err(|e| Error::Template(e.to_string()))?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", without_generation_tags(source)).map_err(|e| Error::Template(e.to_string()))?;
        Ok(ChatTemplate { env, source: source.into(), bos: bos.into(), eos: eos.into(), isolation: None })
    }

    /// The chat template `model`'s GGUF carries, with the texts of its BOS and
    /// EOS tokens (`None` when the file has no template).
    ///
    /// # Errors
    /// When the template does not parse.
    pub fn of_model(
        model: &crate::model::Model,
        tokenizer: &crate::text::tokenizer::Tokenizer,
    ) -> Result<Option<ChatTemplate>> {
        model.vocab.chat_template.as_deref().map(|source| ChatTemplate::for_model(source, model, tokenizer)).transpose()
    }

    /// The template of Jinja `source` (one given instead of the model's, as
    /// llama.cpp's `--chat-template-file`), with the texts of `model`'s BOS
    /// and EOS tokens.
    ///
    /// # Errors
    /// When the template does not parse.
    pub fn for_model(
        source: &str,
        model: &crate::model::Model,
        tokenizer: &crate::text::tokenizer::Tokenizer,
    ) -> Result<ChatTemplate> {
        let text = |id: Option<u32>| id.and_then(|i| tokenizer.token_text(i)).unwrap_or_default();
        ChatTemplate::new(source, &text(model.vocab.bos), &text(model.vocab.eos))
    }

    /// This template, rendered from now on in child processes of `isolation`,
    /// so that a template that exhausts memory ends a child, not this program.
    pub fn isolated(self, isolation: Isolation) -> ChatTemplate {
        ChatTemplate { isolation: Some(isolation), ..self }
    }

    /// The Jinja source this template was compiled from (llama-server's
    /// `/props` shows it).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`, ending with the assistant's turn header when `add_generation_prompt`.
    ///
    /// # Errors
    /// When rendering fails: the template raises, runs out of fuel (an
    /// endless loop), writes more than the output bound, or (isolated) needs
    /// more memory than its child may have.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// Renders `messages` with the function definitions `tools` (OpenAI's
    /// `tools` entries, given to the template as its `tools` variable,
    /// undefined when empty, as transformers' `apply_chat_template` gives them).
    ///
    /// # Errors
    /// As [`ChatTemplate::render`].
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with_kwargs(messages, tools, add_generation_prompt, &serde_json::Map::new())
    }

    /// Renders as [`ChatTemplate::render_with_tools`] with more variables
    /// (`kwargs`, transformers' `apply_chat_template(**kwargs)`:
    /// `enable_thinking`, ...), which never replace the ones it sets.
    ///
    /// # Errors
    /// As [`ChatTemplate::render`].
    pub fn render_with_kwargs(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        if let Some(isolation) = &self.isolation {
            let request = child::Request {
                source: self.source.clone(),
                bos: self.bos.clone(),
                eos: self.eos.clone(),
                messages: messages.to_vec(),
                tools: tools.to_vec(),
                add_generation_prompt,
                kwargs: kwargs.clone(),
            };
            return child::render(isolation, &request);
        }
        let t = self.env.get_template("chat").map_err(|e| Error::Template(e.to_string()))?;
        let mut out = BoundedOutput(Vec::new());
        let ctx = context! {
            messages => messages.iter().map(|m| minijinja::Value::from(minijinja::value::Serde(m))).collect::<Vec<_>>(),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
        };
        // Without tools the variable stays undefined, as transformers leaves
        // it (templates test `tools is defined` before `tools | length`).
        let ctx = match tools {
            [] => ctx,
            _ => context! { tools => minijinja::Value::from(minijinja::value::Serde(tools)), ..ctx },
        };
        let ctx = context! { ..ctx, ..minijinja::Value::from(minijinja::value::Serde(kwargs)) };
        t.render_captured_to(ctx, &mut out).map_err(|e| Error::Template(with_causes(&e)))?;
        String::from_utf8(out.0).map_err(|_| Error::Template("the rendered text is not UTF-8".into()))
    }
}

/// A chat whose past turns are already in the KV cache: each user turn yields
/// only the text to feed next.
pub struct Chat {
    template: ChatTemplate,
    messages: Vec<Message>,
    /// The text in the context so far (rendered turns plus generated text).
    fed: String,
}

impl Chat {
    /// A new chat, optionally with a system prompt.
    pub fn new(template: ChatTemplate, system: Option<&str>) -> Chat {
        let messages = system.map(|s| vec![Message::new("system", s)]).unwrap_or_default();
        Chat { template, messages, fed: String::new() }
    }

    /// Adds a user message and returns the text to feed: the rendered
    /// conversation minus what the context already holds.
    ///
    /// # Errors
    /// When the template fails.
    pub fn user(&mut self, text: &str) -> Result<String> {
        self.messages.push(Message::new("user", text));
        let full = self.template.render(&self.messages, true)?;
        let delta = match full.strip_prefix(self.fed.as_str()) {
            Some(rest) => rest.to_string(),
            // The template rewrote history (some strip past reasoning): feed the
            // difference between renderings without and with the new turn.
            None => {
                let before = self.template.render(&self.messages[..self.messages.len() - 1], false)?;
                full.strip_prefix(before.as_str()).unwrap_or(&full).to_string()
            }
        };
        self.fed = full;
        Ok(delta)
    }

    /// Records the assistant's reply: `generated` is the text the model produced
    /// (including an end-of-turn token's text when it emitted one).
    pub fn assistant(&mut self, generated: &str, content: &str) {
        self.fed.push_str(generated);
        self.messages.push(Message::new("assistant", content));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    #[test]
    fn second_turn_feeds_only_the_new_text() {
        let mut chat = Chat::new(ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap(), None);
        assert_eq!(chat.user("Hi").unwrap(), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        chat.assistant("Hello!<|im_end|>", "Hello!");
        assert_eq!(chat.user("Bye").unwrap(), "\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn python_string_methods_work() {
        let t = ChatTemplate::new("{{ messages[0]['content'].strip().upper() }}", "", "").unwrap();
        let m = [Message::new("user", "  hi ")];
        assert_eq!(t.render(&m, false).unwrap(), "HI");
    }

    #[test]
    fn tools_and_tool_calls_reach_the_template_only_when_given() {
        let source = "{% if tools is defined %}{{ tools[0].function.name }};{% endif %}{% for m in messages %}{% if 'tool_calls' in m %}{{ m.tool_calls[0].function.arguments | tojson }}{% elif m.role == 'tool' %}[{{ m.tool_call_id }}:{{ m.content }}]{% else %}{{ m.content }}{% endif %}{% endfor %}";
        let t = ChatTemplate::new(source, "", "").unwrap();
        let call =
            serde_json::json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}});
        let messages = [
            Message::new("user", "hi"),
            Message { tool_calls: Some(vec![call]), ..Message::new("assistant", "") },
            Message { tool_call_id: Some("c1".into()), ..Message::new("tool", "42") },
        ];
        assert_eq!(t.render(&messages, false).unwrap(), "hi{\"x\": 1}[c1:42]");
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        assert_eq!(t.render_with_tools(&messages[..1], &tools, false).unwrap(), "f;hi");
    }

    #[test]
    fn hostile_templates_fail_within_bounds() {
        let m = [Message::new("user", "hi")];
        for source in [
            "{{ 'x' * 100000000000 }}",
            "{{ range(100000000000) | list | length }}",
            "{% for i in range(1000000000) %}{% endfor %}",
            "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
        ] {
            let t = ChatTemplate::new(source, "", "").unwrap();
            let e = t.render(&m, true).unwrap_err().to_string();
            assert!(e.contains("template"), "{source}: {e}");
        }
    }

    #[test]
    fn generation_tags_render_their_body_with_their_whitespace_control() {
        let source = "a {%- generation %} b {% endgeneration -%} c{% generation %}d{%endgeneration%}";
        assert_eq!(without_generation_tags(source), "a {%- if true %} b {% endif -%} c{% if true %}d{% endif %}");
        let t = ChatTemplate::new(source, "", "").unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "a b cd");
    }

    #[test]
    fn strftime_now_is_today_and_refuses_bad_formats() {
        let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", "", "").unwrap();
        // (SOURCE_DATE_EPOCH is this process's own: no test of this binary sets it.)
        assert!(std::env::var(TEMPLATE_CLOCK_ENV).is_err(), "{TEMPLATE_CLOCK_ENV} is set for the tests");
        let today = chrono::Local::now().format("%Y-%m-%d").to_string();
        assert_eq!(t.render(&[], false).unwrap(), today);
        let e = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "").unwrap().render(&[], false).unwrap_err();
        assert!(e.to_string().contains("strftime_now: invalid format"), "{e}");
    }
}
