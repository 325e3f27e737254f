//! The runs: the tasks admitted and not finished, one task at a time per conversation, the
//! conversation folders in use; a task's start (its place in the slot queue) and its leaving.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::workspace::{InUse, Workspace};
use super::{session_scope, slots, task_key, Backend, Engine, Task};

/// The runs' state.
#[derive(Default)]
pub(super) struct Runs {
    /// Tasks admitted and not finished (running or waiting for a slot).
    pub(super) running: Running,
    /// One task at a time per Session-Key: an agent session takes one prompt at a time.
    session_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Conversation folders a queued or running task uses: never pruned.
    pub(super) conversations: InUse,
}

/// The tasks admitted and not finished (running or waiting for a slot), by sender + TaskId,
/// with their cancels: what a `task.cancel` or the operator stops. Cheap to clone.
#[derive(Clone, Default)]
pub(super) struct Running(Arc<Mutex<HashMap<String, CancellationToken>>>);

impl Running {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls `f` with the cancel of the admitted task `key` while it cannot leave; `None`
    /// when no such task is admitted and not finished.
    pub(super) fn with<R>(&self, key: &str, f: impl FnOnce(&CancellationToken) -> R) -> Option<R> {
        self.map().get(key).map(f)
    }

    fn len(&self) -> usize {
        self.map().len()
    }
}

/// Where an admitted task waits to run.
pub(super) enum Place {
    /// In the slot queue, its conversation's lock (if any) held.
    Queued {
        session: Option<tokio::sync::OwnedMutexGuard<()>>,
        ticket: slots::Ticket,
    },
    /// It joins the slot queue later: after its attachments are downloaded, and behind a
    /// running task of its conversation (the lock, if any).
    Later(Option<Arc<tokio::sync::Mutex<()>>>),
}

/// A task's arrival, for first-come order among equal priorities: its journal row.
pub(super) fn arrival(task: &Task) -> u64 {
    task.row.max(0) as u64
}

impl<B: Backend> Engine<B> {
    /// Starts the work on an admitted task.
    pub(super) fn start(&self, task: Task, span: tracing::Span) {
        let runs = &self.runs;
        let cancel = self.common.abort.child_token();
        runs.running
            .map()
            .insert(task_key(&task.env.from, &task.env.task_id), cancel.clone());
        // The task's place in the slot queue is taken now, in delivery order, unless it must
        // first wait for an earlier task of its conversation or download its attachments.
        let session_lock = task.dispatch.session_key.as_ref().map(|key| {
            let scope = session_scope(&task.env.from, key);
            let mut locks = runs.session_locks.lock().expect("session locks");
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            locks.entry(scope).or_default().clone()
        });
        // A task with attachments joins after downloading them, so it never holds a slot
        // while it waits for them.
        let place = if !task.extras.attachments.is_empty() {
            Place::Later(session_lock)
        } else {
            match session_lock.map(|lock| lock.clone().try_lock_owned().map_err(|_| lock)) {
                Some(Err(lock)) => Place::Later(Some(lock)),
                session => Place::Queued {
                    session: session.map(|s| s.expect("the Err case is above")),
                    ticket: self.common.settings.slots.enqueue(
                        &self.common.spec().name,
                        task.dispatch.priority,
                        arrival(&task),
                    ),
                },
            }
        };
        let this = self.clone();
        self.common
            .tracker
            .spawn(this.lifecycle(task, place, cancel).instrument(span));
    }

    /// Tasks admitted and not finished.
    pub fn active(&self) -> usize {
        self.runs.running.len()
    }

    /// Where the task runs: its conversation's folder when it has a Session-Key, else its own.
    pub(super) fn workspace_of(&self, task: &Task) -> Workspace {
        let scope = task
            .dispatch
            .session_key
            .as_deref()
            .map(|k| session_scope(&task.env.from, k));
        Workspace::of(
            &self.common.spec().workspace_root,
            &task.env.task_id,
            task.row,
            scope.as_deref(),
        )
    }

    /// The task is done with `workspace`: its own folder goes (a conversation's stays for its
    /// next turn).
    pub(super) fn finish_workspace(&self, workspace: &Workspace) {
        workspace.finish(&self.runs.conversations);
    }

    /// The task is no longer here: its own folder goes (a conversation's stays for its next
    /// turn), and a cancel no longer finds it running.
    pub(super) fn leave(&self, task: &Task, workspace: &Workspace) {
        self.finish_workspace(workspace);
        self.runs
            .running
            .map()
            .remove(&task_key(&task.env.from, &task.env.task_id));
    }
}
