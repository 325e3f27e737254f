//! How `dispatch --follow` and `profile test --events` print a task's live stream.

/// Prints a task's live stream for a person (or as JSON lines).
#[derive(Default)]
pub(super) struct StreamPrinter {
    /// Text was printed without a line end yet.
    mid_line: bool,
}

impl StreamPrinter {
    pub(super) fn line(&mut self, text: &str) {
        if self.mid_line {
            println!();
            self.mid_line = false;
        }
        println!("{text}");
    }

    pub(super) fn print(&mut self, event: &serde_json::Value, json: bool) {
        use std::io::Write as _;
        if json {
            println!("{event}");
            return;
        }
        let payload = &event["payload"];
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        match event["type"].as_str().unwrap_or_default() {
            "text.delta" => {
                let t = text(&payload["text"]);
                print!("{t}");
                let _ = std::io::stdout().flush();
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
            println!();
            self.mid_line = false;
        }
    }
}
