//! A task's [`Usage`] as a result carries it: the `X-AAMP-Usage` header (written and read
//! back), the `usage` object of the JSON forms, and the line of the result's text body.
//!
//! The header is in the grammar of `X-AAMP-Dispatch-Context` (`key=value` pairs joined by
//! `"; "`, keys `^[a-z0-9_-]+$`, values percent-encoded as by `encodeURIComponent`), which every
//! AAMP SDK already parses (read in the AAMP reference notes, `shared/reference/aamp.md` §1.2,
//! from `packages/sdks/nodejs/src/types.ts`): an SDK reads it with its dispatch-context parser,
//! and one that knows nothing of it ignores it, as unknown extensions are.
//!
//! `input=1200; output=340; cache_read=5000; cache_write=0; cost_usd=0.012345; model=claude-sonnet-4-5`
//!
//! Tokens are integers. `cost_usd` is dollars with six decimals (exactly the micro-dollars the
//! journal keeps), or `unknown` when no report said what it cost (never `0`);
//! `cost_partial=true` when some reports had a cost and others did not (the dollars count
//! only the former). `model` is left out when the agent named none or several.

use serde_json::{json, Value};

use super::codec;
use super::usage::{micros_from_usd, Usage};

/// The `X-AAMP-Usage` value for `usage`.
pub fn header_value(usage: &Usage) -> String {
    let mut parts = vec![
        format!("input={}", usage.input_tokens),
        format!("output={}", usage.output_tokens),
        format!("cache_read={}", usage.cache_read_tokens),
        format!("cache_write={}", usage.cache_write_tokens),
        format!(
            "cost_usd={}",
            usage.cost_micros.map_or("unknown".to_string(), usd_text)
        ),
    ];
    if usage.cost_partial {
        parts.push("cost_partial=true".to_string());
    }
    if let Some(model) = usage.model.as_deref().filter(|m| !m.is_empty()) {
        parts.push(format!("model={}", codec::encode_uri_component(model)));
    }
    parts.join("; ")
}

/// Reads an `X-AAMP-Usage` value back; `None` when it names no tokens at all (not ours, or
/// garbled). Missing token kinds read as 0, a missing or unreadable cost as unknown.
pub fn parse_header(text: &str) -> Option<Usage> {
    let fields = codec::parse_dispatch_context(text);
    let tokens = |key: &str| fields.get(key).and_then(|v| v.trim().parse::<u64>().ok());
    let kinds = ["input", "output", "cache_read", "cache_write"].map(tokens);
    Some(Usage {
        cost_micros: fields.get("cost_usd").and_then(|c| micros_from_text(c)),
        cost_partial: fields
            .get("cost_partial")
            .is_some_and(|p| p.trim().eq_ignore_ascii_case("true")),
        model: fields
            .get("model")
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty()),
        ..of_tokens(kinds)?
    })
}

/// A usage of these tokens (input, output, cache read, cache write), a missing kind read as
/// 0, and nothing else; `None` when all four are missing.
fn of_tokens(kinds: [Option<u64>; 4]) -> Option<Usage> {
    if kinds.iter().all(Option::is_none) {
        return None;
    }
    let [input, output, cache_read, cache_write] = kinds.map(Option::unwrap_or_default);
    Some(Usage {
        input_tokens: input,
        output_tokens: output,
        cache_read_tokens: cache_read,
        cache_write_tokens: cache_write,
        ..Usage::default()
    })
}

