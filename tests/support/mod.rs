//! Test support over the real mail host (scripts/mailhost.sh): starting it when it is not
//! running, fresh mailboxes per test, a running bridge process, and a dispatcher peer.
#![allow(dead_code, unused_imports)]

mod bridge;
mod browser;
mod config;
mod fake;
mod links;
mod mailhost;
mod peer;
mod procfs;
mod samp;
mod servers;

pub use bridge::*;
pub use browser::*;
pub use config::*;
pub use fake::*;
pub use links::*;
pub use mailhost::*;
pub use peer::*;
pub use procfs::*;
pub use samp::{SampPeer, SampServer};
pub use servers::*;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aamp_bridge::config::{Account, SmtpSecurity};
use aamp_bridge::mailbox::aamp::{Reader, Sender};
use aamp_bridge::mailbox::Inbound;
use aamp_bridge::protocol::{self, AampMessage, Body, Dispatch, Envelope, Intent};
use serde_json::Value;

pub const WAIT: Duration = Duration::from_secs(30);

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .rev()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `profile` on `task`, collecting the stream events it sends.
pub async fn run_collecting(
    profile: &aamp_bridge::runner::Profile,
    task: &aamp_bridge::runner::TaskInput,
    cancel: &tokio_util::sync::CancellationToken,
) -> (
    Result<aamp_bridge::runner::RunOutput, aamp_bridge::runner::RunError>,
    Vec<aamp_bridge::runner::StreamEvent>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let collect = async move {
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        events
    };
    let go = async move {
        let result = aamp_bridge::runner::run(profile, task, cancel, &tx).await;
        drop(tx);
        result
    };
    tokio::join!(go, collect)
}

/// The text of all `text.delta` events, joined.
pub fn text_of(events: &[aamp_bridge::runner::StreamEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            aamp_bridge::runner::StreamEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// Whether a process is still running (a zombie waiting for its parent counts as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to WAIT for `cond`, looking every 50 ms.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The lines of a file (none when it does not exist).
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}
