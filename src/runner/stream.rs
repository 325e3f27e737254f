//! Agent output streams: the line formats of CLI agents (generic NDJSON and SSE, and the real
//! `claude -p --output-format stream-json`, `codex exec --json` and
//! `gemini --output-format stream-json`) turned into AAMP stream events, a final answer, an
//! error and the CLI's own session id. Pure code: lines in, events out.

use serde_json::Value;

/// How a profile's stdout is framed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamFormat {
    /// Plain text: stdout is the answer.
    #[default]
    None,
    Ndjson,
    Sse,
    Claude,
    Codex,
    Gemini,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolStatus {
    Pending,
    Running,
    Completed,
    Failed,
}

impl ToolStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolStatus::Pending => "pending",
            ToolStatus::Running => "running",
            ToolStatus::Completed => "completed",
            ToolStatus::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TodoItem {
    pub id: String,
    pub content: String,
    /// `pending`, `in_progress` or `completed`.
    pub status: String,
}

/// One AAMP stream event (`text.delta`, `tool_call`, `todo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamEvent {
    TextDelta(String),
    ToolCall {
        id: String,
        label: String,
        status: ToolStatus,
        input: Option<String>,
        output: Option<String>,
    },
    Todo(Vec<TodoItem>),
    /// A file that goes with the result.
    Artifact {
        label: String,
        filename: String,
        content_type: String,
        size: u64,
    },
}

impl StreamEvent {
    /// The AAMP event type and payload.
    pub fn to_aamp(&self) -> (&'static str, Value) {
        match self {
            StreamEvent::Artifact {
                label,
                filename,
                content_type,
                size,
            } => (
                "artifact",
                serde_json::json!({"label": label, "artifactId": filename, "filename": filename,
                                   "contentType": content_type, "size": size, "kind": "file"}),
            ),
            StreamEvent::TextDelta(text) => ("text.delta", serde_json::json!({ "text": text })),
            StreamEvent::ToolCall {
                id,
                label,
                status,
                input,
                output,
            } => {
                let mut p = serde_json::json!({ "toolCallId": id, "label": label, "status": status.as_str() });
                if let Some(i) = input {
                    p["input"] = Value::from(i.as_str());
                }
                if let Some(o) = output {
                    p["output"] = Value::from(o.as_str());
                }
                ("tool_call", p)
            }
            StreamEvent::Todo(items) => (
                "todo",
                serde_json::json!({ "items": items.iter().map(|t| serde_json::json!({"id": t.id, "content": t.content, "status": t.status})).collect::<Vec<_>>() }),
            ),
        }
    }
}

/// What the stream said about how the run ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamEnd {
    /// The terminal event was seen (the run is over even if the process lingers).
    pub finished: bool,
    /// The agent's final answer, when the format carries one.
    pub final_text: Option<String>,
    /// The run failed, in the agent's words.
    pub error: Option<String>,
}

/// Reads one stream, line by line.
#[derive(Debug)]
pub struct StreamParser {
    format: StreamFormat,
    /// Text of all deltas so far (the answer when the format has no final text), at most
    /// `max_text` bytes; `text_cut` says more came.
    text: String,
    max_text: usize,
    pub text_cut: bool,
    /// Codex: the last `agent_message`.
    last_message: Option<String>,
    /// The CLI's own session/thread id.
    pub session_id: Option<String>,
    pub end: StreamEnd,
    /// Claude: text already streamed as partial deltas for the current message.
    saw_partial: bool,
    /// SSE framing (one event's data held at most `max_text` bytes).
    sse: crate::protocol::sse::SseReader,
    tool_names: std::collections::HashMap<String, String>,
}

/// Answer text kept by a parser made with [`StreamParser::new`].
const DEFAULT_MAX_TEXT: usize = 8 << 20;

/// Longest text kept for a tool's input or output in an event.
const TOOL_TEXT: usize = 4000;

