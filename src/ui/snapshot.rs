//! The read model the page starts from, and resynchronises from when it falls behind: the
//! same figures `status --json`, `tasks --json` and `task show --json` print (their builders
//! live here, and those commands call them), plus the questions waiting and the tasks under
//! way. Never a password, token or key: the link state names a credentials file at most.

use std::time::Duration;

use serde_json::{json, Value};

use crate::config::LoadedConfig;
use crate::dispatch::journal::TaskRow;
use crate::dispatch::{Journal, JournalError, TaskState};
use crate::mailbox::link::LinkState;
use crate::protocol::message::dispatch_title;
use crate::protocol::usage_wire;

/// One agent as `status` shows it: the JSON `status --json` prints, and its link state for
/// the text form.
pub struct AgentStatus {
    pub json: Value,
    pub link: Option<LinkState>,
}

/// Each agent's link, queue, running tasks, unsent answers and login: what `status --json`
/// prints under `agents`. `live` is the running bridge's own figures (slots); `replicas`
/// reads the claims from the mail server (up to 10 s per replicated mailbox), which the page
/// does not wait for.
pub async fn agents(
    config: &LoadedConfig,
    journal: Option<&Journal>,
    live: Option<&Value>,
    replicas: bool,
) -> Result<Vec<AgentStatus>, JournalError> {
    let counts = match journal {
        Some(j) => j.counts()?,
        None => Vec::new(),
    };
    let now = std::time::SystemTime::now();
    let mut agents = Vec::new();
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
        let running_tasks = match journal {
            Some(j) => j
                .tasks(Some(&agent.name), Some(TaskState::Running), 100)?
                .into_iter()
                .chain(j.tasks(Some(&agent.name), Some(TaskState::HelpNeeded), 100)?)
                .map(|t| {
                    let age = now
                        .duration_since(std::time::UNIX_EPOCH + Duration::from_millis(t.updated_at_ms.max(0) as u64))
                        .unwrap_or_default();
                    json!({"taskId": t.task_id, "state": t.state, "from": t.sender, "ageSecs": age.as_secs()})
                })
                .collect::<Vec<_>>(),
            None => Vec::new(),
        };
        // Tasks set aside because the server refused their claims, and the latest reason.
        let parked_reason = match journal {
            Some(j) => j
                .tasks(Some(&agent.name), Some(TaskState::Parked), 1)?
                .into_iter()
                .next()
                .and_then(|t| t.reason),
            None => None,
        };
        let quota = match journal {
            Some(j) => quota_of(j, &agent.name)?,
            None => Value::Null,
        };
        let slots = live.and_then(|l| {
            l["agents"]
                .as_array()?
                .iter()
                .find(|a| a["agent"] == agent.name.as_str())
                .cloned()
        });
        let replicas = match replicas {
            true => read_replicas(config, &mailbox).await,
            false => config
                .account(&mailbox)
                .ok()
                .and_then(|a| a.replica.map(|r| (r.name, None))),
        };
        // The agent's login, read as the agent reads it (a stuck agent is often one with none).
        let login = crate::runner::Profile::find(
            &config.profile_ref(&agent.profile),
            &config.profile_dirs(),
        )
        .ok()
        .and_then(|p| crate::runner::login::check(&p));
        agents.push(AgentStatus {
            json: json!({
                "replica": replicas.as_ref().map(|(me, _)| me.clone()),
                "replicas": replicas.as_ref().map(|(_, seen)| seen.clone()),
                "agent": agent.name, "mailbox": email, "link": link,
                "reading": link.as_ref().and_then(|l| l.reading()),
                "undelivered": count("undelivered"),
                "queued": count("received") + count("acked"), "running": running_tasks,
                "unsent": count("unsent"), "slots": slots,
                "parked": count("parked"), "parkedReason": parked_reason,
                "login": login, "quota": quota,
                "usageToday": match journal {
                    Some(j) => super::usage::agent_today(j, &agent.name, now)?,
                    None => Value::Null,
                },
            }),
            link,
        });
    }
    Ok(agents)
}

/// The agent's wait at its provider's usage limit (issue 45), null when there is none:
/// `{"until": the reset it stated (null when it did not say), "said", "since", "tries"}`.
fn quota_of(journal: &Journal, agent: &str) -> Result<Value, JournalError> {
    let fmt = crate::protocol::time::format_utc_ms;
    Ok(match journal.quota_wait(agent)? {
        Some(w) => json!({"until": w.resets.map(fmt), "said": w.said, "since": fmt(w.since),
                          "tries": w.tries}),
        None => Value::Null,
    })
}

