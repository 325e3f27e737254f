//! Claude Code's `stream-json` lines.

use super::*;

pub(super) fn claude_todos(input: &Value) -> Vec<TodoItem> {
    todos_of(&input["todos"], |i, t| TodoItem {
        id: str_of(t, &["id"])
            .map(str::to_string)
            .unwrap_or_else(|| format!("todo-{i}")),
        content: str_of(t, &["content"]).unwrap_or_default().to_string(),
        status: normalize_todo_status(str_of(t, &["status"]).unwrap_or("pending")),
    })
}

impl StreamParser {
    /// Claude Code 2.x plans with `TaskCreate` (subject, description) and `TaskUpdate`
    /// (taskId, status, subject); the task list after the call, as a `todo` event. A created
    /// task's id comes in the tool's result ("Task #1 created successfully: ...").
    fn claude_task_tool(
        &mut self,
        tool_use_id: &str,
        name: &str,
        input: &Value,
    ) -> Option<StreamEvent> {
        match name {
            "TaskCreate" => {
                let n = self.claude_tasks.len();
                self.claude_tasks.push(TodoItem {
                    id: format!("new-{}", n + 1),
                    content: str_of(input, &["subject", "description"])
                        .unwrap_or_default()
                        .to_string(),
                    status: normalize_todo_status("pending"),
                });
                self.claude_creating.insert(tool_use_id.to_string(), n);
            }
            "TaskUpdate" => {
                let id = str_of(input, &["taskId"])?;
                let at = self.claude_tasks.iter().position(|t| t.id == id)?;
                match str_of(input, &["status"]) {
                    Some("deleted") => {
                        self.claude_tasks.remove(at);
                    }
                    Some(status) => self.claude_tasks[at].status = normalize_todo_status(status),
                    None => {}
                }
                if let (Some(subject), Some(task)) =
                    (str_of(input, &["subject"]), self.claude_tasks.get_mut(at))
                {
                    task.content = subject.to_string();
                }
            }
            _ => return None,
        }
        Some(StreamEvent::Todo(self.claude_tasks.clone()))
    }

    /// The id a `TaskCreate` result gives its task.
    fn claude_task_created(&mut self, tool_use_id: &str, output: Option<&str>) {
        let Some(at) = self.claude_creating.remove(tool_use_id) else {
            return;
        };
        let number = output.and_then(|text| {
            let digits: String = text
                .split_once('#')?
                .1
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            (!digits.is_empty()).then_some(digits)
        });
        if let (Some(id), Some(task)) = (number, self.claude_tasks.get_mut(at)) {
            task.id = id;
        }
    }

