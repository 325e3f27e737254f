//! How a mailbox connection is doing, kept in a small JSON file beside the cursor so that a
//! `status` command (or a person) can read it while the daemon runs.

use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// The reachability of the mailbox itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    Connecting,
    Connected,
    Unreachable,
    /// The server refused the credentials.
    AuthFailed,
}

/// What `link.json` holds: written by the running bridge, read by `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkState {
    pub mailbox: Reach,
    /// `websocket`, `eventsource`, or `polling`.
    pub push: String,
    /// When `mailbox` last changed (RFC 3339).
    pub since: String,
    pub last_error: Option<String>,
    /// The credentials in use: when they were last read and whether they worked.
    #[serde(default)]
    pub credentials: Option<Credentials>,
}

/// What `status` shows of a mailbox's credentials (never the secret itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    /// The file they are read from, when they are.
    pub file: Option<String>,
    /// When the file was last read (at start, a reload, or a retry after a refusal).
    pub read_at: String,
    /// When the credentials in use were first read.
    pub since: String,
    /// Whether the server took them: `None` until they were tried.
    pub worked: Option<bool>,
}

impl Credentials {
    pub fn of(secret: &crate::config::Secret) -> Credentials {
        let status = secret.status();
        Credentials {
            file: status.file.map(|f| f.display().to_string()),
            read_at: crate::protocol::time::format_utc_ms(status.read_at),
            since: crate::protocol::time::format_utc_ms(status.changed_at),
            worked: status.worked,
        }
    }
}

impl LinkState {
    /// How mail is read now: the push transport or `polling` while the mailbox answers;
    /// `None` while it does not (a push socket that stays open then reads nothing: after a
    /// token rotation the ASMTP socket stays up while every read is refused).
    pub fn reading(&self) -> Option<&str> {
        (self.mailbox == Reach::Connected).then_some(self.push.as_str())
    }
}

impl Reach {
    pub fn as_str(self) -> &'static str {
        match self {
            Reach::Connecting => "connecting",
            Reach::Connected => "connected",
            Reach::Unreachable => "unreachable",
            Reach::AuthFailed => "auth_failed",
        }
    }
}

/// Reads a link file; `None` when there is none (or it is not one).
pub fn read(path: &std::path::Path) -> Option<LinkState> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

pub struct Link {
    path: PathBuf,
    state: Mutex<LinkState>,
    /// Called when the mailbox answers again after it could not be reached (the daemon
    /// tells the agent's outbox, whose mail goes to the same server).
    on_back: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Link {
    pub fn new(path: PathBuf) -> Link {
        let link = Link {
            path,
            state: Mutex::new(LinkState {
                mailbox: Reach::Connecting,
                push: "polling".into(),
                since: crate::events::now_rfc3339(),
                last_error: None,
                credentials: None,
            }),
            on_back: None,
        };
        link.save(&link.state.lock().expect("link lock"));
        link
    }

    /// `back` is called each time the mailbox answers again after it was unreachable.
    pub fn on_back(mut self, back: impl Fn() + Send + Sync + 'static) -> Link {
        self.on_back = Some(Box::new(back));
        self
    }

    /// Records the mailbox's reachability (and the error, if any).
    pub fn mailbox(&self, reach: Reach, error: Option<String>) {
        let mut state = self.state.lock().expect("link lock");
        let back = state.mailbox == Reach::Unreachable && reach == Reach::Connected;
        if state.mailbox != reach {
            state.since = crate::events::now_rfc3339();
        }
        let changed = state.mailbox != reach || (error.is_some() && state.last_error != error);
        state.mailbox = reach;
        if error.is_some() {
            state.last_error = error;
        }
        if changed {
            self.save(&state);
        }
        drop(state);
        if let (true, Some(on_back)) = (back, &self.on_back) {
            on_back();
        }
    }

    /// Records how changes arrive: a push transport, or polling.
    pub fn push(&self, how: &'static str) {
        let mut state = self.state.lock().expect("link lock");
        if state.push != how {
            state.push = how.into();
            self.save(&state);
        }
    }

    /// Records the state of the mailbox's credentials.
    pub fn credentials(&self, secret: &crate::config::Secret) {
        let now = Some(Credentials::of(secret));
        let mut state = self.state.lock().expect("link lock");
        if state.credentials != now {
            state.credentials = now;
            self.save(&state);
        }
    }

    fn save(&self, state: &LinkState) {
        let bytes = serde_json::to_vec_pretty(state).expect("link state serializes");
        if let Err(e) = crate::fsio::write_atomic(&self.path, &bytes, 0o600) {
            tracing::debug!(error = %e, "could not write the link state");
        }
    }
}