/// For a mailbox served by several bridges: this one's name and, read from the server, the
/// claims each replica holds (`{"NAME": {"held": N, "expired": M}}`, null when the server
/// could not be read). `None` for a mailbox of one bridge.
async fn read_replicas(config: &LoadedConfig, mailbox: &str) -> Option<(String, Option<Value>)> {
    let account = config.account(mailbox).ok()?;
    let me = account.replica.as_ref()?.name.clone();
    let read = crate::mailbox::replica_claims(&account);
    let seen = match tokio::time::timeout(Duration::from_secs(10), read).await {
        Ok(Ok(map)) => Some(Value::Object(
            map.into_iter()
                .map(|(name, (held, expired))| (name, json!({"held": held, "expired": expired})))
                .collect(),
        )),
        _ => None,
    };
    Some((me, seen))
}

/// The tasks `id` names (a TaskId, a Message-ID or a journal row), each with its timeline:
/// what `task show --json` prints.
pub fn task_details(journal: &Journal, id: &str) -> Result<Vec<Value>, JournalError> {
    let mut shown = Vec::new();
    for task in journal.find_tasks(id)? {
        let steps = journal.timeline(task.id)?;
        let usage = journal.task_usage(task.id)?;
        let chain = journal.task_chain(task.id)?;
        let children: Vec<Value> = journal
            .delegations_of(task.id)?
            .into_iter()
            .map(|d| {
                json!({"taskId": d.task_id, "to": d.recipient, "title": d.title,
                            "state": d.state, "answer": d.answer})
            })
            .collect();
        shown.push(json!({"task": task, "timeline": steps,
                          "usage": usage.as_ref().map(usage_wire::to_json),
                          "chain": chain, "children": children}));
    }
    Ok(shown)
}

/// How many tasks the page gets in its snapshot: enough for the charts' last hours.
pub const RECENT_TASKS: usize = 500;

/// Each agent's last [`RECENT_TASKS`] tasks, newest first by arrival whatever the agent,
/// each with the title its mail carried.
pub fn recent_tasks(journal: &Journal, agents: &[&str]) -> Result<Vec<Value>, JournalError> {
    let mut rows = Vec::new();
    for agent in agents {
        rows.extend(journal.tasks(Some(agent), None, RECENT_TASKS)?);
    }
    rows.sort_by(|a, b| {
        b.received_at_ms
            .cmp(&a.received_at_ms)
            .then(b.id.cmp(&a.id))
    });
    let subjects = journal.subjects(&rows.iter().map(|r| r.id).collect::<Vec<_>>())?;
    rows.into_iter()
        .map(|row| {
            let title = subjects
                .get(&row.id)
                .map(|s| dispatch_title(s))
                .unwrap_or_default();
            let mut value = serde_json::to_value(&row).unwrap_or_default();
            value["title"] = Value::from(title);
            value
        })
        .map(|mut value| {
            value["usage"] = usage_of(journal, value["id"].as_i64().unwrap_or(0))?;
            Ok(value)
        })
        .collect()
}

/// Task rows as `tasks --json` prints them: each with its `usage` (null when its agent
/// reported nothing).
pub fn with_usage(journal: &Journal, rows: &[TaskRow]) -> Result<Vec<Value>, JournalError> {
    rows.iter()
        .map(|row| {
            let mut value = serde_json::to_value(row).unwrap_or_default();
            value["usage"] = usage_of(journal, row.id)?;
            Ok(value)
        })
        .collect()
}

/// One task's usage as JSON, null when none was reported (an index read per task).
fn usage_of(journal: &Journal, row: i64) -> Result<Value, JournalError> {
    Ok(journal
        .task_usage(row)?
        .as_ref()
        .map_or(Value::Null, usage_wire::to_json))
}

/// Tasks admitted and not finished, with the title their mail carried, oldest first.
pub fn active_tasks(journal: &Journal, agent: &str) -> Result<Vec<Value>, JournalError> {
    let rows = journal.tasks(Some(agent), None, RECENT_TASKS)?;
    let unfinished = journal.unfinished(agent)?;
    Ok(unfinished
        .into_iter()
        .filter_map(|u| {
            let row = rows.iter().find(|r| r.id == u.id)?;
            let mail: Value = serde_json::from_str(&u.mail).unwrap_or_default();
            let title = dispatch_title(mail["view"]["subject"].as_str().unwrap_or_default());
            Some(
                json!({"agent": agent, "row": u.id, "taskId": row.task_id, "from": row.sender,
                "title": title, "state": u.state.as_str(), "receivedAtMs": row.received_at_ms}),
            )
        })
        .collect())
}