fn clip(text: &str) -> String {
    if text.len() <= TOOL_TEXT {
        return text.to_string();
    }
    let mut end = TOOL_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn json_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(clip(s)),
        other => Some(clip(&other.to_string())),
    }
}

fn str_of<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| v.get(*k).and_then(Value::as_str))
}

impl StreamParser {
    pub fn new(format: StreamFormat) -> StreamParser {
        StreamParser::with_limit(format, DEFAULT_MAX_TEXT)
    }

    /// A parser that keeps at most `max_text` bytes of answer text (and of one SSE event's
    /// data), however much the agent sends.
    pub fn with_limit(format: StreamFormat, max_text: usize) -> StreamParser {
        StreamParser {
            format,
            text: String::new(),
            max_text,
            text_cut: false,
            last_message: None,
            session_id: None,
            end: StreamEnd::default(),
            saw_partial: false,
            sse: crate::protocol::sse::SseReader::new(max_text),
            tool_names: Default::default(),
        }
    }

    pub fn format(&self) -> StreamFormat {
        self.format
    }

    /// The event for a tool that finished, under the name it started with.
    fn finished_tool(&self, id: String, failed: bool, output: Option<String>) -> StreamEvent {
        StreamEvent::ToolCall {
            label: self
                .tool_names
                .get(&id)
                .cloned()
                .unwrap_or_else(|| "tool".into()),
            id,
            status: if failed {
                ToolStatus::Failed
            } else {
                ToolStatus::Completed
            },
            input: None,
            output,
        }
    }

    /// Feeds one line (without its newline); returns the events it makes.
    pub fn line(&mut self, line: &str) -> Vec<StreamEvent> {
        let line = line.trim_end_matches('\r');
        match self.format {
            StreamFormat::None => Vec::new(),
            StreamFormat::Sse => self.sse_line(line),
            _ => {
                let trimmed = line.trim();
                if trimmed.is_empty() {
                    return Vec::new();
                }
                // Banners and logs on stdout are skipped, not fatal.
                let Ok(value) = serde_json::from_str::<Value>(trimmed) else {
                    return Vec::new();
                };
                match self.format {
                    StreamFormat::Claude => self.claude(&value),
                    StreamFormat::Codex => self.codex(&value),
                    StreamFormat::Gemini => self.gemini(&value),
                    _ => {
                        let kind = str_of(&value, &["event", "type", "name"])
                            .unwrap_or("message")
                            .to_string();
                        self.generic(&kind, &value)
                    }
                }
            }
        }
    }

