//! What each CLI agent's stream says its model calls used, as [`StreamEvent::Usage`] reports:
//! one per report of the agent, under a key unique within the run, tokens of those calls only
//! (never a running total), a report without numbers sending nothing ("unknown", never 0).
//!
//! What the real CLIs send (captured against `tests/hosts/model_api.py`, in
//! `tests/fixtures/streams/*-usage*.jsonl`):
//! - Claude Code 2.x (`stream-json`): every `assistant` line carries its API message's
//!   `message.usage` (`input_tokens` without the cache, `cache_read_input_tokens`,
//!   `cache_creation_input_tokens`, `output_tokens`), repeated on each content block of one
//!   message, and with the `output_tokens` of the message's start (the API's `message_delta`
//!   comes later: with `--include-partial-messages` its `stream_event` lines carry the API's
//!   `message_start` and `message_delta`, whose final counts are reported as the message
//!   ends, key `msg:ID:end`). The `result` line's `usage`, `modelUsage` (per model, side calls too) and
//!   `total_cost_usd` are the run's totals, for this process only (a `--resume` starts again
//!   from 0). So: one report per message id, then the difference to the result's totals
//!   under the key `result`, with the stated cost. Qwen Code 0.24's stream is Claude's, each
//!   content block a message of its own id (the API call's usage on one of them, zeros on
//!   the others), its usage with a `total_tokens` and `input_tokens` counting the cache reads
//!   (its `createUsage`: Gemini's `promptTokenCount`); no cost, no `modelUsage`. Its result
//!   counts calls no message reports (its memory-extraction subagent after the answer) and,
//!   when resumed, the session's earlier runs too: made per run as Codex's are.
//! - Codex (`exec --json`): `turn.completed.usage` (`input_tokens` counting the cached ones,
//!   `cached_input_tokens`, `output_tokens` with `reasoning_output_tokens` a part of it) is the *thread's*
//!   running total: `codex exec resume` starts from the earlier runs' sum. The parser keeps
//!   the last total of each thread it saw (in this process, bounded) and sends the
//!   difference; a resumed thread it never saw (after a restart) is reported whole (an over-
//!   count, said in the log). No cost, no model.
//! - Gemini CLI (`stream-json`): the `result` line's `stats.models` (per model: `input` not
//!   cached, `cached`, `input_tokens`, `output_tokens`, `total_tokens`), for this process only.
//!   One report per model; output is `total_tokens - input_tokens` (thoughts count as output,
//!   as Google bills them). No cost.
//! - Generic NDJSON/SSE: a `usage` object on any event (`input_tokens`/`prompt_tokens`,
//!   `output_tokens`/`completion_tokens`, `cache_read_input_tokens`/`cached_tokens`,
//!   `cost_usd`/`total_cost_usd`, `model`), one report per event (a guess at the obvious
//!   shape; no real agent checked).

use std::collections::HashMap;
use std::sync::Mutex;

use super::*;
use crate::protocol::usage::micros_from_usd;
use crate::protocol::Usage;

/// What the parser remembers of the run's usage reports.
#[derive(Debug, Default)]
pub(super) struct UsageState {
    /// Claude: the message ids reported, and what they summed to.
    sent: std::collections::HashSet<String>,
    /// Claude: the message streamed now (partial messages) and what was reported of it.
    current: Option<(String, Usage)>,
    sum: Usage,
    /// Generic and Codex: reports made so far (for keys).
    count: u64,
    /// Codex: the thread this run works in.
    thread: Option<String>,
}

fn num(v: &Value, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| v.get(*k).and_then(Value::as_u64))
}

/// The event for `usage` under `key`, unless it says nothing (no tokens, no cost).
fn report(key: String, usage: Usage) -> Option<StreamEvent> {
    (usage.total_tokens() > 0 || usage.cost_micros.is_some_and(|c| c > 0))
        .then_some(StreamEvent::Usage { key, usage })
}

