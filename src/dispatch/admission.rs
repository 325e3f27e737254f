//! Whether a dispatch runs: sender policy, duplicates, the queue's bound and expiry, decided
//! before anything is acknowledged. Pure: the journal's answer comes in as `duplicate`.

use std::time::SystemTime;

use super::journal::TaskState;
use super::AgentSpec;
use crate::protocol::{Dispatch, Envelope};

/// What to do with a dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Run,
    /// A task with this sender and TaskId was let in before: do nothing.
    Duplicate,
    /// Answer with a rejected result saying `reason`, record the message in `state`, and do
    /// not run. The sender may dispatch again (after fixing what the reason says).
    Reject {
        reason: String,
        state: TaskState,
    },
}

/// The admission decision. `active` is the number of tasks running or waiting for a slot.
pub fn admit(
    spec: &AgentSpec,
    env: &Envelope,
    dispatch: &Dispatch,
    duplicate: bool,
    active: usize,
    now: SystemTime,
) -> Admission {
    if duplicate {
        return Admission::Duplicate;
    }
    if !spec.policy.allows(&env.from) {
        return Admission::Reject {
            reason: format!(
                "sender {} is not allowed to dispatch tasks to agent {}; the agent's owner can add it to allow_from",
                env.from, spec.name
            ),
            state: TaskState::Rejected,
        };
    }
    if active >= spec.max_queued {
        return Admission::Reject {
            reason: format!(
                "agent {} is busy with {active} tasks; dispatch again later",
                spec.name
            ),
            state: TaskState::Rejected,
        };
    }
    if let Some(expires) = &dispatch.expires_at {
        match crate::protocol::time::parse(expires) {
            Some(at) if at <= now => {
                return Admission::Reject {
                    reason: format!("the task expired at {expires} before it could start"),
                    state: TaskState::Expired,
                }
            }
            Some(_) => {}
            None => tracing::warn!(expires, "unreadable X-AAMP-Expires-At; ignoring it"),
        }
    }
    Admission::Run
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::SenderPolicy;
    use crate::protocol::Priority;
    use crate::runner::Profile;
    use std::path::PathBuf;

    fn spec() -> AgentSpec {
        AgentSpec {
            name: "coder".into(),
            email: "coder@x.test".into(),
            policy: SenderPolicy::new(&["*@x.test".into()]),
            max_concurrent: 1,
            max_queued: 2,
            profile: Profile::find("echo", &[]).unwrap(),
            workspace_root: PathBuf::from("/nonexistent"),
        }
    }

    fn env(from: &str) -> Envelope {
        Envelope {
            version: "1.1".into(),
            task_id: "t".into(),
            from: from.into(),
            to: vec!["coder@x.test".into()],
            message_id: "<m>".into(),
            subject: String::new(),
            in_reply_to: None,
            references: vec![],
            received_body: None,
        }
    }

    fn dispatch(expires: Option<&str>) -> Dispatch {
        Dispatch {
            title: "t".into(),
            priority: Priority::Normal,
            expires_at: expires.map(str::to_string),
            ..Dispatch::default()
        }
    }

    #[test]
    fn admission_checks_duplicates_policy_the_queue_and_expiry() {
        let spec = spec();
        let now = SystemTime::now();
        let ok = env("a@x.test");
        assert_eq!(
            admit(&spec, &ok, &dispatch(None), false, 0, now),
            Admission::Run
        );
        assert_eq!(
            admit(&spec, &ok, &dispatch(None), true, 0, now),
            Admission::Duplicate
        );
        let refused = admit(&spec, &env("a@evil.test"), &dispatch(None), false, 0, now);
        assert!(
            matches!(&refused, Admission::Reject { reason, state: TaskState::Rejected } if reason.contains("a@evil.test") && reason.contains("allow_from")),
            "{refused:?}"
        );
        let busy = admit(&spec, &ok, &dispatch(None), false, 2, now);
        assert!(matches!(&busy, Admission::Reject { reason, .. } if reason.contains("busy")));
        let expired = admit(
            &spec,
            &ok,
            &dispatch(Some("2020-01-01T00:00:00Z")),
            false,
            0,
            now,
        );
        assert!(matches!(
            &expired,
            Admission::Reject {
                state: TaskState::Expired,
                ..
            }
        ));
        assert_eq!(
            admit(
                &spec,
                &ok,
                &dispatch(Some("2999-01-01T00:00:00Z")),
                false,
                0,
                now
            ),
            Admission::Run
        );
    }
}