/// Micro-dollars as dollars with six decimals: `12345` is `0.012345`.
pub fn usd_text(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// Dollars written as text back into micro-dollars: exactly for up to six decimals, else
/// rounded; `None` for `unknown` or anything that is not an amount.
pub fn micros_from_text(text: &str) -> Option<u64> {
    let text = text.trim();
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if digits(whole) && (frac.is_empty() || digits(frac)) && frac.len() <= 6 {
        let whole: u64 = whole.parse().ok()?;
        let frac: u64 = format!("{frac:0<6}").parse().ok()?;
        return whole.checked_mul(1_000_000)?.checked_add(frac);
    }
    text.parse::<f64>().ok().and_then(micros_from_usd)
}

/// The `usage` object of the JSON forms (`task.result` as JSON, `task show --json`, `tasks
/// --json`, events): the tokens by kind, their total, `costUsd` (a number, or the string
/// `"unknown"`: never 0 for a cost nobody stated), `costMicros` when known, `costPartial`
/// when some parts had no cost, and the model when one.
pub fn to_json(usage: &Usage) -> Value {
    let mut v = json!({
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "cacheReadTokens": usage.cache_read_tokens,
        "cacheWriteTokens": usage.cache_write_tokens,
        "totalTokens": usage.total_tokens(),
        "costUsd": match usage.cost_micros {
            Some(m) => json!(m as f64 / 1_000_000.0),
            None => json!("unknown"),
        },
    });
    if let Some(m) = usage.cost_micros {
        v["costMicros"] = json!(m);
    }
    if usage.cost_partial {
        v["costPartial"] = json!(true);
    }
    if let Some(model) = &usage.model {
        v["model"] = json!(model);
    }
    v
}

/// [`to_json`] read back (what `dispatch --json` and reports get from the JSON forms).
pub fn from_json(v: &Value) -> Option<Usage> {
    let n = |k: &str| v[k].as_u64();
    let kinds = [
        n("inputTokens"),
        n("outputTokens"),
        n("cacheReadTokens"),
        n("cacheWriteTokens"),
    ];
    Some(Usage {
        cost_micros: n("costMicros").or_else(|| v["costUsd"].as_f64().and_then(micros_from_usd)),
        cost_partial: v["costPartial"].as_bool().unwrap_or(false),
        model: v["model"].as_str().map(str::to_string),
        ..of_tokens(kinds)?
    })
}

/// One line for people: `1200 input, 340 output, 5000 cache read, 0 cache write tokens
/// (6540 in all); cost $0.0123 (claude-sonnet-4-5)`.
pub fn line(usage: &Usage) -> String {
    format!(
        "{} input, {} output, {} cache read, {} cache write tokens ({} in all); cost {}{}",
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.total_tokens(),
        usage.cost_text(),
        usage
            .model
            .as_deref()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(cost: Option<u64>, partial: bool, model: Option<&str>) -> Usage {
        Usage {
            input_tokens: 1200,
            output_tokens: 340,
            cache_read_tokens: 5000,
            cache_write_tokens: 7,
            cost_micros: cost,
            cost_partial: partial,
            model: model.map(str::to_string),
        }
    }

    #[test]
    fn the_header_reads_back_what_was_written() {
        for usage in [
            sample(Some(12_345), false, Some("claude-sonnet-4-5")),
            sample(None, false, None),
            sample(Some(1_000_000_007), true, Some("odd model; name=1 ünï")),
            sample(Some(0), false, Some("free")),
            Usage::default(),
        ] {
            let text = header_value(&usage);
            assert!(text.is_ascii() && !text.contains('\n'), "{text}");
            assert_eq!(parse_header(&text), Some(usage.clone()), "{text}");
            assert_eq!(from_json(&to_json(&usage)), Some(usage));
        }
        assert_eq!(
            header_value(&sample(Some(12_345), false, Some("m"))),
            "input=1200; output=340; cache_read=5000; cache_write=7; cost_usd=0.012345; model=m"
        );
    }

    #[test]
    fn unknown_cost_is_not_zero_anywhere() {
        let unknown = sample(None, false, None);
        assert!(header_value(&unknown).contains("cost_usd=unknown"));
        assert_eq!(to_json(&unknown)["costUsd"], "unknown");
        assert!(to_json(&unknown).get("costMicros").is_none());
        assert!(line(&unknown).contains("cost unknown"));
        let zero = sample(Some(0), false, None);
        assert_eq!(to_json(&zero)["costUsd"], 0.0);
        assert_eq!(
            parse_header("input=1; cost_usd=0").unwrap().cost_micros,
            Some(0)
        );
    }

    #[test]
    fn other_spellings_and_garbage_are_read_carefully() {
        assert_eq!(parse_header("project=x; source=feishu"), None);
        assert_eq!(parse_header(""), None);
        let u = parse_header(" output=5 ;cost_usd=0.5; model=a%20b").unwrap();
        assert_eq!((u.input_tokens, u.output_tokens), (0, 5));
        assert_eq!(u.cost_micros, Some(500_000));
        assert_eq!(u.model.as_deref(), Some("a b"));
        assert_eq!(micros_from_text("1.2345678"), Some(1_234_568));
        assert_eq!(micros_from_text("-1"), None);
        assert_eq!(micros_from_text("unknown"), None);
        assert_eq!(parse_header("input=x; output=2").unwrap().input_tokens, 0);
    }
}
