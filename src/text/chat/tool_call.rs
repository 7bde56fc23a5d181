//! Tool calls in the format a chat template documents, so that any front-end
//! (the server's `tools`, a CLI) offers tools the same way: which format a
//! template's model writes a call in, the grammar that constrains an answer
//! to such a call with arguments following the tool's JSON schema, and the
//! parser that reads the call back out of the answer's text.
//!
//! The formats: Llama 3.x's templates ask for one JSON object `{"name":
//! function name, "parameters": {...}}`; Hermes / Qwen ones for
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`; any other
//! template that renders tools gets `{"name": ..., "arguments": {...}}`.
//! A template that renders no tools gets that last format too, the tools and
//! how to call them told in a system message ([`CallFormat::instructions`]),
//! as llama.cpp's generic tool calling does. One call per answer.

use serde_json::{json, Value};

use super::{ChatTemplate, Message};

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

/// A tool the model may call: its name and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The function's name.
    pub name: String,
    /// The JSON schema its arguments follow.
    pub parameters: Value,
}

/// One call read from an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The called function's name.
    pub name: String,
    /// Its arguments (a JSON object).
    pub arguments: Value,
}

/// Whether an answer must call a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallRule {
    /// Text or a call: the text's first character cannot start a call.
    Optional,
    /// A call of one of the tools.
    Required,
}

impl CallFormat {
    /// The format of a template that renders no tools: a JSON object
    /// `{"name": ..., "arguments": {...}}`, offered in a system message.
    pub const GENERIC: CallFormat = CallFormat { open: "", close: "", args_key: "arguments" };

    /// The text of a system message that offers `tools` (OpenAI's `tools`
    /// entries) and says how to call one in this format.
    pub fn instructions(&self, tools: &[Value]) -> String {
        let listed = serde_json::to_string_pretty(tools).unwrap_or_default();
        format!(
            "You can call the following tools:\n{listed}\n\nTo call a tool, answer with only {}{{\"name\": <the tool's name>, \"{}\": <its arguments as a JSON object>}}{}; otherwise answer the user as usual.",
            self.open, self.args_key, self.close
        )
    }

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

    /// The grammar (llguidance's Lark syntax) of an answer that calls one of
    /// `tools` in this format, its arguments following that tool's schema;
    /// under [`CallRule::Optional`], or else text whose first character cannot
    /// start a call.
    pub fn grammar(&self, tools: &[ToolSpec], rule: CallRule) -> String {
        let calls: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, self.args_key: t.parameters},
                    "required": ["name", self.args_key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = json!({"anyOf": calls, "x-guidance": {"whitespace_flexible": false}});
        let quoted = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let call = format!("call: {} %json {schema} {}", quoted(self.open), quoted(self.close));
        let first = self.open.chars().next().unwrap_or('{');
        match rule {
            CallRule::Optional => format!("start: call | TEXT\nTEXT: /[^{first}][\\s\\S]*/\n{call}\n"),
            CallRule::Required => format!("start: call\n{call}\n"),
        }
    }

    /// The call `text` makes, or `None` when it is text (or a call cut short).
    pub fn parse(&self, text: &str) -> Option<ToolCall> {
        let body = text.strip_prefix(self.open)?.strip_suffix(self.close)?;
        let call: Value = serde_json::from_str(body).ok()?;
        let name = call["name"].as_str()?.to_string();
        let arguments = call.get(self.args_key)?.clone();
        Some(ToolCall { name, arguments })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_read_back_in_each_format() {
        let hermes = CallFormat { open: "<tool_call>\n", close: "\n</tool_call>", args_key: "arguments" };
        let llama = CallFormat { open: "", close: "", args_key: "parameters" };
        let want = ToolCall { name: "f".into(), arguments: json!({"x": 1}) };
        assert_eq!(
            hermes.parse("<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":1}}\n</tool_call>"),
            Some(want.clone())
        );
        assert_eq!(llama.parse("{\"name\":\"f\",\"parameters\":{\"x\":1}}"), Some(want));
        assert_eq!(llama.parse("{\"name\":\"f\",\"arguments\":{}}"), None, "the other format's key");
        assert_eq!(hermes.parse("<tool_call>\n{\"name\":\"f\""), None, "a call cut short");
        assert_eq!(llama.parse("Plain text."), None);
        let generic = CallFormat::GENERIC;
        assert_eq!(generic.parse("{\"name\":\"f\",\"arguments\":{\"x\":1}}").map(|c| c.name), Some("f".into()));
        let told = generic.instructions(&[json!({"type": "function", "function": {"name": "get_weather"}})]);
        assert!(told.contains("\"get_weather\"") && told.contains("\"arguments\""), "{told}");
    }

    #[test]
    fn an_optional_call_lets_text_start_with_anything_but_the_calls_first_character() {
        let llama = CallFormat { open: "", close: "", args_key: "parameters" };
        let tools = [ToolSpec { name: "f".into(), parameters: json!({"type": "object"}) }];
        let optional = llama.grammar(&tools, CallRule::Optional);
        assert!(optional.starts_with("start: call | TEXT\nTEXT: /[^{]"), "{optional}");
        let required = llama.grammar(&tools, CallRule::Required);
        assert!(required.starts_with("start: call\n") && required.contains("\"const\":\"f\""), "{required}");
    }
}
