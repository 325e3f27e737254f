//! `aamp-bridge policy` and `pair`: the sender rules kept in the state directory, and pairing
//! codes.

use crate::output::outln;

use super::*;
use crate::config::AgentConfig;
use crate::dispatch::policy::{normalize, Rule};
use crate::dispatch::Journal;

pub(super) fn policy(config: &LoadedConfig, action: PolicyAction) -> anyhow::Result<i32> {
    let agent = policy_agent(config, &action)?;
    let journal = crate::dispatch::Journal::open(&config.state().journal())?;
    match action {
        PolicyAction::List { json, .. } => list(agent, &journal, json),
        PolicyAction::Allow {
            sender, context, ..
        } => allow(agent, &journal, &sender, context),
        PolicyAction::Deny { sender, .. } => {
            check_sender(&sender)?;
            journal.add_policy(&agent.name, true, &Rule::sender(&sender), "cli")?;
            outln!("agent {}: {} is refused", agent.name, normalize(&sender));
            Ok(0)
        }
        PolicyAction::Remove { sender, .. } => remove(agent, &journal, &sender),
    }
}

/// The agent `action` is about, or an error naming the config's agents.
fn policy_agent<'a>(
    config: &'a LoadedConfig,
    action: &PolicyAction,
) -> anyhow::Result<&'a AgentConfig> {
    let (PolicyAction::List { agent, .. }
    | PolicyAction::Allow { agent, .. }
    | PolicyAction::Deny { agent, .. }
    | PolicyAction::Remove { agent, .. }) = action;
    let agents = &config.config.agents;
    let Some(found) = agents.iter().find(|a| &a.name == agent) else {
        let names: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
        bail!(
            "no agent {agent:?} in {}; the agents are: {}",
            config.path.display(),
            names.join(", ")
        );
    };
    Ok(found)
}

fn check_sender(sender: &str) -> anyhow::Result<()> {
    if sender.contains('@') {
        return Ok(());
    }
    bail!("{sender:?} is not an address or a pattern: write a@b.com, disp-*@b.com or @b.com")
}

/// `policy list`: the config's rules, then those kept here.
fn list(agent: &AgentConfig, journal: &Journal, json: bool) -> anyhow::Result<i32> {
    use serde_json::json;
    let from_config = agent.sender_policy();
    let (allow, deny) = journal.policy(&agent.name)?;
    let mut rows = Vec::new();
    for rule in from_config.rules() {
        rows.push(json!({"kind": "allow", "sender": rule.sender, "context": rule.context, "source": "config"}));
    }
    for pattern in from_config.denied() {
        rows.push(json!({"kind": "deny", "sender": pattern, "source": "config"}));
    }
    for (rule, source) in allow {
        rows.push(json!({"kind": "allow", "sender": rule.sender, "context": rule.context, "source": source}));
    }
    for (pattern, source) in deny {
        rows.push(json!({"kind": "deny", "sender": pattern, "source": source}));
    }
    if json {
        outln!(
            "{}",
            crate::events::json_text(&serde_json::Value::Array(rows))?
        );
        return Ok(0);
    }
    if rows.is_empty() {
        outln!(
            "agent {}: nobody may send tasks yet (aamp-bridge policy allow --agent {} ADDRESS)",
            agent.name,
            agent.name
        );
    }
    for row in &rows {
        let context = match row["context"].as_object() {
            Some(c) if !c.is_empty() => format!(" when {}", serde_json::Value::Object(c.clone())),
            _ => String::new(),
        };
        outln!(
            "{:<5} {}{context}  ({})",
            row["kind"].as_str().unwrap_or_default(),
            row["sender"].as_str().unwrap_or_default(),
            row["source"].as_str().unwrap_or_default()
        );
    }
    Ok(0)
}

/// `policy allow`: a sender, when the task's context matches each `KEY=VALUE`.
fn allow(
    agent: &AgentConfig,
    journal: &Journal,
    sender: &str,
    context: Vec<String>,
) -> anyhow::Result<i32> {
    check_sender(sender)?;
    let mut rule = Rule::sender(sender);
    for pair in context {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("--context {pair:?}: write KEY=VALUE"))?;
        rule.context
            .entry(k.trim().to_string())
            .or_default()
            .push(v.trim().to_string());
    }
    journal.add_policy(&agent.name, false, &rule, "cli")?;
    outln!("agent {}: {} may send tasks", agent.name, normalize(sender));
    Ok(0)
}

/// `policy remove`: exit 1 when no rule kept here names the sender.
fn remove(agent: &AgentConfig, journal: &Journal, sender: &str) -> anyhow::Result<i32> {
    let n = journal.remove_policy(&agent.name, sender)?;
    if n == 0 {
        outln!(
            "agent {}: no rule for {} was added here (rules in the config are changed there)",
            agent.name,
            normalize(sender)
        );
        return Ok(1);
    }
    outln!(
        "agent {}: forgot {n} rule(s) for {}",
        agent.name,
        normalize(sender)
    );
    Ok(0)
}

pub(super) fn pair(
    config: &LoadedConfig,
    agent_name: &str,
    ttl_secs: u64,
    json: bool,
) -> anyhow::Result<i32> {
    let Some(agent) = config.config.agents.iter().find(|a| a.name == agent_name) else {
        bail!("no agent {agent_name:?} in {}", config.path.display());
    };
    let mailbox = agent.mailbox_name().to_string();
    let email = config.mailbox_address(&mailbox)?;
    let journal = crate::dispatch::Journal::open(&config.state().journal())?;
    let code = crate::dispatch::new_pair_code();
    let expires = journal.add_pair_code(&agent.name, &code, Duration::from_secs(ttl_secs))?;
    let url = format!(
        "aamp://connect?mailbox={}&pair_code={}",
        protocol::codec::encode_uri_component(&email),
        code
    );
    let expires_at = protocol::time::format_utc(expires);
    if json {
        outln!(
            "{}",
            serde_json::json!({"agent": agent.name, "mailbox": email, "code": code, "url": url, "expiresAt": expires_at})
        );
        return Ok(0);
    }
    let qr = qrcode::QrCode::new(url.as_bytes())
        .map(|q| {
            q.render::<qrcode::render::unicode::Dense1x2>()
                .quiet_zone(true)
                .build()
        })
        .unwrap_or_default();
    outln!("{qr}");
    outln!("Pair with agent {} ({email}):", agent.name);
    outln!("  {url}");
    outln!("  code {code}, valid until {expires_at} (once)");
    outln!("The bridge must be running to answer the pair request.");
    Ok(0)
}
