//! Any text as the config file and as `init` answers: an error naming the problem, or a
//! config that the writer renders back into text the loader accepts as the same config.
#![no_main]

use std::path::Path;

use aamp_bridge::config::{render, LoadedConfig};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
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
});
