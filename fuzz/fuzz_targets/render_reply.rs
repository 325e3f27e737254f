//! The renderer fed with hostile inbound values: any bytes read as a mail, and any fields
//! (split at NUL bytes) put straight into a message, answered with every reply the bridge
//! sends. Never a panic, never a loop without end, no line over RFC 5322's 998 characters,
//! and the reply reads back as the same intent and task.
#![no_main]

#[path = "../checks/render_reply.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
