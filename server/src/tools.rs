//! Tool calling on `/v1/chat/completions`, as llama-server (`--jinja`) and
//! vLLM do it: the request's `tools` go to the chat template (or, when it
//! renders none, into a system message, as llama.cpp's generic tool calling
//! does), the answer is constrained to a call in the format the template
//! documents (the core's [`hamburger::chat::CallFormat`]: its grammar and
//! parser), with the arguments following the called tool's JSON schema, and
//! a call comes back as `message.tool_calls` with `finish_reason:
//! "tool_calls"`. One call per answer (`parallel_tool_calls` asks that a
//! model *may* make several; this server makes one). A streamed answer
//! comes whole at its end (its text, or its call, in one chunk).

use hamburger::chat::{CallFormat, CallRule, ToolSpec};
use hamburger::constraint::{Constraint, ConstraintSpec, Grammars};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::protocol::{Common, Tool, ToolChoice, ToolMode};

/// The tools of a request that uses them: what the template gets, and the
/// format, tools and rule of the call.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// The `tools` entries as the template takes them.
    tools: Vec<Value>,
    /// The tools `tool_choice` lets the model call.
    callable: Vec<ToolSpec>,
    rule: CallRule,
    format: CallFormat,
    /// The system message that offers the tools, when the template renders none.
    instructions: Option<String>,
}

/// A 400 about `tools[i]`.
fn bad_tool(i: usize, why: &str) -> ApiError {
    ApiError::field(&format!("tools[{i}]"), format!("tools[{i}]: {why}"))
}

/// Each tool's name and argument schema, checked.
fn specs(tools: &[Tool]) -> Result<Vec<ToolSpec>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.kind != "function" {
                return Err(bad_tool(i, "'type' must be \"function\""));
            }
            let name = t.function.name.as_deref().filter(|n| !n.is_empty());
            let name = name.ok_or_else(|| bad_tool(i, "'function.name' must be a non-empty string"))?;
            let parameters = match &t.function.parameters {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(s) if s.is_object() => s.clone(),
                Some(_) => return Err(bad_tool(i, "'function.parameters' must be a JSON schema object")),
            };
            Ok(ToolSpec { name: name.to_string(), parameters })
        })
        .collect()
}

impl ToolRequest {
    /// The tools a chat request uses, whose template's model calls them in
    /// `format` (None: the template renders no tools): `None` when it gives
    /// none or `tool_choice` is "none" (no call is made; the template may
    /// still show them: [`ToolRequest::shown_only`]).
    ///
    /// # Errors
    /// A 400 naming the field: a tool without a name or with a non-object
    /// schema, a `tool_choice` naming no given tool (or asking a call of no
    /// tools), or structured output asked beside.
    pub fn of_request(
        tools: Option<&[Tool]>,
        tool_choice: Option<&ToolChoice>,
        format: Option<CallFormat>,
        common: &Common,
    ) -> Result<Option<ToolRequest>, ApiError> {
        let choice = tool_choice.unwrap_or(&ToolChoice::Mode(ToolMode::Auto));
        if *choice == ToolChoice::Mode(ToolMode::None) {
            return Ok(None);
        }
        let tools = tools.unwrap_or_default();
        if tools.is_empty() {
            return match choice {
                ToolChoice::Mode(ToolMode::Auto) => Ok(None),
                _ => Err(ApiError::field("tool_choice", "'tool_choice' asks for a call but 'tools' gives none")),
            };
        }
        let mut callable = specs(tools)?;
        let rule = match choice {
            ToolChoice::Named(named) => {
                let name = &named.function.name;
                callable.retain(|t| t.name == *name);
                if callable.is_empty() {
                    return Err(ApiError::field(
                        "tool_choice",
                        format!("'tool_choice' names '{name}', which 'tools' lacks"),
                    ));
                }
                CallRule::Required
            }
            ToolChoice::Mode(ToolMode::Required) => CallRule::Required,
            ToolChoice::Mode(_) => CallRule::Optional,
        };
        if let Some((_, field)) = crate::structured::spec(common)? {
            return Err(ApiError::field(field, format!("'{field}' cannot be combined with 'tools'")));
        }
        let tools: Vec<Value> = tools.iter().map(|t| serde_json::to_value(t).unwrap_or_default()).collect();
        let (format, instructions) = match format {
            Some(f) => (f, None),
            None => (CallFormat::GENERIC, Some(CallFormat::GENERIC.instructions(&tools))),
        };
        Ok(Some(ToolRequest { tools, callable, rule, format, instructions }))
    }

    /// The tools a request with `tool_choice` "none" still shows its
    /// template, as llama-server does, when the template renders tools
    /// (`format`): no call is made, no answer constrained. Empty otherwise.
    pub fn shown_only(
        tools: Option<&[Tool]>,
        tool_choice: Option<&ToolChoice>,
        format: Option<CallFormat>,
    ) -> Vec<Value> {
        match (tools, tool_choice, format) {
            (Some(tools), Some(ToolChoice::Mode(ToolMode::None)), Some(_)) => {
                tools.iter().map(|t| serde_json::to_value(t).unwrap_or_default()).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The `tools` entries for the chat template (none when it renders none).
    pub fn for_template(&self) -> &[Value] {
        if self.instructions.is_some() {
            &[]
        } else {
            &self.tools
        }
    }

    /// The system message that offers the tools, when the template renders none.
    pub fn instructions(&self) -> Option<&str> {
        self.instructions.as_deref()
    }

    /// The constraint of the answer, compiled for the model (CPU work: call
    /// it off the async workers).
    ///
    /// # Errors
    /// A 400 naming `tools` when a tool's schema does not compile.
    pub fn constraint(&self, grammars: Option<&Grammars>) -> Result<Constraint, ApiError> {
        let grammar = self.format.grammar(&self.callable, self.rule);
        crate::structured::compile(grammars, &ConstraintSpec::Lark(grammar), "tools")
    }

    /// The call `text` makes, as OpenAI's `tool_calls` (one entry, the
    /// arguments a JSON string), or `None` when it is text (or a call cut short).
    pub fn calls(&self, text: &str) -> Option<Value> {
        let call = self.format.parse(text)?;
        Some(json!([{
            "id": format!("call_{}", crate::ids::unique()),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments.to_string()},
        }]))
    }
}
