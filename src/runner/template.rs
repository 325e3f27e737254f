//! `{{name}}` templates for profile fields. Values are substituted as plain text into one
//! argument each; nothing is ever interpreted by a shell.

use std::collections::BTreeMap;

/// The placeholder names a profile may use (besides `env.NAME`).
pub const NAMES: &[&str] = &[
    "prompt",
    "agent",
    "task_id",
    "session_key",
    "safe_session_key",
    "resume_id",
    "workspace",
    "mcp_config",
];

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Var(String),
    Env(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template(Vec<Piece>);

/// Values for the placeholders.
#[derive(Clone, Debug, Default)]
pub struct Vars(BTreeMap<String, String>);

impl Vars {
    pub fn set(&mut self, name: &str, value: impl Into<String>) {
        self.0.insert(name.to_string(), value.into());
    }

    pub fn get(&self, name: &str) -> &str {
        self.0.get(name).map(String::as_str).unwrap_or("")
    }
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            if start > 0 {
                pieces.push(Piece::Text(rest[..start].to_string()));
            }
            let after = &rest[start + 2..];
            let end = after
                .find("}}")
                .ok_or_else(|| format!("unclosed '{{{{' in {text:?}"))?;
            let name = after[..end].trim();
            if let Some(var) = name.strip_prefix("env.") {
                if var.is_empty() {
                    return Err("{{env.}} needs a variable name".into());
                }
                pieces.push(Piece::Env(var.to_string()));
            } else if NAMES.contains(&name) {
                pieces.push(Piece::Var(name.to_string()));
            } else {
                return Err(format!(
                    "unknown placeholder {{{{{name}}}}}; known: {}, env.NAME",
                    NAMES.join(", ")
                ));
            }
            rest = &after[end + 2..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Template(pieces))
    }

    pub fn render(&self, vars: &Vars) -> String {
        self.0
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.clone(),
                Piece::Var(v) => vars.get(v).to_string(),
                Piece::Env(name) => std::env::var(name).unwrap_or_default(),
            })
            .collect()
    }

    /// Whether the template uses the placeholder `{{name}}`.
    pub fn names(&self, name: &str) -> bool {
        self.0
            .iter()
            .any(|p| matches!(p, Piece::Var(v) if v == name))
    }

    pub fn has_placeholders(&self) -> bool {
        self.0.iter().any(|p| !matches!(p, Piece::Text(_)))
    }

    /// The template's own text without its placeholders.
    pub fn literal_text(&self) -> String {
        self.0
            .iter()
            .filter_map(|p| {
                if let Piece::Text(t) = p {
                    Some(t.as_str())
                } else {
                    None
                }
            })
            .collect()
    }
}

/// A session key reduced to `[A-Za-z0-9_-]`, at most 64 characters; `aamp-<agent>` when empty.
pub fn safe_session_key(key: &str, agent: &str) -> String {
    let safe = crate::fsio::safe_word(key, '-', 64);
    if safe.trim_matches('-').is_empty() {
        format!("aamp-{agent}")
    } else {
        safe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_placeholders_as_plain_text() {
        let t = Template::parse("--x={{prompt}};{{agent}}").unwrap();
        let mut v = Vars::default();
        v.set("prompt", "$(rm -rf /) `id` 'q'");
        v.set("agent", "a");
        assert_eq!(t.render(&v), "--x=$(rm -rf /) `id` 'q';a");
        assert!(Template::parse("{{bogus}}").is_err());
        assert!(Template::parse("{{prompt").is_err());
        assert!(Template::parse("{{env.}}").is_err());
    }

    #[test]
    fn safe_keys() {
        assert_eq!(safe_session_key("a b/../c", "x"), "a-b----c");
        assert_eq!(safe_session_key("", "coder"), "aamp-coder");
        assert_eq!(safe_session_key("///", "coder"), "aamp-coder");
    }
}
