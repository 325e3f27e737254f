//! Any text as a profile file, and as a sender policy in the reference bridges' text form:
//! an error or a value, never a panic.
//!
//! Shared by the fuzz target of the same name and by `tests/fuzz_replay.rs`, which replays the
//! saved inputs and seeded mutations of them as an ordinary test.

use aamp_bridge::config::policy::parse_text;
use aamp_bridge::runner::Profile;

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = Profile::parse(&text, "fuzzed", "fuzz input");
    if let Ok(rules) = parse_text(&text) {
        let policy = aamp_bridge::dispatch::SenderPolicy::default().with_rules(rules);
        let _ = policy.allows("someone@example.test");
    }
}
