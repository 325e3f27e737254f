//! What the journal holds from the bridge's last life, picked up at start.

use serde_json::json;

use super::journal::{JournalError, TaskState};
use super::Engine;
use crate::backend::Backend;

/// Runs at most this many times for one task; after that a crash answers it rejected.
const MAX_RUNS: u32 = 2;

impl<B: Backend> Engine<B> {
    /// Picks up what the journal holds from the bridge's last life: tasks not yet run are
    /// queued again; tasks that were running are run again (workspace emptied first) when
    /// the profile allows it and they have not been run `MAX_RUNS` times, and otherwise
    /// answered rejected. Returns how many tasks were picked up.
    pub fn recover(&self) -> Result<usize, JournalError> {
        let inner = &self.common;
        let spec = self.common.spec();
        let name = &spec.name;
        let unfinished = inner.journal.unfinished(name)?;
        for left in &unfinished {
            // The key it was recorded under: its answers' Message-IDs are derived from it, so
            // an ack made again (a replica's claim won again) is the same mail as before.
            let key = left.message_key.clone();
            let what = "a task in the journal";
            let Some(mut task) = inner.read_back(left.id, key, &left.mail, what)? else {
                continue;
            };
            let (env, key) = (&task.env, &task.key);
            let span = tracing::info_span!("task", agent = %name, task_id = %env.task_id, message_id = %key, email_id = %task.extras.email_id);
            let _enter = span.enter();
            let interrupted = matches!(left.state, TaskState::Running | TaskState::HelpNeeded);
            let mut rerun_refused = None;
            if interrupted && (!spec.profile.rerun_interrupted || left.runs >= MAX_RUNS) {
                let reason = if spec.profile.rerun_interrupted {
                    format!("interrupted by a bridge restart {} times; not run again; dispatch it again", left.runs)
                } else {
                    "interrupted by a bridge restart; this agent's tasks are not run twice; dispatch it again".to_string()
                };
                tracing::warn!(runs = left.runs, "{reason}");
                if spec.replica.is_some() {
                    // Another bridge may hold the task by now: it is answered only once this
                    // one has claimed it.
                    rerun_refused = Some(reason);
                } else {
                    let reply = self.outbox.spent_rejection(left.id, env, key, &reason);
                    inner.journal.finish(
                        name,
                        left.id,
                        TaskState::Rejected,
                        Some(&reason),
                        Some(&reply),
                    )?;
                    inner.events.emit(crate::events::Event::TaskCompleted, json!({"agent": name, "taskId": env.task_id, "status": "rejected", "error": reason, "recovered": true}));
                    continue;
                }
            }
            tracing::info!(
                state = left.state.as_str(),
                runs = left.runs,
                "picking up a task from the journal"
            );
            self.common.note(
                left.id,
                "picked up at a restart",
                Some(&format!(
                    "was {} after {} run(s)",
                    left.state.as_str(),
                    left.runs
                )),
            );
            inner.events.emit(crate::events::Event::TaskRecovered, json!({"agent": name, "taskId": env.task_id, "state": left.state.as_str(), "runs": left.runs}));
            task.rerun_refused = rerun_refused;
            self.start(task, span.clone());
        }
        self.outbox.wake();
        Ok(unfinished.len())
    }
}
