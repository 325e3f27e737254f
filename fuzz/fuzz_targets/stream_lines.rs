//! Any bytes as an agent's stdout, line by line, through every stream format's adapter (the
//! SSE and NDJSON framing and the Claude, Codex and Gemini readers): never a panic, and every
//! event they make turns into an AAMP stream event.
#![no_main]

#[path = "../checks/stream_lines.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
