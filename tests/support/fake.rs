//! A fake mailbox back-end for dispatch in-process (the fast tier): records what would have
//! been mailed, fails submissions on demand, serves attachments behind a gate, and, as one of
//! several replicas, loses its claims to another behind a gate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aamp_bridge::backend::{Backend, BackendError, ClaimOutcome, Earlier};
use aamp_bridge::error::ErrorClass;
use aamp_bridge::mailbox::Attachment;
use aamp_bridge::protocol::{self, AampMessage, Body, Intent, RenderedMail};

/// Records what would have been mailed; fails the next `fail` submissions as a server that
/// is down would.
#[derive(Clone, Default)]
pub struct FakeBackend {
    pub sent: Arc<Mutex<Vec<AampMessage>>>,
    pub fail: Arc<AtomicUsize>,
    pub changed: Arc<tokio::sync::Notify>,
    /// Attachments are served (each once the gate is open) instead of refused.
    pub downloads: Option<Downloads>,
    /// This bridge is one of several replicas (`replica` in its mailbox), and every claim it
    /// makes is lost to replica r9 once the gate is open.
    pub claims: Option<Claims>,
    /// This bridge is one of several replicas, and wins every claim it makes.
    pub wins: bool,
    /// With `wins`: this many claims are refused first for the credentials (a password
    /// being rotated).
    pub refuse_claims: Arc<AtomicUsize>,
    /// With `wins`: this many done marks fail first as if the server were down; every mark
    /// asked for is counted in `done_marks`.
    pub fail_done: Arc<AtomicUsize>,
    pub done_marks: Arc<AtomicUsize>,
}

/// Claims held at a gate, counted: made, dropped before the gate opened (the caller gave up
/// waiting), and answered (lost).
#[derive(Clone)]
pub struct Claims {
    pub open: tokio::sync::watch::Sender<bool>,
    pub made: Arc<AtomicUsize>,
    pub dropped: Arc<AtomicUsize>,
    pub lost: Arc<AtomicUsize>,
}

impl Claims {
    pub fn new() -> Claims {
        Claims {
            open: tokio::sync::watch::channel(false).0,
            made: Arc::default(),
            dropped: Arc::default(),
            lost: Arc::default(),
        }
    }
}

/// Counts a claim dropped while it waited at the gate.
struct Waiting<'a> {
    claims: &'a Claims,
    changed: &'a tokio::sync::Notify,
    done: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.claims.dropped.fetch_add(1, Ordering::SeqCst);
            self.changed.notify_waiters();
        }
    }
}

/// Attachment downloads held at a gate, counted.
#[derive(Clone)]
pub struct Downloads {
    pub open: tokio::sync::watch::Sender<bool>,
    pub in_flight: Arc<AtomicUsize>,
    pub most_at_once: Arc<AtomicUsize>,
    pub done: Arc<AtomicUsize>,
}

/// Takes one from a count of failures still to give; false once none is left.
fn take_one(count: &AtomicUsize) -> bool {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait::async_trait]
impl Backend for FakeBackend {
    async fn submit(&self, mail: &RenderedMail) -> Result<(), BackendError> {
        if take_one(&self.fail) {
            return Err(BackendError::new(
                ErrorClass::Transient,
                "connection refused",
            ));
        }
        let view = protocol::rfc5322::parse_raw(&mail.bytes).expect("a mail the parser reads");
        let msg = AampMessage::parse(&view).expect("an AAMP mail");
        self.sent.lock().unwrap().push(msg);
        self.changed.notify_waiters();
        Ok(())
    }

    async fn download(&self, a: &Attachment, _: u64) -> Result<Vec<u8>, BackendError> {
        let Some(d) = &self.downloads else {
            return Err(BackendError::new(
                ErrorClass::Permanent,
                "no attachments here",
            ));
        };
        let now = d.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        d.most_at_once.fetch_max(now, Ordering::SeqCst);
        let mut open = d.open.subscribe();
        let _ = open.wait_for(|o| *o).await;
        d.in_flight.fetch_sub(1, Ordering::SeqCst);
        d.done.fetch_add(1, Ordering::SeqCst);
        Ok(a.name.as_bytes().to_vec())
    }

    async fn open_stream(&self, _: &str, _: &str) -> Option<String> {
        None
    }

    async fn pump_stream(
        &self,
        _: &str,
        mut events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> usize {
        while events.recv().await.is_some() {}
        0
    }

    async fn thread(&self, _: &str) -> Vec<Earlier> {
        Vec::new()
    }

    async fn close_stream(&self, _: &str, _: serde_json::Value) {}

    async fn claim_done(&self, _: &str) -> Result<(), BackendError> {
        self.done_marks.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        if take_one(&self.fail_done) {
            return Err(BackendError::new(
                ErrorClass::Transient,
                "the mail server cannot be reached",
            ));
        }
        Ok(())
    }

    async fn claim(&self, _: &str) -> Result<ClaimOutcome, BackendError> {
        if self.wins {
            if take_one(&self.refuse_claims) {
                return Err(BackendError::new(
                    ErrorClass::Auth,
                    "the mail server refused the credentials",
                ));
            }
            return Ok(ClaimOutcome::Won);
        }
        let Some(claims) = &self.claims else {
            return Ok(ClaimOutcome::Won);
        };
        claims.made.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        let mut waiting = Waiting {
            claims,
            changed: &self.changed,
            done: false,
        };
        let mut open = claims.open.subscribe();
        let _ = open.wait_for(|o| *o).await;
        waiting.done = true;
        claims.lost.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        Ok(ClaimOutcome::Lost {
            by: Some("r9".into()),
        })
    }
}

impl FakeBackend {
    pub fn sent(&self) -> Vec<AampMessage> {
        self.sent.lock().unwrap().clone()
    }

    /// The intents mailed for `task_id`, in order.
    pub fn intents(&self, task_id: &str) -> Vec<Intent> {
        self.sent()
            .iter()
            .filter(|m| m.task_id() == task_id)
            .map(|m| m.intent())
            .collect()
    }

    /// Waits until `cond` holds over what was sent. The limit is a minute of real time,
    /// kept by a thread of its own: a timer of the runtime would fire at once under paused
    /// time, while an agent process (real I/O) is still exiting.
    pub async fn until(
        &self,
        what: &str,
        cond: impl Fn(&[AampMessage]) -> bool,
    ) -> Vec<AampMessage> {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watchdog = {
            let (done, what, sent) = (done.clone(), what.to_string(), self.sent.clone());
            std::thread::spawn(move || {
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                while std::time::Instant::now() < deadline {
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::park_timeout(Duration::from_millis(50));
                }
                eprintln!(
                    "{what}: not sent within a minute; sent: {:?}",
                    sent.lock().unwrap()
                );
                std::process::abort();
            })
        };
        let sent = loop {
            let changed = self.changed.notified();
            let sent = self.sent();
            if cond(&sent) {
                break sent;
            }
            changed.await;
        };
        done.store(true, Ordering::SeqCst);
        watchdog.thread().unpark();
        sent
    }

    pub async fn result(&self, task_id: &str) -> aamp_bridge::protocol::TaskResult {
        let sent = self
            .until("the result", |s| {
                s.iter()
                    .any(|m| m.task_id() == task_id && m.intent() == Intent::TaskResult)
            })
            .await;
        let msg = sent
            .iter()
            .find(|m| m.task_id() == task_id && m.intent() == Intent::TaskResult)
            .unwrap();
        match &msg.body {
            Body::Result(r) => r.clone(),
            other => panic!("{other:?}"),
        }
    }
}
