//! Tool calling on `/v1/chat/completions`, as llama-server (`--jinja`) and
//! vLLM do it: the request's `tools` go to the chat template (which must
//! render them), the answer is constrained to a call in the format the
//! template documents, with the arguments following the called tool's JSON
//! schema, and a call comes back as `message.tool_calls` with
//! `finish_reason: "tool_calls"`.
//!
//! The call formats: Llama 3.x's templates ask for one JSON object
//! `{"name": function name, "parameters": {...}}`; Hermes / Qwen ones for
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`; any other
//! template that renders tools gets `{"name": ..., "arguments": {...}}`. One
//! call per answer (`parallel_tool_calls` asks that a model *may* make
//! several; this server makes one).

use hamburger::chat::ChatTemplate;
use hamburger::chat::Message;
use hamburger::constraint::{Constraint, ConstraintSpec, MicroPolicy};
use serde_json::{json, Value};

use crate::api::Common;
use crate::error::ApiError;
use crate::scheduler::ModelInfo;

/// How a template's model writes a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallFormat {
    /// Text before the call's JSON object (empty: the object alone).
    open: &'static str,
    /// Text after it.
    close: &'static str,
    /// The key of the arguments object: `parameters` (Llama 3.x) or `arguments`.
    args_key: &'static str,
}

impl CallFormat {
    /// The format `template` documents, or `None` when it does not render
    /// tools (its text is the same with and without a tool to offer).
    pub fn of_template(template: &ChatTemplate) -> Option<CallFormat> {
        let user = [Message::new("user", "hello")];
        let probe = [json!({"type": "function", "function": {"name": "probe_tool", "parameters": {"type": "object"}}})];
        let with = template.render_with_tools(&user, &probe, true).ok()?;
        if template.render(&user, true).is_ok_and(|without| without == with) {
            return None;
        }
        let source = template.source();
        Some(if source.contains("<tool_call>") {
            CallFormat { open: "<tool_call>\n", close: "\n</tool_call>", args_key: "arguments" }
        } else if source.contains("\"parameters\"") {
            CallFormat { open: "", close: "", args_key: "parameters" }
        } else {
            CallFormat { open: "", close: "", args_key: "arguments" }
        })
    }
}

/// What `tool_choice` asks.
#[derive(Debug, Clone, PartialEq)]
enum Choice {
    /// The model answers text or a call.
    Auto,
    /// The model calls one of the tools.
    Required,
    /// The model calls this tool.
    Named(String),
}

/// The tools of a request that uses them: what the template gets, and the
/// grammar and parser of the call.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// The `tools` entries as the client sent them (the template's `tools`).
    tools: Vec<Value>,
    /// Each tool's name and argument schema.
    schemas: Vec<(String, Value)>,
    choice: Choice,
    format: CallFormat,
}

/// A 400 about `tools[i]`.
fn bad_tool(i: usize, why: &str) -> ApiError {
    ApiError::field(&format!("tools[{i}]"), format!("tools[{i}]: {why}"))
}

/// `tool_choice`, or `None` for "none".
fn choice(v: Option<&Value>) -> Result<Option<Choice>, ApiError> {
    let bad = || {
        ApiError::field(
            "tool_choice",
            "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )
    };
    match v {
        None | Some(Value::Null) => Ok(Some(Choice::Auto)),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(None),
            "auto" => Ok(Some(Choice::Auto)),
            "required" => Ok(Some(Choice::Required)),
            _ => Err(bad()),
        },
        Some(v) => match (v["type"].as_str(), v.pointer("/function/name").and_then(Value::as_str)) {
            (Some("function"), Some(name)) => Ok(Some(Choice::Named(name.to_string()))),
            _ => Err(bad()),
        },
    }
}

impl ToolRequest {
    /// The tools a chat request uses: `None` when it gives none or
    /// `tool_choice` is "none" (no tools reach the template, no call is made).
    ///
    /// # Errors
    /// A 400 naming the field: tools the model's template does not render, a
    /// tool without a name or with a non-object schema, a `tool_choice` naming
    /// no given tool (or asking a call of no tools), a streamed request
    /// (tool calls are not streamed yet), or structured output asked beside.
    pub fn of_request(
        tools: Option<&[Value]>,
        tool_choice: Option<&Value>,
        info: &ModelInfo,
        common: &Common,
    ) -> Result<Option<ToolRequest>, ApiError> {
        let Some(choice) = choice(tool_choice)? else { return Ok(None) };
        let tools = tools.unwrap_or_default();
        if tools.is_empty() {
            return match choice {
                Choice::Auto => Ok(None),
                _ => Err(ApiError::field("tool_choice", "'tool_choice' asks for a call but 'tools' gives none")),
            };
        }
        let format = info.tool_format.ok_or_else(|| {
            ApiError::field(
                "tools",
                "'tools' is not supported by this model: its chat template does not render tools (give one that does with --chat-template-file)",
            )
        })?;
        let schemas = tools
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t["type"] != "function" {
                    return Err(bad_tool(i, "'type' must be \"function\""));
                }
                let name = t.pointer("/function/name").and_then(Value::as_str).filter(|n| !n.is_empty());
                let name = name.ok_or_else(|| bad_tool(i, "'function.name' must be a non-empty string"))?;
                let schema = match t.pointer("/function/parameters") {
                    None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                    Some(s) if s.is_object() => s.clone(),
                    Some(_) => return Err(bad_tool(i, "'function.parameters' must be a JSON schema object")),
                };
                Ok((name.to_string(), schema))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Choice::Named(name) = &choice {
            if !schemas.iter().any(|(n, _)| n == name) {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("'tool_choice' names '{name}', which 'tools' lacks"),
                ));
            }
        }
        if common.stream() {
            return Err(ApiError::field("stream", "tool calls are not streamed yet: ask without 'stream'"));
        }
        if let Some((_, field)) = crate::structured::spec(common)? {
            return Err(ApiError::field(field, format!("'{field}' cannot be combined with 'tools'")));
        }
        Ok(Some(ToolRequest { tools: tools.to_vec(), schemas, choice, format }))
    }

    /// The `tools` entries for the chat template.
    pub fn for_template(&self) -> &[Value] {
        &self.tools
    }

    /// The grammar of the answer (llguidance's Lark syntax): a call of one of
    /// the tools `tool_choice` allows, its arguments following that tool's
    /// schema; with "auto", or else text whose first character cannot start a call.
    fn grammar(&self) -> String {
        let calls: Vec<Value> = self
            .schemas
            .iter()
            .filter(|(name, _)| !matches!(&self.choice, Choice::Named(n) if n != name))
            .map(|(name, schema)| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": name}, self.format.args_key: schema},
                    "required": ["name", self.format.args_key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = json!({"anyOf": calls, "x-guidance": {"whitespace_flexible": false}});
        let quoted = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let call = format!("call: {} %json {schema} {}", quoted(self.format.open), quoted(self.format.close));
        let first = self.format.open.chars().next().unwrap_or('{');
        match self.choice {
            Choice::Auto => format!("start: call | TEXT\nTEXT: /[^{first}][\\s\\S]*/\n{call}\n"),
            _ => format!("start: call\n{call}\n"),
        }
    }

    /// The constraint of the answer, compiled for the model (CPU work: call
    /// it off the async workers).
    ///
    /// # Errors
    /// A 400 naming `tools` when a tool's schema does not compile.
    pub fn constraint(&self, info: &ModelInfo) -> Result<Constraint, ApiError> {
        let grammars = info.grammars.as_ref().ok_or_else(|| {
            ApiError::field("tools", "'tools' is not supported: the model's tokenizer cannot serve constraints")
        })?;
        grammars
            .compile(&ConstraintSpec::Lark(self.grammar()), MicroPolicy::BestAllowed, true)
            .map_err(|e| ApiError::field("tools", format!("invalid 'tools': {e}")))
    }

    /// The call `text` makes, as OpenAI's `tool_calls` (one entry, the
    /// arguments a JSON string), or `None` when it is text (or a call cut short).
    pub fn calls(&self, text: &str) -> Option<Value> {
        let body = text.strip_prefix(self.format.open)?.strip_suffix(self.format.close)?;
        let call: Value = serde_json::from_str(body).ok()?;
        let name = call["name"].as_str()?;
        let args = call.get(self.format.args_key)?;
        Some(json!([{
            "id": format!("call_{:016x}", crate::api::random_seed()),
            "type": "function",
            "function": {"name": name, "arguments": args.to_string()},
        }]))
    }
}

/// An assistant message's `tool_calls` as templates take them: each
/// `{id, type, function: {name, arguments}}` with the arguments (a JSON
/// string in OpenAI's shape) parsed into an object, as llama-server gives them.
///
/// # Errors
/// A 400 naming `messages[i].tool_calls` for a call without a function name
/// or whose arguments are not JSON.
pub fn template_calls(i: usize, calls: &[Value]) -> Result<Vec<Value>, ApiError> {
    let field = format!("messages[{i}].tool_calls");
    calls
        .iter()
        .map(|c| {
            let bad = |why: &str| ApiError::field(&field, format!("{field}: {why}"));
            let name = c
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a call needs 'function.name'"))?;
            let args = match c.pointer("/function/arguments") {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).map_err(|e| bad(&format!("'arguments' is not JSON: {e}")))?
                }
                Some(v @ Value::Object(_)) => v.clone(),
                None | Some(Value::Null) => json!({}),
                Some(_) => return Err(bad("'arguments' must be a JSON string")),
            };
            Ok(json!({"id": c["id"], "type": "function", "function": {"name": name, "arguments": args}}))
        })
        .collect()
}
