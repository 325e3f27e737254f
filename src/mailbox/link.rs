//! How a mailbox connection is doing, kept in a small JSON file beside the cursor so that a
//! `status` command (or a person) can read it while the daemon runs.

use std::path::PathBuf;
use std::sync::Mutex;

use serde::Serialize;

/// The reachability of the mailbox itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    Connecting,
    Connected,
    Unreachable,
    /// The server refused the credentials.
    AuthFailed,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct State {
    mailbox: Reach,
    /// `websocket`, `eventsource`, or `polling`.
    push: &'static str,
    /// When `mailbox` last changed (RFC 3339).
    since: String,
    last_error: Option<String>,
}

pub struct Link {
    path: PathBuf,
    state: Mutex<State>,
}

impl Link {
    pub fn new(path: PathBuf) -> Link {
        let link = Link {
            path,
            state: Mutex::new(State {
                mailbox: Reach::Connecting,
                push: "polling",
                since: crate::events::now_rfc3339(),
                last_error: None,
            }),
        };
        link.save(&link.state.lock().expect("link lock"));
        link
    }

    /// Records the mailbox's reachability (and the error, if any).
    pub fn mailbox(&self, reach: Reach, error: Option<String>) {
        let mut state = self.state.lock().expect("link lock");
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
    }

    /// Records how changes arrive: a push transport, or polling.
    pub fn push(&self, how: &'static str) {
        let mut state = self.state.lock().expect("link lock");
        if state.push != how {
            state.push = how;
            self.save(&state);
        }
    }

    fn save(&self, state: &State) {
        let bytes = serde_json::to_vec_pretty(state).expect("link state serializes");
        if let Err(e) = crate::fsio::write_atomic(&self.path, &bytes, 0o600) {
            tracing::debug!(error = %e, "could not write the link state");
        }
    }
}
