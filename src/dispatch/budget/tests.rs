use super::*;
use crate::protocol::time::{format_utc, parse};

fn at(text: &str) -> SystemTime {
    parse(text).unwrap()
}

fn price(input: f64, output: f64, cache_read: Option<f64>, cache_write: Option<f64>) -> Price {
    Price {
        input_per_million: input,
        output_per_million: output,
        cache_read_per_million: cache_read,
        cache_write_per_million: cache_write,
    }
}

fn report(model: Option<&str>, tokens: [u64; 4], cost: Option<u64>) -> Usage {
    Usage {
        input_tokens: tokens[0],
        output_tokens: tokens[1],
        cache_read_tokens: tokens[2],
        cache_write_tokens: tokens[3],
        cost_micros: cost,
        model: model.map(str::to_string),
        ..Usage::default()
    }
}

#[test]
fn prices_are_exact_in_millionths_and_never_invented() {
    let mut table = BTreeMap::new();
    table.insert(
        "sonnet".to_string(),
        price(3.0, 15.0, Some(0.3), Some(3.75)),
    );
    table.insert("cheap*".to_string(), price(0.5, 1.0, None, None));
    table.insert("cheap-pro*".to_string(), price(2.0, 4.0, None, None));
    table.insert("cheap-pro-exact".to_string(), price(10.0, 10.0, None, None));
    let prices = Prices::new(&table);
    let cost = |model: Option<&str>, tokens, stated| {
        prices.priced(&report(model, tokens, stated)).cost_micros
    };
    // 1000 x $3 + 500 x $15 + 20000 x $0.30 + 1000 x $3.75, per million: $0.02025.
    assert_eq!(
        cost(Some("sonnet"), [1000, 500, 20_000, 1000], None),
        Some(20_250)
    );
    // Rounded once, halves up: one token at $0.50 a million is half a millionth.
    assert_eq!(cost(Some("cheap-x"), [1, 0, 0, 0], None), Some(1));
    assert_eq!(cost(Some("cheap-x"), [0, 0, 0, 0], None), Some(0));
    // Cache tokens without a cache price cost the input price; the longest prefix wins, an
    // exact name before any prefix.
    assert_eq!(cost(Some("cheap-x"), [0, 0, 2, 2], None), Some(2));
    assert_eq!(
        cost(Some("cheap-pro-1"), [1_000_000, 0, 0, 0], None),
        Some(2_000_000)
    );
    assert_eq!(
        cost(Some("cheap-pro-exact"), [1_000_000, 0, 0, 0], None),
        Some(10_000_000)
    );
    // The agent's own cost stands; a model without a price, or no model, stays unknown.
    assert_eq!(cost(Some("sonnet"), [1000, 0, 0, 0], Some(7)), Some(7));
    assert_eq!(cost(Some("opus"), [1000, 0, 0, 0], None), None);
    assert_eq!(cost(None, [1000, 0, 0, 0], None), None);
    assert!(prices.knows("cheap-anything") && !prices.knows("opus"));
    // A month of big reports does not overflow.
    assert_eq!(
        cost(Some("sonnet"), [u64::MAX, 0, 0, 0], None),
        Some(u64::MAX)
    );
}

#[test]
fn days_and_months_are_utc_and_reset_at_their_end() {
    let day = |now: &str| {
        let (from, to) = period_of(Period::Day, at(now));
        (format_utc(from), format_utc(to))
    };
    let month = |now: &str| {
        let (from, to) = period_of(Period::Month, at(now));
        (format_utc(from), format_utc(to))
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        day("2026-12-03T17:05:00Z"),
        pair("2026-12-03T00:00:00Z", "2026-12-04T00:00:00Z")
    );
    // Midnight begins the new day; a moment before it is the old one's.
    assert_eq!(
        day("2026-12-04T00:00:00Z"),
        pair("2026-12-04T00:00:00Z", "2026-12-05T00:00:00Z")
    );
    assert_eq!(
        day("2026-12-03T23:59:59.999Z"),
        pair("2026-12-03T00:00:00Z", "2026-12-04T00:00:00Z")
    );
    // A local time is read as the UTC moment it is.
    assert_eq!(
        day("2026-12-04T01:00:00+02:00"),
        pair("2026-12-03T00:00:00Z", "2026-12-04T00:00:00Z")
    );
    assert_eq!(
        month("2026-12-31T23:59:59Z"),
        pair("2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z")
    );
    assert_eq!(
        month("2027-01-01T00:00:00Z"),
        pair("2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z")
    );
    assert_eq!(
        month("2028-02-29T12:00:00Z"),
        pair("2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z")
    );
    assert_eq!(
        month("2027-02-15T12:00:00Z"),
        pair("2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z")
    );
}

