//! The journal's own tests: schema, queries' plans, the outbox order, recovery, pruning.

use super::*;

/// A new journal in a folder of its own (dropped with the folder).
fn fresh() -> (tempfile::TempDir, Journal) {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(&dir.path().join("j.sqlite3")).unwrap();
    (dir, journal)
}

/// Task `t1` (Message-ID `<m1>`) recorded with its ack `<a1>` waiting; its row, or `None`
/// for a duplicate.
fn t1_with_ack(j: &Journal) -> Option<i64> {
    j.record(&task("<m1>", "t1", true), Some(&mail("task.ack", "<a1>")))
        .unwrap()
}

/// The statements run for every dispatch, answer and conversation turn: each must search an
/// index, never scan a table (a scan of a journal with a month of history would make every
/// task cost more as the journal grows), and admission's counts must read their index alone.
#[test]
fn the_queries_run_for_every_task_use_indexes_not_scans() {
    let (_dir, journal) = fresh();
    let conn = journal.conn.lock().unwrap();
    for (name, sql) in [
        ("COUNT_OUTGOING", COUNT_OUTGOING),
        ("DUE", DUE),
        ("NEXT_DUE", NEXT_DUE),
        ("COUNT_AGENT_RECENT", COUNT_AGENT_RECENT),
        ("COUNT_SENDER_RECENT", COUNT_SENDER_RECENT),
        ("COUNT_CONVERSATION", COUNT_CONVERSATION),
        ("BOUND_NOT_ADMITTED", BOUND_NOT_ADMITTED),
        ("KNOWS_MESSAGE", tasks::KNOWS_MESSAGE),
        ("MESSAGE_ROW", tasks::MESSAGE_ROW),
        ("ADMITTED_TASK", tasks::ADMITTED_TASK),
        ("SPENT_FORGET", trust::SPENT_FORGET),
        ("SPENT_COUNT", trust::SPENT_COUNT),
        ("POLICY_RULES", trust::POLICY_RULES),
        ("PAIR_FAILURES", trust::PAIR_FAILURES),
        ("WAS_CANCELLED", trust::WAS_CANCELLED),
        ("SESSION", sessions::SESSION),
        ("TURNS_EXPIRE", turns::TURNS_EXPIRE),
        ("TURNS_READ", turns::TURNS_READ),
        ("UNSENT", outbox::UNSENT),
        ("SPENT_AGENT", usage::SPENT_AGENT),
        ("SPENT_AGENT_SENDER", usage::SPENT_AGENT_SENDER),
        ("SPENT_SENDER", usage::SPENT_SENDER),
    ] {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let values: Vec<rusqlite::types::Value> = (0..stmt.parameter_count())
            .map(|_| rusqlite::types::Value::Null)
            .collect();
        let plan: Vec<String> = stmt
            .query_map(rusqlite::params_from_iter(values), |r| {
                r.get::<_, String>(3)
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            // A count reads its LIMITed subquery's rows, not a table's.
            plan.iter()
                .all(|step| !step.starts_with("SCAN") || step.starts_with("SCAN (subquery")),
            "{name} scans a table: {plan:?}"
        );
        if name.starts_with("COUNT_") && name != "COUNT_OUTGOING" {
            assert!(
                plan.iter()
                    .any(|step| step.contains("USING COVERING INDEX")),
                "{name} reads rows: {plan:?}"
            );
        }
    }
}

/// Issue 43: every admitted dispatch counted the agent's tasks of the last 24 hours row by
/// row, limit or no limit: 800,000 VM steps (66 ms) on a journal of 80,000 tasks of the last
/// day. A count whose limit is not set is not made, and one that is stops at its limit.
#[test]
fn admission_counts_cost_no_more_than_their_limits_however_large_the_journal() {
    let (_dir, journal) = fresh();
    let now = now_ms();
    journal
        .with(|c| {
            let tx = c.transaction()?;
            for i in 0..80_000i64 {
                tx.execute(
                    "INSERT INTO tasks (agent, message_key, sender, task_id, state, admitted, mail, received_at, updated_at, session_key)
                     VALUES ('coder', ?1, 'a@x.test', ?1, 'answered', 1, '{}', ?2, ?2, 's1')",
                    params![format!("<m{i}>"), now - 80_000 + i],
                )?;
            }
            tx.commit()
        })
        .unwrap();
    let at = SystemTime::now();
    let unlimited = journal
        .recent_counts("coder", "A@x.test", Some("s1"), &Default::default(), at)
        .unwrap();
    assert_eq!(unlimited, RecentCounts::default());
    assert_eq!(journal.count_steps(), 0, "no limit, no count");
    let limits = crate::dispatch::admission::Limits {
        per_sender_per_hour: Some(100),
        daily_budget: Some(100),
        turns_per_session: Some(100),
    };
    let counted = journal
        .recent_counts("coder", "A@x.test", Some("s1"), &limits, at)
        .unwrap();
    let each = RecentCounts {
        sender_last_hour: 100,
        agent_last_day: 100,
        session_turns: 100,
    };
    assert_eq!(counted, each, "each count reaches its limit and stops");
    let steps = journal.count_steps();
    assert!(
        steps < 3 * 100 * 20,
        "{steps} VM steps for three counts of 100"
    );
    let exact = journal
        .count_admitted("coder", Recent::Agent, from_millis(now - 1_000), 1_000_000)
        .unwrap();
    assert_eq!(exact, 1_000, "below its cap a count is exact");
}

#[test]
fn mail_not_admitted_is_bounded_per_agent_and_pending_answers_stay() {
    let (_dir, journal) = fresh();
    let keys: Vec<String> = (0..30).map(|i| format!("<r{i}>")).collect();
    for key in &keys {
        let mut t = task(key, key, false);
        t.state = TaskState::Rejected;
        journal.record(&t, None).unwrap();
    }
    journal
        .with(|c| {
            c.execute(BOUND_NOT_ADMITTED, params!["coder", 10])
                .map(drop)
        })
        .unwrap();
    let left: Vec<bool> = keys
        .iter()
        .map(|k| journal.knows_message("coder", k).unwrap())
        .collect();
    assert_eq!(left.iter().filter(|k| **k).count(), 11, "{left:?}");
    assert!(left[29] && !left[0], "the oldest go first");
}

fn task<'a>(key: &'a str, task_id: &'a str, admitted: bool) -> NewTask<'a> {
    NewTask {
        agent: "coder",
        message_key: key,
        sender: "A@x.test",
        task_id,
        session_key: Some("s1"),
        state: if admitted {
            TaskState::Received
        } else {
            TaskState::Rejected
        },
        admitted,
        mail: "{}",
        reason: None,
        chain: None,
    }
}

fn mail(intent: &str, id: &str) -> Outgoing {
    Outgoing {
        intent: intent.into(),
        mail: RenderedMail {
            message_id: id.into(),
            from: "coder@x.test".into(),
            to: vec!["a@x.test".into()],
            bytes: b"bytes".to_vec(),
        },
        claim: None,
    }
}

#[test]
fn a_message_is_recorded_once_and_its_task_key_held_only_when_admitted() {
    let (_dir, j) = fresh();
    let id = t1_with_ack(&j).expect("recorded");
    assert!(j.knows_message("coder", "<m1>").unwrap());
    assert!(!j.knows_message("other", "<m1>").unwrap());
    assert_eq!(t1_with_ack(&j), None, "a second delivery is a duplicate");
    assert_eq!(
        j.admitted_task("coder", "a@X.test", "t1").unwrap(),
        Some((id, TaskState::Received))
    );
    j.record(
        &task("<m2>", "t2", false),
        Some(&mail("task.result", "<r2>")),
    )
    .unwrap();
    assert_eq!(j.admitted_task("coder", "a@x.test", "t2").unwrap(), None);
    assert_eq!(j.unsent("coder").unwrap(), 2);
}

#[test]
fn the_outbox_sends_a_tasks_mails_in_order_and_marks_the_ack() {
    let (_dir, j) = fresh();
    let id = t1_with_ack(&j).unwrap();
    j.finish(
        "coder",
        id,
        TaskState::Answered,
        None,
        Some(&mail("task.result", "<r1>")),
    )
    .unwrap();
    let due = j.due("coder", 10).unwrap();
    assert_eq!(due.len(), 1, "the result waits for the ack");
    assert_eq!(due[0].mail.intent, "task.ack");
    j.retry_at(&due[0], SystemTime::now() + Duration::from_secs(60), "down")
        .unwrap();
    assert!(j.due("coder", 10).unwrap().is_empty());
    assert!(j.next_due("coder").unwrap().is_some());
    j.mark_sent(&due[0]).unwrap();
    let due = j.due("coder", 10).unwrap();
    assert_eq!(due[0].mail.intent, "task.result");
    j.mark_sent(&due[0]).unwrap();
    assert_eq!(j.unsent("coder").unwrap(), 0);
    assert!(j.unfinished("coder").unwrap().is_empty());
}

#[test]
fn unfinished_tasks_survive_reopening_with_their_runs_and_groups() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.sqlite3");
    {
        let j = Journal::open(&path).unwrap();
        let id = j.record(&task("<m1>", "t1", true), None).unwrap().unwrap();
        assert_eq!(j.start_run(id).unwrap(), 1);
        j.set_pgid(id, 4242).unwrap();
        j.set_session("coder", "k", "s1").unwrap();
        j.set_session("coder", "k", "s2").unwrap();
    }
    let j = Journal::open(&path).unwrap();
    let left = j.unfinished("coder").unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(
        (left[0].state, left[0].runs, left[0].pgid),
        (TaskState::Running, 1, Some(4242))
    );
    assert_eq!(j.recorded_pgids().unwrap(), vec![4242]);
    assert_eq!(j.session("coder", "k").unwrap().as_deref(), Some("s2"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_journal_of_the_first_schema_is_brought_up_to_date() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.sqlite3");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE tasks (id INTEGER PRIMARY KEY, agent TEXT NOT NULL, message_key TEXT NOT NULL,
               sender TEXT NOT NULL, task_id TEXT NOT NULL, state TEXT NOT NULL, admitted INTEGER NOT NULL,
               mail TEXT NOT NULL, reason TEXT, runs INTEGER NOT NULL DEFAULT 0, pgid INTEGER,
               received_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, UNIQUE (agent, message_key));
             INSERT INTO tasks (agent, message_key, sender, task_id, state, admitted, mail, received_at, updated_at)
               VALUES ('coder', '<old>', 'a@x.test', 't0', 'running', 1, '{}', 1, 1);",
        )
        .unwrap();
    }
    let j = Journal::open(&path).unwrap();
    assert!(j.knows_message("coder", "<old>").unwrap());
    assert_eq!(j.unfinished("coder").unwrap().len(), 1);
    j.record(&task("<new>", "t1", true), None).unwrap();
    assert_eq!(
        j.count_admitted(
            "coder",
            Recent::Conversation {
                sender: "a@x.test",
                key: "s1"
            },
            UNIX_EPOCH,
            10
        )
        .unwrap(),
        1
    );
    drop(j);
    Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let newer = Journal::open(&path).unwrap_err().to_string();
    assert!(newer.contains("newer aamp-bridge"), "{newer}");
}

