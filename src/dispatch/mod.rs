//! What happens to an AAMP message addressed to an agent. Every message is first recorded in
//! the [`journal`] (so it is never lost, and a second delivery of it is recognised); then
//! sender policy, duplicates, the queue's bound and expiry decide whether a dispatch runs
//! (pure, in [`admission`]); the task lifecycle waits for a slot, runs it through
//! `runner`, and records the answer; the outbox worker sends acks and results, retrying
//! until the mail server takes them. Cancels stop the matching task. Nothing here knows SMTP
//! or JMAP: answers leave as rendered bytes through the [`Backend`] seam.
//!
//! One agent's [`Engine`] keeps the task's path; its methods live with their job, one file
//! each, and its long-lived parts are types of their own, each holding its own state:
//!
//! - `route.rs`: each inbound message to its path (dispatch, reply, bounce, cancel, card);
//!   `pairing.rs`: `pair.request`; `recover.rs`: the journal's tasks picked up at start;
//! - `runs.rs`: the tasks admitted and not finished, one at a time per conversation, a
//!   task's start and its leaving;
//! - `lifecycle.rs`: the run's five named steps in order, with `attachments.rs` (the
//!   workspace made ready) and `run.rs` (the agent run, its stream, its answer read back);
//! - [`Claims`] (`claims.rs`): claims when several bridges serve a mailbox;
//! - [`Desk`] (`desk.rs`): the person-facing side, questions to the task's dispatcher and
//!   their answers ([`questions`]) and the live view's answers and cancels ([`operator`]);
//! - [`Outbox`] (`outbox.rs`, with `compose.rs`): the answers' mails, queued in the journal
//!   and sent by its worker, which the daemon runs;
//! - `quota.rs`: the agent's gate at its provider's usage limit: tasks parked (journaled),
//!   held until the reset, then let through one at a time.

pub mod admission;
mod attachments;
pub mod budget;
mod claims;
mod compose;
pub mod delegations;
mod desk;
pub mod journal;
mod lifecycle;
pub mod operator;
mod outbox;
mod pairing;
pub mod prompt;
pub mod questions;
mod quota;
mod recover;
pub mod results;
mod route;
mod run;
mod runs;
pub mod slots;
mod workspace;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::Backend;
pub use crate::config::policy::{self, CancelReply, SenderPolicy, UnknownSenders};
use crate::events::Events;
use crate::inbound::Attachment;
use crate::protocol::{Dispatch, Envelope};
use crate::runner::Profile;
pub use admission::{admit, Admission};
pub use claims::Claims;
pub use desk::Desk;
pub use journal::{Journal, JournalError, Outgoing, TaskState};
pub use outbox::Outbox;
pub use pairing::new_pair_code;
pub use questions::choose;

/// This bridge as one of several serving an agent's mailbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSpec {
    pub name: String,
    /// How long a claim holds unless renewed; it is renewed every third of it.
    pub lease: Duration,
}

/// An agent as dispatch sees it.
#[derive(Debug)]
pub struct AgentSpec {
    pub name: String,
    pub email: String,
    pub policy: SenderPolicy,
    pub max_concurrent: usize,
    /// Tasks running or waiting at most; more are rejected as busy.
    pub max_queued: usize,
    pub profile: Profile,
    /// Task workspaces are made below this folder.
    pub workspace_root: PathBuf,
    pub limits: admission::Limits,
    pub unknown_senders: UnknownSenders,
    pub cancel_reply: CancelReply,
    /// Answered to `card.query`: (summary, card text).
    pub card: Option<(String, String)>,
    /// Rejections sent to refused senders per hour at most.
    pub refusals_per_hour: u32,
    /// A dispatch passed on by agents this many times is not run (a loop between agents).
    pub max_hops: u32,
    /// The addresses this agent's tasks may delegate to (`delegate_to`).
    pub delegate_to: Vec<String>,
    /// Several bridges serve the mailbox: this one's name and the claims' lease. Each task is
    /// claimed on the mail server before it is acknowledged.
    pub replica: Option<ReplicaSpec>,
    /// Budgets in tokens and money (the agent's, its senders', each sender's everywhere), and
    /// the prices that cost a report without a stated cost.
    pub budgets: budget::Budgets,
}

