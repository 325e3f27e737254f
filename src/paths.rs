//! The state directory's layout: one place names every file the bridge keeps there.
//!
//! ```text
//! STATE/journal.sqlite3           the task journal (and its -wal, -shm)
//! STATE/bridge.lock               held by the running bridge
//! STATE/control.sock              the running bridge's owner-only control socket
//! STATE/ui-token                  the live view's access token (0600), and
//! STATE/ui-address                the address it listens on (`aamp-bridge ui` reads both)
//! STATE/bridge.log                the running bridge's log once its stderr closed (and
//!                                   bridge.log.1, its older part)
//! STATE/agents/NAME/              one folder per agent: the files its mailbox back-end
//!                                   keeps, SYSTEM-WHAT (its read position: jmap-email-state,
//!                                   asmtp-watermark, amp-position; the ASMTP thread map,
//!                                   asmtp-threads; the questions an agent posted,
//!                                   asmtp-questions, amp-questions, samp-questions),
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

    /// Where the agents' MCP servers reach the delegation tools.
    pub fn delegate_socket(&self) -> PathBuf {
        self.0.join("delegate.sock")
    }

    /// Where a running bridge's log goes on when its stderr is closed (a `tee` that ended).
    pub fn log(&self) -> PathBuf {
        self.0.join("bridge.log")
    }

    pub fn ui_token(&self) -> PathBuf {
        self.0.join("ui-token")
    }

    pub fn ui_address(&self) -> PathBuf {
        self.0.join("ui-address")
    }

    /// The owner-only page `ui --open` opens, which sends the browser on to the link.
    pub fn ui_opener(&self) -> PathBuf {
        self.0.join("ui-open.html")
    }

    /// The folder of one agent.
    pub fn agent(&self, name: &str) -> PathBuf {
        self.0.join("agents").join(name)
    }

    /// A file one agent's mailbox back-end keeps in the agent's folder, named `SYSTEM-WHAT`:
    /// each back-end names its own (`jmap-email-state`, the AAMP read position;
    /// `asmtp-watermark`, `asmtp-threads`, `asmtp-questions`; `amp-position`,
    /// `amp-questions`; `samp-questions`), and a new one needs no line here.
    pub fn mailbox_file(&self, agent: &str, system: &str, what: &str) -> PathBuf {
        self.agent(agent).join(format!("{system}-{what}"))
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
            dir.mailbox_file("coder", "jmap", "email-state"),
            Path::new("/s/agents/coder/jmap-email-state")
        );
        assert_eq!(
            dir.mailbox_file("coder", "amp", "position"),
            Path::new("/s/agents/coder/amp-position")
        );
    }
}
