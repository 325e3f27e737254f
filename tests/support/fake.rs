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
    /// This bridge is replica `name` among several on one [`Board`] of claims, which its
    /// claims, renewals and done marks read and change as the mail server's keywords would.
    pub replica: Option<OnBoard>,
}

/// The claims on one mailbox's mails as the mail server keeps them, shared by the fake
/// back-ends of several replicas: who holds each mail's claim, whether its lease ran out (the
/// test says when: no clock), and whether it was answered.
#[derive(Clone, Default)]
pub struct Board(Arc<Mutex<std::collections::HashMap<String, Held>>>);

/// One mail's claim on a [`Board`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub by: String,
    pub live: bool,
    pub done: bool,
}

impl Board {
    pub fn held(&self, email_id: &str) -> Option<Held> {
        self.0.lock().unwrap().get(email_id).cloned()
    }

    /// The claim's lease ran out (its holder did not renew it in time).
    pub fn expire(&self, email_id: &str) {
        if let Some(h) = self.0.lock().unwrap().get_mut(email_id) {
            h.live = false;
        }
    }
}

/// A replica's place on a [`Board`]: its name, and its renewals, which wait while `renewing`
/// is false (a replica starved of CPU, its renewals late), counted once they reach the board.
#[derive(Clone)]
pub struct OnBoard {
    pub board: Board,
    pub name: String,
    pub renewing: tokio::sync::watch::Sender<bool>,
    pub renewals: Arc<AtomicUsize>,
    pub claims: Arc<AtomicUsize>,
}

impl OnBoard {
    pub fn new(board: &Board, name: &str) -> OnBoard {
        OnBoard {
            board: board.clone(),
            name: name.to_string(),
            renewing: tokio::sync::watch::channel(true).0,
            renewals: Arc::default(),
            claims: Arc::default(),
        }
    }

    /// As [`aamp_bridge::mailbox::aamp::claims::claim`] decides.
    fn claim(&self, email_id: &str) -> ClaimOutcome {
        self.claims.fetch_add(1, Ordering::SeqCst);
        let mut all = self.board.0.lock().unwrap();
        let me = self.name.clone();
        let held = all.entry(email_id.to_string()).or_insert(Held {
            by: me.clone(),
            live: false,
            done: false,
        });
        if held.done || (held.live && held.by != me) {
            return ClaimOutcome::Lost {
                by: Some(held.by.clone()),
            };
        }
        let from = std::mem::replace(&mut held.by, me.clone());
        held.live = true;
        match from == me {
            true => ClaimOutcome::Won,
            false => ClaimOutcome::TakenOver { from },
        }
    }

    /// As [`aamp_bridge::mailbox::aamp::claims::renew`] decides, once renewals go through.
    async fn renew(&self, email_id: &str) -> bool {
        let _ = self.renewing.subscribe().wait_for(|on| *on).await;
        self.renewals.fetch_add(1, Ordering::SeqCst);
        let mut all = self.board.0.lock().unwrap();
        match all.get_mut(email_id) {
            Some(h) if h.by == self.name && !h.done => {
                h.live = true;
                true
            }
            _ => false,
        }
    }

    /// As [`aamp_bridge::mailbox::aamp::claims::finish`] decides: marked only while this
    /// replica holds the claim.
    fn done(&self, email_id: &str) -> bool {
        let mut all = self.board.0.lock().unwrap();
        match all.get_mut(email_id) {
            Some(h) if h.by != self.name => false,
            Some(h) => {
                h.done = true;
                true
            }
            None => true,
        }
    }
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

    async fn claim_done(&self, email_id: &str) -> Result<bool, BackendError> {
        self.done_marks.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        if take_one(&self.fail_done) {
            return Err(BackendError::new(
                ErrorClass::Transient,
                "the mail server cannot be reached",
            ));
        }
        Ok(self.replica.as_ref().is_none_or(|r| r.done(email_id)))
    }

    async fn renew_claim(&self, email_id: &str) -> Result<bool, BackendError> {
        let Some(replica) = &self.replica else {
            return Ok(true);
        };
        let renewed = replica.renew(email_id).await;
        self.changed.notify_waiters();
        Ok(renewed)
    }

    async fn claim(&self, email_id: &str) -> Result<ClaimOutcome, BackendError> {
        if let Some(replica) = &self.replica {
            let outcome = replica.claim(email_id);
            self.changed.notify_waiters();
            return Ok(outcome);
        }
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
