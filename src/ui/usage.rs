//! What the agents' model calls cost, read from the journal's hourly sums
//! ([`Journal::usage_hours`], [`Journal::spent`]): grouped for the `usage` report (by agent,
//! sender, model or day), per agent for `status`, and per agent and per sender, today and hour
//! by hour, for the live view. Days and hours are UTC.
//!
//! Only the hourly sums are read: a month is at most 744 hours per agent, sender and model,
//! whatever the number of tasks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use crate::dispatch::journal::{Spender, UsageHour};
use crate::dispatch::{Journal, JournalError};
use crate::protocol::usage_wire;
use crate::protocol::Usage;

/// What a report's rows are grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    Agent,
    Sender,
    Model,
    Day,
}

impl By {
    pub fn as_str(self) -> &'static str {
        match self {
            By::Agent => "agent",
            By::Sender => "sender",
            By::Model => "model",
            By::Day => "day",
        }
    }

    pub fn parse(text: &str) -> Option<By> {
        [By::Agent, By::Sender, By::Model, By::Day]
            .into_iter()
            .find(|b| b.as_str() == text)
    }

    fn key(self, h: &UsageHour) -> String {
        match self {
            By::Agent => h.agent.clone(),
            By::Sender => h.sender.clone(),
            By::Model if h.model.is_empty() => "(none named)".to_string(),
            By::Model => h.model.clone(),
            By::Day => day_text(h.hour.div_euclid(24)),
        }
    }
}

/// One row of a report: a group's sum and how many reports made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub key: String,
    pub usage: Usage,
    pub reports: u64,
}

/// A report: its rows (sorted by key), their total, and the models whose reports had no
/// cost (neither stated by the agent nor priced).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub by: By,
    pub rows: Vec<Row>,
    pub total: Row,
    pub uncosted_models: Vec<String>,
}

/// Groups the hourly sums by `by`.
pub fn report(hours: &[UsageHour], by: By) -> Report {
    let mut groups: BTreeMap<String, Row> = BTreeMap::new();
    let mut total = Row {
        key: "total".to_string(),
        usage: Usage::default(),
        reports: 0,
    };
    let mut uncosted = BTreeSet::new();
    for h in hours {
        let key = by.key(h);
        let row = groups.entry(key.clone()).or_insert_with(|| Row {
            key,
            usage: Usage::default(),
            reports: 0,
        });
        add(row, h);
        add(&mut total, h);
        if h.usage.cost_micros.is_none() || h.usage.cost_partial {
            uncosted.insert(if h.model.is_empty() {
                "(none named)".to_string()
            } else {
                h.model.clone()
            });
        }
    }
    Report {
        by,
        rows: groups.into_values().collect(),
        total,
        uncosted_models: uncosted.into_iter().collect(),
    }
}

fn add(row: &mut Row, h: &UsageHour) {
    if row.reports == 0 {
        row.usage = h.usage.clone();
    } else {
        row.usage.add(&h.usage);
    }
    row.reports += h.reports;
}

/// The report as JSON: `by`, `rows` (`key`, `reports` and the [`usage_wire::to_json`]
/// fields), `total`, `uncostedModels`.
pub fn report_json(report: &Report, from: SystemTime, to: SystemTime) -> Value {
    let row = |r: &Row| {
        let mut v = usage_wire::to_json(&r.usage);
        v["key"] = json!(r.key);
        v["reports"] = json!(r.reports);
        v
    };
    json!({
        "from": crate::protocol::time::format_utc(from),
        "until": crate::protocol::time::format_utc(to),
        "by": report.by.as_str(),
        "rows": report.rows.iter().map(row).collect::<Vec<_>>(),
        "total": row(&report.total),
        "uncostedModels": report.uncosted_models,
    })
}

/// One CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180), and a
/// leading `=`, `+`, `-` or `@` made inert for spreadsheets (a sender's address is theirs to
/// choose).
pub fn csv_field(text: &str) -> String {
    let text = match text.chars().next() {
        Some('=' | '+' | '-' | '@') => format!("'{text}"),
        _ => text.to_string(),
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// The report as CSV: a header line, one line per row, then the total. An unknown cost is
/// the word `unknown`, never an empty field or 0.
pub fn report_csv(report: &Report) -> String {
    let mut out = format!(
        "{},reports,input_tokens,output_tokens,cache_read_tokens,cache_write_tokens,total_tokens,cost_usd,cost_partial\n",
        report.by.as_str()
    );
    for r in report.rows.iter().chain([&report.total]) {
        let u = &r.usage;
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            csv_field(&r.key),
            r.reports,
            u.input_tokens,
            u.output_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens,
            u.total_tokens(),
            u.cost_micros
                .map_or("unknown".to_string(), usage_wire::usd_text),
            u.cost_partial
        ));
    }
    out
}

/// Days since the Unix epoch as `YYYY-MM-DD`.
pub fn day_text(day: i64) -> String {
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs((day.max(0) as u64) * 86_400);
    crate::protocol::time::format_utc(at)
        .get(..10)
        .unwrap_or_default()
        .to_string()
}

/// The start of the UTC day `now` falls in.
pub fn day_start(now: SystemTime) -> SystemTime {
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs - secs % 86_400)
}

/// What `agent` spent today (UTC), for `status`: null when it reported nothing.
pub fn agent_today(journal: &Journal, agent: &str, now: SystemTime) -> Result<Value, JournalError> {
    let who = Spender {
        agent: Some(agent),
        sender: None,
    };
    let spent = journal.spent(who, day_start(now), now)?;
    let nothing = spent.total_tokens() == 0 && spent.cost_micros.is_none();
    Ok(match nothing {
        true => Value::Null,
        false => usage_wire::to_json(&spent),
    })
}

