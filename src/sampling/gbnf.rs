//! llama.cpp's grammar language, GBNF (`root ::= "a" | [0-9]+`), rewritten
//! into llguidance's Lark-like syntax, so a `grammar` written for
//! llama.cpp constrains here too: `name ::=` becomes `name:` (`root` the
//! start rule, every name lowercase and dash-free), a character class or
//! `.` a regular expression, strings re-escaped; groups, alternatives and
//! repetitions (`*`, `+`, `?`, `{m,n}`) carry over as they are.

/// Whether `text` is GBNF: some line defines a rule with `::=`.
pub fn is_gbnf(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        let name_end = l.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')).unwrap_or(l.len());
        name_end > 0 && l[name_end..].trim_start().starts_with("::=")
    })
}

/// The Lark rule name of GBNF rule `name`: `root` is `start`; otherwise
/// `g_` then the name with uppercase letters as `_x` and dashes as `__`
/// (Lark's rule names are lowercase; the mapping is one to one).
fn rule_name(name: &str) -> String {
    if name == "root" {
        return "start".into();
    }
    let mut out = String::from("g_");
    for c in name.chars() {
        match c {
            '-' => out.push_str("__"),
            c if c.is_ascii_uppercase() => {
                out.push('_');
                out.push(c.to_ascii_lowercase());
            }
            c => out.push(c),
        }
    }
    out
}

/// A character of a regular expression's class, escaped where needed.
fn class_char(c: char, out: &mut String) {
    match c {
        c if c.is_ascii_alphanumeric() || c == ' ' => out.push(c),
        c if c.is_ascii_punctuation() => {
            out.push('\\');
            out.push(c);
        }
        c if c.is_control() => out.push_str(&format!("\\x{{{:x}}}", c as u32)),
        c => out.push(c),
    }
}

/// Reads GBNF's escapes; `chars` is just past the backslash.
fn escape(chars: &mut std::iter::Peekable<std::str::CharIndices>, at: usize) -> Result<char, String> {
    let hex = |chars: &mut std::iter::Peekable<std::str::CharIndices>, n: usize| {
        let digits: String = (0..n).filter_map(|_| chars.next().map(|(_, c)| c)).collect();
        u32::from_str_radix(&digits, 16).ok().and_then(char::from_u32).ok_or(format!("bad escape at byte {at}"))
    };
    match chars.next().map(|(_, c)| c) {
        Some('n') => Ok('\n'),
        Some('r') => Ok('\r'),
        Some('t') => Ok('\t'),
        Some('x') => hex(chars, 2),
        Some('u') => hex(chars, 4),
        Some('U') => hex(chars, 8),
        Some(c) => Ok(c),
        None => Err(format!("unfinished escape at byte {at}")),
    }
}

/// `text` (GBNF) in llguidance's Lark-like syntax.
///
/// # Errors
/// An unfinished string or character class, a bad escape, or a character
/// GBNF does not have, naming its byte offset.
pub fn to_lark(text: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = text.char_indices().peekable();
    let mut depth = 0usize;
    while let Some((at, c)) = chars.next() {
        match c {
            '#' => while chars.next_if(|&(_, c)| c != '\n').is_some() {},
            '\n' => out.push(if depth == 0 { '\n' } else { ' ' }),
            c if c.is_whitespace() => out.push(' '),
            '"' => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some((_, '"')) => break,
                        Some((i, '\\')) => s.push(escape(&mut chars, i)?),
                        Some((_, c)) => s.push(c),
                        None => return Err(format!("unfinished string at byte {at}")),
                    }
                }
                out.push_str(&serde_json::Value::String(s).to_string());
            }
            '[' => {
                out.push_str("/[");
                if chars.next_if(|&(_, c)| c == '^').is_some() {
                    out.push('^');
                }
                loop {
                    match chars.next() {
                        Some((_, ']')) => break,
                        Some((_, '-')) => out.push('-'),
                        Some((i, '\\')) => class_char(escape(&mut chars, i)?, &mut out),
                        Some((_, c)) => class_char(c, &mut out),
                        None => return Err(format!("unfinished character class at byte {at}")),
                    }
                }
                out.push_str("]/");
            }
            '.' => out.push_str("/(?s:.)/"),
            '(' => {
                depth += 1;
                out.push('(');
            }
            ')' => {
                depth = depth.saturating_sub(1);
                out.push(')');
            }
            '|' | '*' | '+' | '?' => out.push(c),
            '{' => {
                out.push('{');
                while let Some((_, c)) = chars.next_if(|&(_, c)| c.is_ascii_digit() || c == ',' || c == ' ') {
                    out.push(c);
                }
                match chars.next() {
                    Some((_, '}')) => out.push('}'),
                    _ => return Err(format!("unfinished repetition at byte {at}")),
                }
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let mut name = String::from(c);
                while let Some((_, c)) = chars.next_if(|&(_, c)| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                    name.push(c);
                }
                let rest = &text[chars.peek().map_or(text.len(), |&(i, _)| i)..];
                let after_space = rest.trim_start_matches([' ', '\t']);
                if let Some(defined) = after_space.strip_prefix("::=") {
                    // The rule's body may start on the next line.
                    let body = defined.trim_start();
                    for _ in 0..rest[..rest.len() - body.len()].chars().count() {
                        chars.next();
                    }
                    out.push('\n');
                    out.push_str(&rule_name(&name));
                    out.push_str(": ");
                } else {
                    out.push_str(&rule_name(&name));
                }
            }
            c => return Err(format!("unexpected '{c}' at byte {at}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_classes_strings_and_repetitions_carry_over() {
        let g = "root ::= \"a\"{5,5} item-list # comment\nitem-list ::=\n  (\n  [a-z\\n] | \"\\\"x\" )* .\n";
        assert!(is_gbnf(g));
        let lark = to_lark(g).unwrap();
        assert_eq!(
            lark.split_whitespace().collect::<Vec<_>>().join(" "),
            r#"start: "a"{5,5} g_item__list g_item__list: ( /[a-z\x{a}]/ | "\"x" )* /(?s:.)/"#
        );
        assert!(!is_gbnf("start: \"a\""));
        assert!(to_lark("root ::= \"a").unwrap_err().contains("unfinished string"));
        assert!(to_lark("root ::= [a").unwrap_err().contains("unfinished character class"));
    }
}
