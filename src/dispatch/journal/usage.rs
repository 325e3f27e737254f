//! What the agents' model calls cost, as their own reports said: one row per report in
//! `usage` (a task's, kept while the task is), and the same summed per agent, sender, model and
//! hour in `usage_hours` (kept for [`USAGE_HOURS_KEPT`], after the tasks are gone), which
//! budgets, the `usage` command and the live view read.
//!
//! Counting is idempotent: a report is keyed by its task, the task's run and the runner's key
//! for it, and only the first row under a key adds to the hours, in the same transaction. A
//! report seen twice, a restart mid-task (the run's reports so far are journaled as they came;
//! the task's next run has its own number) and a retold turn are each counted once.

use std::time::{Duration, SystemTime};

use rusqlite::{params, Transaction};

use super::{millis, Journal, JournalError};
use crate::protocol::Usage;

/// How long the hourly sums stay after the tasks' own retention (a year and a month: a
/// month's report a year back).
pub const USAGE_HOURS_KEPT: Duration = Duration::from_secs(400 * 24 * 3600);

/// The hour a moment falls in, in hours since the Unix epoch (UTC).
pub fn hour_of(at: SystemTime) -> i64 {
    millis(at).div_euclid(3_600_000)
}

/// Whose spending a sum is over: an agent's, a sender's (on every agent), or one sender's on
/// one agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spender<'a> {
    pub agent: Option<&'a str>,
    pub sender: Option<&'a str>,
}

/// One hourly sum, as the `usage` report and the live view read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageHour {
    pub agent: String,
    pub sender: String,
    /// `""` when the agent named no model.
    pub model: String,
    /// Hours since the Unix epoch (UTC).
    pub hour: i64,
    pub usage: Usage,
    /// Reports in the hour.
    pub reports: u64,
}

/// A sum's columns read back into a [`Usage`]: tokens, the cost of the reports that had one,
/// and how many had none.
macro_rules! sum_columns {
    () => {
        "COALESCE(SUM(input), 0), COALESCE(SUM(output), 0), COALESCE(SUM(cache_read), 0),
         COALESCE(SUM(cache_write), 0), COALESCE(SUM(cost_micros), 0),
         COALESCE(SUM(uncosted), 0), COALESCE(SUM(reports), 0)"
    };
}
const SUM_COLUMNS: &str = sum_columns!();

/// [`Journal::spent`]'s sums: hours `?1..?2`, then the agent and/or the sender.
pub(super) const SPENT_AGENT: &str = concat!(
    "SELECT ",
    sum_columns!(),
    " FROM usage_hours WHERE agent = ?3 AND hour >= ?1 AND hour < ?2"
);
pub(super) const SPENT_AGENT_SENDER: &str = concat!(
    "SELECT ",
    sum_columns!(),
    " FROM usage_hours WHERE agent = ?3 AND hour >= ?1 AND hour < ?2 AND sender = ?4"
);
pub(super) const SPENT_SENDER: &str = concat!(
    "SELECT ",
    sum_columns!(),
    " FROM usage_hours WHERE sender = ?3 AND hour >= ?1 AND hour < ?2"
);
const SPENT_ALL: &str = concat!(
    "SELECT ",
    sum_columns!(),
    " FROM usage_hours WHERE hour >= ?1 AND hour < ?2"
);

