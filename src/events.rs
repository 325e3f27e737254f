//! Runtime events for scripts: with `--json`, one JSON object per line on stdout
//! (`{"event":"task.completed","agent":...}`); always also a log line on stderr.

use std::io::Write;

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

/// Every event the bridge emits: the names scripts read (`"event"` in `--json` lines). A
/// closed set, so a name cannot be misspelt at one call site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    AgentCard,
    AgentReady,
    BridgeReloadFailed,
    BridgeReloaded,
    BridgeRunning,
    BridgeStopped,
    BridgeStopping,
    CardAnswered,
    MailFailed,
    MailRetrying,
    MailSent,
    MailboxChanged,
    MailboxPush,
    MailboxRegistered,
    MessageIgnored,
    PairRefused,
    SenderPaired,
    TaskAcked,
    TaskAnswered,
    TaskCompleted,
    TaskDuplicate,
    TaskHelpNeeded,
    TaskInterrupted,
    TaskParked,
    TaskReceived,
    TaskRecovered,
    TaskRejected,
    TaskStarted,
    TaskStream,
    TaskStreamOpened,
    TaskSuperseded,
}

impl Event {
    pub const ALL: [Event; 31] = [
        Event::AgentCard,
        Event::AgentReady,
        Event::BridgeReloadFailed,
        Event::BridgeReloaded,
        Event::BridgeRunning,
        Event::BridgeStopped,
        Event::BridgeStopping,
        Event::CardAnswered,
        Event::MailFailed,
        Event::MailRetrying,
        Event::MailSent,
        Event::MailboxChanged,
        Event::MailboxPush,
        Event::MailboxRegistered,
        Event::MessageIgnored,
        Event::PairRefused,
        Event::SenderPaired,
        Event::TaskAcked,
        Event::TaskAnswered,
        Event::TaskCompleted,
        Event::TaskDuplicate,
        Event::TaskHelpNeeded,
        Event::TaskInterrupted,
        Event::TaskParked,
        Event::TaskReceived,
        Event::TaskRecovered,
        Event::TaskRejected,
        Event::TaskStarted,
        Event::TaskStream,
        Event::TaskStreamOpened,
        Event::TaskSuperseded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Event::AgentCard => "agent.card",
            Event::AgentReady => "agent.ready",
            Event::BridgeReloadFailed => "bridge.reload_failed",
            Event::BridgeReloaded => "bridge.reloaded",
            Event::BridgeRunning => "bridge.running",
            Event::BridgeStopped => "bridge.stopped",
            Event::BridgeStopping => "bridge.stopping",
            Event::CardAnswered => "card.answered",
            Event::MailFailed => "mail.failed",
            Event::MailRetrying => "mail.retrying",
            Event::MailSent => "mail.sent",
            Event::MailboxChanged => "mailbox.changed",
            Event::MailboxPush => "mailbox.push",
            Event::MailboxRegistered => "mailbox.registered",
            Event::MessageIgnored => "message.ignored",
            Event::PairRefused => "pair.refused",
            Event::SenderPaired => "sender.paired",
            Event::TaskAcked => "task.acked",
            Event::TaskAnswered => "task.answered",
            Event::TaskCompleted => "task.completed",
            Event::TaskDuplicate => "task.duplicate",
            Event::TaskHelpNeeded => "task.help_needed",
            Event::TaskInterrupted => "task.interrupted",
            Event::TaskParked => "task.parked",
            Event::TaskReceived => "task.received",
            Event::TaskRecovered => "task.recovered",
            Event::TaskRejected => "task.rejected",
            Event::TaskStarted => "task.started",
            Event::TaskStream => "task.stream",
            Event::TaskStreamOpened => "task.stream.opened",
            Event::TaskSuperseded => "task.superseded",
        }
    }
}

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
    pub fn emit(&self, event: Event, fields: Value) {
        let event = event.as_str();
        tracing::info!(target: "aamp_bridge::events", event, %fields);
        self.write(event, fields);
    }

    /// Like [`Events::emit`], for detail too fine for the log's usual level (a task's every
    /// stream event): logged at debug level, written in full with `--json`.
    pub fn emit_detail(&self, event: Event, fields: Value) {
        let event = event.as_str();
        tracing::debug!(target: "aamp_bridge::events", event, %fields);
        self.write(event, fields);
    }

    fn write(&self, event: &str, fields: Value) {
        // The live view's tap: only when a page is open is the line built for it.
        let tap = TAP.get().filter(|tap| tap.receiver_count() > 0);
        if !self.json && tap.is_none() {
            return;
        }
        let mut line = Map::new();
        line.insert("event".into(), Value::from(event));
        line.insert(
            "time".into(),
            Value::from(crate::protocol::time::format_utc_ms(
                std::time::SystemTime::now(),
            )),
        );
        if let Value::Object(map) = fields {
            line.extend(map);
        }
        let line = json_line(&Value::Object(line));
        if let Some(tap) = tap {
            // No receiver left since the check: nobody missed it.
            let _ = tap.send(std::sync::Arc::from(line.as_str()));
        }
        if self.json {
            writer().send(line);
        }
    }
}

/// Event lines the tap keeps for its slowest reader; one that falls further behind is told
/// it lagged (and reads a fresh snapshot) instead of holding memory.
const TAP_LINES: usize = 1024;

/// Every event line, as `--json` prints it, for in-process readers (the live view's feed).
/// Made at the first [`tap`]; until then, and while nobody holds a receiver, emitting costs
/// nothing more than without it.
static TAP: std::sync::OnceLock<tokio::sync::broadcast::Sender<std::sync::Arc<str>>> =
    std::sync::OnceLock::new();