    /// `claude -p --output-format stream-json --verbose [--include-partial-messages]`.
    pub(super) fn claude(&mut self, v: &Value) -> Vec<StreamEvent> {
        if let Some(id) = str_of(v, &["session_id"]) {
            self.session_id = Some(id.to_string());
        }
        match str_of(v, &["type"]).unwrap_or_default() {
            "stream_event" => self.claude_partial(v),
            "assistant" => {
                let mut events = self.claude_assistant(v);
                events.extend(self.claude_message_usage(&v["message"]));
                events
            }
            "user" => self.claude_tool_results(v),
            "result" => {
                self.claude_result(v);
                self.claude_limit(v);
                self.claude_result_usage(v).into_iter().collect()
            }
            "rate_limit_event" => {
                self.claude_limit(v);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// A usage limit the stream states (issue 45): a `rate_limit_event` whose status is
    /// "rejected", with `resetsAt` in seconds since the epoch (Claude Code 2.1 on a
    /// subscription), or a result that failed with `api_error_status` 429 (an API key).
    fn claude_limit(&mut self, v: &Value) {
        let info = &v["rate_limit_info"];
        if str_of(info, &["status"]) == Some("rejected") {
            let resets = info["resetsAt"]
                .as_u64()
                .and_then(|s| std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(s)));
            self.end.usage_limit = Some(resets.or(self.end.usage_limit.flatten()));
        } else if v["api_error_status"].as_u64() == Some(429) && self.end.usage_limit.is_none() {
            self.end.usage_limit = Some(None);
        }
    }

    /// A partial message (`--include-partial-messages`): the top level's text as it comes.
    fn claude_partial(&mut self, v: &Value) -> Vec<StreamEvent> {
        let event = &v["event"];
        match str_of(event, &["type"]) {
            Some("message_start") => {
                return self
                    .claude_message_usage(&event["message"])
                    .into_iter()
                    .collect()
            }
            Some("message_delta") => {
                return self.claude_message_end_usage(event).into_iter().collect()
            }
            _ => {}
        }
        if str_of(event, &["type"]) == Some("content_block_delta")
            && event["delta"]["type"] == "text_delta"
            && v["parent_tool_use_id"].is_null()
        {
            self.saw_partial = true;
            let text = event["delta"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            return self.delta(&text);
        }
        Vec::new()
    }

    /// A whole assistant message: its text (unless streamed already) and its tool calls.
    fn claude_assistant(&mut self, v: &Value) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        let top_level = v["parent_tool_use_id"].is_null();
        for block in v["message"]["content"].as_array().into_iter().flatten() {
            match str_of(block, &["type"]) {
                // With partial messages on, this text was streamed already.
                Some("text") if top_level && !self.saw_partial => {
                    let text = block["text"].as_str().unwrap_or_default().to_string();
                    events.extend(self.delta(&text));
                }
                Some("tool_use") => self.claude_tool_use(block, top_level, &mut events),
                _ => {}
            }
        }
        if top_level {
            self.saw_partial = false;
        }
        if let Some(err) = str_of(v, &["error"]) {
            self.end.error = Some(format!("the agent reported {err}"));
        }
        events
    }

    /// A tool call, with the todo list its planning tools give.
    fn claude_tool_use(&mut self, block: &Value, top_level: bool, events: &mut Vec<StreamEvent>) {
        let id = str_of(block, &["id"]).unwrap_or("tool").to_string();
        let name = str_of(block, &["name"]).unwrap_or("tool").to_string();
        self.tool_names.insert(id.clone(), name.clone());
        if name == "TodoWrite" {
            events.push(StreamEvent::Todo(claude_todos(&block["input"])));
        }
        if top_level {
            events.extend(self.claude_task_tool(&id, &name, &block["input"]));
        }
        events.push(StreamEvent::ToolCall {
            id,
            label: name,
            status: ToolStatus::Running,
            input: json_text(&block["input"]),
            output: None,
        });
    }

    /// A user message: the results of tool calls.
    fn claude_tool_results(&mut self, v: &Value) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        for block in v["message"]["content"].as_array().into_iter().flatten() {
            if str_of(block, &["type"]) != Some("tool_result") {
                continue;
            }
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
            self.claude_task_created(&id, output.as_deref());
            events.push(self.finished_tool(id, failed, output));
        }
        events
    }

    /// The run's end: its answer, or its error in the agent's own words.
    fn claude_result(&mut self, v: &Value) {
        self.end.finished = true;
        let is_error = v["is_error"].as_bool().unwrap_or(false)
            || str_of(v, &["subtype"]).is_some_and(|s| s.starts_with("error"));
        let result = str_of(v, &["result"]).map(str::to_string);
        if !is_error {
            self.end.error = None;
            self.end.final_text = result;
            return;
        }
        let errors: Vec<&str> = v["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        // Its own words first: the result's text, its errors, its error object
        // (Qwen Code, whose stream is Claude's, puts them there).
        let message = str_of(&v["error"], &["message"])
            .or_else(|| v["error"].as_str())
            .map(str::to_string);
        self.end.error = Some(
            result
                .filter(|r| !r.is_empty())
                .or_else(|| (!errors.is_empty()).then(|| errors.join("; ")))
                .or(message.filter(|m| !m.is_empty()))
                .unwrap_or_else(|| {
                    format!(
                        "the agent ended with {}",
                        str_of(v, &["subtype"]).unwrap_or("an error")
                    )
                }),
        );
    }
}
