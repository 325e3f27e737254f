//! An agent's usage limit, told apart from a failure in the agent's own words and codes, with
//! when it resets when the agent said. Pure code: an error's text (and the time now) in, a
//! [`Limit`] out; `runner::cli` and `runner::acp` turn it into
//! [`RunError::UsageLimit`](crate::runner::RunError::UsageLimit).
//!
//! What each agent prints, read from the installed CLIs and their sources (nothing copied):
//! - Claude Code 2.1 (its bundled JS, and runs against `tests/hosts/model_api.py`): on a
//!   subscription, a stream-json `rate_limit_event` with `rate_limit_info.status` "rejected"
//!   and `resetsAt` (seconds since the epoch; read by `runner::stream`), then a `result` with
//!   `is_error`, `api_error_status` 429 and "You've hit your session limit · resets 5:58pm
//!   (UTC)" (or "… resets Dec 4, 5pm (Europe/Berlin)", a year when it is another year); with
//!   an API key, "API Error: Request rejected (429) · …" with no time. Older versions:
//!   "Claude AI usage limit reached|1733000000".
//! - Codex 0.171 (openai/codex `codex-rs/protocol/src/error.rs`, `UsageLimitReachedError`):
//!   "You've hit your usage limit. … try again at 5:58 PM." (the agent's local time; "Dec
//!   29th, 2025 10:15 PM" on another day; "try again later." without a time), as `error` and
//!   `turn.failed` events of `codex exec --json`; older: "… try again in 2 hours 5 minutes.".
//! - Gemini CLI 0.61 (`googleQuotaErrors.ts` in its bundle): a 429 RESOURCE_EXHAUSTED it gave
//!   up on: "[API Error: You have exhausted your daily quota on this model.]" (no time), or
//!   "… Suggested retry after 3592s." (a RetryInfo delay over its own 300 s retry cap); the
//!   API's own "Please retry in 12.5s." and "Quota exceeded for quota metric …".
//! - claude-agent-acp 0.49: `session/prompt` fails with -32603 "Internal error: " and Claude
//!   Code's text, `data.errorKind` "rate_limit" (see `runner::acp::outcome`).

use std::time::{Duration, SystemTime};

/// A usage limit an agent hit: its words, and when it said the limit resets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    pub said: String,
    pub resets: Option<SystemTime>,
}

/// The usage limit `text` (an agent's error, its stderr) tells of, if it tells of one; the
/// reset time read against `now`.
pub fn recognise(text: &str, now: SystemTime) -> Option<Limit> {
    let flat = text.replace(['\u{2019}', '\u{2018}'], "'");
    let lower = flat.to_lowercase();
    if !is_limit(&lower) {
        return None;
    }
    let said = said_line(&flat);
    let resets = epoch_after_bar(&flat)
        .or_else(|| claude_resets(&flat, now))
        .or_else(|| codex_resets(&flat, now))
        .or_else(|| delay_after(&lower, now));
    Some(Limit { said, resets })
}

/// The error a run that failed with `text` (its stream's error or its stderr) ends in: the
/// agent's usage limit when the text tells of one or its stream stated one (`stated`: the
/// reset time it gave, `Some(None)` for none), else `otherwise`.
pub(crate) fn or_failure(
    text: &str,
    stated: Option<Option<SystemTime>>,
    otherwise: crate::runner::RunError,
) -> crate::runner::RunError {
    let read = recognise(text, SystemTime::now());
    let limit = match (read, stated) {
        (Some(read), Some(resets)) => Limit {
            resets: resets.or(read.resets),
            ..read
        },
        (Some(read), None) => read,
        (None, Some(resets)) => Limit {
            said: text.trim().chars().take(300).collect(),
            resets,
        },
        (None, None) => return otherwise,
    };
    crate::runner::RunError::UsageLimit {
        said: limit.said,
        resets: limit.resets,
    }
}

/// Whether the (lower-cased) text tells of a usage limit rather than another failure.
fn is_limit(lower: &str) -> bool {
    const WORDS: &[&str] = &[
        "you've hit your",
        "usage limit reached",
        "usage_limit_reached",
        "usage limit has been reached",
        "request rejected (429)",
        "rate_limit_error",
        "api error: 429",
        "resource_exhausted",
        "exhausted your daily quota",
        "exceeded your current quota",
        "quota exceeded for quota metric",
        "suggested retry after",
    ];
    WORDS.iter().any(|w| lower.contains(w))
}

