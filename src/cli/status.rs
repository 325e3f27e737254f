//! `aamp-bridge status`: each agent's link, queue, running tasks and unsent answers (from the
//! running bridge's control socket, else the state files).

use super::*;

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
        println!(
            "{}",
            serde_json::json!({"running": running.is_some(), "pid": running, "stateDir": config.state_dir,
                "source": if live.is_some() { "daemon" } else { "state files" },
                "journal": {"path": journal_path, "bytes": journal_bytes, "maxBytes": max_mb.saturating_mul(1 << 20)},
                "daemon": live, "agents": agents})
        );
        return Ok(0);
    }
    match &running {
        Some(pid) => println!(
            "aamp-bridge is running (pid {pid}{}), state in {}",
            live.as_ref()
                .map(|l| format!(
                    ", up {} s, version {}",
                    l["uptimeSecs"],
                    l["version"].as_str().unwrap_or("?")
                ))
                .unwrap_or_default(),
            config.state_dir.display()
        ),
        None => println!(
            "aamp-bridge is not running (state in {}); what it last knew:",
            config.state_dir.display()
        ),
    }
    println!(
        "journal {}: {:.1} MB (kept under {max_mb} MB)",
        journal_path.display(),
        journal_bytes as f64 / f64::from(1 << 20)
    );
    for (a, link) in agents.iter().zip(&links) {
        let reach = link
            .as_ref()
            .map_or("never connected", |l| l.mailbox.as_str());
        println!(
            "{}  <{}>  mailbox {reach} since {}, {}",
            a["agent"].as_str().unwrap_or_default(),
            a["mailbox"].as_str().unwrap_or_default(),
            link.as_ref().map_or("-", |l| l.since.as_str()),
            match link.as_ref().map(|l| l.reading()) {
                Some(Some("polling")) | None => "polling".to_string(),
                Some(Some(p)) => format!("push over {p}"),
                Some(None) => "no mail read until it answers".to_string(),
            }
        );
        if let Some(error) = link.as_ref().and_then(|l| l.last_error.as_deref()) {
            println!("    last error: {error}");
        }
        if a["login"]["loggedIn"] == false {
            println!(
                "    the agent is not logged in: {}; fix: {}",
                a["login"]["detail"].as_str().unwrap_or_default(),
                a["login"]["fix"].as_str().unwrap_or_default()
            );
        }
        if let Some(c) = link.as_ref().and_then(|l| l.credentials.as_ref()) {
            println!(
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
        println!(
            "    {} queued, {} running, {} answers waiting to be sent",
            a["queued"],
            a["running"].as_array().map_or(0, Vec::len),
            a["unsent"]
        );
        if a["parked"].as_u64().unwrap_or(0) > 0 {
            println!(
                "    {} tasks parked, not run or answered here: {} (tried again at the next start; aamp-bridge tasks --state parked)",
                a["parked"],
                a["parkedReason"].as_str().unwrap_or("the server refused their claims")
            );
        }
        if a["undelivered"].as_u64().unwrap_or(0) > 0 {
            println!(
                "    {} answers could not be delivered in the last 7 days (aamp-bridge tasks --state undelivered)",
                a["undelivered"]
            );
        }
        if let Some(me) = a["replica"].as_str() {
            let seen = &a["replicas"];
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
                (true, _) => {
                    println!("    replica {me}; the claims on the server could not be read")
                }
                (false, true) => println!("    replica {me}; no replica holds a task now"),
                (false, false) => println!("    replica {me}; claims: {}", held.join("; ")),
            }
        }
        for t in a["running"].as_array().into_iter().flatten() {
            println!(
                "    - {} ({}, {} s, from {})",
                t["taskId"].as_str().unwrap_or_default(),
                t["state"].as_str().unwrap_or_default(),
                t["ageSecs"],
                t["from"].as_str().unwrap_or_default()
            );
        }
    }
    Ok(0)
}

/// `aamp-bridge reload`: the running bridge reads its config, profiles and credentials again
/// (asked over its control socket, which answers once the reload is done). Exit 1 when no
/// bridge runs on this state directory or the reload failed.
pub(super) fn reload(config: &LoadedConfig, json: bool) -> anyhow::Result<i32> {
    let Some(pid) = crate::fsio::StateLock::holder(&config.state_dir) else {
        if json {
            println!("{}", serde_json::json!({"running": false}));
        } else {
            println!(
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
        println!("{done}");
    } else {
        if let Some(error) = done["error"].as_str() {
            println!("the config was not reloaded: {error}");
        }
        let names = |key: &str| -> Vec<String> {
            done[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        };
        let (agents, changed) = (names("agents"), names("credentialsChanged"));
        if !agents.is_empty() {
            println!("reloaded agents: {}", agents.join(", "));
        }
        if changed.is_empty() {
            println!("no credentials changed");
        } else {
            println!(
                "credentials reloaded for {} (retried now; `aamp-bridge status` shows whether they work)",
                changed.join(", ")
            );
        }
    }
    Ok(if done["error"].is_null() { 0 } else { 1 })
}
