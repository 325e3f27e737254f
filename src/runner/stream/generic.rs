//! Generic NDJSON and SSE events (`type`/`event` and a payload), and SSE framing through
//! `protocol::sse`.

use super::*;

impl StreamParser {
    pub(super) fn sse_line(&mut self, line: &str) -> Vec<StreamEvent> {
        let event = self.sse.line(line);
        self.sse_event(event)
    }

    pub(super) fn sse_dispatch(&mut self) -> Vec<StreamEvent> {
        let event = self.sse.finish();
        self.sse_event(event)
    }

    pub(super) fn sse_event(
        &mut self,
        event: Option<crate::protocol::sse::SseEvent>,
    ) -> Vec<StreamEvent> {
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
    pub(super) fn generic(&mut self, kind: &str, value: &Value) -> Vec<StreamEvent> {
        let payload = value
            .get("payload")
            .or_else(|| value.get("data"))
            .unwrap_or(value);
        let mut events = self.generic_events(kind, payload);
        events.extend(self.generic_usage(value, payload));
        events
    }

    fn generic_events(&mut self, kind: &str, payload: &Value) -> Vec<StreamEvent> {
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
                self.generic_result(payload);
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
                let done = matches!(kind, "tool_result" | "tool_call_update");
                vec![generic_tool(payload, done)]
            }
            _ => Vec::new(),
        }
    }

    /// The run's end: its final text and error, when it gives them.
    fn generic_result(&mut self, payload: &Value) {
        if let Some(text) = str_of(payload, &["text", "result", "output", "content", "message"]) {
            self.end.final_text = Some(text.to_string());
        }
        if let Some(err) = str_of(payload, &["error"]) {
            self.end.error = Some(err.to_string());
        }
        self.end.finished = true;
    }
}

/// A tool call started, or (`done`) its result.
fn generic_tool(payload: &Value, done: bool) -> StreamEvent {
    let id = str_of(
        payload,
        &["toolCallId", "tool_call_id", "call_id", "id", "name"],
    )
    .unwrap_or("tool")
    .to_string();
    let name = str_of(payload, &["name", "tool", "label"]).unwrap_or("tool");
    let failed = payload
        .get("is_error")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        || str_of(payload, &["status"]) == Some("failed");
    StreamEvent::ToolCall {
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
    }
}
