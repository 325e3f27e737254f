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
    let counts = match &journal {
        Some(j) => j.counts()?,
        None => Vec::new(),
    };
    let now = std::time::SystemTime::now();
    let mut agents = Vec::new();
    let mut links = Vec::new();
    for agent in &config.config.agents {
        let mailbox = agent.mailbox_name().to_string();
        let email = config.mailbox_address(&mailbox).unwrap_or_default();
        let link = crate::mailbox::link::read(&config.state().link(&agent.name));
        let count = |state: &str| {
            counts
                .iter()
                .find(|(a, s, _)| *a == agent.name && s == state)
                .map_or(0, |(_, _, n)| *n)
        };
        let running_tasks = match &journal {
            Some(j) => j
                .tasks(Some(&agent.name), Some(crate::dispatch::TaskState::Running), 100)?
                .into_iter()
                .chain(j.tasks(Some(&agent.name), Some(crate::dispatch::TaskState::HelpNeeded), 100)?)
                .map(|t| {
                    let age = now
                        .duration_since(std::time::UNIX_EPOCH + Duration::from_millis(t.updated_at_ms.max(0) as u64))
                        .unwrap_or_default();
                    serde_json::json!({"taskId": t.task_id, "state": t.state, "from": t.sender, "ageSecs": age.as_secs()})
                })
                .collect::<Vec<_>>(),
            None => Vec::new(),
        };
        // Tasks set aside because the server refused their claims, and the latest reason.
        let parked_reason = match &journal {
            Some(j) => j
                .tasks(
                    Some(&agent.name),
                    Some(crate::dispatch::TaskState::Parked),
                    1,
                )?
                .into_iter()
                .next()
                .and_then(|t| t.reason),
            None => None,
        };
        let slots = live.as_ref().and_then(|l| {
            l["agents"]
                .as_array()?
                .iter()
                .find(|a| a["agent"] == agent.name.as_str())
                .cloned()
        });
        let replicas = replicas(config, &mailbox).await;
        // The agent's login, read as the agent reads it (a stuck agent is often one with none).
        let login = crate::runner::Profile::find(
            &config.profile_ref(&agent.profile),
            &config.profile_dirs(),
        )
        .ok()
        .and_then(|p| crate::runner::login::check(&p));
        links.push(link.clone());
        agents.push(serde_json::json!({
            "replica": replicas.as_ref().map(|(me, _)| me.clone()),
            "replicas": replicas.as_ref().map(|(_, seen)| seen.clone()),
            "agent": agent.name, "mailbox": email, "link": link,
            "reading": link.as_ref().and_then(|l| l.reading()),
            "undelivered": count("undelivered"),
            "queued": count("received") + count("acked"), "running": running_tasks,
            "unsent": count("unsent"), "slots": slots,
            "parked": count("parked"), "parkedReason": parked_reason,
            "login": login,
        }));
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"running": running.is_some(), "pid": running, "stateDir": config.state_dir,
                "source": if live.is_some() { "daemon" } else { "state files" },
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

/// For a mailbox served by several bridges: this one's name and, read from the server, the
/// claims each replica holds (`{"NAME": {"held": N, "expired": M}}`, null when the server
/// could not be read). `None` for a mailbox of one bridge.
async fn replicas(
    config: &LoadedConfig,
    mailbox: &str,
) -> Option<(String, Option<serde_json::Value>)> {
    let account = config.account(mailbox).ok()?;
    let me = account.replica.as_ref()?.name.clone();
    let mut reader = crate::mailbox::Reader::new(account).ok()?;
    let seen = match tokio::time::timeout(Duration::from_secs(10), async {
        reader.connect().await?;
        reader.replicas().await
    })
    .await
    {
        Ok(Ok(map)) => Some(serde_json::Value::Object(
            map.into_iter()
                .map(|(name, (held, expired))| {
                    (name, serde_json::json!({"held": held, "expired": expired}))
                })
                .collect(),
        )),
        _ => None,
    };
    Some((me, seen))
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
