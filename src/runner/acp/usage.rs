//! What an ACP agent says its turn used: one [`StreamEvent::Usage`] per run (key `turn`), sent
//! when the agent answers `session/prompt`.
//!
//! What the adapters send (read in their installed code, /work/test-agents):
//! - `PromptResponse.usage` (unstable `unstable_end_turn_token_usage`): claude-agent-acp 0.49
//!   (`sessionUsage`: the turn's Claude `result.usage` summed, reset when a turn starts:
//!   `inputTokens` without the cache, `cachedReadTokens`, `cachedWriteTokens`, `outputTokens`)
//!   and codex-acp 2.6 (`buildPromptUsage`: the thread's total at the prompt's end less the
//!   total at its start, input without the cache; `thoughtTokens` a part of `outputTokens`,
//!   as OpenAI counts them, so not added). Both for this prompt only.
//! - `_meta.quota` of the answer: `token_count {input_tokens, output_tokens}` and
//!   `model_usage [{model, token_count}]`: codex-acp 2.6 (the same counts) and Gemini CLI
//!   0.61's `--acp` (which sends no `usage`: `promptTokenCount`, cache included, and
//!   `candidatesTokenCount` of each model call of the prompt). Read when `usage` is absent;
//!   the model named when one is.
//! - `_meta.usage` of an empty `agent_message_chunk`, one per model call: Qwen Code 0.24's
//!   `--acp` (`createTranscriptUsageUpdate`: `inputTokens` its `promptTokenCount`, the cache
//!   included, `cachedReadTokens`, `outputTokens`; subagents' calls too), which puts no usage
//!   in its answer. Sent as they come (key `call:N`); when any came, the answer's tokens are
//!   not counted again.
//! - `usage_update` session updates: `used`/`size` are the context window (not spent
//!   tokens); `cost` is "cumulative session cost". claude-agent-acp sends Claude Code's
//!   `total_cost_usd`, which counts from 0 in each process (`claude -p --resume` showed it:
//!   a resumed run's cost covers its own calls only), and the bridge runs one adapter process
//!   per task: so the last cost seen is the run's. Kept as the difference from the cost seen
//!   before it in this run, summed: the same when it is cumulative, right when the adapter
//!   would send one per call (a guess: none of the installed ones does). Currencies other
//!   than USD are left out (said in the log). codex-acp and Gemini send no cost.

use super::*;
use crate::protocol::usage::micros_from_usd;
use crate::protocol::Usage;
use agent_client_protocol::v1::schema::{PromptResponse, UsageUpdate};

/// What the run's `usage_update`s and prompt answer said.
#[derive(Debug, Default)]
pub(super) struct AcpUsage {
    /// The cumulative cost seen last, in USD.
    last_cost: Option<f64>,
    /// The run's cost so far, in millionths of a dollar.
    cost_micros: Option<u64>,
    /// The tokens of the prompt's answer.
    tokens: Option<Usage>,
    /// Per-call reports sent (Qwen Code).
    calls: u64,
}

impl Shared {
    /// A `usage_update`: its cost, when it states one in dollars.
    pub(super) fn usage_update(&self, update: &UsageUpdate) {
        let Some(cost) = &update.cost else { return };
        if !cost.currency.eq_ignore_ascii_case("USD") {
            tracing::info!(currency = %cost.currency, "a cost not in US dollars is not counted");
            return;
        }
        let mut usage = self.usage.lock().expect("usage lock");
        let before = usage.last_cost.unwrap_or(0.0);
        let more = if cost.amount >= before {
            cost.amount - before
        } else {
            cost.amount
        };
        usage.last_cost = Some(cost.amount);
        if let Some(m) = micros_from_usd(more) {
            usage.cost_micros = Some(usage.cost_micros.unwrap_or(0).saturating_add(m));
        }
    }

    /// The answer to `session/prompt`: its usage, else its `_meta.quota`.
    pub(super) fn prompt_usage(&self, response: &PromptResponse) {
        let tokens = response
            .usage
            .as_ref()
            .map(|u| Usage {
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                cache_read_tokens: u.cached_read_tokens.unwrap_or(0),
                cache_write_tokens: u.cached_write_tokens.unwrap_or(0),
                ..Usage::default()
            })
            .or_else(|| quota_usage(response.meta.as_ref()?.get("quota")?));
        let Some(mut tokens) = tokens else { return };
        if tokens.model.is_none() {
            tokens.model = response
                .meta
                .as_ref()
                .and_then(|m| m.get("quota"))
                .and_then(only_model);
        }
        self.usage.lock().expect("usage lock").tokens = Some(tokens);
    }