/// The Anthropic API's usage object (Claude's `message.usage` and `result.usage`), `None`
/// when it has no numbers.
fn anthropic_usage(v: &Value) -> Option<Usage> {
    let input = num(v, &["input_tokens"]);
    let output = num(v, &["output_tokens"]);
    let cache_read = num(v, &["cache_read_input_tokens"]).unwrap_or(0);
    // Qwen Code's (it alone adds `total_tokens`) counts the cache reads in `input_tokens`
    // (Gemini's `promptTokenCount`); Anthropic's does not.
    let in_input = if v.get("total_tokens").is_some() {
        cache_read
    } else {
        0
    };
    (input.is_some() || output.is_some()).then(|| Usage {
        input_tokens: input.unwrap_or(0).saturating_sub(in_input),
        output_tokens: output.unwrap_or(0),
        cache_read_tokens: cache_read,
        cache_write_tokens: num(v, &["cache_creation_input_tokens"]).unwrap_or(0),
        ..Usage::default()
    })
}

/// What `total` has that `part` has not (0 where `part` has more).
fn minus(total: &Usage, part: &Usage) -> Usage {
    Usage {
        input_tokens: total.input_tokens.saturating_sub(part.input_tokens),
        output_tokens: total.output_tokens.saturating_sub(part.output_tokens),
        cache_read_tokens: total
            .cache_read_tokens
            .saturating_sub(part.cache_read_tokens),
        cache_write_tokens: total
            .cache_write_tokens
            .saturating_sub(part.cache_write_tokens),
        ..Usage::default()
    }
}

impl StreamParser {
    /// Claude: an API message's usage (an `assistant` line's `message`, or a partial
    /// message's `message_start`), once per message id.
    pub(super) fn claude_message_usage(&mut self, message: &Value) -> Option<StreamEvent> {
        let id = str_of(message, &["id"])?;
        let mut usage = anthropic_usage(&message["usage"])?;
        if !self.usage.sent.insert(id.to_string()) {
            return None;
        }
        usage.model = str_of(message, &["model"]).map(str::to_string);
        self.usage.sum.add(&usage);
        self.usage.current = Some((id.to_string(), usage.clone()));
        report(format!("msg:{id}"), usage)
    }

    /// Claude's partial messages: `message_delta` gives the message's final counts (its
    /// `output_tokens` above all): what they add to what was reported of it.
    pub(super) fn claude_message_end_usage(&mut self, event: &Value) -> Option<StreamEvent> {
        let (id, reported) = self.usage.current.take()?;
        let u = &event["usage"];
        let at_end = Usage {
            input_tokens: num(u, &["input_tokens"]).unwrap_or(reported.input_tokens),
            output_tokens: num(u, &["output_tokens"]).unwrap_or(reported.output_tokens),
            cache_read_tokens: num(u, &["cache_read_input_tokens"])
                .unwrap_or(reported.cache_read_tokens),
            cache_write_tokens: num(u, &["cache_creation_input_tokens"])
                .unwrap_or(reported.cache_write_tokens),
            ..Usage::default()
        };
        let mut more = minus(&at_end, &reported);
        more.model = reported.model.clone();
        self.usage.sum.add(&more);
        report(format!("msg:{id}:end"), more)
    }

    /// Claude: the result's totals (all models in `modelUsage`, else `usage`) less what the
    /// messages reported, with the run's stated cost.
    pub(super) fn claude_result_usage(&mut self, v: &Value) -> Option<StreamEvent> {
        let per_model: Vec<(&String, &Value)> = v["modelUsage"]
            .as_object()
            .map(|m| m.iter().collect())
            .unwrap_or_default();
        let total = if per_model.is_empty() {
            anthropic_usage(&v["usage"])
        } else {
            let mut sum = Usage::default();
            for (_, m) in &per_model {
                sum.input_tokens += num(m, &["inputTokens"]).unwrap_or(0);
                sum.output_tokens += num(m, &["outputTokens"]).unwrap_or(0);
                sum.cache_read_tokens += num(m, &["cacheReadInputTokens"]).unwrap_or(0);
                sum.cache_write_tokens += num(m, &["cacheCreationInputTokens"]).unwrap_or(0);
            }
            Some(sum)
        };
        let mut total = total?;
        // Qwen Code's result (no `modelUsage`; a `total_tokens`) counts the whole session's,
        // earlier runs' too when resumed: less the total its session had last.
        if per_model.is_empty() && v["usage"].get("total_tokens").is_some() {
            if let Some(session) = &self.session_id {
                let before = running_total(&format!("qwen:{session}"), &total);
                total = minus(&total, &before.unwrap_or_default());
            }
        }
        let cost = v["total_cost_usd"].as_f64().and_then(micros_from_usd);
        let mut rest = minus(&total, &self.usage.sum);
        rest.cost_micros = cost;
        // The model the messages named, when the result names one only (its name there
        // may carry a suffix such as `[1m]`); else the result's own, when one.
        rest.model = match (per_model.as_slice(), &self.usage.sum.model) {
            ([_], Some(named)) => Some(named.clone()),
            ([(name, _)], None) => Some(name.to_string()),
            _ => self
                .usage
                .sum
                .model
                .clone()
                .filter(|_| per_model.is_empty()),
        };
        report("result".into(), rest)
    }