/// Schema 5 adds outbox.claim: a journal of schema 4 keeps its unsent mail (sent as it is)
/// and takes mail that waits on a claim.
#[test]
fn a_journal_of_schema_4_gets_the_outbox_claim() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.sqlite3");
    drop(Journal::open(&path).unwrap());
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch("ALTER TABLE outbox DROP COLUMN claim")
            .unwrap();
        c.pragma_update(None, "user_version", 4).unwrap();
        c.execute(
            "INSERT INTO outbox (agent, intent, message_id, sender, recipients, bytes, created_at, next_at)
             VALUES ('coder', 'task.result', '<old>', 'coder@x.test', '[]', x'00', 1, 1)",
            [],
        )
        .unwrap();
    }
    let j = Journal::open(&path).unwrap();
    let mut waits = mail("task.result", "<new>");
    waits.claim = Some("M1".into());
    j.enqueue("coder", None, &waits).unwrap();
    let due = j.due("coder", 10).unwrap();
    let claims: Vec<_> = due
        .iter()
        .map(|p| (p.mail.mail.message_id.as_str(), p.mail.claim.as_deref()))
        .collect();
    assert_eq!(claims, vec![("<old>", None), ("<new>", Some("M1"))]);
    j.answered_elsewhere(&due[1], "r2").unwrap();
    assert_eq!(j.unsent("coder").unwrap(), 1);
}

