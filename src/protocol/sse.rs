//! Server-sent events (the WHATWG `text/event-stream` format), read incrementally and
//! bounded. The one reader for every event stream the bridge reads: the AAMP service's task
//! streams, JMAP's EventSource push, and agents that print SSE. Pure.
//!
//! Lines end with LF, CRLF or CR; a line starting with `:` is a comment; `field: value`
//! (one space after the colon dropped); `data` lines of one event are joined with LF; a
//! blank line ends the event, which is dispatched only when it has data. Other fields (`id`,
//! `retry`) are read and not kept.

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// `message` unless an `event:` line named it.
    pub event: String,
    pub data: String,
}

/// Reads events from a stream of bytes or lines. Holds at most `max` bytes of one event's
/// data (more is dropped and [`SseReader::cut`] says so) and of one unfinished line (a
/// longer line is dropped whole and counted in [`SseReader::overlong`]).
#[derive(Debug)]
pub struct SseReader {
    max: usize,
    pending: Vec<u8>,
    event: Option<String>,
    data: String,
    has_data: bool,
    /// Data was dropped because an event held more than `max` bytes.
    pub cut: bool,
    /// Lines dropped because they were longer than `max` bytes.
    pub overlong: usize,
    /// The pending line is the rest of an overlong one: dropped up to its end.
    skipping: bool,
    /// The last line ended with CR (an LF right after it ends nothing).
    last_was_cr: bool,
}

impl SseReader {
    pub fn new(max: usize) -> SseReader {
        SseReader {
            max,
            pending: Vec::new(),
            event: None,
            data: String::new(),
            has_data: false,
            cut: false,
            overlong: 0,
            skipping: false,
            last_was_cr: false,
        }
    }

    /// Feeds bytes as they arrive; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' || b == b'\r' {
                // A CR LF pair ends one line: the LF after a CR finds nothing pending.
                let ended_empty = self.pending.is_empty();
                let line = std::mem::take(&mut self.pending);
                if self.skipping {
                    self.skipping = false;
                    self.last_was_cr = b == b'\r';
                    continue;
                }
                if b == b'\n' && ended_empty && self.last_was_cr {
                    self.last_was_cr = false;
                    continue;
                }
                self.last_was_cr = b == b'\r';
                if let Some(event) = self.line(&String::from_utf8_lossy(&line)) {
                    out.push(event);
                }
                continue;
            }
            self.last_was_cr = false;
            if self.skipping {
                continue;
            }
            if self.pending.len() >= self.max {
                self.pending.clear();
                self.skipping = true;
                self.overlong += 1;
                continue;
            }
            self.pending.push(b);
        }
        out
    }

    /// Reads one line (without its end); returns the event a blank line completes.
    pub fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => {
                let extra = value.len() + usize::from(self.has_data);
                if self.data.len() + extra <= self.max {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                    self.has_data = true;
                } else {
                    self.cut = true;
                }
            }
            _ => {}
        }
        None
    }

    /// The event still pending when the stream ends (no blank line after it).
    pub fn finish(&mut self) -> Option<SseEvent> {
        if !self.pending.is_empty() && !self.skipping {
            let line = std::mem::take(&mut self.pending);
            if let Some(event) = self.line(&String::from_utf8_lossy(&line)) {
                return Some(event);
            }
        }
        self.dispatch()
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        if !self.has_data {
            return None;
        }
        self.has_data = false;
        Some(SseEvent {
            event: event.unwrap_or_else(|| "message".to_string()),
            data: std::mem::take(&mut self.data),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8], max: usize) -> (Vec<SseEvent>, SseReader) {
        let mut reader = SseReader::new(max);
        let mut out = reader.feed(input);
        out.extend(reader.finish());
        (out, reader)
    }

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn events_are_read_whatever_the_line_ends_and_the_chunking() {
        let input = b": hello\r\nevent: state\r\ndata: {\"a\":1}\r\n\r\ndata:x\ndata: y\n\nevent: empty\n\ndata: last";
        let (whole, _) = all(input, 1024);
        assert_eq!(
            whole,
            vec![
                ev("state", "{\"a\":1}"),
                ev("message", "x\ny"),
                ev("message", "last")
            ]
        );
        let mut reader = SseReader::new(1024);
        let mut bytewise: Vec<SseEvent> = input.iter().flat_map(|b| reader.feed(&[*b])).collect();
        bytewise.extend(reader.finish());
        assert_eq!(bytewise, whole);
        let (cr_only, _) = all(b"data: a\rdata: b\r\r", 1024);
        assert_eq!(cr_only, vec![ev("message", "a\nb")]);
    }

    #[test]
    fn what_is_too_long_is_dropped_and_said() {
        let (events, reader) = all(b"data: 0123456789\n\ndata: ok\n\n", 8);
        assert_eq!(events, vec![ev("message", "ok")]);
        assert_eq!(reader.overlong, 1);
        let (events, reader) = all(b"data: 123456\ndata: 789012\n\n", 12);
        assert_eq!(events, vec![ev("message", "123456")]);
        assert!(reader.cut);
    }
}
