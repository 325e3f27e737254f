//! Gemini CLI's `stream-json` lines.

use super::*;

impl StreamParser {
    /// `gemini -p ... --output-format stream-json`.
    pub(super) fn gemini(&mut self, v: &Value) -> Vec<StreamEvent> {
        match str_of(v, &["type"]).unwrap_or_default() {
            "init" => {
                self.session_id = str_of(v, &["session_id"]).map(str::to_string);
                Vec::new()
            }
            "message" if str_of(v, &["role"]) == Some("assistant") => {
                let text = str_of(v, &["content"]).unwrap_or_default().to_string();
                self.delta(&text)
            }
            "tool_use" => self.gemini_tool_use(v),
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
                            .unwrap_or("the agent reported an error")
                            .to_string(),
                    );
                }
                self.gemini_usage(v)
            }
            _ => Vec::new(),
        }
    }

    /// A tool call: a step, with the todo list `write_todos` gives.
    fn gemini_tool_use(&mut self, v: &Value) -> Vec<StreamEvent> {
        self.answer_from = self.text.len();
        let id = str_of(v, &["tool_id"]).unwrap_or("tool").to_string();
        let name = str_of(v, &["tool_name"]).unwrap_or("tool").to_string();
        self.tool_names.insert(id.clone(), name.clone());
        let mut events = Vec::new();
        if name == "write_todos" {
            let todos = todos_of(&v["parameters"]["todos"], |i, t| TodoItem {
                id: format!("todo-{i}"),
                content: str_of(t, &["description", "content", "text"])
                    .unwrap_or_default()
                    .to_string(),
                status: normalize_todo_status(str_of(t, &["status"]).unwrap_or("pending")),
            });
            events.push(StreamEvent::Todo(todos));
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
}