/// A receiver of every event line emitted from now on (the same JSON `--json` prints, whether
/// or not `--json` is on), in emission order. Bounded: a reader more than [`TAP_LINES`]
/// behind gets `RecvError::Lagged` and must resynchronise from the state.
pub fn tap() -> tokio::sync::broadcast::Receiver<std::sync::Arc<str>> {
    TAP.get_or_init(|| tokio::sync::broadcast::channel(TAP_LINES).0)
        .subscribe()
}

/// `value` as one JSON line with U+2028 and U+2029 escaped (`\u2028`, `\u2029`): JSON allows
/// them raw in strings, but JavaScript before ES2019 and many line-oriented readers take them
/// for line ends, so a sender's subject could split an event in two. They occur only inside
/// strings, so replacing them keeps the JSON the same value.
fn json_line(value: &Value) -> String {
    escape_separators(value.to_string())
}

/// `value` as one line of JSON for a command's `--json` output, U+2028 and U+2029 escaped as
/// in the event lines.
pub fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    serde_json::to_string(value).map(escape_separators)
}

fn escape_separators(text: String) -> String {
    if text.contains(['\u{2028}', '\u{2029}']) {
        text.replace('\u{2028}', "\\u2028")
            .replace('\u{2029}', "\\u2029")
    } else {
        text
    }
}

/// Event lines waiting for stdout at most; past that they are dropped (and counted), so a
/// consumer that stops reading never stops the daemon.
const QUEUE: usize = 4096;

/// Writes event lines to stdout from a thread of its own.
struct Writer {
    lines: std::sync::mpsc::SyncSender<String>,
    queued: std::sync::Arc<AtomicU64>,
    written: std::sync::Arc<AtomicU64>,
    dropped: AtomicU64,
}

impl Writer {
    fn send(&self, line: String) {
        if self.lines.try_send(line).is_ok() {
            self.queued.fetch_add(1, Ordering::SeqCst);
        } else {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    dropped = n,
                    "stdout is not being read; JSON events are being dropped"
                );
            }
        }
    }
}

fn writer() -> &'static Writer {
    static WRITER: std::sync::OnceLock<Writer> = std::sync::OnceLock::new();
    WRITER.get_or_init(|| {
        let (lines, queue) = std::sync::mpsc::sync_channel::<String>(QUEUE);
        let written = std::sync::Arc::new(AtomicU64::new(0));
        let counter = written.clone();
        std::thread::Builder::new()
            .name("events-stdout".into())
            .spawn(move || {
                let mut open = true;
                for line in queue {
                    if open {
                        open = write_line(&line);
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            })
            .expect("a thread for stdout");
        Writer {
            lines,
            queued: std::sync::Arc::new(AtomicU64::new(0)),
            written,
            dropped: AtomicU64::new(0),
        }
    })
}

/// Writes one event line to stdout; false when stdout is closed, which only means nobody
/// reads the events any more: said once in the log, and the lines after it are not written.
fn write_line(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => true,
        // A stdout set non-blocking by someone sharing it is full, not closed.
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
        Err(e) => {
            tracing::warn!(error = %e, "stdout is closed; JSON events are no longer written");
            false
        }
    }
}

/// Waits (up to `max`) until the event lines emitted so far are written, for a clean exit.
pub fn flush(max: std::time::Duration) {
    let w = writer();
    let target = w.queued.load(Ordering::SeqCst);
    let deadline = std::time::Instant::now() + max;
    while w.written.load(Ordering::SeqCst) < target && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// `2026-11-29T10:02:18.123Z`.
pub fn now_rfc3339() -> String {
    crate::protocol::time::format_utc_ms(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_escape_the_unicode_line_separators() {
        let value = serde_json::json!({"title": "one\u{2028}two\u{2029}three\nfour"});
        let line = json_line(&value);
        assert_eq!(line, r#"{"title":"one\u2028two\u2029three\nfour"}"#);
        assert!(!line.contains(['\u{2028}', '\u{2029}', '\n']));
        assert_eq!(serde_json::from_str::<Value>(&line).unwrap(), value);
        // The commands' --json lines (dispatch, tasks, doctor, policy) the same way.
        let text = json_text(&value).unwrap();
        assert_eq!(text, line);
    }

    #[test]
    fn the_tap_carries_every_event_in_order_without_json() {
        let mut rx = tap();
        let events = Events::new(false);
        for i in 0..50 {
            events.emit_detail(
                Event::TaskStream,
                serde_json::json!({"taskId": "tap-test", "payload": {"text": i.to_string()}}),
            );
        }
        let mut seen = Vec::new();
        while let Ok(line) = rx.try_recv() {
            let v: Value = serde_json::from_str(&line).unwrap();
            // Other tests in this process may emit too.
            if v["taskId"] == "tap-test" {
                assert_eq!(v["event"], "task.stream");
                seen.push(v["payload"]["text"].as_str().unwrap().to_string());
            }
        }
        let wanted: Vec<String> = (0..50).map(|i| i.to_string()).collect();
        assert_eq!(seen, wanted);
    }

    #[test]
    fn event_names_are_distinct_and_dotted() {
        let names: std::collections::BTreeSet<&str> =
            Event::ALL.iter().map(|e| e.as_str()).collect();
        assert_eq!(names.len(), Event::ALL.len());
        assert!(names.iter().all(|n| n.contains('.') && !n.contains(' ')));
    }
}
