//! What the wizard remembers between its questions and what it shows before writing: the
//! servers a mailbox was just tested on (offered again, certificate trust included, to the
//! next mailbox on the same domain), and the summary's lines.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{AgentAnswers, MailboxAnswers, OwnMailbox, Servers};

/// The servers that worked, by the address's domain (lower-case).
#[derive(Default)]
pub(super) struct Known(Mutex<HashMap<String, Servers>>);

fn domain(email: &str) -> Option<String> {
    email
        .rsplit_once('@')
        .map(|(_, d)| d.trim().to_ascii_lowercase())
        .filter(|d| !d.is_empty())
}

impl Known {
    /// Keeps the servers of a mailbox whose test passed.
    pub(super) fn worked(&self, mailbox: &MailboxAnswers) {
        if let MailboxAnswers::Existing { email, servers, .. } = mailbox {
            if let (Some(d), Ok(mut known)) = (domain(email), self.0.lock()) {
                known.insert(d, servers.clone());
            }
        }
    }

    /// The servers that worked for another address on `email`'s domain.
    pub(super) fn for_address(&self, email: &str) -> Option<Servers> {
        let d = domain(email)?;
        self.0.lock().ok()?.get(&d).cloned()
    }
}

/// ` (JMAP …, SMTP host:port security)` for the summary.
fn servers_line(s: &Servers) -> String {
    let mut parts = Vec::new();
    if let Some(jmap) = &s.jmap_url {
        parts.push(format!("JMAP {jmap}"));
    }
    if let Some(host) = &s.smtp_host {
        let security = s.smtp_security.unwrap_or_default();
        let port = s.smtp_port.unwrap_or(security.default_port());
        parts.push(format!("SMTP {host}:{port} {}", security.name()));
    }
    if s.insecure_tls {
        parts.push("certificates not verified".to_string());
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!(" ({})", parts.join(", ")),
    }
}

fn mailbox_line(mailbox: &MailboxAnswers) -> String {
    match mailbox {
        MailboxAnswers::Register { servers, .. } => format!(
            "a new mailbox from the AAMP service{}",
            servers_line(servers)
        ),
        MailboxAnswers::Existing { email, servers, .. } => {
            format!("{email}{}", servers_line(servers))
        }
        MailboxAnswers::Keep => "its current mailbox".to_string(),
        MailboxAnswers::Asmtp { handle, .. } => format!("ASMTP {handle}"),
        MailboxAnswers::Amp { address, .. } => format!("AMP {address}"),
        MailboxAnswers::Samp { samp_url, .. } => format!("SAMP at {samp_url}"),
    }
}

/// Who may send an agent tasks, as the summary says it: the person's own mailbox (`me`) is
/// allowed to send to every agent, so an agent with no other sender is not "nobody".
fn senders(agent: &AgentAnswers, own: Option<&OwnMailbox>) -> String {
    let own = own.filter(|o| o.allow).map(|o| format!("you ({})", o.name));
    let mut who: Vec<String> = agent.allow_from.clone();
    if agent.pair {
        who.insert(0, "whoever pairs with the code shown next".to_string());
    }
    who.extend(own);
    match who.len() {
        0 => "nobody yet".to_string(),
        1 => who.remove(0),
        _ => {
            let last = who.pop().unwrap_or_default();
            format!("{} and {last}", who.join(", "))
        }
    }
}

/// The summary's lines.
pub(super) fn lines(agents: &[AgentAnswers], own: Option<&OwnMailbox>) -> Vec<String> {
    let mut out: Vec<String> = agents
        .iter()
        .map(|a| {
            format!(
                "  {} ({}) on {}; tasks from {}",
                a.name,
                a.profile,
                mailbox_line(&a.mailbox),
                senders(a, own)
            )
        })
        .collect();
    if let Some(own) = own {
        let on = match &own.mailbox {
            m @ (MailboxAnswers::Register { .. } | MailboxAnswers::Existing { .. }) => {
                mailbox_line(m)
            }
            _ => "its current mailbox".to_string(),
        };
        out.push(format!(
            "  you ({}) on {on}; may send tasks to the agents above",
            own.name
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(allow_from: &[&str], pair: bool) -> AgentAnswers {
        AgentAnswers {
            name: "helper".into(),
            profile: "echo".into(),
            mailbox: MailboxAnswers::Keep,
            allow_from: allow_from.iter().map(|s| s.to_string()).collect(),
            pair,
            summary: None,
        }
    }

    /// Issue 43: "tasks from nobody yet" stood beside "you (me) ... may send tasks".
    #[test]
    fn the_own_mailbox_counts_among_the_senders() {
        let own = OwnMailbox {
            name: "me".into(),
            mailbox: MailboxAnswers::Keep,
            allow: true,
        };
        let text = lines(&[agent(&[], false)], Some(&own)).join("\n");
        assert!(text.contains("tasks from you (me)"), "{text}");
        assert!(!text.contains("nobody"), "{text}");
        assert!(lines(&[agent(&["a@x"], false)], Some(&own))[0]
            .ends_with("tasks from a@x and you (me)"));
        assert!(lines(&[agent(&[], false)], None)[0].ends_with("tasks from nobody yet"));
    }

    /// Issue 43: a second mailbox on the same domain was offered the guessed servers again,
    /// not those that had just worked, and asked again to trust the certificate.
    #[test]
    fn servers_that_worked_are_offered_for_the_same_domain() {
        let known = Known::default();
        let servers = Servers {
            jmap_url: Some("https://mail.example.com:8443/jmap".into()),
            smtp_host: Some("mail.example.com".into()),
            smtp_port: Some(2525),
            smtp_security: None,
            insecure_tls: true,
        };
        known.worked(&MailboxAnswers::Existing {
            email: "agent@Example.com".into(),
            login: None,
            password: None,
            password_file: None,
            servers: servers.clone(),
        });
        let again = known.for_address("me@example.com").unwrap();
        assert_eq!(again.jmap_url, servers.jmap_url);
        assert_eq!(again.smtp_port, Some(2525));
        assert!(again.insecure_tls);
        assert!(known.for_address("me@other.org").is_none());
    }
}