/// The line that says it (the first that names the limit), at most 300 characters.
fn said_line(text: &str) -> String {
    let line = text
        .lines()
        .map(|l| {
            l.trim()
                .trim_start_matches("[API Error: ")
                .trim_end_matches(']')
        })
        .find(|l| is_limit(&l.to_lowercase()))
        .unwrap_or(text.trim());
    line.chars().take(300).collect()
}

/// "usage limit reached|1733000000": the epoch after the bar (Claude Code before 1.0).
fn epoch_after_bar(text: &str) -> Option<SystemTime> {
    let (_, rest) = text.split_once("limit reached|")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let secs: u64 = digits.parse().ok()?;
    // Milliseconds when it is that long.
    let secs = if digits.len() > 11 { secs / 1000 } else { secs };
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Claude Code's "resets 5:58pm (UTC)", "resets 5pm", "resets Dec 4, 5pm (Europe/Berlin)",
/// "resets Dec 4, 2027, 5:30pm (UTC)": a time of day (the next one) or a date and time, in
/// the zone named in brackets, else this machine's.
fn claude_resets(text: &str, now: SystemTime) -> Option<SystemTime> {
    let at = text.find("resets ")? + "resets ".len();
    let rest = &text[at..];
    let (when, zone) = match rest.find(" (") {
        Some(open) => {
            let close = rest[open..].find(')')? + open;
            (&rest[..open], Some(&rest[open + 2..close]))
        }
        None => (rest.split(['\n', '·', '∙']).next()?.trim(), None),
    };
    wall_time(when.trim().trim_end_matches('.'), zone, now)
}

/// Codex's "try again at 5:58 PM." or "try again at Dec 29th, 2025 10:15 PM." (the agent's
/// local time), or "try again in 2 hours 5 minutes.".
fn codex_resets(text: &str, now: SystemTime) -> Option<SystemTime> {
    let lower = text.to_lowercase();
    if let Some(at) = lower.find("try again at ") {
        let rest = &text[at + "try again at ".len()..];
        let when = rest.split('\n').next()?.trim().trim_end_matches('.');
        return wall_time(when, None, now);
    }
    let at = lower.find("try again in ")?;
    let rest = &lower[at + "try again in ".len()..];
    let rest = rest.split(['.', '\n']).next()?;
    let mut secs = 0u64;
    let mut number = None;
    for word in rest.split([' ', ',']).filter(|w| !w.is_empty()) {
        if let Ok(n) = word.parse::<u64>() {
            number = Some(n);
            continue;
        }
        let n = number.take()?;
        let unit: u64 = match word.trim_end_matches('s') {
            "day" => 86_400,
            "hour" => 3_600,
            "minute" | "min" => 60,
            "second" | "sec" => 1,
            _ => return None,
        };
        secs = secs.checked_add(n.checked_mul(unit)?)?;
    }
    (secs > 0)
        .then(|| now.checked_add(Duration::from_secs(secs)))
        .flatten()
}

/// Gemini's "suggested retry after 3592s." and the API's "please retry in 12.5s" (or "ms").
fn delay_after(lower: &str, now: SystemTime) -> Option<SystemTime> {
    let at = ["suggested retry after ", "please retry in ", "retry after "]
        .iter()
        .find_map(|w| lower.find(w).map(|i| i + w.len()))?;
    let rest = &lower[at..];
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let value: f64 = number.parse().ok()?;
    let unit = &rest[number.len()..];
    let secs = if unit.starts_with("ms") {
        value / 1000.0
    } else if unit.starts_with('s') {
        value
    } else {
        return None;
    };
    Duration::try_from_secs_f64(secs)
        .ok()
        .and_then(|d| now.checked_add(d))
}

/// A wall-clock time as the agents print it: "5:58pm", "5pm", "5:58 PM", optionally after a
/// date "Dec 4," / "Dec 29th, 2025" / "Dec 4, 2027,"; in `zone` (an IANA name, "UTC"), else
/// this machine's zone. A time of day alone is the next one after `now` (a minute's slack).
fn wall_time(text: &str, zone: Option<&str>, now: SystemTime) -> Option<SystemTime> {
    let tz = match zone {
        Some(name) => jiff::tz::TimeZone::get(name).ok()?,
        None => jiff::tz::TimeZone::try_system().unwrap_or(jiff::tz::TimeZone::UTC),
    };
    let now_zoned = jiff::Timestamp::try_from(now)
        .ok()?
        .to_zoned_datetime(tz.clone());
    let words: Vec<&str> = text.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    // The time is the last word or two ("5:58pm", "5:58 PM").
    let (time_words, date_words) = match words.as_slice() {
        [date @ .., t, ampm] if is_meridiem(ampm) => (format!("{t}{ampm}"), date),
        [date @ .., t] => (t.to_string(), date),
        [] => return None,
    };
    let (hour, minute) = clock(&time_words)?;
    let time = jiff::civil::time(hour, minute, 0, 0);
    let date = match date_words {
        [] => now_zoned.date(),
        [month, day] => jiff::civil::date(now_zoned.year(), month_of(month)?, day_of(day)?),
        [month, day, year] => jiff::civil::date(year.parse().ok()?, month_of(month)?, day_of(day)?),
        _ => return None,
    };
    let mut at = date.to_datetime(time).to_zoned_datetime(tz).ok()?;
    if date_words.is_empty()
        && at.timestamp() < now_zoned.timestamp() - jiff::SignedDuration::from_secs(60)
    {
        at = at.checked_add(jiff::Span::new().days(1)).ok()?;
    }
    SystemTime::try_from(at.timestamp()).ok()
}

fn is_meridiem(word: &str) -> bool {
    matches!(word.to_ascii_lowercase().as_str(), "am" | "pm")
}

/// "5:58pm", "5pm", "17:05": (hour, minute) on a 24-hour clock.
fn clock(text: &str) -> Option<(i8, i8)> {
    let lower = text.to_ascii_lowercase();
    let (digits, pm) = match lower.strip_suffix("pm") {
        Some(d) => (d, Some(true)),
        None => match lower.strip_suffix("am") {
            Some(d) => (d, Some(false)),
            None => (lower.as_str(), None),
        },
    };
    let (h, m) = digits.split_once(':').unwrap_or((digits, "0"));
    let (mut hour, minute): (i8, i8) = (h.parse().ok()?, m.parse().ok()?);
    if !(0..=59).contains(&minute) || !(0..=23).contains(&hour) {
        return None;
    }
    match pm {
        Some(pm) if (1..=12).contains(&hour) => hour = hour % 12 + if pm { 12 } else { 0 },
        Some(_) => return None,
        None => {}
    }
    Some((hour, minute))
}

fn month_of(word: &str) -> Option<i8> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let lower = word.to_ascii_lowercase();
    let n = MONTHS.iter().position(|m| lower.starts_with(m))?;
    i8::try_from(n + 1).ok()
}