fn budget(tokens_day: Option<u64>, usd_month: Option<f64>, hard: bool) -> Budget {
    Budget {
        tokens_per_day: tokens_day,
        usd_per_month: usd_month,
        hard,
        ..Budget::default()
    }
}

#[test]
fn a_budget_used_up_says_which_what_was_spent_and_when_it_resets() {
    let now = at("2026-12-03T17:05:00Z");
    let who = ("coder", "ann@x.test");
    let agent = budget(Some(1000), None, false);
    let each = budget(None, Some(5.0), true);
    let budgets = Budgets::new(Some(&agent), Some(&each), None, &BTreeMap::new());
    // What these budgets say of a month and a day of `tokens` costing `cost`, before a task
    // (`running` false) or while one runs.
    let over = |tokens: u64, cost: Option<u64>, partial: bool, running: bool| {
        let mut usage = report(Some("m"), [tokens, 0, 0, 0], cost);
        usage.cost_partial = partial;
        let spent = Spent(vec![
            (Scope::Agent, Period::Day, usage.clone()),
            (Scope::SenderHere, Period::Month, usage),
        ]);
        budgets.over(&spent, who, now, running)
    };
    assert_eq!(over(999, Some(4_999_999), false, false), None);
    assert_eq!(
        over(1200, Some(1), false, false).unwrap().refusal(),
        "over budget: agent coder's budget of 1,000 tokens a day (UTC) is used up: 1,200 tokens spent today; it resets at 2026-12-04T00:00:00Z (in 6 h 55 min); dispatch again after that"
    );
    // The soft token budget is not a hard one: only the money budget stops a running task.
    assert_eq!(over(1200, Some(1), false, true), None);
    assert_eq!(
        over(10, Some(5_000_000), true, true).unwrap().stop(),
        "stopped over budget: sender ann@x.test's hard budget on agent coder of $5.00 a month (UTC) was crossed while the task ran: $5.00 spent this month (counting only what has a known cost: some of the agent's reports stated none and their model has no price in the config's [prices]); it resets at 2027-01-01T00:00:00Z (in 28 d 6 h)"
    );
    let everywhere = budget(None, Some(0.5), false);
    let budgets = Budgets::new(None, None, Some(&everywhere), &BTreeMap::new());
    let usage = report(None, [1, 0, 0, 0], Some(512_345));
    let over = budgets
        .over(
            &Spent(vec![(Scope::Sender, Period::Month, usage)]),
            who,
            now,
            false,
        )
        .unwrap();
    assert!(over.refusal().contains("sender ann@x.test's budget on all agents together of $0.50 a month (UTC) is used up: $0.5123 spent this month;"), "{}", over.refusal());
}

