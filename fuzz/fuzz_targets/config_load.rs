//! Any text as the config file and as `init` answers: an error naming the problem, or a
//! config that the writer renders back into text the loader accepts as the same config.
#![no_main]

#[path = "../checks/config_load.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