#[test]
fn pruning_keeps_unfinished_tasks_and_unsent_mail() {
    let (_dir, j) = fresh();
    let done = j.record(&task("<m1>", "t1", true), None).unwrap().unwrap();
    j.finish("coder", done, TaskState::Answered, None, None)
        .unwrap();
    let waiting = j.record(&task("<m2>", "t2", true), None).unwrap().unwrap();
    j.finish(
        "coder",
        waiting,
        TaskState::Answered,
        None,
        Some(&mail("task.result", "<r2>")),
    )
    .unwrap();
    j.record(&task("<m3>", "t3", true), None).unwrap();
    let removed = j.prune(SystemTime::now() + Duration::from_secs(1)).unwrap();
    assert_eq!(removed, 1);
    assert!(!j.knows_message("coder", "<m1>").unwrap());
    assert!(j.knows_message("coder", "<m2>").unwrap());
    assert!(j.knows_message("coder", "<m3>").unwrap());
}

#[test]
fn a_conversations_turns_are_kept_in_order_bounded_and_cut() {
    let (_dir, journal) = fresh();
    for n in 0..(turns::TURNS_KEPT + 3) {
        journal
            .add_turn("a", "k1", &format!("ask {n}"), &format!("answer {n}"))
            .unwrap();
    }
    journal
        .add_turn("a", "k2", &"x".repeat(turns::TURN_TEXT * 2), "ok")
        .unwrap();
    let kept = journal.turns("a", "k1").unwrap();
    assert_eq!(kept.len() as i64, turns::TURNS_KEPT);
    assert_eq!(kept[0].request, "ask 3");
    assert_eq!(
        kept.last().unwrap().answer,
        format!("answer {}", turns::TURNS_KEPT + 2)
    );
    assert_eq!(
        journal.turns("a", "k2").unwrap()[0].request.len(),
        turns::TURN_TEXT
    );
    assert!(journal.turns("b", "k1").unwrap().is_empty(), "per agent");
}

