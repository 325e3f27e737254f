//! The state directory's layout: one place names every file the bridge keeps there.
//!
//! ```text
//! STATE/journal.sqlite3           the task journal (and its -wal, -shm)
//! STATE/bridge.lock               held by the running bridge
//! STATE/control.sock              the running bridge's owner-only control socket
//! STATE/ui-token                  the live view's access token (0600), and
//! STATE/ui-address                the address it listens on (`aamp-bridge ui` reads both)
//! STATE/agents/NAME/              one folder per agent: its mailbox cursor or watermark
//!                                   (jmap-email-state, asmtp-watermark, amp-position),
//!                                   the ASMTP thread map (asmtp-threads), the questions
//!                                   an agent posted (asmtp-questions, amp-questions,
//!                                   samp-questions),
//! STATE/agents/NAME/link.json       the link state `status` reads,
//! STATE/agents/NAME/tasks/          and the task workspaces
//! ```

use std::path::{Path, PathBuf};

/// A state directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDir(PathBuf);

impl StateDir {
    pub fn new(path: impl Into<PathBuf>) -> StateDir {
        StateDir(path.into())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn journal(&self) -> PathBuf {
        self.0.join("journal.sqlite3")
    }

    pub fn lock(&self) -> PathBuf {
        self.0.join("bridge.lock")
    }

    pub fn control_socket(&self) -> PathBuf {
        self.0.join("control.sock")
    }

    pub fn ui_token(&self) -> PathBuf {
        self.0.join("ui-token")
    }

    pub fn ui_address(&self) -> PathBuf {
        self.0.join("ui-address")
    }

    /// The folder of one agent.
    pub fn agent(&self, name: &str) -> PathBuf {
        self.0.join("agents").join(name)
    }

    /// Where one agent's JMAP intake keeps its read position (the Email state).
    pub fn jmap_cursor(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("jmap-email-state")
    }

    /// Where one agent's ASMTP intake keeps its read position (the watermark).
    pub fn asmtp_watermark(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("asmtp-watermark")
    }

    /// One agent's ASMTP thread map.
    pub fn asmtp_threads(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("asmtp-threads")
    }

    /// The questions one agent posted on ASMTP.
    pub fn asmtp_questions(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("asmtp-questions")
    }

    /// Where one agent's AMP intake keeps its read position.
    pub fn amp_position(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("amp-position")
    }

    /// The questions one agent posted on AMP.
    pub fn amp_questions(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("amp-questions")
    }

    /// The questions one agent posted on SAMP.
    pub fn samp_questions(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("samp-questions")
    }

    /// Session ids an old bridge kept in a file, imported into the journal once.
    pub fn legacy_sessions(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("sessions.json")
    }

    /// The link state of one agent's mailbox.
    pub fn link(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("link.json")
    }

    /// Where one agent's task workspaces are made.
    pub fn workspaces(&self, agent: &str) -> PathBuf {
        self.agent(agent).join("tasks")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_under_the_state_directory() {
        let dir = StateDir::new("/s");
        assert_eq!(dir.journal(), Path::new("/s/journal.sqlite3"));
        assert_eq!(dir.link("coder"), Path::new("/s/agents/coder/link.json"));
        assert_eq!(dir.workspaces("coder"), Path::new("/s/agents/coder/tasks"));
        assert_eq!(dir.control_socket(), Path::new("/s/control.sock"));
        assert_eq!(dir.lock(), Path::new("/s/bridge.lock"));
        assert_eq!(
            dir.jmap_cursor("coder"),
            Path::new("/s/agents/coder/jmap-email-state")
        );
        assert_eq!(
            dir.amp_position("coder"),
            Path::new("/s/agents/coder/amp-position")
        );
    }
}
