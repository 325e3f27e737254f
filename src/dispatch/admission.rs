//! Whether a dispatch runs: sender policy, duplicates, the queue's bound and expiry, decided
//! before anything is acknowledged. Pure: the journal's answer comes in as `duplicate`.

use std::time::SystemTime;

use super::journal::TaskState;
use super::policy::{SenderPolicy, Verdict};
use super::AgentSpec;
use crate::protocol::{Dispatch, Envelope};

/// What to do with a dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Run,
    /// A task with this sender and TaskId was let in before: do nothing.
    Duplicate,
    /// The sender policy refuses the sender: answered `rejected`, or not at all, by the agent's
    /// `unknown_senders` (and never more often than the refusal rate allows).
    Refuse {
        reason: String,
    },
    /// Answer with a rejected result saying `reason`, record the message in `state`, and do
    /// not run. The sender may dispatch again (after fixing what the reason says).
    Reject {
        reason: String,
        state: TaskState,
    },
}

/// What the journal and the queue say about this dispatch's sender and session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Tasks running or waiting for a slot.
    pub active: usize,
    /// Tasks admitted from this sender in the last hour.
    pub sender_last_hour: u32,
    /// Tasks admitted for this agent in the last 24 hours.
    pub agent_last_day: u32,
    /// Tasks admitted in this dispatch's conversation (its sender's Session-Key) so far.
    pub session_turns: u32,
    /// A cancel for this (sender, TaskId) came before the dispatch.
    pub cancelled_before: bool,
    /// What the agent and the sender spent in their budgets' current periods.
    pub spent: super::budget::Spent,
}

/// Limits on how much one sender, one session or the whole agent may ask (kept with the
/// journal, which counts against them).
pub use super::journal::Limits;