/// How the engine lives with the rest of the bridge.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long an unsent ack or result is retried before the bridge gives up on it.
    pub retry_for: Duration,
    /// Carried by every agent process this bridge starts (and their children) as
    /// [`OWNER_VAR`], so leftovers of a crashed bridge are found at the next start.
    pub owner_tag: String,
    /// The bridge's one scheduler of slots (each agent's `max_concurrent_tasks`, and the
    /// top-level one for all agents together).
    pub slots: Arc<slots::Slots>,
    /// The running tasks' grants to the delegation tools, when the bridge serves them.
    pub delegation: Option<Arc<delegations::Registry>>,
}

/// The environment variable naming the bridge (its state directory) an agent belongs to.
pub const OWNER_VAR: &str = "AAMP_BRIDGE_OWNER";
/// The environment variable naming one run of one task.
pub const RUN_VAR: &str = "AAMP_BRIDGE_RUN";
/// The environment variable telling an agent how many hops its task has had;
/// `aamp-bridge dispatch` run by the agent sends one more.
pub const HOPS_VAR: &str = "AAMP_BRIDGE_HOPS";

/// One admitted task.
#[derive(Clone, Debug)]
struct Task {
    /// Its journal row.
    row: i64,
    /// The inbound message's key (Message-ID, or a stand-in).
    key: String,
    env: Envelope,
    dispatch: Dispatch,
    extras: MailExtras,
    /// Found in the journal at start, interrupted, and not to be run again (the profile
    /// says so, or it ran too often): with several bridges the answer waits for the claim.
    rerun_refused: Option<String>,
}

/// A conversation is one Session-Key of one sender: the same key from two senders is two
/// conversations (no sender can take over, or lock out, another's).
fn session_scope(sender: &str, key: &str) -> String {
    format!("{}\n{key}", sender.to_ascii_lowercase())
}

/// The conversation as the agent sees it (`{{session_key}}`, `AAMP_SESSION_KEY`): the
/// sender's Session-Key and a short tag of the sender, so an agent that keys its own sessions
/// by it keeps two senders' conversations apart too.
fn conversation_key(sender: &str, key: &str) -> String {
    let tag = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        sender.to_ascii_lowercase().as_bytes(),
    );
    format!("{key}-{}", &tag.simple().to_string()[..8])
}

/// What a mail brings besides its AAMP message.
#[derive(Clone, Debug, Default)]
pub struct MailExtras {
    /// The mail's id on its server (what a claim names).
    pub email_id: String,
    /// The text body was cut at the fetch limit.
    pub truncated: bool,
    pub attachments: Vec<Attachment>,
}

/// What every part of one agent's dispatch shares: its spec, its back-end, the journal, the
/// events, the bridge's settings, and where (and until when) its tasks run.
struct Common<B> {
    /// Replaced whole on a reload (policy, profile, queue bound).
    spec: std::sync::RwLock<Arc<AgentSpec>>,
    backend: B,
    journal: Arc<Journal>,
    events: Events,
    settings: Settings,
    tracker: TaskTracker,
    /// Cancelled when the bridge stops its tasks: a task stopped this way is not answered;
    /// it stays in the journal and runs again at the next start.
    abort: CancellationToken,
}

