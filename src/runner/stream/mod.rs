//! Agent output streams: the line formats of CLI agents (generic NDJSON and SSE, and the real
//! `claude -p --output-format stream-json`, `codex exec --json` and
//! `gemini --output-format stream-json`) turned into AAMP stream events, a final answer, an
//! error and the CLI's own session id. Pure code: lines in, events out.

mod claude;
mod codex;
mod gemini;
mod generic;
mod usage;

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
    /// Lines a CLI agent without a stream format printed, as they came: text for the
    /// operator (the live view, `--json`), never put on the dispatcher's AAMP stream. That
    /// output is the answer itself, which the result carries; a stream (and its
    /// `task.stream.opened` mail) for every plain task would cost more than it tells.
    Output(String),
    /// What some of the agent's model calls cost, from its own report. `key` names the report
    /// within one [`crate::runner::run`] (the agent's message or turn id, or a counter): a
    /// report seen twice under one key is counted once. Tokens are what those calls used, not
    /// a running total. Not for the dispatcher's stream: the result carries the task's sum.
    Usage {
        key: String,
        usage: crate::protocol::Usage,
    },
}

impl StreamEvent {
    /// Whether the event goes on the dispatcher's stream too (all but [`StreamEvent::Output`]).
    pub fn for_dispatcher(&self) -> bool {
        !matches!(self, StreamEvent::Output(_) | StreamEvent::Usage { .. })
    }

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
            StreamEvent::TextDelta(text) | StreamEvent::Output(text) => {
                ("text.delta", serde_json::json!({ "text": text }))
            }
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
            StreamEvent::Usage { key, usage } => {
                ("usage", serde_json::json!({ "key": key, "usage": usage }))
            }
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
    /// What the agent's own sandbox or approval policy refused during the run (Codex: a
    /// command it declined, or one its read-only sandbox stopped), each once, named for the
    /// answer's note.
    pub refused: Vec<String>,
    /// The stream itself said the agent hit its usage limit (Claude: a rejected
    /// `rate_limit_event`, a result with `api_error_status` 429): `Some(resets)`, with the
    /// reset time when it gave one. Read with `error` (`runner::limit`).
    pub usage_limit: Option<Option<std::time::SystemTime>>,
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
    /// Claude Code 2.x: its task list, made with `TaskCreate` and changed with `TaskUpdate`,
    /// and the creations whose id the tool's result will tell.
    claude_tasks: Vec<TodoItem>,
    claude_creating: std::collections::HashMap<String, usize>,
    /// Where in `text` the answer starts: after the last tool call (Gemini; what it said
    /// before is progress).
    answer_from: usize,
    /// The usage reports sent so far (`usage`).
    usage: usage::UsageState,
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
            claude_tasks: Vec::new(),
            claude_creating: Default::default(),
            answer_from: 0,
            usage: Default::default(),
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
            let after_tools = self
                .text
                .get(self.answer_from..)
                .filter(|t| !t.trim().is_empty());
            let text = self
                .last_message
                .clone()
                .or_else(|| after_tools.map(str::to_string))
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
}

/// The todos of a JSON list (none when `list` is no list), each made by `todo` from its
/// place in the list and its entry.
fn todos_of(list: &Value, todo: impl Fn(usize, &Value) -> TodoItem) -> Vec<TodoItem> {
    let entries = list.as_array().into_iter().flatten();
    entries.enumerate().map(|(i, t)| todo(i, t)).collect()
}

fn normalize_todo_status(status: &str) -> String {
    match status {
        "in_progress" | "completed" | "pending" => status.to_string(),
        "done" | "complete" => "completed".into(),
        _ => "pending".into(),
    }
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