/// The admission decision, made before anything is acknowledged.
pub fn admit(
    spec: &AgentSpec,
    policy: &SenderPolicy,
    env: &Envelope,
    dispatch: &Dispatch,
    duplicate: bool,
    load: &Load,
    now: SystemTime,
) -> Admission {
    if duplicate {
        return Admission::Duplicate;
    }
    if let Verdict::Refused(why) = policy.check(&env.from, &dispatch.dispatch_context) {
        return Admission::Refuse {
            reason: format!(
                "Unauthorized sender policy: {why} to dispatch tasks to agent {}; the agent's owner can allow it (aamp-bridge policy allow, or pairing)",
                spec.name
            ),
        };
    }
    let reject = |reason: String| Admission::Reject {
        reason,
        state: TaskState::Rejected,
    };
    if let Some(hops) = dispatch.hop_count {
        if hops >= spec.max_hops {
            return reject(format!(
                "loop guard: this task was passed on between agents {hops} times (at most {}); it is not run",
                spec.max_hops
            ));
        }
    }
    if let Some(refusal) = chain_guard(spec, dispatch, now) {
        return refusal;
    }
    if load.cancelled_before {
        return Admission::Reject {
            reason: "cancelled by the dispatcher before it started".into(),
            state: TaskState::Cancelled,
        };
    }
    // One of several bridges never answers "busy": it claims only with a free slot, and
    // leaves the task to the others meanwhile.
    if spec.replica.is_none() && load.active >= spec.max_queued {
        return reject(format!(
            "agent {} is busy with {} tasks; dispatch again later",
            spec.name, load.active
        ));
    }
    let limits = &spec.limits;
    if let Some(max) = limits.per_sender_per_hour {
        if load.sender_last_hour >= max {
            return reject(format!(
                "sender {} has dispatched {} tasks to agent {} in the last hour (at most {max}); dispatch again later",
                env.from, load.sender_last_hour, spec.name
            ));
        }
    }
    if let Some(max) = limits.daily_budget {
        if load.agent_last_day >= max {
            return reject(format!(
                "agent {} has used its budget of {max} tasks for the last 24 hours; dispatch again later",
                spec.name
            ));
        }
    }
    if let Some(over) = spec
        .budgets
        .over(&load.spent, (&spec.name, &env.from), now, false)
    {
        return reject(over.refusal());
    }
    if let (Some(max), Some(_)) = (limits.turns_per_session, &dispatch.session_key) {
        if load.session_turns >= max {
            return reject(format!(
                "this conversation has reached its limit of {max} turns; start a new Session-Key"
            ));
        }
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

/// The guards a delegation chain carries (`protocol::chain`): a chain that comes back to this
/// agent (a loop), whose deadline has passed, or whose token budget is spent is not run, and
/// its dispatcher hears why.
fn chain_guard(spec: &AgentSpec, dispatch: &Dispatch, now: SystemTime) -> Option<Admission> {
    let chain = &dispatch.chain;
    let named = chain
        .id
        .as_deref()
        .map(|id| format!("delegation chain {id}"))
        .unwrap_or_else(|| "delegation chain".into());
    if chain.contains(&spec.email) {
        return Some(Admission::Reject {
            reason: format!(
                "loop guard: this {named} already passed through agent {} ({}); an agent takes part in a chain once, so it is not run",
                spec.email,
                chain.members.join(" -> ")
            ),
            state: TaskState::Rejected,
        });
    }
    if let Some(deadline) = &chain.deadline {
        if crate::protocol::time::parse(deadline).is_some_and(|at| at <= now) {
            return Some(Admission::Reject {
                reason: format!(
                    "deadline: this {named} had to be done by {deadline}, which has passed; it is not run"
                ),
                state: TaskState::Expired,
            });
        }
    }
    if chain.budget_tokens == Some(0) {
        return Some(Admission::Reject {
            reason: format!(
                "over budget: this {named} has no tokens left (X-AAMP-Budget-Tokens: 0); it is not run"
            ),
            state: TaskState::Rejected,
        });
    }
    None
}

#[cfg(test)]
mod tests_support {
    use super::*;
    use crate::dispatch::SenderPolicy;
    use crate::protocol::Priority;
    use crate::runner::Profile;
    use std::path::PathBuf;

    pub(super) fn spec() -> AgentSpec {
        AgentSpec {
            name: "coder".into(),
            email: "coder@x.test".into(),
            policy: SenderPolicy::new(&["*@x.test".into()]),
            max_concurrent: 1,
            max_queued: 2,
            profile: Profile::find("echo", &[]).unwrap(),
            workspace_root: PathBuf::from("/nonexistent"),
            limits: Limits {
                per_sender_per_hour: Some(5),
                daily_budget: Some(10),
                turns_per_session: Some(3),
            },
            unknown_senders: crate::dispatch::UnknownSenders::Reject,
            cancel_reply: crate::dispatch::CancelReply::Result,
            card: None,
            refusals_per_hour: 20,
            max_hops: 4,
            delegate_to: vec![],
            replica: None,
            budgets: Default::default(),
        }
    }

    /// What [`admit`] says now of `d` from `env`, to the agent of [`spec`] under its policy.
    pub(super) fn admit_now(
        env: &Envelope,
        d: &Dispatch,
        duplicate: bool,
        load: &Load,
    ) -> Admission {
        let spec = spec();
        admit(
            &spec,
            &spec.policy,
            env,
            d,
            duplicate,
            load,
            SystemTime::now(),
        )
    }

    pub(super) fn env(from: &str) -> Envelope {
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

    pub(super) fn dispatch(expires: Option<&str>) -> Dispatch {
        Dispatch {
            title: "t".into(),
            priority: Priority::Normal,
            expires_at: expires.map(str::to_string),
            ..Dispatch::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;

    #[test]
    fn admission_checks_duplicates_policy_the_queue_and_expiry() {
        let ok = env("a@x.test");
        let idle = Load::default();
        assert_eq!(
            admit_now(&ok, &dispatch(None), false, &idle),
            Admission::Run
        );
        assert_eq!(
            admit_now(&ok, &dispatch(None), true, &idle),
            Admission::Duplicate
        );
        let refused = admit_now(&env("a@evil.test"), &dispatch(None), false, &idle);
        assert!(
            matches!(&refused, Admission::Refuse { reason } if reason.contains("a@evil.test") && reason.starts_with("Unauthorized sender policy")),
            "{refused:?}"
        );
        let busy = admit_now(
            &ok,
            &dispatch(None),
            false,
            &Load {
                active: 2,
                ..Load::default()
            },
        );
        assert!(matches!(&busy, Admission::Reject { reason, .. } if reason.contains("busy")));
        let expired = admit_now(&ok, &dispatch(Some("2020-01-01T00:00:00Z")), false, &idle);
        assert!(matches!(
            &expired,
            Admission::Reject {
                state: TaskState::Expired,
                ..
            }
        ));
        assert_eq!(
            admit_now(&ok, &dispatch(Some("2999-01-01T00:00:00Z")), false, &idle),
            Admission::Run
        );
    }

    #[test]
    fn limits_sessions_and_early_cancels() {
        let ok = env("a@x.test");
        let mut keyed = dispatch(None);
        keyed.session_key = Some("k".into());
        let check = |d: &Dispatch, load: Load, needle: &str| {
            let got = admit_now(&ok, d, false, &load);
            assert!(
                matches!(&got, Admission::Reject { reason, .. } if reason.contains(needle)),
                "{needle}: {got:?}"
            );
        };
        check(
            &dispatch(None),
            Load {
                sender_last_hour: 5,
                ..Load::default()
            },
            "last hour",
        );
        check(
            &dispatch(None),
            Load {
                agent_last_day: 10,
                ..Load::default()
            },
            "budget",
        );
        let mut relayed = dispatch(None);
        relayed.hop_count = Some(4);
        check(&relayed, Load::default(), "loop guard");
        check(
            &keyed,
            Load {
                session_turns: 3,
                ..Load::default()
            },
            "turns",
        );
        let early = admit_now(
            &ok,
            &dispatch(None),
            false,
            &Load {
                cancelled_before: true,
                ..Load::default()
            },
        );
        assert!(matches!(
            early,
            Admission::Reject {
                state: TaskState::Cancelled,
                ..
            }
        ));
        assert_eq!(
            admit_now(
                &ok,
                &keyed,
                false,
                &Load {
                    session_turns: 2,
                    ..Load::default()
                },
            ),
            Admission::Run
        );
    }
}

#[cfg(test)]
mod budget_tests {
    use super::tests_support::*;
    use super::*;
    use crate::dispatch::budget::{Budgets, Period, Scope, Spent};
    use crate::protocol::Usage;

    #[test]
    fn a_used_up_budget_rejects_with_its_words() {
        let mut spec = spec();
        let budget = crate::config::Budget {
            tokens_per_day: Some(100),
            ..Default::default()
        };
        spec.budgets = Budgets::new(None, Some(&budget), None, &Default::default());
        let policy = spec.policy.clone();
        let now = crate::protocol::time::parse("2026-12-03T23:30:00Z").unwrap();
        let spent = |tokens| Load {
            spent: Spent::default().with(
                Scope::SenderHere,
                Period::Day,
                Usage {
                    input_tokens: tokens,
                    ..Usage::default()
                },
            ),
            ..Load::default()
        };
        let admit = |load: &Load| {
            admit(
                &spec,
                &policy,
                &env("a@x.test"),
                &dispatch(None),
                false,
                load,
                now,
            )
        };
        assert_eq!(admit(&spent(99)), Admission::Run);
        assert_eq!(
            admit(&spent(100)),
            Admission::Reject {
                reason: "over budget: sender a@x.test's budget on agent coder of 100 tokens a day (UTC) is used up: 100 tokens spent today; it resets at 2026-12-04T00:00:00Z (in 30 min); dispatch again after that".into(),
                state: TaskState::Rejected,
            }
        );
    }
}

#[cfg(test)]
mod chain_tests {
    use super::tests_support::*;
    use super::*;
    use crate::protocol::Chain;

    fn chained(chain: Chain) -> Dispatch {
        Dispatch {
            chain,
            ..dispatch(None)
        }
    }

    #[test]
    fn a_chain_that_loops_is_late_or_spent_is_rejected_with_why() {
        let spec = spec();
        let policy = spec.policy.clone();
        let now = crate::protocol::time::parse("2026-12-03T12:00:00Z").unwrap();
        let admit = |d: &Dispatch| {
            admit(
                &spec,
                &policy,
                &env("a@x.test"),
                d,
                false,
                &Load::default(),
                now,
            )
        };
        let looped = admit(&chained(Chain {
            id: Some("c-1".into()),
            members: vec!["planner@x.test".into(), "coder@x.test".into()],
            ..Chain::default()
        }));
        assert!(
            matches!(&looped, Admission::Reject { reason, state: TaskState::Rejected }
                if reason.starts_with("loop guard") && reason.contains("chain c-1") && reason.contains("planner@x.test -> coder@x.test")),
            "{looped:?}"
        );
        let late = admit(&chained(Chain {
            deadline: Some("2026-12-03T11:59:59Z".into()),
            ..Chain::default()
        }));
        assert!(
            matches!(&late, Admission::Reject { reason, state: TaskState::Expired } if reason.starts_with("deadline")),
            "{late:?}"
        );
        let spent = admit(&chained(Chain {
            budget_tokens: Some(0),
            ..Chain::default()
        }));
        assert!(
            matches!(&spent, Admission::Reject { reason, .. } if reason.contains("no tokens left")),
            "{spent:?}"
        );
        let fine = chained(Chain {
            id: Some("c-2".into()),
            members: vec!["planner@x.test".into()],
            deadline: Some("2026-12-03T12:00:01Z".into()),
            budget_tokens: Some(1),
            traceparent: None,
        });
        assert_eq!(admit(&fine), Admission::Run);
        // The sender policy is asked first: a refused sender hears nothing of the chain.
        let refused = super::admit(
            &spec,
            &policy,
            &env("a@evil.test"),
            &chained(Chain {
                members: vec!["coder@x.test".into()],
                ..Chain::default()
            }),
            false,
            &Load::default(),
            now,
        );
        assert!(matches!(refused, Admission::Refuse { .. }));
    }
}
