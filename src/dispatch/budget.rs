//! Budgets in tokens and money, and the price table: a report without a stated cost priced
//! before it is journaled; the spent figures read from the journal's hourly sums (an index
//! read per budget and period, never a scan of history); a task over budget refused before it
//! starts (at admission and again when its slot comes), and a running task that crosses a hard
//! budget stopped with the budget's words.
//!
//! Periods are UTC days and UTC months: the journal's hourly sums are UTC hours, and jiff is
//! built without a time zone database here, so a local day could not be told honestly.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use super::journal::{Journal, JournalError, Spender};
use super::{Engine, Task};
use crate::backend::Backend;
use crate::config::{Budget, Price};
use crate::protocol::Usage;
use crate::runner::{RunError, StreamEvent};

/// A model's price: millionths of a dollar per million tokens of each kind (input, output,
/// cache read, cache write).
type Rates = [u64; 4];

/// The config's `[prices]`: exact model names first, else the longest prefix (`name*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prices {
    exact: BTreeMap<String, Rates>,
    prefixes: Vec<(String, Rates)>,
}

fn micros_of(usd: f64) -> u64 {
    crate::protocol::usage::micros_from_usd(usd).unwrap_or(0)
}

impl Prices {
    pub fn new(table: &BTreeMap<String, Price>) -> Prices {
        let mut prices = Prices::default();
        for (model, p) in table {
            let input = micros_of(p.input_per_million);
            let rates = [
                input,
                micros_of(p.output_per_million),
                p.cache_read_per_million.map_or(input, micros_of),
                p.cache_write_per_million.map_or(input, micros_of),
            ];
            match model.strip_suffix('*') {
                Some(prefix) => prices.prefixes.push((prefix.to_string(), rates)),
                None => {
                    prices.exact.insert(model.clone(), rates);
                }
            }
        }
        prices
            .prefixes
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        prices
    }

    fn rates(&self, model: &str) -> Option<&Rates> {
        self.exact.get(model).or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| model.starts_with(p.as_str()))
                .map(|(_, r)| r)
        })
    }

    /// Whether the table has a price for `model`.
    pub fn knows(&self, model: &str) -> bool {
        self.rates(model).is_some()
    }

    /// The report with its cost: the agent's own when it stated one, else from the table
    /// when its model has a price, else still unknown.
    pub fn priced(&self, usage: &Usage) -> Usage {
        let mut priced = usage.clone();
        if priced.cost_micros.is_none() {
            if let Some(rates) = usage.model.as_deref().and_then(|m| self.rates(m)) {
                priced.cost_micros = Some(cost_micros(usage, rates));
            }
        }
        priced
    }
}

/// What `usage`'s tokens cost at `rates`, in millionths of a dollar: summed exactly, rounded
/// once (to the nearest, halves up).
fn cost_micros(usage: &Usage, rates: &Rates) -> u64 {
    let tokens = [
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
    ];
    let sum: u128 = tokens
        .iter()
        .zip(rates)
        .map(|(t, r)| u128::from(*t) * u128::from(*r))
        .sum();
    u64::try_from((sum + 500_000) / 1_000_000).unwrap_or(u64::MAX)
}

/// Whose spending a budget counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The agent's, every sender together (`[agents.budget]`).
    Agent,
    /// Each sender's on this agent (`[agents.sender_budget]`).
    SenderHere,
    /// Each sender's on every agent together (the top-level `[sender_budget]`).
    Sender,
}

/// A budget's period: a UTC day, a UTC month.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    Day,
    Month,
}

/// What a budget counts: tokens of every kind, or millionths of a dollar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    Tokens,
    Micros,
}

/// One limit of one budget table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub scope: Scope,
    pub period: Period,
    pub measure: Measure,
    pub max: u64,
    pub hard: bool,
}

/// The start of the period `now` is in, and its end (when the budget resets).
pub fn period_of(period: Period, now: SystemTime) -> (SystemTime, SystemTime) {
    const DAY: u64 = 24 * 3600;
    let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let day_start = secs - secs % DAY;
    let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
    match period {
        Period::Day => (at(day_start), at(day_start + DAY)),
        Period::Month => {
            let utc = jiff::tz::Offset::UTC;
            let today = utc
                .to_datetime(crate::protocol::time::timestamp(at(day_start)))
                .date();
            let first = today.first_of_month();
            let (y, m) = match first.month() {
                12 => (first.year() + 1, 1),
                m => (first.year(), m + 1),
            };
            let next = jiff::civil::Date::new(y, m, 1)
                .ok()
                .and_then(|d| utc.to_timestamp(d.at(0, 0, 0, 0)).ok());
            let days_in = u64::from(today.day().unsigned_abs()) - 1;
            let start = day_start - days_in * DAY;
            let end = next
                .and_then(|t| SystemTime::try_from(t).ok())
                .unwrap_or(at(start + 31 * DAY));
            (at(start), end)
        }
    }
}