    /// A model call's usage in a message chunk's `_meta.usage` (Qwen Code), as a report.
    pub(super) fn chunk_usage(
        &self,
        meta: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Option<StreamEvent> {
        let u = meta?.get("usage")?;
        let n = |k: &str| u.get(k).and_then(|v| v.as_u64());
        let (input, output) = (n("inputTokens"), n("outputTokens"));
        if input.is_none() && output.is_none() {
            return None;
        }
        let cached = n("cachedReadTokens").unwrap_or(0);
        let usage = Usage {
            input_tokens: input.unwrap_or(0).saturating_sub(cached),
            cache_read_tokens: cached,
            output_tokens: output.unwrap_or(0),
            ..Usage::default()
        };
        if usage.total_tokens() == 0 {
            return None;
        }
        let mut state = self.usage.lock().expect("usage lock");
        state.calls += 1;
        Some(StreamEvent::Usage {
            key: format!("call:{}", state.calls),
            usage,
        })
    }

    /// The run's report: the prompt's tokens (unless its calls were reported one by one) with
    /// the cost seen, when either said anything.
    pub(super) fn usage_report(&self) -> Option<StreamEvent> {
        let usage = self.usage.lock().expect("usage lock");
        let mut report = match usage.calls {
            0 => usage.tokens.clone().unwrap_or_default(),
            _ => Usage::default(),
        };
        report.cost_micros = usage.cost_micros;
        (report.total_tokens() > 0 || report.cost_micros.is_some_and(|c| c > 0)).then(|| {
            StreamEvent::Usage {
                key: "turn".into(),
                usage: report,
            }
        })
    }
}

/// `_meta.quota.token_count` (codex-acp, Gemini CLI): input (the cache included: no part of
/// it is said to be cached) and output.
fn quota_usage(quota: &serde_json::Value) -> Option<Usage> {
    let count = quota.get("token_count")?;
    let input = count.get("input_tokens").and_then(|v| v.as_u64());
    let output = count.get("output_tokens").and_then(|v| v.as_u64());
    (input.is_some() || output.is_some()).then(|| Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        model: only_model(quota),
        ..Usage::default()
    })
}

/// The model `_meta.quota.model_usage` names, when it names one only.
fn only_model(quota: &serde_json::Value) -> Option<String> {
    match quota.get("model_usage")?.as_array()?.as_slice() {
        [one] => one.get("model")?.as_str().map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(json: serde_json::Value) -> PromptResponse {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn claude_agent_acp_turn_usage_and_cumulative_cost_make_one_report() {
        let shared = Shared::default();
        for amount in [0.01, 0.025] {
            let u: UsageUpdate = serde_json::from_value(serde_json::json!({
                "used": 5, "size": 200000, "cost": {"amount": amount, "currency": "USD"}
            }))
            .unwrap();
            shared.usage_update(&u);
        }
        shared.prompt_usage(&response(serde_json::json!({
            "stopReason": "end_turn",
            "usage": {"inputTokens": 10, "outputTokens": 3, "cachedReadTokens": 4,
                      "cachedWriteTokens": 2, "totalTokens": 19}
        })));
        let Some(StreamEvent::Usage { key, usage }) = shared.usage_report() else {
            panic!("no report")
        };
        assert_eq!(key, "turn");
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens
            ),
            (10, 3, 4, 2)
        );
        assert_eq!(usage.cost_micros, Some(25_000));
    }

    #[test]
    fn qwen_calls_are_reported_one_by_one_and_not_again_at_the_end() {
        let shared = Shared::default();
        let meta = serde_json::json!({"usage": {"inputTokens": 100, "outputTokens": 5,
                                                "cachedReadTokens": 40, "totalTokens": 105}});
        let Some(StreamEvent::Usage { key, usage }) = shared.chunk_usage(meta.as_object()) else {
            panic!("no report")
        };
        assert_eq!(key, "call:1");
        assert_eq!(
            (
                usage.input_tokens,
                usage.cache_read_tokens,
                usage.output_tokens
            ),
            (60, 40, 5)
        );
        assert!(shared
            .chunk_usage(serde_json::json!({"usage": {}}).as_object())
            .is_none());
        shared.prompt_usage(&response(serde_json::json!({
            "stopReason": "end_turn",
            "_meta": {"quota": {"token_count": {"input_tokens": 100, "output_tokens": 5}}}
        })));
        assert!(shared.usage_report().is_none());
    }

    #[test]
    fn gemini_quota_meta_is_read_and_nothing_said_sends_nothing() {
        let shared = Shared::default();
        assert!(shared.usage_report().is_none());
        shared.prompt_usage(&response(serde_json::json!({"stopReason": "end_turn"})));
        assert!(shared.usage_report().is_none());
        shared.prompt_usage(&response(serde_json::json!({
            "stopReason": "end_turn",
            "_meta": {"quota": {"token_count": {"input_tokens": 120, "output_tokens": 7},
                                "model_usage": [{"model": "gemini-x", "token_count": {}}]}}
        })));
        let Some(StreamEvent::Usage { usage, .. }) = shared.usage_report() else {
            panic!("no report")
        };
        assert_eq!((usage.input_tokens, usage.output_tokens), (120, 7));
        assert_eq!(usage.model.as_deref(), Some("gemini-x"));
        assert_eq!(usage.cost_micros, None);
    }
}
