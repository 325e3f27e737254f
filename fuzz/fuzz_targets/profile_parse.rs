//! Any text as a profile file, and as a sender policy in the reference bridges' text form:
//! an error or a value, never a panic.
#![no_main]

#[path = "../checks/profile_parse.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