    /// Ends the stream; returns events still pending (an SSE event without a blank line).
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        let events = if self.format == StreamFormat::Sse {
            self.sse_dispatch()
        } else {
            Vec::new()
        };
        if self.end.final_text.is_none() {
            let text = self
                .last_message
                .clone()
                .or_else(|| (!self.text.is_empty()).then(|| self.text.clone()));
            self.end.final_text = text;
        }
        events
    }

    fn delta(&mut self, text: &str) -> Vec<StreamEvent> {
        if text.is_empty() {
            return Vec::new();
        }
        let room = self.max_text.saturating_sub(self.text.len());
        if text.len() <= room {
            self.text.push_str(text);
        } else {
            let mut end = room;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            self.text.push_str(&text[..end]);
            self.text_cut = true;
        }
        vec![StreamEvent::TextDelta(text.to_string())]
    }

    fn sse_line(&mut self, line: &str) -> Vec<StreamEvent> {
        let event = self.sse.line(line);
        self.sse_event(event)
    }

    fn sse_dispatch(&mut self) -> Vec<StreamEvent> {
        let event = self.sse.finish();
        self.sse_event(event)
    }

    fn sse_event(&mut self, event: Option<crate::protocol::sse::SseEvent>) -> Vec<StreamEvent> {
        if self.sse.cut {
            self.text_cut = true;
        }
        let Some(crate::protocol::sse::SseEvent { event, data }) = event else {
            return Vec::new();
        };
        let value = serde_json::from_str::<Value>(&data).unwrap_or(Value::String(data));
        let kind = if event == "message" {
            str_of(&value, &["type", "event", "kind", "sse_type"])
                .unwrap_or("message")
                .to_string()
        } else {
            event
        };
        self.generic(&kind, &value)
    }

    /// The generic NDJSON/SSE vocabulary of the AAMP CLI bridges.
    fn generic(&mut self, kind: &str, value: &Value) -> Vec<StreamEvent> {
        let payload = value
            .get("payload")
            .or_else(|| value.get("data"))
            .unwrap_or(value);
        if let Value::String(s) = payload {
            return if matches!(kind, "delta" | "text.delta" | "text" | "message") {
                self.delta(s)
            } else {
                Vec::new()
            };
        }
        if let Some(text) = str_of(
            payload,
            &[
                "delta",
                "text_delta",
                "textDelta",
                "content_delta",
                "contentDelta",
            ],
        ) {
            return self.delta(text);
        }
        match kind {
            "delta" | "text.delta" | "text" => {
                let text = str_of(payload, &["text", "content", "message", "output"])
                    .unwrap_or_default()
                    .to_string();
                self.delta(&text)
            }
            "result" | "final" | "output" | "done" => {
                if let Some(text) =
                    str_of(payload, &["text", "result", "output", "content", "message"])
                {
                    self.end.final_text = Some(text.to_string());
                }
                if let Some(err) = str_of(payload, &["error"]) {
                    self.end.error = Some(err.to_string());
                }
                self.end.finished = true;
                Vec::new()
            }
            "error" => {
                self.end.error = str_of(payload, &["message", "error"])
                    .map(str::to_string)
                    .or(Some("the agent reported an error".into()));
                Vec::new()
            }
            "session" => {
                self.session_id =
                    str_of(payload, &["session_id", "sessionId", "id"]).map(str::to_string);
                Vec::new()
            }
            "tool_start" | "tool_call" | "tool_result" | "tool_call_update" => {
                let id = str_of(
                    payload,
                    &["toolCallId", "tool_call_id", "call_id", "id", "name"],
                )
                .unwrap_or("tool")
                .to_string();
                let name = str_of(payload, &["name", "tool", "label"]).unwrap_or("tool");
                let done = matches!(kind, "tool_result" | "tool_call_update");
                let failed = payload
                    .get("is_error")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                    || str_of(payload, &["status"]) == Some("failed");
                vec![StreamEvent::ToolCall {
                    id,
                    label: name.to_string(),
                    status: if !done {
                        ToolStatus::Running
                    } else if failed {
                        ToolStatus::Failed
                    } else {
                        ToolStatus::Completed
                    },
                    input: if done {
                        None
                    } else {
                        payload
                            .get("input")
                            .or_else(|| payload.get("arguments"))
                            .and_then(json_text)
                    },
                    output: if done {
                        payload
                            .get("output")
                            .or_else(|| payload.get("result"))
                            .and_then(json_text)
                    } else {
                        None
                    },
                }]
            }
            _ => Vec::new(),
        }
    }

    /// `claude -p --output-format stream-json --verbose [--include-partial-messages]`.
    fn claude(&mut self, v: &Value) -> Vec<StreamEvent> {
        if let Some(id) = str_of(v, &["session_id"]) {
            self.session_id = Some(id.to_string());
        }
        match str_of(v, &["type"]).unwrap_or_default() {
            "stream_event" => {
                let event = &v["event"];
                match str_of(event, &["type"]) {
                    Some("content_block_delta")
                        if event["delta"]["type"] == "text_delta"
                            && v["parent_tool_use_id"].is_null() =>
                    {
                        self.saw_partial = true;
                        let text = event["delta"]["text"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string();
                        self.delta(&text)
                    }
                    _ => Vec::new(),
                }
            }
            "assistant" => {
                let mut events = Vec::new();
                let top_level = v["parent_tool_use_id"].is_null();
                for block in v["message"]["content"].as_array().into_iter().flatten() {
                    match str_of(block, &["type"]) {
                        // With partial messages on, this text was streamed already.
                        Some("text") if top_level && !self.saw_partial => {
                            let text = block["text"].as_str().unwrap_or_default().to_string();
                            events.extend(self.delta(&text));
                        }
                        Some("tool_use") => {
                            let id = str_of(block, &["id"]).unwrap_or("tool").to_string();
                            let name = str_of(block, &["name"]).unwrap_or("tool").to_string();
                            self.tool_names.insert(id.clone(), name.clone());
                            if name == "TodoWrite" {
                                events.push(StreamEvent::Todo(claude_todos(&block["input"])));
                            }
                            events.push(StreamEvent::ToolCall {
                                id,
                                label: name,
                                status: ToolStatus::Running,
                                input: json_text(&block["input"]),
                                output: None,
                            });
                        }
                        _ => {}
                    }
                }
                if top_level {
                    self.saw_partial = false;
                }
                if let Some(err) = str_of(v, &["error"]) {
                    self.end.error = Some(format!("claude reported {err}"));
                }
                events
            }
            "user" => {
                let mut events = Vec::new();
                for block in v["message"]["content"].as_array().into_iter().flatten() {
                    if str_of(block, &["type"]) == Some("tool_result") {
                        let id = str_of(block, &["tool_use_id"])
                            .unwrap_or("tool")
                            .to_string();
                        let failed = block["is_error"].as_bool().unwrap_or(false);
                        let output = match &block["content"] {
                            Value::Array(parts) => Some(clip(
                                &parts
                                    .iter()
                                    .filter_map(|p| p["text"].as_str())
                                    .collect::<Vec<_>>()
                                    .join("\n"),
                            )),
                            other => json_text(other),
                        };
                        events.push(self.finished_tool(id, failed, output));
                    }
                }
                events
            }
            "result" => {
                self.end.finished = true;
                let is_error = v["is_error"].as_bool().unwrap_or(false)
                    || str_of(v, &["subtype"]).is_some_and(|s| s.starts_with("error"));
                let result = str_of(v, &["result"]).map(str::to_string);
                if is_error {
                    let errors: Vec<&str> = v["errors"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect();
                    self.end.error = Some(
                        result
                            .filter(|r| !r.is_empty())
                            .or_else(|| (!errors.is_empty()).then(|| errors.join("; ")))
                            .unwrap_or_else(|| {
                                format!(
                                    "claude ended with {}",
                                    str_of(v, &["subtype"]).unwrap_or("an error")
                                )
                            }),
                    );
                } else {
                    self.end.error = None;
                    self.end.final_text = result;
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// `codex exec --json`: whole items, no token deltas.
    fn codex(&mut self, v: &Value) -> Vec<StreamEvent> {
        match str_of(v, &["type"]).unwrap_or_default() {
            "thread.started" => {
                self.session_id = str_of(v, &["thread_id"]).map(str::to_string);
                Vec::new()
            }
            "turn.completed" => {
                self.end.finished = true;
                self.end.error = None;
                Vec::new()
            }
            "turn.failed" => {
                self.end.finished = true;
                self.end.error = Some(
                    str_of(&v["error"], &["message"])
                        .unwrap_or("codex reported a failed turn")
                        .to_string(),
                );
                Vec::new()
            }
            kind @ ("item.started" | "item.updated" | "item.completed") => {
                let item = &v["item"];
                let id = str_of(item, &["id"]).unwrap_or("item").to_string();
                let done = kind == "item.completed";
                match str_of(item, &["type"]).unwrap_or_default() {
                    "agent_message" if done => {
                        let text = str_of(item, &["text"]).unwrap_or_default().to_string();
                        self.last_message = Some(text.clone());
                        let sep = if self.text.is_empty() { "" } else { "\n\n" };
                        self.delta(&format!("{sep}{text}"))
                    }
                    "command_execution" => {
                        let status = match str_of(item, &["status"]) {
                            Some("completed") if item["exit_code"].as_i64().unwrap_or(0) == 0 => {
                                ToolStatus::Completed
                            }
                            Some("completed") | Some("failed") | Some("declined") => {
                                ToolStatus::Failed
                            }
                            _ => ToolStatus::Running,
                        };
                        vec![StreamEvent::ToolCall {
                            id,
                            label: format!(
                                "Run: {}",
                                str_of(item, &["command"]).unwrap_or_default()
                            ),
                            status,
                            input: item.get("command").and_then(json_text),
                            output: if done {
                                item.get("aggregated_output").and_then(json_text)
                            } else {
                                None
                            },
                        }]
                    }
                    "file_change" => {
                        let paths: Vec<&str> = item["changes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|c| c["path"].as_str())
                            .collect();
                        vec![StreamEvent::ToolCall {
                            id,
                            label: format!("Edit: {}", paths.join(", ")),
                            status: if !done {
                                ToolStatus::Running
                            } else if str_of(item, &["status"]) == Some("failed") {
                                ToolStatus::Failed
                            } else {
                                ToolStatus::Completed
                            },
                            input: None,
                            output: item.get("changes").and_then(json_text),
                        }]
                    }
                    "mcp_tool_call" => vec![StreamEvent::ToolCall {
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
                    }],
                    "todo_list" => vec![StreamEvent::Todo(
                        item["items"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .enumerate()
                            .map(|(i, t)| TodoItem {
                                id: format!("{id}-{i}"),
                                content: str_of(t, &["text"]).unwrap_or_default().to_string(),
                                status: if t["completed"].as_bool().unwrap_or(false) {
                                    "completed"
                                } else {
                                    "pending"
                                }
                                .to_string(),
                            })
                            .collect(),
                    )],
                    _ => Vec::new(),
                }
            }
            // `error` events are retries and warnings: the run goes on.
            _ => Vec::new(),
        }
    }

    /// `gemini -p ... --output-format stream-json`.
    fn gemini(&mut self, v: &Value) -> Vec<StreamEvent> {
        match str_of(v, &["type"]).unwrap_or_default() {
            "init" => {
                self.session_id = str_of(v, &["session_id"]).map(str::to_string);
                Vec::new()
            }
            "message" if str_of(v, &["role"]) == Some("assistant") => {
                let text = str_of(v, &["content"]).unwrap_or_default().to_string();
                self.delta(&text)
            }
            "tool_use" => {
                let id = str_of(v, &["tool_id"]).unwrap_or("tool").to_string();
                let name = str_of(v, &["tool_name"]).unwrap_or("tool").to_string();
                self.tool_names.insert(id.clone(), name.clone());
                let mut events = Vec::new();
                if name == "write_todos" {
                    let todos = v["parameters"]["todos"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .enumerate()
                        .map(|(i, t)| TodoItem {
                            id: format!("todo-{i}"),
                            content: str_of(t, &["description", "content", "text"])
                                .unwrap_or_default()
                                .to_string(),
                            status: normalize_todo_status(
                                str_of(t, &["status"]).unwrap_or("pending"),
                            ),
                        });
                    events.push(StreamEvent::Todo(todos.collect()));
                }
                events.push(StreamEvent::ToolCall {
                    id,
                    label: name,
                    status: ToolStatus::Running,
                    input: v.get("parameters").and_then(json_text),
                    output: None,
                });
                events
            }
            "tool_result" => {
                let id = str_of(v, &["tool_id"]).unwrap_or("tool").to_string();
                let failed = str_of(v, &["status"]) == Some("error");
                let output = if failed {
                    str_of(&v["error"], &["message"]).map(clip)
                } else {
                    v.get("output").and_then(json_text)
                };
                vec![self.finished_tool(id, failed, output)]
            }
            "result" => {
                self.end.finished = true;
                if str_of(v, &["status"]) == Some("error") {
                    self.end.error = Some(
                        str_of(&v["error"], &["message"])
                            .unwrap_or("gemini reported an error")
                            .to_string(),
                    );
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }
}

fn normalize_todo_status(status: &str) -> String {
    match status {
        "in_progress" | "completed" | "pending" => status.to_string(),
        "done" | "complete" => "completed".into(),
        _ => "pending".into(),
    }
}

fn claude_todos(input: &Value) -> Vec<TodoItem> {
    input["todos"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| TodoItem {
            id: str_of(t, &["id"])
                .map(str::to_string)
                .unwrap_or_else(|| format!("todo-{i}")),
            content: str_of(t, &["content"]).unwrap_or_default().to_string(),
            status: normalize_todo_status(str_of(t, &["status"]).unwrap_or("pending")),
        })
        .collect()
}

/// Guesses how a CLI's stdout is framed from a sample of it (for `profile new`): the Claude,
/// Codex and Gemini JSON streams by their event types, then SSE, generic NDJSON, or text.
pub fn detect(sample: &str) -> StreamFormat {
    let lines: Vec<&str> = sample
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(50)
        .collect();
    if lines.is_empty() {
        return StreamFormat::None;
    }
    if lines
        .iter()
        .any(|l| l.starts_with("data:") || l.starts_with("event:"))
    {
        return StreamFormat::Sse;
    }
    let objects: Vec<Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(Value::is_object)
        .collect();
    if objects.len() * 2 < lines.len() {
        return StreamFormat::None;
    }
    let types: Vec<&str> = objects.iter().filter_map(|o| o["type"].as_str()).collect();
    let has = |t: &str| types.contains(&t);
    if has("stream_event")
        || (has("system") && objects.iter().any(|o| o["subtype"] == "init"))
        || (has("assistant") && objects.iter().any(|o| o["message"].is_object()))
    {
        StreamFormat::Claude
    } else if has("thread.started") || has("turn.started") || has("item.completed") {
        StreamFormat::Codex
    } else if has("init") && objects.iter().any(|o| o["session_id"].is_string())
        || (has("message") && objects.iter().any(|o| o["role"].is_string()))
    {
        StreamFormat::Gemini
    } else {
        StreamFormat::Ndjson
    }
}

impl StreamFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamFormat::None => "none",
            StreamFormat::Ndjson => "ndjson",
            StreamFormat::Sse => "sse",
            StreamFormat::Claude => "claude",
            StreamFormat::Codex => "codex",
            StreamFormat::Gemini => "gemini",
        }
    }
}

#[cfg(test)]
mod detect_tests {
    use super::*;

    #[test]
    fn each_cli_stream_is_recognised() {
        let cases = [
            ("plain answer\nOK\n", StreamFormat::None),
            ("", StreamFormat::None),
            ("event: delta\ndata: {\"text\":\"OK\"}\n\n", StreamFormat::Sse),
            ("{\"type\":\"system\",\"subtype\":\"init\",\"session_id\":\"s\"}\n{\"type\":\"assistant\",\"message\":{\"content\":[]}}\n", StreamFormat::Claude),
            ("{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n{\"type\":\"item.completed\",\"item\":{}}\n", StreamFormat::Codex),
            ("{\"type\":\"init\",\"session_id\":\"s\",\"model\":\"m\"}\n{\"type\":\"message\",\"role\":\"assistant\",\"content\":\"OK\",\"delta\":true}\n", StreamFormat::Gemini),
            ("{\"text\":\"O\"}\n{\"text\":\"K\"}\n", StreamFormat::Ndjson),
            ("{\"a\":1}\nnot json\nnot json\nnot json\n", StreamFormat::None),
        ];
        for (sample, want) in cases {
            assert_eq!(detect(sample), want, "{sample:?}");
        }
    }
}
