//! Who may hand an agent work. Pure code.
//!
//! A policy is a list of allow rules and deny patterns. A sender pattern is a case-insensitive
//! glob over the whole address (`*` any run of characters, `?` one), or `@domain` for every
//! address at exactly that domain; a plain address matches itself. An allow rule may also
//! require dispatch-context values: for every key it lists, the dispatch's
//! `X-AAMP-Dispatch-Context` must hold that key with one of the listed values. A deny pattern
//! wins over any allow rule. An empty policy allows nobody.

use std::collections::BTreeMap;

/// What a sender the policy refuses hears back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownSenders {
    /// A `rejected` result saying why (at most `max_refusals_per_hour` of them).
    #[default]
    Reject,
    /// Nothing at all.
    Ignore,
}

/// How a task cancelled by its dispatcher is answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CancelReply {
    /// `task.result` rejected with `X-AAMP-ErrorMsg: cancelled`.
    #[default]
    Result,
    /// No answer.
    Silent,
}

/// One allow rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rule {
    pub sender: String,
    /// key → allowed values; every key must be present with one of its values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, Vec<String>>,
}

impl Rule {
    pub fn sender(pattern: &str) -> Rule {
        Rule {
            sender: normalize(pattern),
            context: BTreeMap::new(),
        }
    }

    fn matches(&self, sender: &str, context: &BTreeMap<String, String>) -> bool {
        glob(&self.sender, sender)
            && self
                .context
                .iter()
                .filter(|(_, values)| !values.is_empty())
                .all(|(key, values)| context.get(key).is_some_and(|v| values.contains(v)))
    }
}

/// A sender pattern as it is compared: trimmed, lower-case, `@domain` as `*@domain`.
pub fn normalize(pattern: &str) -> String {
    let p = pattern.trim().to_ascii_lowercase();
    match p.strip_prefix('@') {
        Some(domain) => format!("*@{domain}"),
        None => p,
    }
}

/// Whether `pattern` (normalized) matches all of `text`: `*` any run, `?` one character.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The decision for one sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed by this rule (its sender pattern).
    Allowed(String),
    /// Refused; why, to tell the sender.
    Refused(String),
}

#[derive(Clone, Debug, Default)]
pub struct SenderPolicy {
    allow: Vec<Rule>,
    deny: Vec<String>,
}

impl SenderPolicy {
    /// Allow rules from plain patterns.
    pub fn new(patterns: &[String]) -> SenderPolicy {
        SenderPolicy {
            allow: patterns.iter().map(|p| Rule::sender(p)).collect(),
            deny: Vec::new(),
        }
    }

    pub fn with_rules(mut self, rules: impl IntoIterator<Item = Rule>) -> SenderPolicy {
        self.allow.extend(rules.into_iter().map(|mut r| {
            r.sender = normalize(&r.sender);
            r
        }));
        self
    }

    pub fn with_denied(mut self, patterns: impl IntoIterator<Item = String>) -> SenderPolicy {
        self.deny
            .extend(patterns.into_iter().map(|p| normalize(&p)));
        self
    }

    pub fn rules(&self) -> &[Rule] {
        &self.allow
    }

    pub fn denied(&self) -> &[String] {
        &self.deny
    }

    pub fn check(&self, sender: &str, context: &BTreeMap<String, String>) -> Verdict {
        let sender = sender.trim().to_ascii_lowercase();
        if !sender.contains('@') {
            return Verdict::Refused(format!("{sender:?} is not an address"));
        }
        if let Some(p) = self.deny.iter().find(|p| glob(p, &sender)) {
            return Verdict::Refused(format!("sender {sender} is denied ({p})"));
        }
        if let Some(rule) = self.allow.iter().find(|r| r.matches(&sender, context)) {
            return Verdict::Allowed(rule.sender.clone());
        }
        if self.allow.iter().any(|r| glob(&r.sender, &sender)) {
            return Verdict::Refused(format!(
                "sender {sender} is allowed only for certain X-AAMP-Dispatch-Context values, and this dispatch does not have them"
            ));
        }
        Verdict::Refused(format!("sender {sender} is not allowed"))
    }

    /// Whether some dispatch of `sender` could be allowed (with the right dispatch context):
    /// not denied, and named by an allow rule.
    pub fn may_ever_dispatch(&self, sender: &str) -> bool {
        let sender = sender.trim().to_ascii_lowercase();
        !self.deny.iter().any(|p| glob(p, &sender))
            && self.allow.iter().any(|r| glob(&r.sender, &sender))
    }

