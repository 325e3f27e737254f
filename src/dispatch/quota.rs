//! An agent at its provider's usage limit (issue 45): its tasks parked, not failed. A run that
//! ends in [`RunError::UsageLimit`](crate::runner::RunError::UsageLimit) closes the agent's
//! gate until the limit resets (plus a little jitter; a limit that did not say when is probed
//! on the one retry schedule, [`crate::backoff`]). Every task of the agent waits at the gate
//! before it takes a slot (so the bridge's slots stay free for other agents), the parked ones
//! first, then by arrival; once it opens they go one at a time, each when the one before ran
//! past its first model call or finished: never a burst into the same wall.
//!
//! The wait and the parked tasks are journaled (`journal/quota.rs`), so a restart or a
//! kill -9 finds them and keeps waiting. Timers are tokio's (a paused clock in tests): no
//! polling, one sleep to the time the gate opens.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::journal::QuotaWait;
use super::{Common, Journal, Outbox, Task};
use crate::backend::Backend;
use crate::backoff::{jitter, Backoff};
use crate::protocol::Body;

/// Past a stated reset, the run starts after this much more (and up to a quarter more).
const AFTER_RESET: Duration = Duration::from_secs(2);
/// A limit that states no reset (or whose reset came and went) is tried again after this,
/// doubling, up to [`PROBE_CAP`].
const PROBE_BASE: Duration = Duration::from_secs(10);
const PROBE_CAP: Duration = Duration::from_secs(30 * 60);

/// One agent's gate.
pub(super) struct Quota {
    agent: String,
    journal: Arc<Journal>,
    state: Mutex<State>,
    changed: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    /// The limit the agent is at, and when the gate opens.
    wait: Option<(QuotaWait, Instant)>,
    /// Tasks at the gate, in the order they go.
    queue: Vec<i64>,
    /// The parked tasks' rows, in the order they were parked (they go first).
    parked: Vec<i64>,
    /// The task let through last, until it ran past its first model call or finished.
    passing: Option<i64>,
}

/// What a task waiting at the gate is told: the agent's words and when it runs.
#[derive(Clone, Debug)]
pub(super) struct Waiting {
    pub said: String,
    /// The reset the agent stated.
    pub resets: Option<SystemTime>,
    /// When the gate opens (the reset plus jitter, or the next probe).
    pub opens: SystemTime,
}

/// When a wait's gate opens, from now.
fn opens_after(wait: &QuotaWait) -> Duration {
    let probe = Backoff::new(PROBE_BASE, PROBE_CAP);
    match wait.resets {
        Some(at) => {
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            // Found at the limit again after its stated reset: the reset was early (a time
            // read to the minute), so the next try is a probe's time away at least.
            let floor = match wait.tries {
                0 => Duration::ZERO,
                n => probe.delay_for(n - 1),
            };
            left.max(floor) + jitter(AFTER_RESET)
        }
        None => probe.delay_for(wait.tries),
    }
}

impl State {
    fn sort(&mut self) {
        let parked = self.parked.clone();
        let place = |row: &i64| {
            (
                parked.iter().position(|p| p == row).unwrap_or(usize::MAX),
                *row,
            )
        };
        self.queue.sort_by_key(place);
    }

    fn can_pass(&self, row: i64, now: Instant) -> bool {
        self.passing.is_none()
            && self.queue.first() == Some(&row)
            && self.wait.as_ref().is_none_or(|(_, opens)| *opens <= now)
    }
}