    /// Codex: `turn.completed`'s thread total, less the thread's total seen last.
    pub(super) fn codex_turn_usage(&mut self, v: &Value) -> Option<StreamEvent> {
        let u = &v["usage"];
        let input = num(u, &["input_tokens"]);
        let output = num(u, &["output_tokens"]);
        if input.is_none() && output.is_none() {
            return None;
        }
        let cached = num(u, &["cached_input_tokens"]).unwrap_or(0);
        let total = Usage {
            input_tokens: input.unwrap_or(0).saturating_sub(cached),
            cache_read_tokens: cached,
            cache_write_tokens: num(u, &["cache_write_input_tokens"]).unwrap_or(0),
            // `reasoning_output_tokens` are a part of `output_tokens`, as in OpenAI's usage.
            output_tokens: output.unwrap_or(0),
            ..Usage::default()
        };
        let before = self
            .usage
            .thread
            .as_deref()
            .and_then(|t| running_total(&format!("codex:{t}"), &total));
        self.usage.count += 1;
        report(
            format!("turn:{}", self.usage.count),
            minus(&total, &before.unwrap_or_default()),
        )
    }

    pub(super) fn codex_thread(&mut self, id: Option<&str>) {
        self.usage.thread = id.map(str::to_string);
    }

    /// Gemini: the result's stats, one report per model.
    pub(super) fn gemini_usage(&mut self, v: &Value) -> Vec<StreamEvent> {
        let stats = &v["stats"];
        let one = |name: Option<&str>, m: &Value| {
            let prompt = num(m, &["input_tokens"])?;
            let cached = num(m, &["cached"]).unwrap_or(0);
            let total = num(m, &["total_tokens"]);
            let output = total
                .map(|t| t.saturating_sub(prompt))
                .or_else(|| num(m, &["output_tokens"]))
                .unwrap_or(0);
            let usage = Usage {
                input_tokens: num(m, &["input"]).unwrap_or(prompt.saturating_sub(cached)),
                cache_read_tokens: cached,
                output_tokens: output,
                model: name.map(str::to_string),
                ..Usage::default()
            };
            report(format!("result:{}", name.unwrap_or("all")), usage)
        };
        match stats["models"].as_object() {
            Some(models) if !models.is_empty() => models
                .iter()
                .filter_map(|(name, m)| one(Some(name), m))
                .collect(),
            _ => one(None, stats).into_iter().collect(),
        }
    }