/// What was spent in the current period of each budget read, by scope and period.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spent(Vec<(Scope, Period, Usage)>);

impl Spent {
    /// This sum with `usage` as what `scope` spent in `period`.
    pub fn with(mut self, scope: Scope, period: Period, usage: Usage) -> Spent {
        self.0.push((scope, period, usage));
        self
    }

    fn of(&self, scope: Scope, period: Period) -> Option<&Usage> {
        self.0
            .iter()
            .find(|(s, p, _)| *s == scope && *p == period)
            .map(|(_, _, u)| u)
    }
}

/// An agent's budgets (its own, each sender's on it, each sender's everywhere) and prices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budgets {
    limits: Vec<Limit>,
    pub prices: Prices,
}

fn limits_of(scope: Scope, budget: &Budget) -> impl Iterator<Item = Limit> + '_ {
    let usd = |v: Option<f64>| v.map(micros_of);
    [
        (Period::Day, Measure::Tokens, budget.tokens_per_day),
        (Period::Month, Measure::Tokens, budget.tokens_per_month),
        (Period::Day, Measure::Micros, usd(budget.usd_per_day)),
        (Period::Month, Measure::Micros, usd(budget.usd_per_month)),
    ]
    .into_iter()
    .filter_map(move |(period, measure, max)| {
        Some(Limit {
            scope,
            period,
            measure,
            max: max?,
            hard: budget.hard,
        })
    })
}

impl Budgets {
    pub fn new(
        agent: Option<&Budget>,
        each_sender: Option<&Budget>,
        sender_everywhere: Option<&Budget>,
        prices: &BTreeMap<String, Price>,
    ) -> Budgets {
        let tables = [
            (Scope::Agent, agent),
            (Scope::SenderHere, each_sender),
            (Scope::Sender, sender_everywhere),
        ];
        let limits = tables
            .into_iter()
            .filter_map(|(scope, b)| Some(limits_of(scope, b?)))
            .flatten()
            .collect();
        Budgets {
            limits,
            prices: Prices::new(prices),
        }
    }

    /// Whether any limit (any hard one, with `hard_only`) is set.
    fn any(&self, hard_only: bool) -> bool {
        self.limits.iter().any(|l| l.hard || !hard_only)
    }

    /// What `sender` and `agent` spent in the current periods of the budgets (the hard ones,
    /// with `hard_only`): one index read per scope and period, none without budgets.
    pub fn read(
        &self,
        journal: &Journal,
        (agent, sender): (&str, &str),
        now: SystemTime,
        hard_only: bool,
    ) -> Result<Spent, JournalError> {
        let mut spent = Spent::default();
        for limit in self.limits.iter().filter(|l| l.hard || !hard_only) {
            if spent.of(limit.scope, limit.period).is_some() {
                continue;
            }
            let who = match limit.scope {
                Scope::Agent => Spender {
                    agent: Some(agent),
                    sender: None,
                },
                Scope::SenderHere => Spender {
                    agent: Some(agent),
                    sender: Some(sender),
                },
                Scope::Sender => Spender {
                    agent: None,
                    sender: Some(sender),
                },
            };
            let (from, to) = period_of(limit.period, now);
            let usage = journal.spent(who, from, to)?;
            spent.0.push((limit.scope, limit.period, usage));
        }
        Ok(spent)
    }

    /// The first budget (hard, with `hard_only`) that `spent` used up, with its words.
    pub fn over(
        &self,
        spent: &Spent,
        (agent, sender): (&str, &str),
        now: SystemTime,
        hard_only: bool,
    ) -> Option<Over> {
        self.limits
            .iter()
            .filter(|l| l.hard || !hard_only)
            .find_map(|limit| {
                let usage = spent.of(limit.scope, limit.period)?;
                let used = match limit.measure {
                    Measure::Tokens => usage.total_tokens(),
                    Measure::Micros => usage.cost_micros.unwrap_or(0),
                };
                (used >= limit.max).then(|| Over {
                    limit: *limit,
                    used,
                    cost_incomplete: usage.cost_partial
                        || (usage.cost_micros.is_none() && usage.total_tokens() > 0),
                    agent: agent.to_string(),
                    sender: sender.to_string(),
                    now,
                    resets: period_of(limit.period, now).1,
                })
            })
    }
}

