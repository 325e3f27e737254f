//! Writing a config back as TOML: what `init` and `import` save. The text is commented, keys
//! come in the order the loader documents them, values equal to their defaults are left out,
//! and what it writes loads back to the same config (tested below).

use serde::Serialize;
use toml::{Table, Value};

use super::{AgentConfig, Config, MailboxConfig, MailboxKind};

/// One comment line per key the wizard may write.
const COMMENTS: &[(&str, &str)] = &[
    ("state_dir", "journal, cursors, task workspaces"),
    ("profiles_dir", "your own profiles, searched first"),
    (
        "max_concurrent_tasks",
        "tasks running at once across all agents",
    ),
    (
        "shutdown_grace_secs",
        "after SIGTERM, running tasks get this long to finish",
    ),
    (
        "outbox_retry_hours",
        "an ack or result that cannot be sent is retried this long",
    ),
    (
        "journal_retention_days",
        "finished tasks are remembered this long",
    ),
    (
        "journal_max_size_mb",
        "past this size the oldest finished tasks are forgotten",
    ),
    (
        "email",
        "the mailbox's address: mail to it is the agent's work",
    ),
    (
        "credentials_file",
        "{email, mailboxToken, smtpPassword}, mode 0600",
    ),
    ("slug", "the address prefix asked for at registration"),
    ("jmap_url", "JMAP session URL"),
    ("login", "login name for JMAP and SMTP"),
    ("password_file", "the password, in a file of mode 0600"),
    ("smtp_host", "SMTP submission server"),
    ("smtp_security", "starttls | tls | plain (loopback only)"),
    (
        "insecure_tls",
        "accept invalid certificates from this mailbox's hosts",
    ),
    ("push", "JMAP push when the server offers it"),
    ("save_sent", "keep a copy of what the bridge sends in Sent"),
    (
        "sender_auth",
        "what makes a From believable (docs/security.md)",
    ),
    (
        "aamp_url",
        "the AAMP service: live task streams, registration, directory",
    ),
    ("name", "[a-z0-9_-]"),
    ("mailbox", "a [mailboxes] key"),
    ("profile", "a profile name (aamp-bridge agents) or a file"),
    ("allow_from", "who may send tasks; empty = nobody"),
    ("senders", "allow rules with dispatch-context conditions"),
    ("deny_from", "refused whatever else allows them"),
    ("max_concurrent_tasks", "tasks this agent runs at once"),
    ("summary", "published in the AAMP service's directory"),
];

fn comment(key: &str) -> Option<&'static str> {
    COMMENTS.iter().find(|(k, _)| *k == key).map(|(_, c)| *c)
}

fn table_of<T: Serialize>(value: &T) -> Table {
    match Value::try_from(value) {
        Ok(Value::Table(t)) => t,
        // The config types are structs of plain values: they always serialize to a table.
        other => unreachable!("a config struct serialized to {other:?}"),
    }
}

fn defaults<T: Serialize + serde::de::DeserializeOwned>(minimal: &str) -> Table {
    let value: T = toml::from_str(minimal).expect("the minimal table loads");
    table_of(&value)
}

/// A key as TOML writes it: bare when it can be.
fn key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        name.to_string()
    } else {
        Value::String(name.to_string()).to_string()
    }
}

fn write_keys(out: &mut String, table: &Table, defaults: &Table, skip: &[&str]) {
    for (name, value) in table {
        if skip.contains(&name.as_str()) || defaults.get(name) == Some(value) {
            continue;
        }
        let line = format!("{} = {}", key(name), value);
        match comment(name) {
            Some(c) if line.len() < 60 => {
                out.push_str(&format!("{line:<40} # {c}\n"));
            }
            Some(c) => out.push_str(&format!("# {c}\n{line}\n")),
            None => out.push_str(&format!("{line}\n")),
        }
    }
}

