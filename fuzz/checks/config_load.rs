//! Any text as the config file and as `init` answers: an error naming the problem, or a
//! config that the writer renders back into text the loader accepts as the same config.
//!
//! Shared by the fuzz target of the same name and by `tests/fuzz_replay.rs`, which replays the
//! saved inputs and seeded mutations of them as an ordinary test.

use std::path::Path;

use aamp_bridge::config::{render, LoadedConfig};

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let path = Path::new("/nonexistent/aamp-bridge/config.toml");
    if let Ok(loaded) = LoadedConfig::from_text(path, &text) {
        for name in loaded.config.mailboxes.keys() {
            let _ = loaded.account(name);
        }
        let _ = loaded.agents(&[]);
        let written = render(&loaded.config);
        let again = LoadedConfig::from_text(path, &written)
            .unwrap_or_else(|e| panic!("the rendered config does not load: {e}\n{written}"));
        assert_eq!(render(&again.config), written, "rendering is stable");
    }
    let _ = aamp_bridge::wizard::Answers::parse(&text);
}