/// A delivery report marks a mail undelivered only once it left, and only for an address it
/// was sent to (issue 31: a forged one stopped an answer waiting in the outbox for good).
#[test]
fn a_report_marks_only_a_sent_mail_to_an_address_it_was_sent_to() {
    let (_dir, j) = fresh();
    t1_with_ack(&j);
    let to = ["A@X.test".to_string()];
    assert!(matches!(
        j.bounced("coder", "<a1>", &to, "bounced").unwrap(),
        BounceFound::NotSent(_)
    ));
    let due = j.due("coder", 10).unwrap();
    assert_eq!(due.len(), 1, "still waiting to be sent");
    j.mark_sent(&due[0]).unwrap();
    assert!(matches!(
        j.bounced("coder", "<a1>", &["other@x.test".to_string()], "bounced")
            .unwrap(),
        BounceFound::NotARecipient(_)
    ));
    assert!(matches!(
        j.bounced("coder", "<a1>", &to, "bounced").unwrap(),
        BounceFound::Marked(Bounced { intent, .. }) if intent == "task.ack"
    ));
    assert_eq!(
        j.bounced("coder", "<nobody's>", &to, "bounced").unwrap(),
        BounceFound::NotOurs
    );
}

/// A task another replica won is kept as a record (issue 31: it was deleted, and a second
/// delivery ran again): its Message-ID and TaskId stay known, it counts toward no limit, and
/// it comes back as a task once, for one caller.
#[test]
fn a_task_left_to_another_replica_is_kept_and_taken_back_once() {
    let (_dir, j) = fresh();
    let row = j
        .record(&task("<m1>", "t1", true), None)
        .unwrap()
        .expect("recorded");
    j.elsewhere(row, "claimed by replica r2").unwrap();
    assert_eq!(
        j.message_row("coder", "<m1>").unwrap(),
        Some((row, TaskState::Elsewhere))
    );
    assert_eq!(
        j.admitted_task("coder", "a@x.test", "t1").unwrap(),
        Some((row, TaskState::Elsewhere))
    );
    assert!(
        j.unfinished("coder").unwrap().is_empty(),
        "not picked up at a start"
    );
    let counted = j
        .count_admitted(
            "coder",
            Recent::Agent,
            std::time::SystemTime::UNIX_EPOCH,
            10,
        )
        .unwrap();
    assert_eq!(counted, 0, "not counted toward this replica's limits");
    let (key, mail) = j.reclaim(row).unwrap().expect("taken back");
    assert_eq!((key.as_str(), mail.as_str()), ("<m1>", "{}"));
    assert_eq!(j.reclaim(row).unwrap(), None, "once");
    assert_eq!(j.unfinished("coder").unwrap().len(), 1);
}