/// A budget used up: which, what was spent, when it resets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Over {
    pub limit: Limit,
    pub used: u64,
    /// Money spent counts only reports with a known cost, and some had none.
    pub cost_incomplete: bool,
    agent: String,
    sender: String,
    now: SystemTime,
    pub resets: SystemTime,
}

/// `1234567` as `1,234,567`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Dollars for people: cents when whole cents say it, else four decimals.
fn dollars(micros: u64) -> String {
    match micros % 10_000 {
        0 => format!(
            "${}.{:02}",
            grouped(micros / 1_000_000),
            micros % 1_000_000 / 10_000
        ),
        _ => format!("${:.4}", micros as f64 / 1_000_000.0),
    }
}

/// A wait for people: `3 d 4 h`, `6 h 55 min`, `12 min` (rounded up to the minute).
fn wait_text(wait: Duration) -> String {
    let minutes = wait.as_secs().div_ceil(60).max(1);
    let (d, h, m) = (minutes / 1440, minutes / 60 % 24, minutes % 60);
    match (d, h) {
        (0, 0) => format!("{m} min"),
        (0, _) => format!("{h} h {m} min"),
        _ => format!("{d} d {h} h"),
    }
}

impl Over {
    fn amount(&self, n: u64) -> String {
        match self.limit.measure {
            Measure::Tokens => format!("{} tokens", grouped(n)),
            Measure::Micros => dollars(n),
        }
    }

    /// Whose budget, its size and period: "agent coder's budget of $5.00 a day (UTC)".
    fn budget_text(&self) -> String {
        let kind = if self.limit.hard {
            "hard budget"
        } else {
            "budget"
        };
        let whose = match self.limit.scope {
            Scope::Agent => format!("agent {}'s {kind}", self.agent),
            Scope::SenderHere => format!("sender {}'s {kind} on agent {}", self.sender, self.agent),
            Scope::Sender => format!("sender {}'s {kind} on all agents together", self.sender),
        };
        let per = match self.limit.period {
            Period::Day => "a day (UTC)",
            Period::Month => "a month (UTC)",
        };
        format!("{whose} of {} {per}", self.amount(self.limit.max))
    }

    /// What was spent and when the budget resets.
    fn spent_text(&self) -> String {
        let this = match self.limit.period {
            Period::Day => "today",
            Period::Month => "this month",
        };
        let unknown = if self.limit.measure == Measure::Micros && self.cost_incomplete {
            " (counting only what has a known cost: some of the agent's reports stated none and their model has no price in the config's [prices])"
        } else {
            ""
        };
        let wait = self.resets.duration_since(self.now).unwrap_or_default();
        format!(
            "{} spent {this}{unknown}; it resets at {} (in {})",
            self.amount(self.used),
            crate::protocol::time::format_utc(self.resets),
            wait_text(wait)
        )
    }

    /// Why a task is not started.
    pub fn refusal(&self) -> String {
        format!(
            "over budget: {} is used up: {}; dispatch again after that",
            self.budget_text(),
            self.spent_text()
        )
    }

    /// Why a running task was stopped.
    pub fn stop(&self) -> String {
        format!(
            "stopped over budget: {} was crossed while the task ran: {}",
            self.budget_text(),
            self.spent_text()
        )
    }
}

/// One run's watch on its budgets: prices each report, and stops the run (through its own
/// cancel token) once a hard budget is crossed, keeping why.
pub(super) struct Guard<'a> {
    budgets: &'a Budgets,
    agent: &'a str,
    sender: &'a str,
    stop: CancellationToken,
    why: std::sync::Arc<OnceLock<String>>,
    /// The task's journal row and the tokens its delegation chain left it (`X-AAMP-Budget-Tokens`).
    chain: Option<(i64, u64)>,
}

impl<'a> Guard<'a> {
    /// The guard of a run whose own token is a child of `cancel`.
    pub fn new(
        budgets: &'a Budgets,
        (agent, sender): (&'a str, &'a str),
        cancel: &CancellationToken,
    ) -> Self {
        Guard {
            budgets,
            agent,
            sender,
            stop: cancel.child_token(),
            why: Default::default(),
            chain: None,
        }
    }

    /// The guard also stops task `row` once it spent the `tokens` its delegation chain left it.
    pub fn with_chain(mut self, row: i64, tokens: Option<u64>) -> Self {
        self.chain = tokens.map(|t| (row, t));
        self
    }

