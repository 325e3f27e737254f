//! What a model's work cost: tokens by kind and, where known, money. The unit of accounting
//! across the crate: a runner reads one from each agent's own report, the journal sums them per
//! task, per agent and per sender, and a result carries the task's sum.
//!
//! Money is kept in millionths of a US dollar (`cost_micros`), an integer, so sums over a month
//! of reports never drift the way sums of floating-point dollars do. A report that says nothing
//! of money has `cost_micros: None` ("unknown"), never 0; a sum with any unknown part says so
//! (`cost_partial`).

use serde::{Deserialize, Serialize};

/// Tokens and money of one model call, one turn, or a sum of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Input tokens not read from a cache.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Input tokens written to the provider's prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Millionths of a US dollar: stated by the agent, or priced from the config's table;
    /// `None` when neither knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
    /// A sum some of whose parts had no known cost: `cost_micros` counts only the others.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cost_partial: bool,
    /// The model, as the agent named it; `None` when it named none, or a sum over several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl Usage {
    /// All tokens, of every kind.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }

    /// Adds `other` to this sum. The model stays only while every part names the same one.
    pub fn add(&mut self, other: &Usage) {
        let empty = *self == Usage::default();
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.cost_partial |= other.cost_partial
            || (!empty && self.cost_micros.is_some() != other.cost_micros.is_some());
        self.cost_micros = match (self.cost_micros, other.cost_micros) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) if empty => b.or(a),
            (a, b) => a.or(b),
        };
        if empty {
            self.model = other.model.clone();
        } else if self.model != other.model {
            self.model = None;
        }
    }

    /// Dollars, for people (`$0.0123`); "unknown" when no part had a cost.
    pub fn cost_text(&self) -> String {
        match self.cost_micros {
            Some(m) => format!(
                "${:.4}{}",
                m as f64 / 1_000_000.0,
                if self.cost_partial { "+" } else { "" }
            ),
            None => "unknown".to_string(),
        }
    }
}

/// Dollars as an agent states them (`total_cost_usd: 0.0123`) in millionths, rounded; `None`
/// for a negative, infinite or absurd amount (over a million dollars).
pub fn micros_from_usd(usd: f64) -> Option<u64> {
    (usd.is_finite() && (0.0..1e6).contains(&usd)).then(|| (usd * 1_000_000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(input: u64, output: u64, cost: Option<u64>, model: &str) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cost_micros: cost,
            model: Some(model.into()),
            ..Usage::default()
        }
    }

    #[test]
    fn sums_keep_tokens_exact_and_say_when_cost_is_partial() {
        let mut sum = Usage::default();
        sum.add(&u(10, 2, Some(30), "m"));
        sum.add(&u(5, 1, Some(12), "m"));
        assert_eq!((sum.input_tokens, sum.output_tokens), (15, 3));
        assert_eq!((sum.cost_micros, sum.cost_partial), (Some(42), false));
        assert_eq!(sum.model.as_deref(), Some("m"));
        sum.add(&u(1, 1, None, "other"));
        assert_eq!((sum.cost_micros, sum.cost_partial), (Some(42), true));
        assert_eq!(sum.model, None);
        assert_eq!(sum.total_tokens(), 20);
        assert_eq!(sum.cost_text(), "$0.0000+");
    }

    #[test]
    fn unknown_cost_stays_unknown() {
        let mut sum = Usage::default();
        sum.add(&u(1, 1, None, "m"));
        sum.add(&u(1, 1, None, "m"));
        assert_eq!((sum.cost_micros, sum.cost_partial), (None, false));
        assert_eq!(sum.cost_text(), "unknown");
    }

    #[test]
    fn dollars_become_micros() {
        assert_eq!(micros_from_usd(0.0123456), Some(12346));
        assert_eq!(micros_from_usd(-1.0), None);
        assert_eq!(micros_from_usd(f64::NAN), None);
    }
}
