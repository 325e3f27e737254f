//! `aamp-bridge status`: each agent's link, queue, running tasks and unsent answers (from the
//! running bridge's control socket, else the state files).

use crate::output::outln;

use super::*;

use crate::mailbox::link::{Credentials, LinkState};
use serde_json::Value;

pub(super) async fn status(config: &LoadedConfig, json: bool) -> anyhow::Result<i32> {
    let running = crate::fsio::StateLock::holder(&config.state_dir);
    // Live figures from the running bridge, when it answers on its control socket.
    let live = running
        .as_ref()
        .and_then(|_| daemon::ask_control(&config.state_dir));
    let journal_path = config.state().journal();
    let journal = journal_path
        .exists()
        .then(|| crate::dispatch::Journal::open(&journal_path))
        .transpose()?;
    let (agents, links): (Vec<_>, Vec<_>) =
        crate::ui::snapshot::agents(config, journal.as_ref(), live.as_ref(), true)
            .await?
            .into_iter()
            .map(|a| (a.json, a.link))
            .unzip();
    let journal_bytes = crate::dispatch::journal::size_on_disk(&journal_path);
    let max_mb = config.config.journal_max_size_mb;
    if json {
        outln!(
            "{}",
            serde_json::json!({"running": running.is_some(), "pid": running, "stateDir": config.state_dir,
                "source": if live.is_some() { "daemon" } else { "state files" },
                "journal": {"path": journal_path, "bytes": journal_bytes, "maxBytes": max_mb.saturating_mul(1 << 20)},
                "daemon": live, "agents": agents})
        );
        return Ok(0);
    }
    print_bridge(config, running.as_deref(), live.as_ref());
    outln!(
        "journal {}: {:.1} MB (kept under {max_mb} MB)",
        journal_path.display(),
        journal_bytes as f64 / f64::from(1 << 20)
    );
    for (a, link) in agents.iter().zip(&links) {
        print_agent(a, link.as_ref());
    }
    Ok(0)
}

/// Whether the bridge runs, and since when (from its control socket's answer).
fn print_bridge(config: &LoadedConfig, running: Option<&str>, live: Option<&Value>) {
    let Some(pid) = running else {
        outln!(
            "aamp-bridge is not running (state in {}); what it last knew:",
            config.state_dir.display()
        );
        return;
    };
    let up = live.map(|l| {
        let version = l["version"].as_str().unwrap_or("?");
        format!(", up {} s, version {version}", l["uptimeSecs"])
    });
    outln!(
        "aamp-bridge is running (pid {pid}{}), state in {}",
        up.unwrap_or_default(),
        config.state_dir.display()
    );
}

/// One agent of `status`: its `json` of the snapshot and its link.
fn print_agent(a: &Value, link: Option<&LinkState>) {
    print_link(a, link);
    if a["login"]["loggedIn"] == false {
        outln!(
            "    the agent is not logged in: {}; fix: {}",
            a["login"]["detail"].as_str().unwrap_or_default(),
            a["login"]["fix"].as_str().unwrap_or_default()
        );
    }
    if let Some(c) = link.and_then(|l| l.credentials.as_ref()) {
        print_credentials(c);
    }
    print_queue(a);
    if let Some(u) = crate::protocol::usage_wire::from_json(&a["usageToday"]) {
        outln!("    today (UTC): {}", crate::protocol::usage_wire::line(&u));
    }
    if let Some(me) = a["replica"].as_str() {
        print_replicas(me, &a["replicas"]);
    }
    for t in a["running"].as_array().into_iter().flatten() {
        outln!(
            "    - {} ({}, {} s, from {})",
            t["taskId"].as_str().unwrap_or_default(),
            t["state"].as_str().unwrap_or_default(),
            t["ageSecs"],
            t["from"].as_str().unwrap_or_default()
        );
    }
}

/// The agent's address, how its mailbox is reached and read, and its last error.
fn print_link(a: &Value, link: Option<&LinkState>) {
    let reach = link.map_or("never connected", |l| l.mailbox.as_str());
    outln!(
        "{}  <{}>  mailbox {reach} since {}, {}",
        a["agent"].as_str().unwrap_or_default(),
        a["mailbox"].as_str().unwrap_or_default(),
        link.map_or("-", |l| l.since.as_str()),
        match link.map(|l| l.reading()) {
            Some(Some("polling")) | None => "polling".to_string(),
            Some(Some(p)) => format!("push over {p}"),
            Some(None) => "no mail read until it answers".to_string(),
        }
    );
    if let Some(error) = link.and_then(|l| l.last_error.as_deref()) {
        outln!("    last error: {error}");
    }
}

/// Whether the mailbox's credentials work, and where and when they were read.
fn print_credentials(c: &Credentials) {
    outln!(
        "    credentials {}, read {}{}",
        match c.worked {
            Some(true) => "work",
            Some(false) => "refused",
            None => "not tried yet",
        },
        c.read_at,
        match &c.file {
            Some(file) if c.since != c.read_at => {
                format!(" from {file} (these since {})", c.since)
            }
            Some(file) => format!(" from {file}"),
            None => " (in the config)".to_string(),
        }
    );
}