    /// Stops the run at its delegation chain's `deadline` (`X-AAMP-Deadline`), if it has one,
    /// until the returned watch is dropped.
    pub fn stop_at(&self, deadline: Option<&str>) -> Option<DeadlineWatch> {
        let text = deadline?.to_string();
        let at = crate::protocol::time::parse(&text)?;
        let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
        let (stop, why) = (self.stop.clone(), self.why.clone());
        Some(DeadlineWatch(tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let said = format!(
                "deadline: this task's delegation chain had to be done by {text}; it was stopped"
            );
            tracing::info!(reason = %said, "a delegation chain's deadline passed: stopping the task");
            let _ = why.set(said);
            stop.cancel();
        })))
    }

    /// After a report was counted: the chain's budget spent stops the run.
    fn chain_spent(&self, journal: &Journal) {
        let Some((row, budget)) = self.chain else {
            return;
        };
        let spent = match journal.task_usage(row) {
            Ok(usage) => usage.map(|u| u.total_tokens()).unwrap_or(0),
            Err(e) => {
                tracing::warn!(error = %e, "could not read what the task spent against its chain's budget");
                return;
            }
        };
        if spent >= budget {
            let why = format!(
                "over budget: this task's delegation chain left it {budget} tokens, and it spent {spent}; it was stopped"
            );
            tracing::info!(reason = %why, "a delegation chain's budget was spent: stopping the task");
            let _ = self.why.set(why);
            self.stop.cancel();
        }
    }

    /// The token the run is cancelled by: `cancel`'s, or the guard's own.
    pub fn token(&self) -> &CancellationToken {
        &self.stop
    }

    /// The run's outcome, a stop of the guard's own said with its budget's words (a cancel
    /// by the dispatcher or the bridge's shutdown stays a cancel).
    pub fn explain<T>(
        &self,
        outcome: Result<T, RunError>,
        cancel: &CancellationToken,
    ) -> Result<T, RunError> {
        match (outcome, self.why.get()) {
            (Err(RunError::Cancelled), Some(why)) if !cancel.is_cancelled() => {
                Err(RunError::Stopped(why.clone()))
            }
            (outcome, _) => outcome,
        }
    }

    /// A usage report with its cost from the price table, when the agent stated none.
    pub fn priced(&self, event: StreamEvent) -> StreamEvent {
        match event {
            StreamEvent::Usage { key, usage } if usage.cost_micros.is_none() => {
                StreamEvent::Usage {
                    key,
                    usage: self.budgets.prices.priced(&usage),
                }
            }
            other => other,
        }
    }

    /// After a report was counted: a hard budget crossed stops the run.
    pub fn counted(&self, journal: &Journal, now: SystemTime) {
        if self.why.get().is_none() {
            self.chain_spent(journal);
        }
        if !self.budgets.any(true) || self.why.get().is_some() {
            return;
        }
        let who = (self.agent, self.sender);
        let spent = match self.budgets.read(journal, who, now, true) {
            Ok(spent) => spent,
            Err(e) => {
                tracing::warn!(error = %e, "could not read what was spent against the hard budgets");
                return;
            }
        };
        if let Some(over) = self.budgets.over(&spent, who, now, true) {
            let why = over.stop();
            tracing::info!(reason = %why, "a hard budget was crossed: stopping the task");
            let _ = self.why.set(why);
            self.stop.cancel();
        }
    }
}

/// A run's watch on its chain's deadline; dropped when the run ends.
pub(super) struct DeadlineWatch(tokio::task::JoinHandle<()>);

impl Drop for DeadlineWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The models seen from `from` to `to` in reports with no stated cost that `prices` has no
/// price for (`""`: reports that named no model), by name: money budgets cannot count them.
pub fn unpriced_models(
    journal: &Journal,
    prices: &Prices,
    (from, to): (SystemTime, SystemTime),
) -> Result<Vec<String>, JournalError> {
    let mut models: Vec<String> = journal
        .usage_hours(from, to)?
        .into_iter()
        .filter(|h| h.usage.cost_micros.is_none() || h.usage.cost_partial)
        .filter(|h| h.model.is_empty() || !prices.knows(&h.model))
        .map(|h| h.model)
        .collect();
    models.sort();
    models.dedup();
    Ok(models)
}

impl<B: Backend> Engine<B> {
    /// Why `task` may not start now (a budget of its agent or its sender used up while it
    /// waited), if so. A journal that cannot be read lets it start, said in the log.
    pub(super) fn over_budget(&self, task: &Task) -> Option<String> {
        let spec = self.common.spec();
        if !spec.budgets.any(false) {
            return None;
        }
        let (now, who) = (
            SystemTime::now(),
            (spec.name.as_str(), task.env.from.as_str()),
        );
        match spec.budgets.read(&self.common.journal, who, now, false) {
            Ok(spent) => spec
                .budgets
                .over(&spent, who, now, false)
                .map(|o| o.refusal()),
            Err(e) => {
                tracing::warn!(error = %e, "could not read what was spent against the budgets; the task starts");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
