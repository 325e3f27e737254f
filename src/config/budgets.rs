//! Budgets in tokens and money (`[agents.budget]`, `[agents.sender_budget]`, the top-level
//! `[sender_budget]`) and the price table that turns a model's tokens into money where the
//! agent states no cost (`[prices."MODEL"]`). No price is built in: a price that goes stale
//! would silently make every money budget wrong, so a model without one has an unknown cost.

use super::*;

/// The most tokens a budget may name (a trillion a day is no limit: leave the key out).
const MAX_TOKENS: u64 = 1_000_000_000_000;
/// The most dollars a budget or a price may name.
const MAX_USD: f64 = 1_000_000.0;

/// One budget: limits per UTC day and per UTC month, in tokens (all kinds, cache reads
/// included) and in US dollars; each optional. Soft unless `hard`: a soft budget refuses the
/// next task once spent, a hard one also stops a running task when it crosses it.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub tokens_per_day: Option<u64>,
    pub tokens_per_month: Option<u64>,
    pub usd_per_day: Option<f64>,
    pub usd_per_month: Option<f64>,
    /// Stop a running task that crosses the budget (else it finishes, and the next waits).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hard: bool,
}

/// What a model costs, in US dollars per million tokens of each kind. Cache prices left out
/// are the input price (a budget then counts cache tokens at the dearer rate, never free).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_million: f64,
    pub output_per_million: f64,
    pub cache_read_per_million: Option<f64>,
    pub cache_write_per_million: Option<f64>,
}

impl Budget {
    /// Problems of one budget table (`key`), as (key, problem, fix).
    fn problem(&self, key: &str) -> Option<(String, String, String)> {
        let tokens = [
            ("tokens_per_day", self.tokens_per_day),
            ("tokens_per_month", self.tokens_per_month),
        ];
        for (name, value) in tokens {
            match value {
                Some(0) => {
                    return Some((
                        format!("{key}.{name}"),
                        "is 0: no task could ever run".into(),
                        "name at least 1 token, or leave the key out for no limit".into(),
                    ))
                }
                Some(n) if n > MAX_TOKENS => {
                    return Some((
                        format!("{key}.{name}"),
                        format!("{n} tokens is more than any budget needs ({MAX_TOKENS} at most)"),
                        "leave the key out for no limit".into(),
                    ))
                }
                _ => {}
            }
        }
        let money = [
            ("usd_per_day", self.usd_per_day),
            ("usd_per_month", self.usd_per_month),
        ];
        for (name, value) in money {
            if let Some(usd) = value {
                if !(usd.is_finite() && usd > 0.0 && usd <= MAX_USD) {
                    return Some((
                        format!("{key}.{name}"),
                        format!("{usd} is not a budget in dollars (more than 0, at most {MAX_USD})"),
                        "write the dollars as a positive number (5 or 12.50), or leave the key out for no limit".into(),
                    ));
                }
            }
        }
        None
    }
}

impl Price {
    fn problem(&self, key: &str) -> Option<(String, String, String)> {
        let prices = [
            ("input_per_million", Some(self.input_per_million)),
            ("output_per_million", Some(self.output_per_million)),
            ("cache_read_per_million", self.cache_read_per_million),
            ("cache_write_per_million", self.cache_write_per_million),
        ];
        for (name, value) in prices {
            if let Some(usd) = value {
                if !(usd.is_finite() && (0.0..=MAX_USD).contains(&usd)) {
                    return Some((
                        format!("{key}.{name}"),
                        format!(
                            "{usd} is not a price in dollars per million tokens (0 to {MAX_USD})"
                        ),
                        "write the provider's list price, e.g. 3 or 0.30".into(),
                    ));
                }
            }
        }
        None
    }
}

/// Whether `pattern` (a `[prices]` key: a model's name, or a prefix ending in `*`) is well
/// formed.
fn valid_model_key(pattern: &str) -> bool {
    let body = pattern.strip_suffix('*').unwrap_or(pattern);
    !body.is_empty() && !body.contains('*') && !body.chars().any(char::is_whitespace)
}

