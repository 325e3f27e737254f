//! Runtime events for scripts: with `--json`, one JSON object per line on stdout
//! (`{"event":"task.completed","agent":...}`); always also a log line on stderr.

use std::io::Write;

use serde_json::{Map, Value};

#[derive(Clone, Copy, Debug, Default)]
pub struct Events {
    json: bool,
}

impl Events {
    pub fn new(json: bool) -> Events {
        Events { json }
    }

    /// Emits `event` with `fields` (an object). Write errors are ignored: a closed stdout must
    /// not stop the daemon.
    pub fn emit(&self, event: &str, fields: Value) {
        tracing::info!(target: "aamp_bridge::events", event, %fields);
        if !self.json {
            return;
        }
        let mut line = Map::new();
        line.insert("event".into(), Value::from(event));
        line.insert("time".into(), Value::from(now_rfc3339()));
        if let Value::Object(map) = fields {
            line.extend(map);
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", Value::Object(line));
        let _ = out.flush();
    }
}

/// `2026-11-29T10:02:18Z`.
pub fn now_rfc3339() -> String {
    crate::protocol::time::format_utc(std::time::SystemTime::now())
}