    /// Generic NDJSON/SSE: an event's `usage` object, when it has one with numbers.
    pub(super) fn generic_usage(&mut self, value: &Value, payload: &Value) -> Option<StreamEvent> {
        let u = payload
            .get("usage")
            .or_else(|| value.get("usage"))
            .filter(|u| u.is_object())?;
        let input = num(u, &["input_tokens", "prompt_tokens", "inputTokens"]);
        let output = num(u, &["output_tokens", "completion_tokens", "outputTokens"]);
        let cost = ["cost_usd", "total_cost_usd", "costUsd"]
            .iter()
            .find_map(|k| u.get(*k).or_else(|| payload.get(*k)))
            .and_then(Value::as_f64)
            .and_then(micros_from_usd);
        if input.is_none() && output.is_none() && cost.is_none() {
            return None;
        }
        let cached = num(
            u,
            &[
                "cache_read_input_tokens",
                "cached_tokens",
                "cacheReadTokens",
            ],
        );
        self.usage.count += 1;
        report(
            format!("usage:{}", self.usage.count),
            Usage {
                input_tokens: input.unwrap_or(0),
                output_tokens: output.unwrap_or(0),
                cache_read_tokens: cached.unwrap_or(0),
                cache_write_tokens: num(u, &["cache_creation_input_tokens", "cacheWriteTokens"])
                    .unwrap_or(0),
                cost_micros: cost,
                model: str_of(u, &["model"])
                    .or_else(|| str_of(payload, &["model"]))
                    .map(str::to_string),
                ..Usage::default()
            },
        )
    }
}

/// Sessions (Codex threads, Qwen Code sessions) whose running total this process saw last,
/// at most this many.
const THREADS_KEPT: usize = 4096;