impl LoadedConfig {
    /// Every budget table and the price table.
    pub(super) fn check_budgets(&self) -> Result<(), ConfigError> {
        let config = &self.config;
        let mut tables: Vec<(String, &Budget)> = Vec::new();
        if let Some(b) = &config.sender_budget {
            tables.push(("sender_budget".into(), b));
        }
        for (i, agent) in config.agents.iter().enumerate() {
            if let Some(b) = &agent.budget {
                tables.push((format!("agents[{i}].budget"), b));
            }
            if let Some(b) = &agent.sender_budget {
                tables.push((format!("agents[{i}].sender_budget"), b));
            }
        }
        let problems = tables
            .iter()
            .filter_map(|(key, b)| b.problem(key))
            .chain(config.prices.iter().filter_map(|(model, price)| {
                if !valid_model_key(model) {
                    return Some((
                        format!("prices.{model:?}"),
                        "is not a model name, or a prefix ending in '*'".into(),
                        "name the model as the agent reports it (e.g. \"claude-sonnet-4-5\"), or a prefix such as \"claude-sonnet-4*\"".into(),
                    ));
                }
                price.problem(&format!("prices.{model:?}"))
            }));
        match problems.into_iter().next() {
            Some((key, problem, fix)) => Err(self.error(key, problem, fix)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(extra_top: &str, extra_agent: &str) -> Result<LoadedConfig, ConfigError> {
        let text = format!(
            "{extra_top}\n[mailboxes.coder]\nemail = \"c@x.test\"\njmap_url = \"http://127.0.0.1/.well-known/jmap\"\nsmtp_host = \"127.0.0.1\"\npassword_file = \"/nonexistent/p\"\n[[agents]]\nname = \"coder\"\nprofile = \"echo\"\n{extra_agent}\n"
        );
        LoadedConfig::from_text(Path::new("/tmp/config.toml"), &text)
    }

    fn error_of(top: &str, agent: &str) -> String {
        load(top, agent).map(|_| ()).unwrap_err().to_string()
    }

    #[test]
    fn budgets_and_prices_load_and_say_what_is_wrong() {
        let loaded = load(
            "[sender_budget]\nusd_per_day = 2\n[prices.\"claude-sonnet-4*\"]\ninput_per_million = 3\noutput_per_million = 15\ncache_read_per_million = 0.3",
            "[agents.budget]\ntokens_per_day = 1000\nusd_per_month = 12.5\nhard = true\n[agents.sender_budget]\ntokens_per_month = 5000",
        );
        // The mailbox's password file is missing: only the budget part is looked at here.
        let err = loaded.as_ref().err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_none_or(|e| !e.contains("budget") && !e.contains("prices")),
            "{err:?}"
        );
        let said = error_of("", "[agents.budget]\ntokens_per_dya = 5");
        assert!(said.contains("tokens_per_dya"), "{said}");
        let said = error_of("", "[agents.budget]\ntokens_per_day = -5");
        assert!(
            said.contains("tokens_per_day") || said.contains("-5"),
            "{said}"
        );
        let said = error_of("", "[agents.budget]\nusd_per_day = -5");
        assert!(said.contains("agents[0].budget.usd_per_day"), "{said}");
        assert!(said.contains("positive"), "{said}");
        let said = error_of("", "[agents.sender_budget]\ntokens_per_month = 0");
        assert!(
            said.contains("agents[0].sender_budget.tokens_per_month"),
            "{said}"
        );
        let said = error_of("[sender_budget]\nusd_per_month = 1e9", "");
        assert!(said.contains("sender_budget.usd_per_month"), "{said}");
        let said = error_of(
            "[prices.\"m\"]\ninput_per_million = -1\noutput_per_million = 1",
            "",
        );
        assert!(said.contains("input_per_million"), "{said}");
        let said = error_of(
            "[prices.\"a*b\"]\ninput_per_million = 1\noutput_per_million = 1",
            "",
        );
        assert!(said.contains("prefix ending in '*'"), "{said}");
        let said = error_of("[prices.\"m\"]\ninput_per_million = 1", "");
        assert!(said.contains("output_per_million"), "{said}");
    }
}
