//! `aamp-bridge usage`: what the agents' model calls cost over a span (this month by default),
//! grouped by agent, sender, model or day, from the journal's hourly sums (read as `tasks`
//! reads the journal: the bridge may run or not).

use std::time::{Duration, SystemTime};

use crate::output::outln;
use crate::ui::usage::{self as report, By};

use super::*;

/// `--since`/`--until` as given: a date (`2026-11-01`), an RFC 3339 time, or a span back from
/// now (`90m`, `12h`, `7d`, `2w`).
pub(super) fn parse_when(text: &str, now: SystemTime) -> anyhow::Result<SystemTime> {
    let t = text.trim();
    if let Some(at) =
        protocol::time::parse(t).or_else(|| protocol::time::parse(&format!("{t}T00:00:00Z")))
    {
        return Ok(at);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .with_context(|| format!("{text:?}: a date (2026-11-01), a time (2026-11-01T08:00:00Z) or a span back from now (90m, 12h, 7d, 2w)"))?;
    let secs = match unit {
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => bail!("{text:?}: the span's unit is one of m, h, d, w (7d: the last seven days)"),
    };
    Ok(now
        .checked_sub(Duration::from_secs(n.saturating_mul(secs)))
        .unwrap_or(SystemTime::UNIX_EPOCH))
}

/// The start of the UTC month `now` falls in.
pub(super) fn month_start(now: SystemTime) -> SystemTime {
    let text = protocol::time::format_utc(now);
    protocol::time::parse(&format!("{}-01T00:00:00Z", &text[..7.min(text.len())]))
        .unwrap_or_else(|| report::day_start(now))
}

pub(super) struct Args {
    pub since: Option<String>,
    pub until: Option<String>,
    pub by: String,
    pub json: bool,
    pub csv: bool,
}

pub(super) fn usage(config: &LoadedConfig, args: Args) -> anyhow::Result<i32> {
    let now = SystemTime::now();
    let by = By::parse(&args.by)
        .with_context(|| format!("--by {:?}: one of agent, sender, model, day", args.by))?;
    let from = match &args.since {
        Some(s) => parse_when(s, now)?,
        None => month_start(now),
    };
    let to = match &args.until {
        Some(u) => parse_when(u, now)?,
        None => now,
    };
    if to < from {
        bail!("--until is before --since: nothing in between");
    }
    let hours = match config.state().journal().exists() {
        true => open_journal(config)?.usage_hours(from, to)?,
        // Before the first start there is no journal, and nothing was spent.
        false => Vec::new(),
    };
    let report = report::report(&hours, by);
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report::report_json(&report, from, to))?
        );
    } else if args.csv {
        crate::output::out!("{}", report::report_csv(&report));
    } else {
        print_report(&report, from, to);
    }
    Ok(0)
}

fn print_report(report: &report::Report, from: SystemTime, to: SystemTime) {
    outln!(
        "usage from {} to {} (UTC hours), by {}",
        protocol::time::format_utc(from),
        protocol::time::format_utc(to),
        report.by.as_str()
    );
    if report.rows.is_empty() {
        outln!("nothing reported in that time");
        return;
    }
    let width = report
        .rows
        .iter()
        .map(|r| r.key.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    outln!(
        "{:<width$}  {:>12} {:>12} {:>12} {:>12} {:>14}  {}",
        report.by.as_str(),
        "input",
        "output",
        "cache read",
        "cache write",
        "all tokens",
        "cost"
    );
    for r in report.rows.iter().chain([&report.total]) {
        let u = &r.usage;
        outln!(
            "{:<width$}  {:>12} {:>12} {:>12} {:>12} {:>14}  {}",
            r.key,
            u.input_tokens,
            u.output_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens,
            u.total_tokens(),
            u.cost_text()
        );
    }
    if !report.uncosted_models.is_empty() {
        outln!(
            "no cost known for some reports of: {} (the agent stated none and the config has no price for the model; \"unknown\" is not 0, and \"+\" marks a sum with such parts)",
            report.uncosted_models.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_reads_dates_times_and_spans() {
        let now = protocol::time::parse("2026-12-03T17:10:00Z").unwrap();
        let at = |t: &str| protocol::time::format_utc(parse_when(t, now).unwrap());
        assert_eq!(at("2026-11-01"), "2026-11-01T00:00:00Z");
        assert_eq!(at("2026-11-01T08:00:00Z"), "2026-11-01T08:00:00Z");
        assert_eq!(at("7d"), "2026-11-26T17:10:00Z");
        assert_eq!(at("12h"), "2026-12-03T05:10:00Z");
        assert_eq!(at("90m"), "2026-12-03T15:40:00Z");
        assert!(parse_when("7y", now).is_err());
        assert!(parse_when("yesterday", now).is_err());
        let month = protocol::time::format_utc(month_start(now));
        assert_eq!(month, "2026-12-01T00:00:00Z");
    }
}
