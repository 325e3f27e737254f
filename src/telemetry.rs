//! Logging: human-readable lines on stderr, filtered by `AAMP_BRIDGE_LOG` (or `RUST_LOG`).
//!
//! A running bridge (`start`) hands its lines to a thread of its own, so that a stderr nobody
//! reads never stops it: a reader that stalls (a paused pager) costs the lines past a bounded
//! queue (dropped, and counted in the log), and a reader that went away (a `tee` ended with
//! Ctrl-C, a dropped `ssh`) is noticed once, after which the lines go into the state
//! directory's log ([`crate::paths::StateDir::log`]). The subscriber's own report of a failed
//! write is off: it is an `eprintln!`, which panics on a closed stderr, and it panicked every
//! thread that logged, the signal listener among them.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// Sets up logging; `start` is the bridge itself (`info` by default, lines written from a
/// thread of their own), any other command logs warnings only.
pub fn init(start: bool) {
    let default = if start { "info" } else { "warn" };
    let filter = std::env::var("AAMP_BRIDGE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default.to_string());
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new(default)))
        .with_ansi(ansi)
        .with_target(false)
        .log_internal_errors(false)
        .with_writer(Lines {
            queued: start,
            ansi,
        })
        .init();
}

/// Where the log goes on once stderr is closed: the state directory's log, named when the
/// bridge knows its state directory (it holds the state lock, so no two bridges share it).
pub fn fall_back_to(path: PathBuf) {
    let _ = FALLBACK.set(path);
}

/// Waits (up to `max`) until the log lines queued so far are written, for a clean exit.
pub fn flush(max: Duration) {
    let Some(sink) = sink() else { return };
    let target = sink.queued.load(Ordering::SeqCst);
    let deadline = std::time::Instant::now() + max;
    while sink.written.load(Ordering::SeqCst) < target && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
}

static FALLBACK: OnceLock<PathBuf> = OnceLock::new();

/// Log lines waiting for stderr at most; past that they are dropped and counted.
const QUEUE: usize = 4096;

/// The state directory's log is started afresh past this size, its older part kept once
/// (`bridge.log.1`), so it never holds more than twice this.
const FILE_MAX: u64 = 8 << 20;

/// The subscriber's writer. Each event comes as one call with its whole line, which is
/// escaped ([`escape_line`]) and, for `start`, handed to the log thread's queue; other
/// commands write it to stderr at once. A failed write is forgotten.
#[derive(Clone, Copy, Debug)]
struct Lines {
    queued: bool,
    /// The lines carry the subscriber's colours.
    ansi: bool,
}

impl MakeWriter<'_> for Lines {
    type Writer = Lines;

    fn make_writer(&self) -> Lines {
        *self
    }
}