impl Quota {
    /// `agent`'s gate as the journal left it (a wait and its parked tasks survive restarts).
    pub(super) fn new(agent: &str, journal: Arc<Journal>) -> Quota {
        let wait = journal.quota_wait(agent).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "could not read the agent's usage-limit wait");
            None
        });
        let parked = journal.quota_parked(agent).unwrap_or_default();
        let wait = wait.map(|w| {
            let opens = Instant::now() + opens_after(&w);
            (w, opens)
        });
        Quota {
            agent: agent.to_string(),
            journal,
            state: Mutex::new(State {
                wait,
                parked,
                ..State::default()
            }),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The task at `row` comes to the gate: `None` when it goes on at once (no limit, nobody
    /// waiting), else it joins the queue and what it waits for is returned.
    pub(super) fn enter(&self, row: i64) -> Option<Waiting> {
        let mut state = self.state();
        let parked = state.parked.contains(&row);
        if state.wait.is_none() && state.queue.is_empty() && state.passing.is_none() && !parked {
            return None;
        }
        if !state.queue.contains(&row) {
            state.queue.push(row);
            state.sort();
        }
        Some(self.waiting(&state))
    }

    fn waiting(&self, state: &State) -> Waiting {
        let now = (Instant::now(), SystemTime::now());
        match &state.wait {
            Some((wait, opens)) => Waiting {
                said: wait.said.clone(),
                resets: wait.resets,
                opens: now.1 + opens.saturating_duration_since(now.0),
            },
            None => Waiting {
                said: "earlier tasks go first, one at a time".into(),
                resets: None,
                opens: now.1,
            },
        }
    }

    /// Waits until the task at `row` (which [`Quota::enter`]ed) may go: `false` when it was
    /// cancelled first (it then leaves the queue).
    pub(super) async fn pass(&self, row: i64, cancel: &CancellationToken) -> bool {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let opens = {
                let mut state = self.state();
                if state.can_pass(row, Instant::now()) {
                    state.queue.retain(|r| *r != row);
                    state.passing = Some(row);
                    return true;
                }
                // A gate already open (the task waits for the one before it) is waited on
                // for its change only: no timer that fires at once, again and again.
                let now = Instant::now();
                state
                    .wait
                    .as_ref()
                    .map(|(_, opens)| *opens)
                    .filter(|at| *at > now)
            };
            let timer = async {
                match opens {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = changed => {}
                () = timer => {}
                () = cancel.cancelled() => {
                    self.left(row);
                    return false;
                }
            }
        }
    }

    /// The task at `row` made its first model call (its first stream event): the limit is
    /// over, and the next task may go.
    pub(super) fn ran(&self, row: i64) {
        let mut state = self.state();
        if state.passing != Some(row) {
            return;
        }
        state.passing = None;
        self.over(&mut state, row);
    }

    /// The task at `row` finished (or left) without meeting the limit.
    pub(super) fn left(&self, row: i64) {
        let mut state = self.state();
        state.queue.retain(|r| *r != row);
        if state.passing == Some(row) {
            state.passing = None;
            self.over(&mut state, row);
        } else if state.parked.contains(&row) {
            state.parked.retain(|r| *r != row);
            let _ = self.journal.quota_unpark(row);
            self.changed.notify_waiters();
        }
    }

    fn over(&self, state: &mut State, row: i64) {
        if state.wait.take().is_some() {
            tracing::info!(agent = %self.agent, "the agent's usage limit is over; its tasks go on one at a time");
            if let Err(e) = self.journal.quota_over(&self.agent) {
                tracing::warn!(error = %e, "could not journal that the usage limit is over");
            }
        }
        state.parked.retain(|r| *r != row);
        let _ = self.journal.quota_unpark(row);
        self.changed.notify_waiters();
    }

    /// The task at `row` met the agent's usage limit: it is parked (journaled) and the gate
    /// closes until the limit resets. Returns what it waits for, and whether it was parked
    /// for the first time (its dispatcher is told once).
    pub(super) fn hit(&self, row: i64, said: &str, resets: Option<SystemTime>) -> (Waiting, bool) {
        let mut state = self.state();
        let (tries, since) = match &state.wait {
            Some((w, _)) => (w.tries.saturating_add(1), w.since),
            None => (0, SystemTime::now()),
        };
        let wait = QuotaWait {
            said: said.to_string(),
            resets,
            tries,
            since,
        };
        let opens = Instant::now() + opens_after(&wait);
        let first = self
            .journal
            .quota_park(&self.agent, &wait, row)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not journal the parked task");
                false
            });
        state.wait = Some((wait, opens));
        if state.passing == Some(row) {
            state.passing = None;
        }
        if !state.parked.contains(&row) {
            state.parked.push(row);
        }
        self.changed.notify_waiters();
        (self.waiting(&state), first)
    }

    /// Whether the task at `row` is told it waits (once per task, across restarts).
    pub(super) fn first_told(&self, row: i64) -> bool {
        self.journal.quota_told(&self.agent, row).unwrap_or(false)
    }
}