/// The running total of `thread` seen last (`None`: never seen), and `total` kept as its new
/// one.
fn running_total(thread: &str, total: &Usage) -> Option<Usage> {
    static TOTALS: Mutex<Option<HashMap<String, Usage>>> = Mutex::new(None);
    let mut guard = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    let totals = guard.get_or_insert_with(HashMap::new);
    if totals.len() >= THREADS_KEPT && !totals.contains_key(thread) {
        totals.clear();
    }
    totals.insert(thread.to_string(), total.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The usage reports a captured stream (tests/fixtures/streams) makes, in order.
    fn reports(format: StreamFormat, fixture: &str) -> Vec<(String, Usage)> {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/streams")
                .join(fixture),
        )
        .unwrap();
        let mut parser = StreamParser::new(format);
        let mut events: Vec<StreamEvent> = text.lines().flat_map(|l| parser.line(l)).collect();
        events.extend(parser.finish());
        events
            .into_iter()
            .filter_map(|e| match e {
                StreamEvent::Usage { key, usage } => Some((key, usage)),
                _ => None,
            })
            .collect()
    }

    fn sum(reports: &[(String, Usage)]) -> Usage {
        let mut sum = Usage::default();
        for (_, u) in reports {
            sum.add(u);
        }
        sum
    }

    fn tokens(u: &Usage) -> (u64, u64, u64, u64) {
        (
            u.input_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens,
            u.output_tokens,
        )
    }

    /// Claude Code 2.1 against the stand-in, a resumed run with a Bash call: two API
    /// messages (the first in two `assistant` lines), their `output_tokens` those of the
    /// message's start; the result's totals are what the stand-in's ledger said (1021 + 1025
    /// input, 649 + 651 cache reads, 278 + 279 cache writes, 7 + 6 output) and its cost.
    #[test]
    fn claude_messages_once_each_and_the_result_makes_up_the_rest() {
        let got = reports(StreamFormat::Claude, "claude-usage.jsonl");
        let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "msg:msg_standin_2",
                "msg:msg_standin_2:end",
                "msg:msg_standin_3",
                "msg:msg_standin_3:end",
                "result"
            ]
        );
        assert_eq!(tokens(&got[0].1), (1021, 649, 278, 1));
        assert_eq!(got[0].1.model.as_deref(), Some("claude-opus-4-8"));
        assert_eq!(tokens(&got[1].1), (0, 0, 0, 6));
        // The messages said it all: the result adds its cost only.
        assert_eq!(tokens(&got[4].1), (0, 0, 0, 0));
        assert_eq!(got[4].1.cost_micros, Some(14_686));
        assert_eq!(got[4].1.model.as_deref(), Some("claude-opus-4-8"));
        let total = sum(&got);
        assert_eq!(tokens(&total), (2046, 1300, 557, 13));
    }

    /// Without partial messages only the `assistant` lines tell: the result makes up the rest.
    #[test]
    fn without_partial_messages_the_result_makes_up_the_output() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/streams/claude-usage.jsonl"),
        )
        .unwrap();
        let mut parser = StreamParser::new(StreamFormat::Claude);
        let got: Vec<(String, Usage)> = text
            .lines()
            .filter(|l| !l.contains("\"stream_event\""))
            .flat_map(|l| parser.line(l))
            .filter_map(|e| match e {
                StreamEvent::Usage { key, usage } => Some((key, usage)),
                _ => None,
            })
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(tokens(&got[2].1), (0, 0, 0, 11));
        assert_eq!(tokens(&sum(&got)), (2046, 1300, 557, 13));
    }

    /// Resumed, Qwen Code's result counts the session's earlier run (3833 input with the
    /// cache, 13 output) and a call no message reported (its memory subagent's, 846 + 281
    /// cached, 3 output): the run's own is what the stand-in's ledger says.
    #[test]
    fn a_resumed_qwen_result_counts_its_own_run() {
        // Qwen Code 0.24 (`--output-format stream-json`, Claude's format) against the
        // stand-in's Chat Completions with cached tokens: its `input_tokens` count them.
        let first = reports(StreamFormat::Claude, "qwen-usage.jsonl");
        assert_eq!(first.len(), 2, "{first:?}");
        assert_eq!(tokens(&first[0].1), (1434, 477, 0, 7));
        assert_eq!(sum(&first).cost_micros, None);
        let resumed = reports(StreamFormat::Claude, "qwen-usage-resumed.jsonl");
        assert_eq!(tokens(&sum(&first)), (2876, 957, 0, 13));
        assert_eq!(tokens(&sum(&resumed)), (1147 + 846, 382 + 281, 0, 6));
    }

    /// A failed run reports nothing: its result's usage is all zeros and it states no cost.
    #[test]
    fn a_claude_result_with_nothing_in_it_sends_nothing() {
        assert_eq!(reports(StreamFormat::Claude, "qwen-no-auth.jsonl"), []);
        assert_eq!(
            reports(StreamFormat::Claude, "claude-not-logged-in.jsonl").len(),
            0
        );
    }

    /// Codex 0.1xx: `turn.completed` counts the thread's whole total; the resumed run
    /// (`codex exec resume`) reports only what it added (757 + 252 cached, 3 output).
    #[test]
    fn codex_turns_are_the_threads_total_less_the_last_seen() {
        let first = reports(StreamFormat::Codex, "codex-usage.jsonl");
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].0, "turn:1");
        assert_eq!(tokens(&first[0].1), (1452, 483, 0, 13));
        assert_eq!(first[0].1.cost_micros, None);
        let resumed = reports(StreamFormat::Codex, "codex-usage-resumed.jsonl");
        assert_eq!(tokens(&resumed[0].1), (757, 252, 0, 3));
    }

    /// Gemini CLI 0.61: the result's stats per model (the router's call included).
    #[test]
    fn gemini_result_stats_per_model() {
        let got = reports(StreamFormat::Gemini, "gemini-usage.jsonl");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "result:gemini-standin");
        assert_eq!(tokens(&got[0].1), (2426, 0, 0, 17));
        assert_eq!(got[0].1.model.as_deref(), Some("gemini-standin"));
        assert_eq!(reports(StreamFormat::Gemini, "gemini-error.jsonl").len(), 0);
    }

    #[test]
    fn generic_usage_objects_are_reports_and_empty_ones_are_not() {
        let mut parser = StreamParser::new(StreamFormat::Ndjson);
        let mut got = parser.line(r#"{"type":"result","text":"OK","usage":{"prompt_tokens":12,"completion_tokens":3,"cost_usd":0.002,"model":"m"}}"#);
        got.extend(parser.line(r#"{"type":"delta","text":"x","usage":{}}"#));
        let usage: Vec<_> = got
            .into_iter()
            .filter_map(|e| match e {
                StreamEvent::Usage { key, usage } => Some((key, usage)),
                _ => None,
            })
            .collect();
        assert_eq!(usage.len(), 1);
        assert_eq!(usage[0].0, "usage:1");
        assert_eq!((usage[0].1.input_tokens, usage[0].1.output_tokens), (12, 3));
        assert_eq!(usage[0].1.cost_micros, Some(2000));
        assert_eq!(usage[0].1.model.as_deref(), Some("m"));
    }
}