/// The live view's usage: today's sums per agent and per sender, and the last 24 hours hour
/// by hour (`hours`: oldest first, 24 of them, each with its sum and per agent and sender).
pub fn live(journal: &Journal, now: SystemTime) -> Result<Value, JournalError> {
    let hour_secs = Duration::from_secs(3600);
    let this_hour = crate::dispatch::journal::hour_of(now);
    let from = SystemTime::UNIX_EPOCH + hour_secs * (this_hour - 23).max(0) as u32;
    let hours = journal.usage_hours(from.min(day_start(now)), now)?;
    let today_hour = crate::dispatch::journal::hour_of(day_start(now));
    let today: Vec<UsageHour> = hours
        .iter()
        .filter(|h| h.hour >= today_hour)
        .cloned()
        .collect();
    let sums = |rows: &[UsageHour], by: By| -> Value {
        report(rows, by)
            .rows
            .iter()
            .map(|r| (r.key.clone(), usage_wire::to_json(&r.usage)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let chart: Vec<Value> = (this_hour - 23..=this_hour)
        .map(|hour| {
            let rows: Vec<UsageHour> = hours.iter().filter(|h| h.hour == hour).cloned().collect();
            let total = report(&rows, By::Agent).total;
            json!({"hour": hour, "startMs": hour * 3_600_000,
                   "usage": usage_wire::to_json(&total.usage),
                   "agents": sums(&rows, By::Agent), "senders": sums(&rows, By::Sender)})
        })
        .collect();
    let today_report = report(&today, By::Agent);
    Ok(json!({
        "day": day_text(today_hour.div_euclid(24)),
        "today": usage_wire::to_json(&today_report.total.usage),
        "agents": sums(&today, By::Agent),
        "senders": sums(&today, By::Sender),
        "uncostedModels": today_report.uncosted_models,
        "hours": chart,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hour(
        agent: &str,
        sender: &str,
        model: &str,
        hour: i64,
        tokens: u64,
        cost: Option<u64>,
    ) -> UsageHour {
        UsageHour {
            agent: agent.into(),
            sender: sender.into(),
            model: model.into(),
            hour,
            usage: Usage {
                input_tokens: tokens,
                output_tokens: 1,
                cost_micros: cost,
                model: (!model.is_empty()).then(|| model.to_string()),
                ..Usage::default()
            },
            reports: 2,
        }
    }

    #[test]
    fn a_report_groups_sums_and_names_the_models_without_cost() {
        let hours = [
            hour("coder", "ann@x", "m1", 10, 100, Some(5)),
            hour("coder", "bob@x", "m2", 10, 50, None),
            hour("writer", "ann@x", "m1", 40, 10, Some(1)),
            hour("writer", "ann@x", "", 41, 1, None),
        ];
        let by_agent = report(&hours, By::Agent);
        let keys: Vec<&str> = by_agent.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["coder", "writer"]);
        assert_eq!(by_agent.rows[0].usage.input_tokens, 150);
        assert_eq!(
            (
                by_agent.rows[0].usage.cost_micros,
                by_agent.rows[0].usage.cost_partial
            ),
            (Some(5), true)
        );
        assert_eq!(by_agent.total.usage.input_tokens, 161);
        assert_eq!(by_agent.total.usage.output_tokens, 4);
        assert_eq!(by_agent.total.reports, 8);
        assert_eq!(by_agent.total.usage.cost_micros, Some(6));
        assert_eq!(by_agent.uncosted_models, ["(none named)", "m2"]);
        let by_day = report(&hours, By::Day);
        let days: Vec<&str> = by_day.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(days, ["1970-01-01", "1970-01-02"]);
        let by_sender = report(&hours, By::Sender);
        assert_eq!(by_sender.rows[1].key, "bob@x");
        assert_eq!(by_sender.rows[1].usage.cost_micros, None, "unknown, not 0");
        let by_model = report(&hours, By::Model);
        assert_eq!(by_model.rows.len(), 3);
        // The total is the sum of the rows whatever the grouping.
        for r in [&by_day, &by_sender, &by_model] {
            assert_eq!(r.total, by_agent.total);
        }
    }

    #[test]
    fn csv_quotes_what_would_break_a_field_and_says_unknown() {
        assert_eq!(csv_field("plain@x.org"), "plain@x.org");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
        assert_eq!(csv_field("=HYPERLINK(1)"), "'=HYPERLINK(1)");
        let hours = [hour("c", "\"odd\",name@x", "m", 0, 3, None)];
        let csv = report_csv(&report(&hours, By::Sender));
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "sender,reports,input_tokens,output_tokens,cache_read_tokens,cache_write_tokens,total_tokens,cost_usd,cost_partial");
        assert_eq!(lines[1], "\"\"\"odd\"\",name@x\",2,3,1,0,0,4,unknown,false");
        assert_eq!(lines[2], "total,2,3,1,0,0,4,unknown,false");
    }

    #[test]
    fn the_live_view_has_today_per_agent_and_sender_and_24_hours() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.sqlite3")).unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 5 * 3600);
        let v = live(&j, now).unwrap();
        assert_eq!(v["hours"].as_array().unwrap().len(), 24);
        assert_eq!(v["today"]["totalTokens"], 0);
        assert_eq!(v["today"]["costUsd"], "unknown");
        assert_eq!(agent_today(&j, "coder", now).unwrap(), Value::Null);
        assert_eq!(day_text(20_000), "2024-10-04");
    }
}
