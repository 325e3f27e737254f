//! Config files for tests, built a table at a time instead of TOML written out in each test.

use super::*;

/// A config file's text.
#[derive(Clone, Debug, Default)]
pub struct Toml {
    top: String,
    mailboxes: String,
    agents: String,
}

impl Toml {
    pub fn new() -> Toml {
        Toml::default()
    }

    /// A top-level setting (`shutdown_grace_secs = 5`).
    pub fn top(mut self, line: &str) -> Toml {
        self.top.push_str(line.trim_end());
        self.top.push('\n');
        self
    }

    /// A mailbox on the test host (polled every second unless `settings` says otherwise),
    /// with more keys in `settings` (`push = false`, `sender_auth = "none"`).
    pub fn host_mailbox(
        mut self,
        host: &MailHost,
        key: &str,
        account: &Account,
        settings: &str,
    ) -> Toml {
        let settings = if settings.contains("poll_interval_secs") {
            settings.to_string()
        } else {
            format!("poll_interval_secs = 1\n{settings}")
        };
        self.mailboxes
            .push_str(&host.mailbox_toml_with(key, account, &settings));
        self
    }

    /// Any other mailbox table, as written.
    pub fn mailbox_text(mut self, text: &str) -> Toml {
        self.mailboxes.push_str(text);
        self.mailboxes.push('\n');
        self
    }

    /// An agent on the mailbox of its own name, running `profile`, taking tasks from `allow`,
    /// with more keys in `extra`.
    pub fn agent(mut self, name: &str, profile: &str, allow: &[&str], extra: &str) -> Toml {
        let allow: Vec<String> = allow.iter().map(|a| format!("{a:?}")).collect();
        self.agents.push_str(&format!(
            "[[agents]]\nname = \"{name}\"\nmailbox = \"{name}\"\nprofile = \"{profile}\"\nallow_from = [{}]\n{extra}\n",
            allow.join(", ")
        ));
        self
    }

    pub fn text(&self) -> String {
        format!("{}\n{}{}", self.top, self.mailboxes, self.agents)
    }
}

/// The config most tests use: one agent `agent` on the test host's mailbox `agent`, running
/// `profile`, taking tasks from `allow`.
pub fn one_agent(host: &MailHost, account: &Account, profile: &str, allow: &str) -> Toml {
    Toml::new()
        .host_mailbox(host, "agent", account, "")
        .agent("agent", profile, &[allow], "")
}