    pub fn allows(&self, sender: &str) -> bool {
        matches!(self.check(sender, &BTreeMap::new()), Verdict::Allowed(_))
    }

    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
    }
}

/// Reads the reference bridges' text form: `allow_from: a@x, *@y` lines, each followed by
/// optional `context_equals: key=v1, key=v2` lines that apply to the senders of the
/// `allow_from` line before them. `#` starts a comment.
pub fn parse_text(text: &str) -> Result<Vec<Rule>, String> {
    let mut rules: Vec<Rule> = Vec::new();
    let mut group = 0..0;
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let (key, value) = line.split_once(':').ok_or_else(|| {
            format!(
                "line {}: expected `allow_from:` or `context_equals:`",
                n + 1
            )
        })?;
        match key.trim().to_ascii_lowercase().as_str() {
            "allow_from" => {
                let start = rules.len();
                rules.extend(
                    value
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(Rule::sender),
                );
                group = start..rules.len();
            }
            "context_equals" => {
                if group.is_empty() {
                    return Err(format!(
                        "line {}: context_equals before any allow_from",
                        n + 1
                    ));
                }
                for pair in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let (k, v) = pair
                        .split_once('=')
                        .ok_or_else(|| format!("line {}: {pair:?} is not key=value", n + 1))?;
                    for rule in &mut rules[group.clone()] {
                        rule.context
                            .entry(k.trim().to_string())
                            .or_default()
                            .push(v.trim().to_string());
                    }
                }
            }
            other => return Err(format!("line {}: unknown key {other:?}", n + 1)),
        }
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn patterns() {
        let p = SenderPolicy::new(&[
            "Boss@Corp.test".into(),
            "*@team.test".into(),
            "@ops.test".into(),
            "disp-*@example.com".into(),
        ]);
        assert!(p.allows("boss@corp.test"));
        assert!(p.allows("BOSS@CORP.TEST"));
        assert!(!p.allows("other@corp.test"));
        assert!(p.allows("anyone@team.test"));
        assert!(!p.allows("anyone@evil-team.test"));
        assert!(!p.allows("anyone@sub.team.test"));
        assert!(p.allows("x@ops.test"));
        assert!(
            p.allows("disp-42@example.com"),
            "a glob copied from the reference bridge works"
        );
        assert!(!p.allows("disp-42@example.com.evil.test"));
        assert!(!p.allows("no-at-sign"));
        assert!(!SenderPolicy::new(&[]).allows("boss@corp.test"));
    }

    #[test]
    fn globs_match_whole_addresses() {
        assert!(glob("a*b?d", "aXXbcd"));
        assert!(glob("*", "anything"));
        assert!(!glob("a*", "ba"));
        assert!(glob("*@x.test", "@x.test"));
        assert!(!glob("*@x.test", "a@x.test.evil"));
    }

    #[test]
    fn context_rules_and_denials() {
        let mut rule = Rule::sender("*@corp.test");
        rule.context
            .insert("project".into(), vec!["alpha".into(), "beta".into()]);
        let p = SenderPolicy::default()
            .with_rules([rule])
            .with_denied(["mallory@corp.test".to_string()]);
        assert!(matches!(
            p.check("a@corp.test", &ctx(&[("project", "beta")])),
            Verdict::Allowed(_)
        ));
        let wrong = p.check("a@corp.test", &ctx(&[("project", "gamma")]));
        assert!(
            matches!(&wrong, Verdict::Refused(r) if r.contains("Dispatch-Context")),
            "{wrong:?}"
        );
        assert!(matches!(
            p.check("a@corp.test", &ctx(&[])),
            Verdict::Refused(_)
        ));
        assert!(
            matches!(p.check("mallory@corp.test", &ctx(&[("project", "alpha")])), Verdict::Refused(r) if r.contains("denied"))
        );
    }

    #[test]
    fn the_reference_text_form_reads() {
        let rules = parse_text(
            "# who may ask\nallow_from: a@x.test, *@y.test\ncontext_equals: project=p1, project=p2, env=prod\nallow_from: ops@z.test\n",
        )
        .unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[1].sender, "*@y.test");
        assert_eq!(rules[1].context["project"], vec!["p1", "p2"]);
        assert_eq!(rules[1].context["env"], vec!["prod"]);
        assert!(rules[2].context.is_empty());
        assert!(parse_text("context_equals: a=b").is_err());
        assert!(parse_text("allow: a@b").is_err());
    }
}
