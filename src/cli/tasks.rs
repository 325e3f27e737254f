//! `aamp-bridge tasks` and `task show`: the journal's read model for a person.

use crate::output::{errln, outln};

use super::*;

pub(super) fn tasks(
    config: &LoadedConfig,
    agent: Option<String>,
    state: Option<String>,
    limit: usize,
    json: bool,
) -> anyhow::Result<i32> {
    use crate::dispatch::TaskState;
    if !config.state().journal().exists() {
        // Before the first start there is no journal, and no task: nothing went wrong.
        if json {
            outln!("[]");
        } else {
            outln!(
                "no tasks yet: the bridge has not run with the state directory {} (aamp-bridge start)",
                config.state_dir.display()
            );
        }
        return Ok(0);
    }
    let journal = open_journal(config)?;
    let rows = match state.as_deref() {
        // Not a state of its own: tasks whose answer the server refused for good.
        Some("undelivered") => journal.undelivered(agent.as_deref(), limit)?,
        Some(s) => {
            let state = TaskState::parse(s).with_context(|| {
                format!(
                    "--state {s:?}: one of {}, or undelivered",
                    TaskState::ALL.map(TaskState::as_str).join(", ")
                )
            })?;
            journal.tasks(agent.as_deref(), Some(state), limit)?
        }
        None => journal.tasks(agent.as_deref(), None, limit)?,
    };
    let shown = crate::ui::snapshot::with_usage(&journal, &rows)?;
    if json {
        outln!("{}", crate::events::json_text(&shown)?);
        return Ok(0);
    }
    if rows.is_empty() {
        outln!("no tasks");
    }
    for (t, v) in rows.into_iter().zip(&shown) {
        outln!(
            "{:>5}  {}  {:<10} {:<11} {:>22}  {}  from {}{}{}",
            t.id,
            ms_time(t.received_at_ms),
            t.agent,
            t.state,
            usage_column(&v["usage"]),
            t.task_id,
            t.sender,
            t.reason
                .map(|r| format!("  ({})", r.chars().take(80).collect::<String>()))
                .unwrap_or_default(),
            t.undelivered
                .map(|u| format!("  UNDELIVERED: {}", u.chars().take(100).collect::<String>()))
                .unwrap_or_default()
        );
    }
    Ok(0)
}

/// A task's tokens and cost in a column of `tasks`: `-` when its agent reported nothing.
fn usage_column(usage: &serde_json::Value) -> String {
    match crate::protocol::usage_wire::from_json(usage) {
        Some(u) => format!("{} tok {}", u.total_tokens(), u.cost_text()),
        None => "-".to_string(),
    }
}

pub(super) fn task_show(config: &LoadedConfig, id: &str, json: bool) -> anyhow::Result<i32> {
    let journal = open_journal(config)?;
    let shown = crate::ui::snapshot::task_details(&journal, id)?;
    if shown.is_empty() {
        errln!(
            "no task {id:?} in {} (aamp-bridge tasks lists them)",
            journal.path().display()
        );
        return Ok(1);
    }
    if json {
        outln!(
            "{}",
            crate::events::json_text(&serde_json::Value::Array(shown))?
        );
        return Ok(0);
    }
    for item in shown {
        let t = &item["task"];
        outln!(
            "task {} (journal row {})",
            t["taskId"].as_str().unwrap_or_default(),
            t["id"]
        );
        outln!("  agent       {}", t["agent"].as_str().unwrap_or_default());
        outln!("  from        {}", t["sender"].as_str().unwrap_or_default());
        outln!(
            "  message id  {}",
            t["messageId"].as_str().unwrap_or_default()
        );
        outln!(
            "  state       {} after {} run(s)",
            t["state"].as_str().unwrap_or_default(),
            t["runs"]
        );
        if let Some(reason) = t["reason"].as_str() {
            outln!("  reason      {reason}");
        }
        if let Some(why) = t["undelivered"].as_str() {
            outln!("  delivery    UNDELIVERED: the server refused the answer ({why})");
        }
        show_chain(&item);
        match crate::protocol::usage_wire::from_json(&item["usage"]) {
            Some(u) => outln!("  usage       {}", crate::protocol::usage_wire::line(&u)),
            None => outln!("  usage       none reported by the agent"),
        }
        let start = item["timeline"][0]["atMs"].as_i64().unwrap_or(0);
        for step in item["timeline"].as_array().into_iter().flatten() {
            let at = step["atMs"].as_i64().unwrap_or(0);
            outln!(
                "  {}  +{:>7} ms  {}{}",
                ms_time(at),
                at - start,
                step["what"].as_str().unwrap_or_default(),
                step["detail"]
                    .as_str()
                    .map(|d| format!(": {}", d.replace('\n', "\n        ")))
                    .unwrap_or_default()
            );
        }
    }
    Ok(0)
}

/// A task's place in a delegation chain: its parent (the task it was delegated from) and its
/// children (the tasks it delegated), each with its state.
fn show_chain(item: &serde_json::Value) {
    let chain = &item["chain"];
    if let Some(parent) = chain["parentTaskId"].as_str() {
        outln!(
            "  parent      {parent} (hop {}, chain {}, trace {})",
            chain["hops"].as_u64().unwrap_or(0),
            chain["chain"]["id"].as_str().unwrap_or("-"),
            chain["chain"]["traceparent"]
                .as_str()
                .and_then(|t| t.split('-').nth(1))
                .unwrap_or("-")
        );
    }
    for child in item["children"].as_array().into_iter().flatten() {
        outln!(
            "  child       {} to {}: {}",
            child["taskId"].as_str().unwrap_or_default(),
            child["to"].as_str().unwrap_or_default(),
            child["state"].as_str().unwrap_or_default()
        );
    }
}
