//! Codex's `exec --json` lines.

use super::*;

impl StreamParser {
    /// `codex exec --json`: whole items, no token deltas.
    pub(super) fn codex(&mut self, v: &Value) -> Vec<StreamEvent> {
        match str_of(v, &["type"]).unwrap_or_default() {
            "thread.started" => {
                self.session_id = str_of(v, &["thread_id"]).map(str::to_string);
                self.codex_thread(str_of(v, &["thread_id"]));
                Vec::new()
            }
            "turn.completed" => {
                self.end.finished = true;
                self.end.error = None;
                self.codex_turn_usage(v).into_iter().collect()
            }
            "turn.failed" => {
                self.end.finished = true;
                self.end.error = Some(
                    str_of(&v["error"], &["message"])
                        .unwrap_or("the agent reported a failed turn")
                        .to_string(),
                );
                Vec::new()
            }
            kind @ ("item.started" | "item.updated" | "item.completed") => {
                self.codex_item(&v["item"], kind == "item.completed")
            }
            // `error` events are retries and warnings: the run goes on.
            _ => Vec::new(),
        }
    }

    /// An item started, updated or (`done`) completed.
    fn codex_item(&mut self, item: &Value, done: bool) -> Vec<StreamEvent> {
        let id = str_of(item, &["id"]).unwrap_or("item").to_string();
        match str_of(item, &["type"]).unwrap_or_default() {
            "agent_message" if done => {
                let text = str_of(item, &["text"]).unwrap_or_default().to_string();
                self.last_message = Some(text.clone());
                let sep = if self.text.is_empty() { "" } else { "\n\n" };
                self.delta(&format!("{sep}{text}"))
            }
            "command_execution" => {
                if done {
                    self.note_sandbox_refusal(item);
                }
                vec![codex_command(item, id, done)]
            }
            "file_change" => {
                if done && matches!(str_of(item, &["status"]), Some("failed" | "declined")) {
                    self.note_refused_edit(item);
                }
                vec![codex_file_change(item, id, done)]
            }
            "mcp_tool_call" => vec![codex_mcp_call(item, id, done)],
            "todo_list" => vec![codex_todos(item, &id)],
            _ => Vec::new(),
        }
    }

    /// A command Codex declined (its approval policy), or one its sandbox stopped (a write
    /// under `read-only` fails with the kernel's "Read-only file system"), noted for the
    /// answer: the sender learns what did not happen, not only what the model said after.
    fn note_sandbox_refusal(&mut self, item: &Value) {
        let command = str_of(item, &["command"]).unwrap_or_default();
        let output = str_of(item, &["aggregated_output"]).unwrap_or_default();
        let why = match str_of(item, &["status"]) {
            Some("declined") => "declined by Codex's approval policy",
            // Whatever the exit status: `touch x; echo done` exits 0 with nothing made.
            Some("completed" | "failed") if output.contains("Read-only file system") => {
                "stopped by Codex's read-only sandbox"
            }
            _ => return,
        };
        let short: String = command.chars().take(200).collect();
        self.note(format!("\"{short}\" ({why})"));
    }

    /// An edit (apply_patch) Codex did not make: under `read-only` its sandbox refuses every
    /// write, and the answer would otherwise read as if the task were done.
    fn note_refused_edit(&mut self, item: &Value) {
        let short: String = changed_paths(item).chars().take(200).collect();
        self.note(format!(
            "an edit of {short} (not made: Codex's sandbox or approval policy refused it)"
        ));
    }

    fn note(&mut self, note: String) {
        if !self.end.refused.contains(&note) && self.end.refused.len() < 20 {
            self.end.refused.push(note);
        }
    }
}

/// A command run: its status (a non-zero exit fails it) and, once done, what it printed.
fn codex_command(item: &Value, id: String, done: bool) -> StreamEvent {
    let status = match str_of(item, &["status"]) {
        Some("completed") if item["exit_code"].as_i64().unwrap_or(0) == 0 => ToolStatus::Completed,
        Some("completed") | Some("failed") | Some("declined") => ToolStatus::Failed,
        _ => ToolStatus::Running,
    };
    StreamEvent::ToolCall {
        id,
        label: format!("Run: {}", str_of(item, &["command"]).unwrap_or_default()),
        status,
        input: item.get("command").and_then(json_text),
        output: if done {
            item.get("aggregated_output").and_then(json_text)
        } else {
            None
        },
    }
}

/// An edit of files (apply_patch).
fn codex_file_change(item: &Value, id: String, done: bool) -> StreamEvent {
    StreamEvent::ToolCall {
        id,
        label: format!("Edit: {}", changed_paths(item)),
        status: if !done {
            ToolStatus::Running
        } else if str_of(item, &["status"]) == Some("failed") {
            ToolStatus::Failed
        } else {
            ToolStatus::Completed
        },
        input: None,
        output: item.get("changes").and_then(json_text),
    }
}

/// The paths a `file_change` item names, comma-separated.
fn changed_paths(item: &Value) -> String {
    let paths: Vec<&str> = item["changes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["path"].as_str())
        .collect();
    paths.join(", ")
}

/// A call of an MCP server's tool, named `server.tool`.
fn codex_mcp_call(item: &Value, id: String, done: bool) -> StreamEvent {
    StreamEvent::ToolCall {
        id,
        label: format!(
            "{}.{}",
            str_of(item, &["server"]).unwrap_or("mcp"),
            str_of(item, &["tool"]).unwrap_or("tool")
        ),
        status: if !done {
            ToolStatus::Running
        } else if item["error"].is_object() {
            ToolStatus::Failed
        } else {
            ToolStatus::Completed
        },
        input: item.get("arguments").and_then(json_text),
        output: if done {
            item.get("result")
                .or_else(|| item.get("error"))
                .and_then(json_text)
        } else {
            None
        },
    }
}

/// Codex's plan, as todos with ids from the item's.
fn codex_todos(item: &Value, id: &str) -> StreamEvent {
    StreamEvent::Todo(todos_of(&item["items"], |i, t| TodoItem {
        id: format!("{id}-{i}"),
        content: str_of(t, &["text"]).unwrap_or_default().to_string(),
        status: if t["completed"].as_bool().unwrap_or(false) {
            "completed"
        } else {
            "pending"
        }
        .to_string(),
    }))
}