/// The agent's tasks by where they are: queued, running, unsent, parked, undelivered.
fn print_queue(a: &Value) {
    outln!(
        "    {} queued, {} running, {} answers waiting to be sent",
        a["queued"],
        a["running"].as_array().map_or(0, Vec::len),
        a["unsent"]
    );
    if a["parked"].as_u64().unwrap_or(0) > 0 {
        outln!(
            "    {} tasks parked, not run or answered here: {} (tried again at the next start; aamp-bridge tasks --state parked)",
            a["parked"],
            a["parkedReason"].as_str().unwrap_or("the server refused their claims")
        );
    }
    if let Some(quota) = a["quota"].as_object() {
        let until = match quota.get("until").and_then(Value::as_str) {
            Some(t) => format!("until {t}"),
            None => "(no reset stated; tried again with backoff)".to_string(),
        };
        outln!(
            "    waiting for quota {until}: {}",
            quota.get("said").and_then(Value::as_str).unwrap_or("")
        );
    }
    if a["undelivered"].as_u64().unwrap_or(0) > 0 {
        outln!(
            "    {} answers could not be delivered in the last 7 days (aamp-bridge tasks --state undelivered)",
            a["undelivered"]
        );
    }
}

/// For a mailbox of several bridges (this one `me`): the claims each replica holds, as
/// `seen` on the server (null when it could not be read).
fn print_replicas(me: &str, seen: &Value) {
    let held: Vec<String> = seen
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, n)| {
            let mine = if name == me { " (this one)" } else { "" };
            match n["expired"].as_u64() {
                Some(0) | None => format!("{name}{mine}: {} running", n["held"]),
                Some(x) => format!(
                    "{name}{mine}: {} running, {x} whose lease ran out (to be taken over)",
                    n["held"]
                ),
            }
        })
        .collect();
    match (seen.is_null(), held.is_empty()) {
        (true, _) => outln!("    replica {me}; the claims on the server could not be read"),
        (false, true) => outln!("    replica {me}; no replica holds a task now"),
        (false, false) => outln!("    replica {me}; claims: {}", held.join("; ")),
    }
}

/// `aamp-bridge reload`: the running bridge reads its config, profiles and credentials again
/// (asked over its control socket, which answers once the reload is done). Exit 1 when no
/// bridge runs on this state directory or the reload failed.
pub(super) fn reload(config: &LoadedConfig, json: bool) -> anyhow::Result<i32> {
    let Some(pid) = crate::fsio::StateLock::holder(&config.state_dir) else {
        if json {
            outln!("{}", serde_json::json!({"running": false}));
        } else {
            outln!(
                "aamp-bridge is not running (state in {}); nothing to reload",
                config.state_dir.display()
            );
        }
        return Ok(1);
    };
    let Some(done) = daemon::reload_over_control(&config.state_dir) else {
        anyhow::bail!("the bridge (pid {pid}) did not answer on its control socket; send it SIGHUP (kill -HUP {pid})");
    };
    if json {
        outln!("{done}");
    } else {
        print_reload(&done);
    }
    Ok(if reload_worked(&done) { 0 } else { 1 })
}

/// Whether everything a reload was to do took effect: the config read, every agent's
/// settings taken, and every changed credential tried and working.
fn reload_worked(done: &serde_json::Value) -> bool {
    let none = |key: &str| done[key].as_array().is_none_or(|a| a.is_empty());
    let credentials_work = done["credentials"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|c| c["works"] == true);
    done["error"].is_null() && none("failed") && credentials_work
}

/// What a reload did, for a person: what was reloaded, what was not and why, and whether the
/// new credentials work.
fn print_reload(done: &serde_json::Value) {
    let list = |key: &str| done[key].as_array().cloned().unwrap_or_default();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    if let Some(error) = done["error"].as_str() {
        outln!("the config was not reloaded: {error}");
    }
    let agents: Vec<String> = list("agents").iter().map(text).collect();
    if !agents.is_empty() {
        outln!("reloaded agents: {}", agents.join(", "));
    }
    for failed in list("failed") {
        outln!(
            "agent {}: {}",
            text(&failed["agent"]),
            text(&failed["error"])
        );
    }
    let changed = list("credentialsChanged");
    let tried = list("credentials");
    if changed.is_empty() && tried.is_empty() {
        outln!("no credentials changed");
    }
    for mailbox in &tried {
        let name = text(&mailbox["mailbox"]);
        let what = if changed.contains(&mailbox["mailbox"]) {
            format!("credentials reloaded for {name}")
        } else {
            format!("credentials of {name} unchanged")
        };
        let detail = text(&mailbox["detail"]);
        match mailbox["works"].as_bool() {
            Some(true) => outln!("{what}, and they work: {detail}"),
            Some(false) => outln!("{what}, but the server REFUSED them: {detail}"),
            None => outln!(
                "{what}, but they could not be tried: {detail} (`aamp-bridge status` shows whether they work)"
            ),
        }
    }
    // A bridge from before reloads tried credentials says only which changed.
    if tried.is_empty() {
        for name in changed.iter().map(text) {
            outln!(
                "credentials reloaded for {name} (retried now; `aamp-bridge status` shows whether they work)"
            );
        }
    }
}
