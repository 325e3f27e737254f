//! Session updates as stream events: text, tool calls with their status and output, plans as todos,
//! files the agent hands over.

use super::*;
use agent_client_protocol::v1::schema::{Plan, SessionInfoUpdate, ToolCall, ToolCallUpdate};

pub(super) fn tool_status(status: ToolCallStatus) -> ToolStatus {
    match status {
        ToolCallStatus::Pending => ToolStatus::Pending,
        ToolCallStatus::Completed => ToolStatus::Completed,
        ToolCallStatus::Failed => ToolStatus::Failed,
        _ => ToolStatus::Running,
    }
}

pub(super) fn json_text(value: &Option<serde_json::Value>) -> Option<String> {
    value.as_ref().map(|v| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// A tool's content as text: its text blocks, and a one-line summary per diff.
pub(super) fn content_text(content: &[ToolCallContent], shared: &Shared) -> Option<String> {
    let parts: Vec<String> = content
        .iter()
        .filter_map(|c| match c {
            ToolCallContent::Content(c) => match &c.content {
                ContentBlock::Text(t) => Some(t.text.clone()),
                _ => None,
            },
            // A command run in one of our terminals: what it printed so far.
            ToolCallContent::Terminal(t) => shared
                .terminals
                .as_ref()
                .and_then(|terminals| terminals.text(&t.terminal_id.0))
                .map(|text| super::super::clean(&text, true, true)),
            ToolCallContent::Diff(d) => {
                let old = d.old_text.as_deref().map_or(0, |t| t.lines().count());
                Some(format!(
                    "edited {}: {} lines → {} lines",
                    d.path.display(),
                    old,
                    d.new_text.lines().count()
                ))
            }
            _ => None,
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("\n"))
}

impl Shared {
    /// What a command printed so far, as an adapter that runs commands itself sends it in a
    /// tool call update's `_meta` (codex-acp: `terminal_output_delta.data`, and
    /// `terminal_exit.exit_code`, said when not 0).
    fn meta_output(
        &self,
        id: &str,
        meta: &serde_json::Map<String, serde_json::Value>,
    ) -> Option<String> {
        let delta = meta
            .get("terminal_output_delta")
            .and_then(|d| d.get("data"))
            .and_then(|d| d.as_str());
        let exit = meta
            .get("terminal_exit")
            .and_then(|e| e.get("exit_code"))
            .and_then(|c| c.as_i64());
        if delta.is_none() && exit.is_none() {
            return None;
        }
        let mut outputs = self.meta_output.lock().expect("meta output lock");
        let printed = outputs.entry(id.to_string()).or_default();
        if let Some(delta) = delta {
            printed.push_str(delta);
            if printed.len() > super::META_OUTPUT_MAX {
                let mut cut = printed.len() - super::META_OUTPUT_MAX;
                while !printed.is_char_boundary(cut) {
                    cut += 1;
                }
                printed.drain(..cut);
            }
        }
        let mut text = super::super::clean(printed, true, true);
        if let Some(code) = exit.filter(|c| *c != 0) {
            text.push_str(&format!("\n(exit code {code})"));
        }
        Some(text.trim().to_string())
    }

    /// The answer: what the agent said after its last tool call (what it said before is in
    /// the stream as progress), or all it said when nothing came after.
    pub(super) fn answer(&self) -> String {
        let text = self.text.lock().expect("text lock");
        let from = self.answer_from.load(Ordering::SeqCst).min(text.len());
        match text.get(from..) {
            Some(after) if !after.trim().is_empty() => after.to_string(),
            _ => text.clone(),
        }
    }

    /// What the agent said after its last step, when it said anything.
    pub(super) fn after_step(&self) -> Option<String> {
        let text = self.text.lock().expect("text lock");
        let from = self.answer_from.load(Ordering::SeqCst).min(text.len());
        text.get(from..)
            .filter(|after| !after.trim().is_empty())
            .map(str::to_string)
    }

    /// The agent took a step (a tool call, a plan): what it said before is progress, not
    /// its answer.
    pub(super) fn step(&self) {
        self.answer_from
            .store(self.text.lock().expect("text lock").len(), Ordering::SeqCst);
    }

    /// What the agent said about an error its session is in at the end of the turn, when it
    /// is in one.
    pub(super) fn failed(&self) -> Option<String> {
        let from = (*self.system_error.lock().expect("error lock"))?;
        let text = self.text.lock().expect("text lock");
        let said = text.get(from..).unwrap_or_default().trim();
        Some(if said.is_empty() {
            "it gave no detail".into()
        } else {
            said.to_string()
        })
    }

    /// Adds to the answer, keeping at most `text_max` bytes however much the agent sends.
    fn append_text(&self, more: &str) {
        let mut text = self.text.lock().expect("text lock");
        let room = self.text_max.saturating_sub(text.len());
        if more.len() <= room {
            text.push_str(more);
        } else {
            let mut end = room;
            while !more.is_char_boundary(end) {
                end -= 1;
            }
            text.push_str(&more[..end]);
            self.text_cut.store(true, Ordering::SeqCst);
        }
    }
}

/// An embedded resource as a file: named after the last part of its URI.
pub(super) fn embedded_file(
    resource: &EmbeddedResourceResource,
) -> Option<crate::runner::OutputFile> {
    use base64::Engine as _;
    let name_of = |uri: &str| {
        uri.rsplit('/')
            .find(|s| !s.is_empty())
            .unwrap_or("resource")
            .to_string()
    };
    match resource {
        EmbeddedResourceResource::TextResourceContents(t) => {
            Some(crate::runner::OutputFile::Inline {
                name: name_of(&t.uri),
                content_type: t.mime_type.clone(),
                bytes: t.text.clone().into_bytes(),
            })
        }
        EmbeddedResourceResource::BlobResourceContents(b) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b.blob.trim())
                .ok()?;
            Some(crate::runner::OutputFile::Inline {
                name: name_of(&b.uri),
                content_type: b.mime_type.clone(),
                bytes,
            })
        }
        _ => None,
    }
}

/// One `session/update` as stream events. Thoughts never reach the output.
pub(super) fn map_update(update: &SessionUpdate, shared: &Shared) -> Vec<StreamEvent> {
    match update {
        SessionUpdate::AgentMessageChunk(chunk) => {
            let mut events = shared.message(&chunk.content);
            events.extend(shared.chunk_usage(chunk.meta.as_ref()));
            events
        }
        SessionUpdate::ToolCall(call) => vec![shared.tool_call(call)],
        SessionUpdate::ToolCallUpdate(update) => vec![shared.tool_call_update(update)],
        SessionUpdate::SessionInfoUpdate(info) => {
            shared.session_info(info);
            Vec::new()
        }
        SessionUpdate::Plan(plan) => shared.plan(plan).into_iter().collect(),
        SessionUpdate::UsageUpdate(update) => {
            shared.usage_update(update);
            Vec::new()
        }
        _ => Vec::new(),
    }
}

impl Shared {
    /// A part of the agent's message: text to the answer, files (links and resources) to
    /// what is handed over.
    fn message(&self, content: &ContentBlock) -> Vec<StreamEvent> {
        match content {
            ContentBlock::Text(t) if !t.text.is_empty() => {
                self.append_text(&t.text);
                return vec![StreamEvent::TextDelta(t.text.clone())];
            }
            ContentBlock::ResourceLink(link) => match link.uri.strip_prefix("file://") {
                Some(path) => self
                    .files
                    .lock()
                    .expect("files lock")
                    .push(crate::runner::OutputFile::Path(PathBuf::from(path))),
                None => {
                    tracing::info!(uri = %link.uri, "a resource link that is not a file is not attached")
                }
            },
            ContentBlock::Resource(embedded) => {
                if let Some(file) = embedded_file(&embedded.resource) {
                    self.files.lock().expect("files lock").push(file);
                }
            }
            _ => {}
        }
        Vec::new()
    }

    /// A new tool call: a step, whose title later updates name it by.
    fn tool_call(&self, call: &ToolCall) -> StreamEvent {
        self.step();
        let id = call.tool_call_id.0.to_string();
        self.titles
            .lock()
            .expect("titles lock")
            .insert(id.clone(), call.title.clone());
        StreamEvent::ToolCall {
            id,
            label: call.title.clone(),
            status: tool_status(call.status),
            input: json_text(&call.raw_input),
            output: content_text(&call.content, self).or_else(|| json_text(&call.raw_output)),
        }
    }

    fn tool_call_update(&self, update: &ToolCallUpdate) -> StreamEvent {
        let id = update.tool_call_id.0.to_string();
        let printed = update
            .meta
            .as_ref()
            .and_then(|meta| self.meta_output(&id, meta));
        let mut titles = self.titles.lock().expect("titles lock");
        if let Some(title) = &update.fields.title {
            titles.insert(id.clone(), title.clone());
        }
        let label = titles.get(&id).cloned().unwrap_or_else(|| "tool".into());
        drop(titles);
        let status = update
            .fields
            .status
            .map_or(ToolStatus::Running, tool_status);
        let output = update
            .fields
            .content
            .as_deref()
            .and_then(|c| content_text(c, self))
            .or(printed)
            .or_else(|| json_text(&update.fields.raw_output));
        // An adapter that runs commands in its own sandbox (codex-acp) says nothing of a
        // refusal but what the command printed: a write stopped by a read-only sandbox
        // is named in the answer's note, as the bridge's own refusals are.
        if status == ToolStatus::Failed
            && output
                .as_deref()
                .is_some_and(|o| o.contains("Read-only file system"))
        {
            self.refusals.add(format!(
                "\"{label}\" (stopped by the agent's read-only sandbox)"
            ));
        }
        StreamEvent::ToolCall {
            label,
            id,
            status,
            input: json_text(&update.fields.raw_input),
            output,
        }
    }

    /// codex-acp's thread status: from `systemError` on, what the agent says is about the
    /// error its session is in (see [`Shared::failed`]).
    fn session_info(&self, info: &SessionInfoUpdate) {
        let status = info
            .meta
            .as_ref()
            .and_then(|m| m.get("codex"))
            .and_then(|c| c.get("threadStatus"))
            .and_then(|s| s.get("type"))
            .and_then(|t| t.as_str());
        if let Some(status) = status {
            let mut error = self.system_error.lock().expect("error lock");
            *error = (status == "systemError").then(|| self.text.lock().expect("text lock").len());
        }
    }

    /// A plan as todos, unless it is the plan sent last.
    fn plan(&self, plan: &Plan) -> Option<StreamEvent> {
        let items: Vec<TodoItem> = plan
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| TodoItem {
                id: format!("plan-{i}"),
                content: e.content.clone(),
                status: match e.status {
                    PlanEntryStatus::InProgress => "in_progress",
                    PlanEntryStatus::Completed => "completed",
                    _ => "pending",
                }
                .to_string(),
            })
            .collect();
        // A plan comes from a tool call (claude-agent-acp turns Claude's TaskCreate and
        // TaskUpdate into plans): a step too.
        self.step();
        // An adapter that sends the same plan twice (claude-agent-acp) gives one event.
        let mut last = self.last_plan.lock().expect("plan lock");
        if last.as_ref() == Some(&items) {
            return None;
        }
        *last = Some(items.clone());
        Some(StreamEvent::Todo(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::SessionNotification;

    /// The stream events a recorded run's `session/update` params (one per line) map to.
    fn events_of(fixture: &str) -> (Vec<StreamEvent>, Shared) {
        let shared = Shared {
            text_max: 1 << 20,
            ..Shared::default()
        };
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/acp")
                .join(fixture),
        )
        .unwrap();
        let mut events = Vec::new();
        for line in text.lines() {
            let n: SessionNotification = serde_json::from_str(line).unwrap();
            events.extend(map_update(&n.update, &shared));
        }
        (events, shared)
    }

    /// codex-acp 2.6 turns a model API failure (HTTP 500) into a text and `end_turn`; its
    /// thread status says `systemError` first, and nothing after it says otherwise.
    #[test]
    fn codex_acp_model_failure_is_seen() {
        let (_, shared) = events_of("codex-acp-model-500.jsonl");
        assert_eq!(
            shared.failed().as_deref(),
            Some("We\u{2019}re currently experiencing high demand, which may cause temporary errors.")
        );
        let (_, fine) = events_of("codex-acp-exec.jsonl");
        assert_eq!(fine.failed(), None);
    }

    /// codex-acp 2.6 runs a command itself and sends what it printed in the update's `_meta`
    /// (`terminal_output_delta`), naming a terminal the client never made.
    #[test]
    fn codex_acp_command_output_comes_from_its_meta() {
        let (events, shared) = events_of("codex-acp-exec.jsonl");
        let calls: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::ToolCall {
                    label,
                    status,
                    output,
                    ..
                } => Some((label.clone(), *status, output.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 2, "{events:?}");
        assert_eq!(calls[0].0, "echo hi");
        assert_eq!(calls[1].1, ToolStatus::Completed);
        assert_eq!(calls[1].2.as_deref(), Some("hi"));
        assert_eq!(shared.answer(), "All done. The command said: hi.");
    }
}