/// The config as a commented TOML file.
pub fn render(config: &Config) -> String {
    let mut out = String::from(
        "# aamp-bridge config (the manual's docs/configuration.md). `aamp-bridge init` rewrites this file\n\
         # when run again: your values are kept, comments you add are not.\n\n",
    );
    let top = table_of(config);
    write_keys(
        &mut out,
        &top,
        &defaults::<Config>(""),
        &["mailboxes", "agents"],
    );
    for (name, mailbox) in &config.mailboxes {
        out.push_str(&format!("\n[mailboxes.{}]\n", key(name)));
        // Each key against its kind's default; `kind` itself is left out when it is the
        // default kind.
        let mut mailbox_defaults =
            table_of(&MailboxConfig::new(mailbox.kind(), Default::default()));
        if mailbox.kind() != MailboxKind::default() {
            mailbox_defaults.remove("kind");
        }
        write_keys(&mut out, &table_of(mailbox), &mailbox_defaults, &[]);
    }
    let agent_defaults = defaults::<AgentConfig>("name = \"\"\nprofile = \"\"\n");
    for agent in &config.agents {
        out.push_str("\n[[agents]]\n");
        write_keys(&mut out, &table_of(agent), &agent_defaults, &[]);
    }
    while out.contains("\n\n\n") {
        out = out.replace("\n\n\n", "\n\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(text: &str) {
        let config: Config = toml::from_str(text).unwrap();
        let written = render(&config);
        let again: Config = toml::from_str(&written)
            .unwrap_or_else(|e| panic!("the rendered config does not load: {e}\n{written}"));
        assert_eq!(table_of(&config), table_of(&again), "{written}");
        assert_eq!(render(&again), written, "rendering is stable");
    }

    /// The first TOML block of a page of the manual.
    fn first_toml_block(page: &str) -> &str {
        let begin = page.find("```toml\n").unwrap() + 8;
        let end = page[begin..].find("```").unwrap();
        &page[begin..begin + end]
    }

    /// The manual's example config: the bridge and its agents (docs/configuration.md) with
    /// the AAMP mailboxes they name (docs/mailboxes/aamp.md), as one file.
    #[test]
    fn the_manuals_example_round_trips() {
        let config = include_str!("../../docs/configuration.md");
        let aamp = include_str!("../../docs/mailboxes/aamp.md");
        let whole = format!("{}\n{}", first_toml_block(config), first_toml_block(aamp));
        round_trip(&whole);
    }

    #[test]
    fn odd_names_rules_and_defaults_round_trip() {
        round_trip(
            r#"
            max_concurrent_tasks = 3
            [mailboxes."with space"]
            email = "a@example.com"
            jmap_url = "https://x/.well-known/jmap"
            password_file = "p"
            smtp_host = "x"
            smtp_port = 2525
            push = false
            sender_auth = "authentication-results"
            [[agents]]
            name = "a"
            mailbox = "with space"
            profile = "echo"
            allow_from = ["b@example.com", "@team.example"]
            senders = [{ sender = "c@x", context = { project = ["p1", "p \"2\""] } }]
            sender_policy = """allow_from: d@x
            context_equals: k=v"""
            unknown_senders = "ignore"
            [agents.budget]
            tokens_per_day = 1000
            usd_per_month = 12.5
            hard = true
            [agents.sender_budget]
            usd_per_day = 1
            [sender_budget]
            tokens_per_month = 5000
            [prices."claude-sonnet-4*"]
            input_per_million = 3
            output_per_million = 15
            cache_read_per_million = 0.3
            "#,
        );
    }

    /// Each kind of mailbox is written with its `kind` (but the default one), its own keys,
    /// and the common keys that are not at their default, in the order they always had.
    #[test]
    fn every_kind_of_mailbox_round_trips() {
        let text = r#"
            [mailboxes.a]
            kind = "asmtp"
            asmtp_url = "https://asmtp.test"
            handle = "@o.a"
            token_file = "a.token"
            skip_backlog = true
            poll_interval_secs = 2
            [mailboxes.b]
            kind = "amp"
            amp_url = "https://amp.test"
            address = "b@u.amp.test"
            agent_id = "b1"
            api_key_file = "b.key"
            recheck_secs = 0
            insecure_tls = true
            [mailboxes.c]
            kind = "samp"
            samp_url = "https://samp.test/mcp"
            key_file = "c.key"
            timeout_secs = 9
            [mailboxes.d]
            kind = "aamp"
            email = "d@x"
            jmap_url = "https://x"
            password_file = "p"
            smtp_host = "x"
            insecure_tls = true
            poll_interval_secs = 3
            replica = "h"
            "#;
        round_trip(text);
        let written = render(&toml::from_str(text).unwrap());
        assert!(
            written.contains(
                "[mailboxes.a]\nkind = \"asmtp\"\nasmtp_url = \"https://asmtp.test\"\nhandle = \"@o.a\"\ntoken_file = \"a.token\"\nskip_backlog = true\npoll_interval_secs = 2\n"
            ) && written.contains("[mailboxes.c]\nkind = \"samp\"\nsamp_url = \"https://samp.test/mcp\"\nkey_file = \"c.key\"\ntimeout_secs = 9\n")
                && written.contains("smtp_host = \"x\"")
                && !written.contains("kind = \"aamp\""),
            "{written}"
        );
        let d = &written[written.find("[mailboxes.d]").unwrap()..];
        let at = |key: &str| d.find(key).unwrap_or_else(|| panic!("{key}: {d}"));
        assert!(
            at("smtp_host") < at("insecure_tls")
                && at("insecure_tls") < at("poll_interval_secs")
                && at("poll_interval_secs") < at("replica"),
            "{d}"
        );
    }

    #[test]
    fn defaults_are_left_out_and_keys_are_commented() {
        let config: Config = toml::from_str(
            "[mailboxes.m]\nemail = \"a@x\"\njmap_url = \"u\"\npassword_file = \"p\"\nsmtp_host = \"h\"\n[[agents]]\nname = \"a\"\nprofile = \"echo\"\nallow_from = [\"b@x\"]\n",
        )
        .unwrap();
        let text = render(&config);
        assert!(!text.contains("push"), "{text}");
        assert!(!text.contains("max_hops"), "{text}");
        assert!(text.contains("allow_from = [\"b@x\"]"), "{text}");
        assert!(text.contains("# who may send tasks"), "{text}");
    }
}