#[test]
fn spent_is_read_from_the_journal_per_scope_and_period() {
    use crate::dispatch::journal::NewTask;
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(&dir.path().join("j.sqlite3")).unwrap();
    let task = |key: &str, sender: &str| {
        let new = NewTask::received("coder", key, sender);
        journal.record(&new, None).unwrap().unwrap()
    };
    let (a, b) = (task("a", "ann@x.test"), task("b", "bob@x.test"));
    let now = at("2026-12-03T17:05:00Z");
    let yesterday = at("2026-12-02T23:30:00Z");
    let u = |n| report(Some("m"), [n, 0, 0, 0], Some(n));
    journal.record_usage(a, 1, "k1", &u(100), now).unwrap();
    journal
        .record_usage(a, 1, "k0", &u(1000), yesterday)
        .unwrap();
    journal.record_usage(b, 1, "k1", &u(10), now).unwrap();
    let day = budget(Some(105), None, false);
    let month = Budget {
        tokens_per_month: Some(1100),
        ..Budget::default()
    };
    let budgets = Budgets::new(Some(&day), Some(&month), None, &BTreeMap::new());
    let spent = budgets
        .read(&journal, ("coder", "Ann@x.test"), now, false)
        .unwrap();
    assert_eq!(
        spent.of(Scope::Agent, Period::Day).unwrap().input_tokens,
        110
    );
    assert_eq!(
        spent
            .of(Scope::SenderHere, Period::Month)
            .unwrap()
            .input_tokens,
        1100
    );
    let over = budgets
        .over(&spent, ("coder", "Ann@x.test"), now, false)
        .unwrap();
    assert_eq!((over.limit.scope, over.used), (Scope::Agent, 110));
    // Models without a stated cost or a price, named for `doctor`.
    journal
        .record_usage(b, 1, "k2", &report(Some("opus"), [5, 0, 0, 0], None), now)
        .unwrap();
    journal
        .record_usage(b, 1, "k3", &report(None, [5, 0, 0, 0], None), now)
        .unwrap();
    journal
        .record_usage(b, 1, "k4", &report(Some("priced"), [5, 0, 0, 0], None), now)
        .unwrap();
    let mut table = BTreeMap::new();
    table.insert("priced".to_string(), price(1.0, 1.0, None, None));
    let day = period_of(Period::Day, now);
    let unpriced = unpriced_models(&journal, &Prices::new(&table), day).unwrap();
    assert_eq!(unpriced, vec!["".to_string(), "opus".to_string()]);
    // No hard budget: nothing read for a running task.
    assert_eq!(
        budgets
            .read(&journal, ("coder", "ann@x.test"), now, true)
            .unwrap(),
        Spent::default()
    );
}

#[test]
fn a_run_that_spends_its_delegation_chains_tokens_is_stopped_with_why() {
    use crate::dispatch::journal::NewTask;
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(&dir.path().join("j.sqlite3")).unwrap();
    let new = NewTask {
        task_id: "child",
        ..NewTask::received("coder", "k", "planner@x.test")
    };
    let row = journal.record(&new, None).unwrap().unwrap();
    let budgets = Budgets::default();
    let cancel = CancellationToken::new();
    let guard =
        Guard::new(&budgets, ("coder", "planner@x.test"), &cancel).with_chain(row, Some(100));
    let now = at("2026-12-03T17:05:00Z");
    journal
        .record_usage(row, 1, "r1", &report(Some("m"), [60, 0, 0, 0], None), now)
        .unwrap();
    guard.counted(&journal, now);
    assert!(!guard.token().is_cancelled(), "60 of 100 tokens");
    journal
        .record_usage(row, 1, "r2", &report(Some("m"), [50, 0, 0, 0], None), now)
        .unwrap();
    guard.counted(&journal, now);
    assert!(guard.token().is_cancelled(), "110 of 100 tokens");
    let outcome: Result<(), RunError> = guard.explain(Err(RunError::Cancelled), &cancel);
    match outcome {
        Err(RunError::Stopped(why)) => assert!(
            why.contains("delegation chain left it 100 tokens, and it spent 110"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_run_past_its_delegation_chains_deadline_is_stopped_with_why() {
    let budgets = Budgets::default();
    let cancel = CancellationToken::new();
    let guard = Guard::new(&budgets, ("coder", "planner@x.test"), &cancel);
    let soon = format_utc(SystemTime::now() + std::time::Duration::from_millis(200));
    let watch = guard.stop_at(Some(&soon));
    assert!(watch.is_some());
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        guard.token().cancelled(),
    )
    .await
    .expect("stopped at the deadline");
    match guard.explain::<()>(Err(RunError::Cancelled), &cancel) {
        Err(RunError::Stopped(why)) => assert!(why.starts_with("deadline:"), "{why}"),
        other => panic!("{other:?}"),
    }
    // No deadline, or one that cannot be read: no watch.
    assert!(guard.stop_at(None).is_none());
    assert!(guard.stop_at(Some("someday")).is_none());
}
