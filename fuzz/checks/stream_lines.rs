//! Any bytes as an agent's stdout, line by line, through every stream format's adapter (the
//! SSE and NDJSON framing and the Claude, Codex and Gemini readers): never a panic, and every
//! event they make turns into an AAMP stream event.
//!
//! Shared by the fuzz target of the same name and by `tests/fuzz_replay.rs`, which replays the
//! saved inputs and seeded mutations of them as an ordinary test.

use aamp_bridge::runner::stream::{StreamFormat, StreamParser};

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for format in [
        StreamFormat::Ndjson,
        StreamFormat::Sse,
        StreamFormat::Claude,
        StreamFormat::Codex,
        StreamFormat::Gemini,
    ] {
        let mut parser = StreamParser::with_limit(format, 256);
        let mut events = Vec::new();
        for line in text.split('\n') {
            events.extend(parser.line(line));
        }
        events.extend(parser.finish());
        for event in &events {
            let (kind, payload) = event.to_aamp();
            assert!(!kind.is_empty() && payload.is_object());
        }
    }
}
