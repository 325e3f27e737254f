//! A delegation chain: what an agent that hands part of its task to another agent passes on
//! with the sub-task, so every bridge on the way can refuse a chain that loops, runs too deep,
//! runs late or has spent its tokens. It rides in `X-AAMP-*` headers of a `task.dispatch`
//! beside the hop count (`X-AAMP-Hop-Count`) and the parent's TaskId (`X-AAMP-ParentTaskId`);
//! `docs/delegation.md` is its reference for other implementations. Pure: no clock, no random
//! numbers (the caller gives both).

use serde::{Deserialize, Serialize};

/// The chain's header names (also in `protocol::message::header`).
pub mod header {
    pub const CHAIN_ID: &str = "X-AAMP-Chain-Id";
    pub const CHAIN: &str = "X-AAMP-Chain";
    pub const DEADLINE: &str = "X-AAMP-Deadline";
    pub const BUDGET_TOKENS: &str = "X-AAMP-Budget-Tokens";
    pub const TRACEPARENT: &str = "X-AAMP-Traceparent";
}

/// The longest list of addresses read from `X-AAMP-Chain`: a chain that long has looped or
/// gone past any hop limit anyway.
pub const MAX_MEMBERS: usize = 64;

/// The longest chain id accepted (written back unchanged on one header line).
pub const MAX_ID: usize = 128;

/// What travels with a delegated task. Every field is optional: a dispatch from a person or a
/// workflow has none, and a receiver reads what it finds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Chain {
    /// The chain's id, the same at every hop (`X-AAMP-Chain-Id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The agents' addresses the chain passed through, oldest first, lowercased
    /// (`X-AAMP-Chain`): an agent finding its own address here would close a loop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// No hop starts after this instant (`X-AAMP-Deadline`, RFC 3339 UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// Model tokens the rest of the chain may still spend (`X-AAMP-Budget-Tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u64>,
    /// The W3C trace context of the hop that sent this one (`X-AAMP-Traceparent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<Traceparent>,
}

impl Chain {
    /// Nothing of a chain was carried.
    pub fn is_empty(&self) -> bool {
        *self == Chain::default()
    }

    /// Reads the chain headers of a mail, each value found by `header` (by name, decoded and
    /// trimmed); a value that is malformed is left out (and so not trusted), never an error: an
    /// ordinary dispatch has none of them.
    pub fn read(header: impl Fn(&str) -> Option<String>) -> Chain {
        let text = |name| header(name).filter(|v| !v.is_empty());
        Chain {
            id: text(header::CHAIN_ID).filter(|id| valid_id(id)),
            members: text(header::CHAIN)
                .map(|list| parse_members(&list))
                .unwrap_or_default(),
            deadline: text(header::DEADLINE).filter(|d| super::time::parse(d).is_some()),
            budget_tokens: text(header::BUDGET_TOKENS).and_then(|b| b.parse().ok()),
            traceparent: text(header::TRACEPARENT).and_then(|t| Traceparent::parse(&t)),
        }
    }

    /// The chain's header fields, in order; absent values are left out.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(id) = &self.id {
            out.push((header::CHAIN_ID, id.clone()));
        }
        if !self.members.is_empty() {
            out.push((header::CHAIN, self.members.join(", ")));
        }
        if let Some(deadline) = &self.deadline {
            out.push((header::DEADLINE, deadline.clone()));
        }
        if let Some(budget) = self.budget_tokens {
            out.push((header::BUDGET_TOKENS, budget.to_string()));
        }
        if let Some(trace) = &self.traceparent {
            out.push((header::TRACEPARENT, trace.to_string()));
        }
        out
    }

    /// Whether `address` is already in the chain (compared without case).
    pub fn contains(&self, address: &str) -> bool {
        let address = address.trim().to_ascii_lowercase();
        self.members.contains(&address)
    }

    /// The chain a task of this chain passes on when the agent at `me` delegates: the same id
    /// (or `new_id` for a chain that starts here), `me` added to the members, the deadline
    /// kept (or `deadline` when there was none, or it is earlier), the budget less what this
    /// hop `spent` (or `budget` when none was carried, or it is lower), and a trace context
    /// whose parent is this hop (`span_id`), in the same trace (or `new_trace`).
    pub fn child(&self, me: &str, spent: u64, limits: ChildLimits) -> Chain {
        let mut members = self.members.clone();
        let me = me.trim().to_ascii_lowercase();
        if !members.contains(&me) {
            members.push(me);
        }
        let deadline = match (&self.deadline, limits.deadline) {
            (Some(ours), Some(theirs)) => Some(earliest(ours, &theirs)),
            (ours, theirs) => ours.clone().or(theirs),
        };
        let left = self.budget_tokens.map(|b| b.saturating_sub(spent));
        let budget_tokens = match (left, limits.budget_tokens) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let trace_id = self
            .traceparent
            .as_ref()
            .map(|t| t.trace_id.clone())
            .unwrap_or_else(|| hex(&limits.new_trace));
        Chain {
            id: self.id.clone().or(Some(limits.new_id)),
            members,
            deadline,
            budget_tokens,
            traceparent: Some(Traceparent {
                trace_id,
                parent_id: hex(&limits.span_id),
                flags: "01".into(),
            }),
        }
    }
}

