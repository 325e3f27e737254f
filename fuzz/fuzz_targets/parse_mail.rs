//! Any bytes through the mail reader and the AAMP parser: never a panic, and whatever reads as
//! AAMP renders to a mail that reads back as the same intent and task.
#![no_main]

#[path = "../checks/parse_mail.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