/// Issue 43: the journal (7.9 KB a dispatch) was pruned only at start and never shrank. Over
/// its size limit the oldest finished tasks go first, never one still to be answered, and
/// the file on disk shrinks under the limit.
#[test]
fn upkeep_bounds_the_journal_on_disk_and_keeps_what_is_unanswered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.sqlite3");
    let journal = Journal::open(&path).unwrap();
    let big = format!("{{\"body\": \"{}\"}}", "x".repeat(8_000));
    let mut first = task("<waiting>", "t-waiting", true);
    first.mail = &big;
    journal.record(&first, None).unwrap();
    journal
        .with(|c| {
            let tx = c.transaction()?;
            for i in 0..2_000 {
                tx.execute(
                    "INSERT INTO tasks (agent, message_key, sender, task_id, state, admitted, mail, received_at, updated_at)
                     VALUES ('coder', ?1, 'a@x.test', ?1, 'answered', 1, ?2, ?3, ?3)",
                    params![format!("<m{i}>"), big, now_ms()],
                )?;
            }
            tx.commit()
        })
        .unwrap();
    let before = space::size_on_disk(&path);
    assert!(before > 16 << 20, "{before}");
    let upkeep = Upkeep {
        retention: Duration::from_secs(30 * 86_400),
        max_bytes: 2 << 20,
    };
    let kept = journal.upkeep(&upkeep, SystemTime::now()).unwrap();
    assert_eq!(kept.expired, 0);
    assert!(kept.for_size > 1_500, "{kept:?}");
    assert!(kept.bytes <= 2 << 20, "{kept:?}");
    assert!(space::size_on_disk(&path) <= 2 << 20);
    assert!(
        journal.knows_message("coder", "<waiting>").unwrap(),
        "unanswered: kept"
    );
    assert!(
        journal.knows_message("coder", "<m1999>").unwrap(),
        "newest: kept"
    );
    assert!(
        !journal.knows_message("coder", "<m0>").unwrap(),
        "oldest: gone"
    );
    assert_eq!(journal.unfinished("coder").unwrap().len(), 1);
}

