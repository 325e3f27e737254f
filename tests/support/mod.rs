//! Test support over the real mail host (scripts/mailhost.sh): starting it when it is not
//! running, fresh mailboxes per test, a running bridge process, and a dispatcher peer.
#![allow(dead_code, unused_imports)]

mod amp;
mod asmtp;
mod bridge;
mod browser;
mod config;
mod fake;
mod links;
mod mailhost;
mod model_api;
mod peer;
mod procfs;
mod replica;
mod samp;
mod servers;

pub use amp::AmpBroker;
pub use asmtp::{envelope_text, ulid, AsmtpOperator};
pub use bridge::*;
pub use browser::*;
pub use config::*;
pub use fake::*;
pub use links::*;
pub use mailhost::*;
pub use model_api::ModelApi;
pub use peer::*;
pub use procfs::*;
pub use replica::*;
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

/// Waits up to WAIT for `cond`, looking every 50 ms. For a test without a runtime; an async
/// test awaits [`poll_until`] instead, which leaves its worker free meanwhile.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to WAIT for `cond`, looking every 50 ms without blocking the runtime.
pub async fn poll_until(what: &str, mut cond: impl FnMut() -> bool) {
    poll(what, WAIT, || std::future::ready(cond().then_some(()))).await
}

/// Looks with `look` every 50 ms until it finds something, for up to `within`; fails the
/// test with `what` if it finds nothing.
pub async fn poll<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    within: Duration,
    mut look: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = look().await {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long after `since` `look` first found what it looks for (looking every 50 ms); `None`
/// when it did not within `within` of `since`. For a test that measures how soon.
pub async fn found_within<F: std::future::Future<Output = bool>>(
    since: Instant,
    within: Duration,
    mut look: impl FnMut() -> F,
) -> Option<Duration> {
    loop {
        if look().await {
            return Some(since.elapsed());
        }
        if since.elapsed() > within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fails the test if a test server's record (`--record`) holds a request or frame it marked
/// invalid (against the API's rules).
pub fn assert_none_invalid(record: Vec<Value>) {
    let invalid: Vec<Value> = record
        .into_iter()
        .filter(|r| r.get("invalid").is_some())
        .collect();
    assert!(
        invalid.is_empty(),
        "requests or frames against the server's rules: {invalid:?}"
    );
}

/// Runs a blocking wait (for a child process, or a channel the bridge's events come in on)
/// so that it does not hold up a runtime: in a multi-threaded runtime the worker hands its
/// other tasks over first; outside a runtime it just runs.
pub fn blocking<T>(wait: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

/// The JSON lines of a file (a test server's `--record`), skipping any that is not JSON.
pub fn json_lines(path: &Path) -> Vec<Value> {
    lines(path)
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Sends `request` (with `body` as JSON when there is one) and returns the JSON answer,
/// failing the test on a status other than success.
pub async fn json_call(request: reqwest::RequestBuilder, body: Option<Value>) -> Value {
    let request = match body {
        Some(body) => request.json(&body),
        None => request,
    };
    let response = request.send().await.unwrap();
    let (status, url) = (response.status(), response.url().path().to_string());
    let value: Value = response.json().await.unwrap();
    assert!(status.is_success(), "{url}: {status} {value}");
    value
}

/// The lines of a file (none when it does not exist).
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}
