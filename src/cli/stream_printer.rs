//! How `dispatch --follow` and `profile test --events` print a task's live stream.

use crate::output::{out, outln};

/// Prints a task's live stream for a person (or as JSON lines).
#[derive(Default)]
pub(super) struct StreamPrinter {
    /// Text was printed without a line end yet.
    mid_line: bool,
}

impl StreamPrinter {
    pub(super) fn line(&mut self, text: &str) {
        if self.mid_line {
            outln!();
            self.mid_line = false;
        }
        outln!("{text}");
    }

    pub(super) fn print(&mut self, event: &serde_json::Value, json: bool) {
        if json {
            outln!("{event}");
            return;
        }
        let payload = &event["payload"];
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        match event["type"].as_str().unwrap_or_default() {
            "text.delta" => {
                let t = text(&payload["text"]);
                out!("{t}");
                self.mid_line = !t.ends_with('\n');
            }
            "tool_call" => self.line(&format!(
                "• {} ({})",
                text(&payload["label"]),
                text(&payload["status"])
            )),
            "todo" => {
                for item in payload["items"].as_array().into_iter().flatten() {
                    let mark = match item["status"].as_str() {
                        Some("completed") => "[x]",
                        Some("in_progress") => "[>]",
                        _ => "[ ]",
                    };
                    self.line(&format!("{mark} {}", text(&item["content"])));
                }
            }
            "artifact" => self.line(&format!("+ file {}", text(&payload["filename"]))),
            other => self.line(&format!("[{other}] {payload}")),
        }
    }

    pub(super) fn end(&mut self) {
        if self.mid_line {
            outln!();
            self.mid_line = false;
        }
    }
}