/// Issue 43: pruned while the bridge runs, every hour (paused time), not only at start.
#[tokio::test(start_paused = true)]
async fn the_journal_is_pruned_every_hour_while_the_bridge_runs() {
    let dir = tempfile::tempdir().unwrap();
    let journal = std::sync::Arc::new(Journal::open(&dir.path().join("j.sqlite3")).unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let upkeep = Upkeep {
        retention: Duration::from_secs(86_400),
        max_bytes: 1 << 30,
    };
    let hour = Duration::from_secs(3600);
    let keeper = tokio::spawn(keep(journal.clone(), upkeep, hour, stop.clone()));
    let row = journal
        .record(&task("<old>", "t1", true), None)
        .unwrap()
        .unwrap();
    journal
        .finish("coder", row, TaskState::Answered, None, None)
        .unwrap();
    let two_days_ago = now_ms() - 2 * 86_400_000;
    journal
        .with(|c| c.execute("UPDATE tasks SET updated_at = ?1", [two_days_ago]))
        .unwrap();
    tokio::time::sleep(hour - Duration::from_secs(1)).await;
    assert!(
        journal.knows_message("coder", "<old>").unwrap(),
        "not before the hour"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut polls = 0;
    while journal.knows_message("coder", "<old>").unwrap() {
        polls += 1;
        assert!(polls < 1_000, "not pruned after the hour");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    keeper.await.unwrap();
}

#[test]
fn a_tasks_delegation_chain_is_kept_and_its_chain_listed() {
    let (_dir, journal) = fresh();
    let kept = super::TaskChain {
        parent_task_id: Some("t-parent".into()),
        hops: Some(1),
        chain: crate::protocol::Chain {
            id: Some("c-7".into()),
            members: vec!["planner@x.test".into()],
            budget_tokens: Some(500),
            ..Default::default()
        },
    };
    let json = kept.to_json();
    let child = journal
        .record(
            &NewTask {
                chain: Some(&json),
                ..task("<m1>", "t-child", true)
            },
            None,
        )
        .unwrap()
        .unwrap();
    let plain = journal
        .record(&task("<m2>", "t-plain", true), None)
        .unwrap()
        .unwrap();
    assert_eq!(journal.task_chain(child).unwrap(), Some(kept.clone()));
    assert_eq!(journal.task_chain(plain).unwrap(), None);
    let listed = journal.chain_tasks("c-7").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].row, listed[0].task_id.as_str(), &listed[0].chain),
        (child, "t-child", &kept)
    );
}

#[test]
fn a_delegation_is_answered_once_and_only_by_its_recipient() {
    let (_dir, journal) = fresh();
    let parent = journal
        .record(&task("<p1>", "t-parent", true), None)
        .unwrap()
        .unwrap();
    let new = super::NewDelegation {
        agent: "coder",
        parent,
        task_id: "child-1",
        recipient: "Reviewer@X.test",
        title: "review",
    };
    assert!(journal
        .delegate(&new, &mail("task.dispatch", "<d1@x.test>"))
        .unwrap());
    // Asked again (the parent ran again after a crash): recorded once, sent once.
    assert!(!journal
        .delegate(&new, &mail("task.dispatch", "<d2@x.test>"))
        .unwrap());
    let sent = journal.delegation("coder", "child-1").unwrap().unwrap();
    assert_eq!((sent.state.as_str(), sent.parent), ("sent", parent));
    // Queued with it, in the same transaction.
    assert_eq!(journal.count_outgoing(parent, "task.dispatch").unwrap(), 1);
    assert!(!journal
        .delegation_answered(
            "coder",
            "child-1",
            "someone@else.test",
            "completed",
            "forged"
        )
        .unwrap());
    assert!(journal
        .delegation_answered(
            "coder",
            "child-1",
            "reviewer@x.test",
            "completed",
            "looks good"
        )
        .unwrap());
    assert!(!journal
        .delegation_answered("coder", "child-1", "reviewer@x.test", "completed", "twice")
        .unwrap());
    let answered = journal.delegation("coder", "child-1").unwrap().unwrap();
    assert_eq!(answered.answer.as_deref(), Some("looks good"));
    assert!(!journal.delegation_cancelled("coder", "child-1").unwrap());
    assert_eq!(journal.delegations_of(parent).unwrap().len(), 1);
}
