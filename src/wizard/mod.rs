//! `aamp-bridge init` and `aamp-bridge import`: the person's way into a config. A thin shell:
//! the questions ([`prompt`], the only code that prompts) and the reference bridges' files
//! ([`import`]) both come down to [`Answers`], and [`apply`] turns answers into a config the
//! loader accepts, testing every mailbox live before anything is written.
//!
//! Applying the same answers twice changes nothing: a mailbox registered before is reused,
//! the file is rewritten only when its text changes, and a live pairing code is shown again.
//!
//! Where things are: the answers' model in `answers`; their application in `apply`, one
//! mailbox's set-up and registration in `register`, the `[mailboxes.NAME]` entry an answer
//! makes in `mailbox_config`, the live test of a mailbox in `live`, pairing codes in
//! `pairing`.

use std::path::Path;

use crate::config::{self, Config, LoadedConfig};

mod answers;
mod apply;
pub mod import;
mod line;
mod live;
mod mailbox_config;
mod pairing;
pub mod profile_maker;
pub mod prompt;
mod register;
mod summary;

pub use answers::{AgentAnswers, Answers, MailboxAnswers, OwnMailbox, Servers};
pub use apply::{apply, print_applied, Applied, AppliedAgent};
pub use live::{test_answers, test_mailbox, MailboxTestFailed};
pub use pairing::{pairing, qr, Pairing};

/// Reports progress of slow steps (a spinner in a terminal, nothing otherwise).
pub trait Progress {
    fn step(&self, what: &str);
    fn done(&self, what: &str);
}

/// No progress display.
pub struct Quiet;

impl Progress for Quiet {
    fn step(&self, _: &str) {}
    fn done(&self, _: &str) {}
}

/// The config at `path`, or an empty one when there is none yet.
pub fn existing(path: &Path) -> anyhow::Result<Option<LoadedConfig>> {
    if !path.exists() {
        return Ok(None);
    }
    LoadedConfig::load(path).map(Some).map_err(|e| {
        anyhow::anyhow!("{e}\n  (init edits the existing config, so it must load first: fix it, or move it away to start over)")
    })
}

fn empty_config() -> Config {
    toml::from_str("").expect("an empty config loads")
}

/// A loaded view of an in-memory config, to resolve accounts before it is written.
fn view(path: &Path, config: &Config) -> LoadedConfig {
    let base = path.parent().unwrap_or(Path::new("."));
    LoadedConfig {
        path: path.to_path_buf(),
        state_dir: config
            .state_dir
            .as_ref()
            .map(|d| base.join(d))
            .unwrap_or_else(config::default_state_dir),
        config: config.clone(),
    }
}