/// "4", "29th", "1st".
fn day_of(word: &str) -> Option<i8> {
    let digits: String = word.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|d| (1..=31).contains(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-03 16:57:00 UTC.
    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_317_020)
    }

    fn utc(text: &str) -> SystemTime {
        let ts: jiff::Timestamp = text.parse().unwrap();
        SystemTime::try_from(ts).unwrap()
    }

    fn resets(text: &str) -> Option<SystemTime> {
        recognise(text, now()).expect(text).resets
    }

    fn recognised(text: &str) -> bool {
        recognise(text, now()).is_some()
    }

    #[test]
    fn claude_codes_words_and_reset_times_are_read() {
        // What Claude Code 2.1.197 printed against the stand-in (a subscription's window).
        let said = "You've hit your session limit · resets 5:58pm (UTC)";
        let limit = recognise(said, now()).unwrap();
        assert_eq!(limit.said, said);
        assert_eq!(limit.resets, Some(utc("2026-12-03T17:58:00Z")));
        assert_eq!(
            resets("You've hit your weekly limit · resets Dec 4, 5pm (UTC)"),
            Some(utc("2026-12-04T17:00:00Z"))
        );
        assert_eq!(
            resets("You've hit your session limit · resets 9am (Europe/Berlin)"),
            Some(utc("2026-12-04T08:00:00Z")),
            "a time already past today is tomorrow's"
        );
        assert_eq!(
            resets("You've hit your weekly limit · resets Jan 2, 2027, 5:30pm (UTC)"),
            Some(utc("2027-01-02T17:30:00Z"))
        );
        assert_eq!(
            resets("Claude AI usage limit reached|1796320800"),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_320_800))
        );
        // An API key's 429 after Claude Code's own retries: a limit, no time.
        let api = "API Error: Request rejected (429) · This request would exceed your account's rate limit. Please try again later.";
        assert_eq!(resets(api), None);
        assert!(recognised("API Error: 429 {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"x\"}}"));
    }

    #[test]
    fn codex_words_and_reset_times_are_read() {
        // What Codex 0.171 printed in `codex exec --json` against the stand-in (TZ unset: UTC).
        let said = "You\u{2019}ve hit your usage limit. Visit https://chatgpt.com/settings/usage to purchase more credits or try again at 5:58 PM.";
        let limit = recognise(said, now()).unwrap();
        assert!(limit.said.starts_with("You've hit your usage limit."));
        if jiff::tz::TimeZone::try_system().is_ok_and(|tz| tz == jiff::tz::TimeZone::UTC) {
            assert_eq!(limit.resets, Some(utc("2026-12-03T17:58:00Z")));
            assert_eq!(
                resets("You've hit your usage limit. Try again at Dec 29th, 2026 10:15 PM."),
                Some(utc("2026-12-29T22:15:00Z"))
            );
        }
        assert_eq!(
            resets(
                "You've hit your usage limit. Upgrade to Pro or try again in 2 hours 5 minutes."
            ),
            Some(now() + Duration::from_secs(2 * 3600 + 5 * 60))
        );
        assert_eq!(
            resets("You've hit your usage limit. Try again later."),
            None
        );
        assert!(recognised(
            "unexpected status 429: {\"error\":{\"type\":\"usage_limit_reached\"}}"
        ));
    }

    #[test]
    fn gemini_words_and_retry_delays_are_read() {
        // What the Gemini CLI 0.61 printed against the stand-in, after its own retries.
        let daily = "[API Error: You have exhausted your daily quota on this model.]\nPlease wait and try again later. To increase your limits, request a quota increase through AI Studio, or switch to another /auth method";
        let limit = recognise(daily, now()).unwrap();
        assert_eq!(
            limit.said,
            "You have exhausted your daily quota on this model."
        );
        assert_eq!(limit.resets, None);
        let stated = "[API Error: You exceeded your current quota, please check your plan and billing details.\nSuggested retry after 3592s.]\nPlease wait and try again later.";
        assert_eq!(resets(stated), Some(now() + Duration::from_secs(3592)));
        assert_eq!(
            resets("429 RESOURCE_EXHAUSTED: Quota exceeded for quota metric 'x'. Please retry in 12.5s."),
            Some(now() + Duration::from_millis(12_500))
        );
    }

    #[test]
    fn claude_stream_states_its_reset_and_the_run_ends_in_a_limit() {
        use crate::runner::stream::{StreamFormat, StreamParser};
        // Recorded from Claude Code 2.1.197 (a subscription's token) against the stand-in.
        let lines = [
            r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1796320738,"rateLimitType":"five_hour","isUsingOverage":false},"uuid":"u","session_id":"s"}"#,
            r#"{"type":"assistant","message":{"model":"<synthetic>","role":"assistant","content":[{"type":"text","text":"You've hit your session limit · resets 5:58pm (UTC)"}]},"parent_tool_use_id":null,"session_id":"s"}"#,
            r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"You've hit your session limit · resets 5:58pm (UTC)","session_id":"s"}"#,
        ];
        let mut parser = StreamParser::new(StreamFormat::Claude);
        for line in lines {
            parser.line(line);
        }
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_320_738);
        assert_eq!(parser.end.usage_limit, Some(Some(at)));
        let error = parser.end.error.clone().unwrap();
        let err = or_failure(
            &error,
            parser.end.usage_limit,
            crate::runner::RunError::Cancelled,
        );
        let crate::runner::RunError::UsageLimit { said, resets } = err else {
            panic!("{err:?}")
        };
        assert_eq!(said, "You've hit your session limit · resets 5:58pm (UTC)");
        assert_eq!(
            resets,
            Some(at),
            "the stream's own time, not the text's minute"
        );
        // An API key's 429: a limit without a time, though the words are Claude's own.
        let mut parser = StreamParser::new(StreamFormat::Claude);
        parser.line(r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"API Error: Request rejected (429) · slow down"}"#);
        assert_eq!(parser.end.usage_limit, Some(None));
    }

    #[test]
    fn other_failures_are_not_limits() {
        for text in [
            "the agent exited with status 1",
            "API Error: 500 Internal server error",
            "Invalid API key · Please run /login",
            "Your input exceeds the context window of this model.",
            "stream disconnected before completion: We're currently experiencing high demand",
        ] {
            assert_eq!(recognise(text, now()), None, "{text}");
        }
    }

    #[test]
    fn odd_times_are_no_time_not_a_panic() {
        for text in [
            "You've hit your session limit · resets 25:99pm (UTC)",
            "You've hit your session limit · resets soon (Nowhere/Zone)",
            "You've hit your usage limit. Try again at Foo 99th, 1 13 PM.",
            "usage limit reached|",
            "Suggested retry after abc",
            "You've hit your usage limit. Try again in 99999999999999999 days.",
        ] {
            assert_eq!(
                recognise(text, now()).and_then(|l| l.resets),
                None,
                "{text}"
            );
        }
    }
}