impl std::io::Write for Lines {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let escaped = escape_line(line, self.ansi);
        match sink().filter(|_| self.queued) {
            Some(sink) => sink.send(&escaped),
            None => drop(std::io::stderr().write_all(&escaped)),
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Sink {
    lines: mpsc::SyncSender<Vec<u8>>,
    queued: AtomicU64,
    written: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl Sink {
    fn send(&self, line: &[u8]) {
        if self.lines.try_send(line.to_vec()).is_ok() {
            self.queued.fetch_add(1, Ordering::SeqCst);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn sink() -> Option<&'static Sink> {
    static SINK: OnceLock<Option<Sink>> = OnceLock::new();
    SINK.get_or_init(|| {
        let (lines, queue) = mpsc::sync_channel::<Vec<u8>>(QUEUE);
        let written = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let (w, d) = (written.clone(), dropped.clone());
        std::thread::Builder::new()
            .name("log-stderr".into())
            .spawn(move || write_lines(queue, &w, &d))
            .ok()?;
        Some(Sink {
            lines,
            queued: AtomicU64::new(0),
            written,
            dropped,
        })
    })
    .as_ref()
}

/// The log thread: every queued line to stderr, or to the state directory's log once stderr
/// is closed; a count of the lines dropped before each line that follows a drop.
fn write_lines(queue: mpsc::Receiver<Vec<u8>>, written: &AtomicU64, dropped: &AtomicU64) {
    let mut out = Out::default();
    let mut told = 0;
    for line in queue {
        let lost = dropped.load(Ordering::Relaxed);
        if lost > told {
            out.write(
                format!(
                    "{} WARN {} log lines dropped: stderr was not read in time\n",
                    crate::events::now_rfc3339(),
                    lost - told
                )
                .as_bytes(),
            );
            told = lost;
        }
        out.write(&line);
        written.fetch_add(1, Ordering::SeqCst);
    }
}

/// Where the log thread writes: stderr until a write to it fails, then the fallback file.
#[derive(Default)]
struct Out {
    /// Why stderr was given up, once it was.
    closed: Option<std::io::Error>,
    file: Option<(std::fs::File, u64)>,
}

impl Out {
    fn write(&mut self, line: &[u8]) {
        if self.closed.is_none() {
            match std::io::stderr().write_all(line) {
                Ok(()) => return,
                // A stderr set non-blocking by someone sharing it is full, not closed.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => self.closed = Some(e),
            }
        }
        self.write_to_file(&strip_ansi(line));
    }

    /// Appends `line` to the state directory's log, opened at the first line after stderr
    /// closed (with a line saying so); dropped while the bridge has not named it.
    fn write_to_file(&mut self, line: &[u8]) {
        let Some(path) = FALLBACK.get() else { return };
        if self.file.as_ref().is_some_and(|(_, size)| *size > FILE_MAX) {
            let _ = std::fs::rename(path, path.with_extension("log.1"));
            self.file = None;
        }
        if self.file.is_none() {
            let Ok(file) = open_private_append(path) else {
                return;
            };
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            self.file = Some((file, size));
            let why = self
                .closed
                .as_ref()
                .map(|e| e.to_string())
                .unwrap_or_default();
            let note = format!(
                "{} WARN stderr is closed ({why}): the log goes on here\n",
                crate::events::now_rfc3339()
            );
            self.append(note.as_bytes());
        }
        self.append(line);
    }

    fn append(&mut self, bytes: &[u8]) {
        if let Some((file, size)) = &mut self.file {
            if file.write_all(bytes).is_ok() {
                *size += bytes.len() as u64;
            }
        }
    }
}

fn open_private_append(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// One event's line as the log writes it: what mail and agents wrote into it (a title, a
/// reason, an agent's words) cannot break it up or act on a terminal. Line and paragraph
/// separators (U+2028, U+2029, NEL), line ends inside it and every other control character
/// are written as escapes (`\n`, `\u{2028}`), so one event is one line for any reader;
/// tabs stay, and so do the subscriber's own colour codes when it writes them (`ESC [ digits
/// m`, nothing else of the kind).
fn escape_line(line: &[u8], ansi: bool) -> std::borrow::Cow<'_, [u8]> {
    let text = String::from_utf8_lossy(line);
    let body = text.strip_suffix('\n').unwrap_or(&text);
    let unsafe_char =
        |c: char| c != '\t' && (c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'));
    if !body.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = body;
    while let Some(c) = rest.chars().next() {
        if let Some(len) = colour_code(rest).filter(|_| ansi) {
            out.push_str(&rest[..len]);
            rest = &rest[len..];
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    out.push('\n');
    std::borrow::Cow::Owned(out.into_bytes())
}

/// The length of the colour code (`ESC [ digits and semicolons m`) `text` starts with.
fn colour_code(text: &str) -> Option<usize> {
    let params = text.strip_prefix("\x1b[")?;
    let digits = params.find(|c: char| !(c.is_ascii_digit() || c == ';'))?;
    params[digits..].starts_with('m').then_some(2 + digits + 1)
}

/// `line` without its terminal colours (`ESC [ ... letter`), which a file does not show.
fn strip_ansi(line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len());
    let mut bytes = line.iter().copied();
    while let Some(b) = bytes.next() {
        if b == 0x1b {
            // Skip to the sequence's final byte (0x40..=0x7e, after the `[`).
            let _ = bytes.next();
            for c in bytes.by_ref() {
                if (0x40..=0x7e).contains(&c) {
                    break;
                }
            }
        } else {
            out.push(b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_senders_write_cannot_break_a_log_line() {
        let line = "INFO task received title=\"one\u{2028}two\u{2029}three\u{85}four\nfive\r\x1b]0;pwned\x07\tsix\"\n";
        let escaped = escape_line(line.as_bytes(), false);
        let escaped = std::str::from_utf8(&escaped).unwrap();
        assert_eq!(
            escaped,
            "INFO task received title=\"one\\u{2028}two\\u{2029}three\\u{85}four\\nfive\\r\\u{1b}]0;pwned\\u{7}\tsix\"\n"
        );
        assert_eq!(escaped.lines().count(), 1);
        // The subscriber's colours stay on a terminal; a sender's escape does not.
        let coloured = "\x1b[32m INFO\x1b[0m title=\x1b]8;;evil\x07\n";
        assert_eq!(
            std::str::from_utf8(&escape_line(coloured.as_bytes(), true)).unwrap(),
            "\x1b[32m INFO\x1b[0m title=\\u{1b}]8;;evil\\u{7}\n"
        );
        // A plain line is left as it is.
        assert!(matches!(
            escape_line(b"INFO plain\n", false),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn colours_are_left_out_of_the_file() {
        let line = b"\x1b[2m2026-12-03T10:00:00Z\x1b[0m \x1b[32m INFO\x1b[0m task done\n";
        assert_eq!(
            strip_ansi(line),
            b"2026-12-03T10:00:00Z  INFO task done\n".to_vec()
        );
    }
}