/// What the delegating hop adds to a chain (see [`Chain::child`]).
#[derive(Clone, Debug)]
pub struct ChildLimits {
    pub new_id: String,
    pub deadline: Option<String>,
    pub budget_tokens: Option<u64>,
    pub new_trace: [u8; 16],
    pub span_id: [u8; 8],
}

/// The earlier of two RFC 3339 instants (the first when one cannot be read).
fn earliest(a: &str, b: &str) -> String {
    match (super::time::parse(a), super::time::parse(b)) {
        (Some(x), Some(y)) if y < x => b.to_string(),
        _ => a.to_string(),
    }
}

fn valid_id(id: &str) -> bool {
    id.len() <= MAX_ID
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:@".contains(c))
}

/// `a@x, b@y` read as addresses: lowercased, each with one `@` and no spaces; anything else
/// is dropped, and at most [`MAX_MEMBERS`] are kept.
fn parse_members(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in list.split(',') {
        let m = part.trim().trim_matches(|c| c == '<' || c == '>');
        let ok = m.matches('@').count() == 1
            && !m.starts_with('@')
            && !m.ends_with('@')
            && m.chars().all(|c| c.is_ascii_graphic() && c != ',');
        if ok && !out.iter().any(|o| o.eq_ignore_ascii_case(m)) {
            out.push(m.to_ascii_lowercase());
        }
        if out.len() == MAX_MEMBERS {
            break;
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A W3C Trace Context `traceparent` (version 00): `00-<trace-id>-<parent-id>-<flags>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Traceparent {
    /// 32 lowercase hex digits, not all zero.
    pub trace_id: String,
    /// 16 lowercase hex digits, not all zero: the span that sent this hop.
    pub parent_id: String,
    /// 2 hex digits (`01`: sampled).
    pub flags: String,
}

impl Traceparent {
    /// Reads a `traceparent` value; `None` unless it is well formed (version 00, or a later
    /// version's first four fields, as the W3C spec asks).
    pub fn parse(text: &str) -> Option<Traceparent> {
        let parts: Vec<&str> = text.trim().split('-').collect();
        let is_hex = |s: &str, n: usize| {
            s.len() == n
                && s.chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        };
        let [version, trace, parent, flags, rest @ ..] = parts.as_slice() else {
            return None;
        };
        let ok = is_hex(version, 2)
            && *version != "ff"
            && (rest.is_empty() || *version != "00")
            && is_hex(trace, 32)
            && trace.chars().any(|c| c != '0')
            && is_hex(parent, 16)
            && parent.chars().any(|c| c != '0')
            && is_hex(flags, 2);
        ok.then(|| Traceparent {
            trace_id: trace.to_string(),
            parent_id: parent.to_string(),
            flags: flags.to_string(),
        })
    }
}

impl std::fmt::Display for Traceparent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "00-{}-{}-{}", self.trace_id, self.parent_id, self.flags)
    }
}

impl From<Traceparent> for String {
    fn from(t: Traceparent) -> String {
        t.to_string()
    }
}

impl TryFrom<String> for Traceparent {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Traceparent::parse(&s).ok_or_else(|| format!("not a traceparent: {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mail's headers, looked up by name without case (the last of a name wins).
    struct View(Vec<(String, String)>);

    impl View {
        fn header(&self, name: &str) -> Option<String> {
            self.0
                .iter()
                .rev()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim().to_string())
        }
    }

    fn view(headers: &[(&str, &str)]) -> View {
        View(
            headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        )
    }

    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_chain_is_read_and_written_back_alike() {
        let mail = view(&[
            ("x-aamp-chain-id", "c-1"),
            (
                "X-AAMP-Chain",
                "Planner@A.test, <coder@b.test>, nonsense, planner@a.test",
            ),
            ("X-AAMP-Deadline", "2030-01-01T00:00:00Z"),
            ("X-AAMP-Budget-Tokens", "5000"),
            ("X-AAMP-Traceparent", TRACE),
        ]);
        let chain = Chain::read(|n| mail.header(n));
        assert_eq!(chain.id.as_deref(), Some("c-1"));
        assert_eq!(chain.members, ["planner@a.test", "coder@b.test"]);
        assert!(chain.contains("CODER@b.test"));
        assert_eq!(chain.budget_tokens, Some(5000));
        assert_eq!(chain.traceparent.as_ref().unwrap().to_string(), TRACE);
        let written: Vec<(String, String)> = chain
            .headers()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        let again_mail = View(written);
        let again = Chain::read(|n| again_mail.header(n));
        assert_eq!(again, chain);
        let json = serde_json::to_string(&chain).unwrap();
        assert_eq!(serde_json::from_str::<Chain>(&json).unwrap(), chain);
        let empty = view(&[]);
        assert!(Chain::read(|n| empty.header(n)).is_empty());
    }

    #[test]
    fn malformed_values_are_not_trusted() {
        let bad = view(&[
            ("X-AAMP-Chain-Id", "has spaces in it"),
            ("X-AAMP-Deadline", "tomorrow"),
            ("X-AAMP-Budget-Tokens", "-3"),
            (
                "X-AAMP-Traceparent",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            ),
        ]);
        let chain = Chain::read(|n| bad.header(n));
        assert!(chain.is_empty(), "{chain:?}");
        assert!(
            Traceparent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x")
                .is_none()
        );
        assert!(
            Traceparent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x")
                .is_some()
        );
        assert!(
            Traceparent::parse("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01").is_none()
        );
    }

    #[test]
    fn a_child_keeps_the_trace_and_the_earlier_deadline_and_spends_the_budget() {
        let parent = Chain {
            id: Some("c-1".into()),
            members: vec!["human-is-not-here@x.test".into()],
            deadline: Some("2030-01-01T00:00:00Z".into()),
            budget_tokens: Some(1000),
            traceparent: Traceparent::parse(TRACE),
        };
        let limits = ChildLimits {
            new_id: "unused".into(),
            deadline: Some("2029-06-01T00:00:00Z".into()),
            budget_tokens: Some(5000),
            new_trace: [7; 16],
            span_id: [1; 8],
        };
        let child = parent.child("Planner@a.test", 300, limits.clone());
        assert_eq!(child.id.as_deref(), Some("c-1"));
        assert!(child.contains("planner@a.test"));
        assert_eq!(child.deadline.as_deref(), Some("2029-06-01T00:00:00Z"));
        assert_eq!(child.budget_tokens, Some(700));
        let trace = child.traceparent.unwrap();
        assert_eq!(trace.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace.parent_id, "0101010101010101");
        // A chain that starts here gets the new id and trace, and the caller's budget.
        let root = Chain::default().child("p@a.test", 10_000, limits.clone());
        assert_eq!(root.id.as_deref(), Some("unused"));
        assert_eq!(root.budget_tokens, Some(5000));
        assert_eq!(root.traceparent.unwrap().trace_id, "07".repeat(16));
        // A parent that spent more than it had passes on nothing.
        let spent_all = ChildLimits {
            budget_tokens: None,
            ..limits.clone()
        };
        assert_eq!(
            parent.child("p@a.test", 5000, spent_all).budget_tokens,
            Some(0)
        );
    }
}