fn read_sum(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<(Usage, u64)> {
    let n = |i: usize| r.get::<_, i64>(at + i).map(|v| v.max(0) as u64);
    let (cost, uncosted, reports) = (n(4)?, n(5)?, n(6)?);
    let usage = Usage {
        input_tokens: n(0)?,
        output_tokens: n(1)?,
        cache_read_tokens: n(2)?,
        cache_write_tokens: n(3)?,
        // Every report without a cost: unknown; some without: the others', partial.
        cost_micros: (uncosted < reports).then_some(cost),
        cost_partial: uncosted > 0 && uncosted < reports,
        model: None,
    };
    Ok((usage, reports))
}

fn add_to_hours(tx: &Transaction<'_>, task: i64, usage: &Usage, hour: i64) -> rusqlite::Result<()> {
    let (agent, sender): (String, String) = tx.query_row(
        "SELECT agent, sender FROM tasks WHERE id = ?1",
        [task],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    tx.execute(
        "INSERT INTO usage_hours (agent, hour, sender, model, input, output, cache_read, cache_write, cost_micros, uncosted, reports)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 1)
         ON CONFLICT (agent, hour, sender, model) DO UPDATE SET
           input = input + excluded.input, output = output + excluded.output,
           cache_read = cache_read + excluded.cache_read, cache_write = cache_write + excluded.cache_write,
           cost_micros = cost_micros + excluded.cost_micros, uncosted = uncosted + excluded.uncosted,
           reports = reports + 1",
        params![
            agent,
            hour,
            sender.to_ascii_lowercase(),
            usage.model.as_deref().unwrap_or(""),
            usage.input_tokens as i64,
            usage.output_tokens as i64,
            usage.cache_read_tokens as i64,
            usage.cache_write_tokens as i64,
            usage.cost_micros.unwrap_or(0) as i64,
            i64::from(usage.cost_micros.is_none()),
        ],
    )
    .map(drop)
}

impl Journal {
    /// Records one usage report of run `run` of task `task` (the journal's row id). Returns
    /// false when a report with this key was already counted for that run.
    pub fn record_usage(
        &self,
        task: i64,
        run: u32,
        key: &str,
        usage: &Usage,
        at: SystemTime,
    ) -> Result<bool, JournalError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let added = tx.execute(
                "INSERT INTO usage (task, run, key, input, output, cache_read, cache_write, cost_micros, model, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT (task, run, key) DO NOTHING",
                params![
                    task,
                    run,
                    key,
                    usage.input_tokens as i64,
                    usage.output_tokens as i64,
                    usage.cache_read_tokens as i64,
                    usage.cache_write_tokens as i64,
                    usage.cost_micros.map(|c| c as i64),
                    usage.model,
                    millis(at),
                ],
            )? == 1;
            if added {
                add_to_hours(&tx, task, usage, hour_of(at))?;
            }
            tx.commit()?;
            Ok(added)
        })
    }

    /// What task `task` cost over all its runs; `None` when its agent reported nothing.
    pub fn task_usage(&self, task: i64) -> Result<Option<Usage>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {SUM_COLUMNS}, MIN(model), COUNT(DISTINCT COALESCE(model, ''))
                 FROM (SELECT *, cost_micros IS NULL AS uncosted, 1 AS reports FROM usage WHERE task = ?1)"
            ))?;
            stmt.query_row([task], |r| {
                let (mut usage, reports) = read_sum(r, 0)?;
                let models: i64 = r.get(8)?;
                usage.model = if models == 1 { r.get(7)? } else { None };
                Ok((reports > 0).then_some(usage))
            })
        })
    }

    /// What `who` spent in the hours from `from` up to (not including) `to`; all spending
    /// when `who` names nobody. Read from an index, a month's hours at most per budget.
    pub fn spent(
        &self,
        who: Spender<'_>,
        from: SystemTime,
        to: SystemTime,
    ) -> Result<Usage, JournalError> {
        let sender = who.sender.map(str::to_ascii_lowercase);
        let (sql, key): (&str, Vec<&str>) = match (who.agent, sender.as_deref()) {
            (Some(agent), Some(sender)) => (SPENT_AGENT_SENDER, vec![agent, sender]),
            (Some(agent), None) => (SPENT_AGENT, vec![agent]),
            (None, Some(sender)) => (SPENT_SENDER, vec![sender]),
            (None, None) => (SPENT_ALL, vec![]),
        };
        let hours = [hour_of(from), hour_of(to + Duration::from_secs(3599))];
        self.with(|c| {
            let mut stmt = c.prepare_cached(sql)?;
            let mut values: Vec<rusqlite::types::Value> =
                hours.iter().map(|h| (*h).into()).collect();
            values.extend(key.iter().map(|k| k.to_string().into()));
            stmt.query_row(rusqlite::params_from_iter(values), |r| {
                read_sum(r, 0).map(|(u, _)| u)
            })
        })
    }

    /// The hourly sums from `from` up to `to`, oldest first (for reports and charts).
    pub fn usage_hours(
        &self,
        from: SystemTime,
        to: SystemTime,
    ) -> Result<Vec<UsageHour>, JournalError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT agent, sender, model, hour, {SUM_COLUMNS} FROM usage_hours
                 WHERE hour >= ?1 AND hour < ?2 GROUP BY agent, hour, sender, model ORDER BY hour"
            ))?;
            let rows = stmt.query_map(
                params![hour_of(from), hour_of(to + Duration::from_secs(3599))],
                |r| {
                    let (mut usage, reports) = read_sum(r, 4)?;
                    let model: String = r.get(2)?;
                    usage.model = (!model.is_empty()).then(|| model.clone());
                    Ok(UsageHour {
                        agent: r.get(0)?,
                        sender: r.get(1)?,
                        model,
                        hour: r.get(3)?,
                        usage,
                        reports,
                    })
                },
            )?;
            rows.collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::journal::{NewTask, TaskState};

    fn task(j: &Journal, key: &str, sender: &str) -> i64 {
        let new = NewTask {
            agent: "coder",
            message_key: key,
            sender,
            task_id: key,
            session_key: None,
            state: TaskState::Received,
            admitted: true,
            mail: "{}",
            reason: None,
            chain: None,
        };
        j.record(&new, None).unwrap().unwrap()
    }

    fn report(input: u64, cost: Option<u64>) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: 1,
            cost_micros: cost,
            model: Some("m".into()),
            ..Usage::default()
        }
    }

    #[test]
    fn a_report_seen_twice_counts_once_and_a_new_run_counts_again() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite3")).unwrap();
        let (a, b) = (task(&j, "a", "Ann@x.org"), task(&j, "b", "bob@x.org"));
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 * 3600);
        assert_eq!(j.task_usage(a).unwrap(), None, "nothing reported: unknown");
        assert!(j
            .record_usage(a, 1, "msg_1", &report(10, Some(5)), at)
            .unwrap());
        assert!(!j
            .record_usage(a, 1, "msg_1", &report(10, Some(5)), at)
            .unwrap());
        assert!(j.record_usage(a, 2, "msg_1", &report(7, None), at).unwrap());
        assert!(j
            .record_usage(b, 1, "t", &report(100, Some(1)), at)
            .unwrap());
        let sum = j.task_usage(a).unwrap().unwrap();
        assert_eq!((sum.input_tokens, sum.output_tokens), (17, 2));
        assert_eq!((sum.cost_micros, sum.cost_partial), (Some(5), true));
        assert_eq!(sum.model.as_deref(), Some("m"));
        let hour = Duration::from_secs(3600);
        let who = |agent, sender| Spender { agent, sender };
        let ann = j
            .spent(who(None, Some("ann@x.org")), at, at + hour)
            .unwrap();
        assert_eq!(ann.input_tokens, 17);
        let all = j.spent(who(Some("coder"), None), at, at + hour).unwrap();
        assert_eq!(all.input_tokens, 117);
        let bob = j
            .spent(who(Some("coder"), Some("BOB@x.org")), at, at + hour)
            .unwrap();
        assert_eq!((bob.input_tokens, bob.cost_micros), (100, Some(1)));
        let later = j
            .spent(who(Some("coder"), None), at + hour, at + 2 * hour)
            .unwrap();
        assert_eq!((later.input_tokens, later.cost_micros), (0, None));
        assert_eq!(j.usage_hours(at, at + hour).unwrap().len(), 2);
    }
}
