//! The runs: the tasks admitted and not finished, one task at a time per conversation, the
//! conversation folders in use; a task's start (its place in the slot queue) and its leaving.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::workspace::{Holding, InUse, Workspace};
use super::{session_scope, slots, task_key, Backend, Engine, Task};

/// The runs' state.
#[derive(Default)]
pub(super) struct Runs {
    /// Tasks admitted and not finished (running or waiting for a slot), by sender + TaskId.
    running: Mutex<HashMap<String, CancellationToken>>,
    /// One task at a time per Session-Key: an agent session takes one prompt at a time.
    session_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Conversation folders a queued or running task uses: never pruned.
    conversations: InUse,
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

impl<O: Backend> Engine<O> {
    /// Starts the work on an admitted task.
    pub(super) fn start(&self, task: Task, span: tracing::Span) {
        let runs = &self.inner.runs;
        let cancel = self.inner.abort.child_token();
        runs.running
            .lock()
            .expect("running lock")
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
                    ticket: self.inner.settings.slots.enqueue(
                        &self.spec().name,
                        task.dispatch.priority,
                        arrival(&task),
                    ),
                },
            }
        };
        let this = self.clone();
        self.inner
            .tracker
            .spawn(this.lifecycle(task, place, cancel).instrument(span));
    }

    /// Tasks admitted and not finished.
    pub fn active(&self) -> usize {
        self.inner.runs.running.lock().expect("running lock").len()
    }

    /// Calls `f` with the cancel of the admitted task `key` while it cannot leave; `None`
    /// when no such task is admitted and not finished.
    pub(super) fn with_running<R>(
        &self,
        key: &str,
        f: impl FnOnce(&CancellationToken) -> R,
    ) -> Option<R> {
        self.inner
            .runs
            .running
            .lock()
            .expect("running lock")
            .get(key)
            .map(f)
    }

    /// Where the task runs: its conversation's folder when it has a Session-Key, else its own.
    pub(super) fn workspace_of(&self, task: &Task) -> Workspace {
        let scope = task
            .dispatch
            .session_key
            .as_deref()
            .map(|k| session_scope(&task.env.from, k));
        Workspace::of(
            &self.spec().workspace_root,
            &task.env.task_id,
            task.row,
            scope.as_deref(),
        )
    }

    /// Keeps the conversation's folder from being pruned while the guard lives.
    pub(super) fn hold_conversation(&self, workspace: &Workspace) -> Option<Holding> {
        self.inner.runs.conversations.hold(workspace)
    }

    /// The task is done with `workspace`: its own folder goes (a conversation's stays for its
    /// next turn).
    pub(super) fn finish_workspace(&self, workspace: &Workspace) {
        workspace.finish(&self.inner.runs.conversations);
    }

    /// The task is no longer here: its own folder goes (a conversation's stays for its next
    /// turn), and a cancel no longer finds it running.
    pub(super) fn leave(&self, task: &Task, workspace: &Workspace) {
        self.finish_workspace(workspace);
        self.inner
            .runs
            .running
            .lock()
            .expect("running lock")
            .remove(&task_key(&task.env.from, &task.env.task_id));
    }
}