/// Tells the task's dispatcher, once, that it waits for the agent's usage limit to reset:
/// a live stream of one `status` event (when the mailbox has an AAMP service), announced by
/// `task.stream.opened` and closed at once with the same reason; never an ack or a result
/// (docs/protocol.md).
pub(super) async fn tell<B: Backend>(
    common: &Common<B>,
    outbox: &Outbox<B>,
    task: &Task,
    waiting: &Waiting,
) {
    let env = &task.env;
    let until = waiting.resets.map(crate::protocol::time::format_utc_ms);
    let opens = crate::protocol::time::format_utc_ms(waiting.opens);
    let text = match &until {
        Some(t) => format!("waiting for the agent's usage limit to reset at {t}; the task runs then ({})", waiting.said),
        None => format!("waiting for the agent's usage limit (it did not say when it resets; tried again from {opens}) ({})", waiting.said),
    };
    common.note(task.row, "waiting for quota", Some(&text));
    tracing::info!(until = ?until, "{text}");
    let Some(stream_id) = common.backend.open_stream(&env.task_id, &env.from).await else {
        return;
    };
    let opened = Body::StreamOpened {
        stream_id: stream_id.clone(),
    };
    let opened = outbox.compose(env, &task.key, opened, 0);
    if let Err(e) = outbox.enqueue(task, &opened) {
        tracing::warn!(error = %e, "could not queue task.stream.opened");
    }
    let payload = json!({"state": "waiting_for_quota", "until": until, "retryAt": opens,
                         "said": waiting.said, "text": text});
    let (feed, fed) = tokio::sync::mpsc::channel(1);
    let _ = feed.send(("status", payload.clone())).await;
    drop(feed);
    common.backend.pump_stream(&stream_id, fed).await;
    let mut reason = payload;
    reason["reason"] = "waiting_for_quota".into();
    common.backend.close_stream(&stream_id, reason).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A journal with tasks at rows 1..=9 of agent "a".
    fn journal() -> (Arc<Journal>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::open(&dir.path().join("j.db")).unwrap());
        for n in 1..=9 {
            let (key, id) = (format!("m{n}"), format!("t{n}"));
            let task = super::super::journal::NewTask {
                agent: "a",
                message_key: &key,
                sender: "boss@x",
                task_id: &id,
                session_key: None,
                state: super::super::TaskState::Received,
                admitted: true,
                mail: "{}",
                reason: None,
                chain: None,
            };
            assert_eq!(journal.record(&task, None).unwrap(), Some(n));
        }
        (journal, dir)
    }

    fn gate() -> (Quota, tempfile::TempDir) {
        let (journal, dir) = journal();
        (Quota::new("a", journal), dir)
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_gate_costs_nothing_and_a_limit_holds_every_task_until_its_reset() {
        let (quota, _dir) = gate();
        assert!(quota.enter(1).is_none(), "no limit: at once");
        let reset = SystemTime::now() + Duration::from_secs(3600);
        let (waiting, first) = quota.hit(1, "You've hit your session limit", Some(reset));
        assert!(first);
        assert_eq!(waiting.resets, Some(reset));
        assert!(quota.enter(2).is_some() && quota.enter(1).is_some());
        let cancel = CancellationToken::new();
        let started = Instant::now();
        assert!(quota.pass(1, &cancel).await, "the parked task goes first");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(3600) && waited <= Duration::from_secs(3603),
            "{waited:?}"
        );
        // The next waits for the first to run past its first model call.
        let second = quota.pass(2, &cancel);
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(Duration::from_secs(600), second.as_mut())
                .await
                .is_err()
        );
        quota.ran(1);
        assert!(second.await);
        quota.left(2);
        assert!(quota.enter(3).is_none(), "over: at once again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_limit_without_a_reset_is_probed_with_backoff_and_survives_a_restart() {
        let (journal, _dir) = journal();
        let quota = Quota::new("a", journal.clone());
        let cancel = CancellationToken::new();
        quota.hit(7, "You have exhausted your daily quota", None);
        quota.enter(7);
        let started = Instant::now();
        assert!(quota.pass(7, &cancel).await);
        let first = started.elapsed();
        assert!(
            first >= PROBE_BASE && first <= PROBE_BASE.mul_f64(1.25),
            "{first:?}"
        );
        let (_, again) = quota.hit(7, "You have exhausted your daily quota", None);
        assert!(!again, "told once");
        // A restart: the journal's wait, the parked task first.
        let quota = Quota::new("a", journal.clone());
        assert!(quota.enter(3).is_some());
        assert!(quota.enter(7).is_some());
        let started = Instant::now();
        assert!(quota.pass(7, &cancel).await, "the parked one first");
        assert!(
            started.elapsed() >= PROBE_BASE * 2,
            "the second probe waits twice as long"
        );
        quota.left(7);
        assert!(quota.pass(3, &cancel).await);
        quota.ran(3);
        assert_eq!(journal.quota_wait("a").unwrap(), None);
        assert!(journal.quota_parked("a").unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let (quota, _dir) = gate();
        quota.hit(
            1,
            "limit",
            Some(SystemTime::now() + Duration::from_secs(60)),
        );
        quota.enter(1);
        quota.enter(2);
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(!quota.pass(1, &cancel).await);
        assert!(
            quota.pass(2, &CancellationToken::new()).await,
            "2 goes once 1 left"
        );
    }
}