impl<B> Common<B> {
    /// The agent as it is now.
    fn spec(&self) -> Arc<AgentSpec> {
        self.spec.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notes a step in the task's timeline (a failure to note is only logged).
    fn note(&self, row: i64, what: &str, detail: Option<&str>) {
        if let Err(e) = self.journal.note(row, what, detail) {
            tracing::debug!(error = %e, "could not note a step in the task's timeline");
        }
    }

    /// The task recorded at `row` under `key`, read back from its `mail` as the journal
    /// keeps it; `None` when it is no dispatch, or cannot be read back (it is then closed
    /// without an answer; `what` names it in the log).
    fn read_back(
        &self,
        row: i64,
        key: String,
        mail: &str,
        what: &str,
    ) -> Result<Option<Task>, JournalError> {
        let inbound = match crate::inbound::Inbound::from_json(mail) {
            Ok(inbound) => inbound,
            Err(e) => {
                tracing::error!(row, error = %e, "{what} cannot be read back; it is closed without an answer");
                let why = Some("could not be read back from the journal");
                let name = &self.spec().name;
                self.journal
                    .finish(name, row, TaskState::Rejected, why, None)?;
                return Ok(None);
            }
        };
        let crate::protocol::Body::Dispatch(dispatch) = inbound.message.body else {
            return Ok(None);
        };
        let extras = MailExtras {
            email_id: inbound.email_id,
            truncated: inbound.truncated,
            attachments: inbound.attachments,
        };
        let env = inbound.message.envelope;
        let rerun_refused = None;
        Ok(Some(Task {
            row,
            key,
            env,
            dispatch,
            extras,
            rerun_refused,
        }))
    }
}

/// One agent's task path: the bridge's engine. It routes each inbound message, runs the
/// admitted tasks through their lifecycle, and picks up the journal's tasks at start; the
/// [`Outbox`] sends what they answer, the [`Claims`] hold them among replicas, and the
/// [`Desk`] is where a person's answers and cancels come in. Cheap to clone.
pub struct Engine<B> {
    common: Arc<Common<B>>,
    outbox: Outbox<B>,
    claims: Claims<B>,
    desk: Desk<B>,
    /// Tasks admitted and not finished, their conversations' locks and folders ([`runs`]).
    runs: Arc<runs::Runs>,
    /// The agent's gate at its provider's usage limit ([`quota`]).
    quota: Arc<quota::Quota>,
}

impl<B> Clone for Engine<B> {
    fn clone(&self) -> Self {
        Engine {
            common: self.common.clone(),
            outbox: self.outbox.clone(),
            claims: self.claims.clone(),
            desk: self.desk.clone(),
            runs: self.runs.clone(),
            quota: self.quota.clone(),
        }
    }
}

fn task_key(from: &str, task_id: &str) -> String {
    format!("{}\n{}", from.to_ascii_lowercase(), task_id)
}

impl<B: Backend> Engine<B> {
    /// Tasks are spawned on `tracker`; `abort` stops them without an answer.
    pub fn new(
        spec: AgentSpec,
        backend: B,
        journal: Arc<Journal>,
        events: Events,
        settings: Settings,
        tracker: TaskTracker,
        abort: CancellationToken,
    ) -> Self {
        settings.slots.add_agent(&spec.name, spec.max_concurrent);
        let quota = Arc::new(quota::Quota::new(&spec.name, journal.clone()));
        let common = Arc::new(Common {
            spec: std::sync::RwLock::new(Arc::new(spec)),
            backend,
            journal,
            events,
            settings,
            tracker,
            abort,
        });
        let outbox = Outbox::new(common.clone());
        let runs = Arc::new(runs::Runs::default());
        Engine {
            claims: Claims::new(common.clone(), outbox.clone()),
            desk: Desk::new(common.clone(), outbox.clone(), runs.running.clone()),
            outbox,
            runs,
            common,
            quota,
        }
    }

    /// The agent's back-end (its mailbox's sender).
    pub fn backend(&self) -> &B {
        &self.common.backend
    }

    /// The outbox that sends this agent's answers (the daemon runs its worker).
    pub fn outbox(&self) -> &Outbox<B> {
        &self.outbox
    }

    /// Where the live view answers the agent's questions and cancels its tasks.
    pub fn desk(&self) -> &Desk<B> {
        &self.desk
    }

    pub fn name(&self) -> String {
        self.common.spec().name.clone()
    }

    /// Takes a reloaded config for this agent: its sender policy, profile and queue bound
    /// apply to tasks admitted from now on; tasks under way keep what they started with.
    /// The agent's name, address and concurrency stay as they were: what of the new config
    /// waits for a restart is returned, so the person who reloaded hears it.
    pub fn reload(&self, new: AgentSpec) -> Option<&'static str> {
        let old = self.common.spec();
        let waits = (new.email != old.email || new.max_concurrent != old.max_concurrent)
            .then_some("its mailbox address and max_concurrent_tasks change at the next restart, not at a reload");
        if let Some(waits) = waits {
            tracing::warn!(agent = %old.name, "{waits}");
        }
        let spec = AgentSpec {
            name: old.name.clone(),
            email: old.email.clone(),
            max_concurrent: old.max_concurrent,
            workspace_root: old.workspace_root.clone(),
            ..new
        };
        *self.common.spec.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(spec);
        tracing::info!(agent = %old.name, "config reloaded");
        waits
    }
}
