//! Pairing: a `pair.request` with a live one-time code adds its sender to the agent's allowed
//! senders; wrong codes lock out their own sender, never everyone.

use std::time::{Duration, SystemTime};

use serde_json::json;

use super::journal::{JournalError, TaskState};
use super::{policy, Engine};
use crate::backend::Backend;
use crate::inbound::Inbound;
use crate::protocol::{Body, Status};

/// Pairing: the window wrong codes are counted in, how many one sender may give before it is
/// locked out, how many the agent takes before wrong codes go unanswered, and how many
/// refused pair requests are answered an hour.
const PAIR_WINDOW_SECS: u64 = 15 * 60;
const PAIR_SENDER_TRIES: u32 = 5;
const PAIR_AGENT_TRIES: u32 = 20;
const PAIR_REFUSALS_PER_HOUR: u32 = 20;

/// Equal bytes, compared in time that does not depend on where they differ.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new pairing code: 9 bytes from the OS's random source, base64url (12 characters).
pub fn new_pair_code() -> String {
    use base64::Engine as _;
    let bytes = uuid::Uuid::new_v4().into_bytes();
    // A v4 UUID's bytes come from the OS random source; bytes 6 and 8 carry version bits.
    let random: Vec<u8> = bytes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 6 && *i != 8)
        .map(|(_, b)| *b)
        .take(9)
        .collect();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
}

impl<B: Backend> Engine<B> {
    /// `pair.request`, the one intent the sender policy does not gate: a valid pairing code
    /// (unexpired, unused, compared in constant time) adds the sender to the agent's allowed
    /// senders, with the dispatch-context rules it asked for, and is used up. Repeated wrong
    /// codes lock the sender (5 in 15 minutes) and the agent (20) out for a while.
    pub(super) fn on_pair_request(&self, inbound: &Inbound, key: &str) -> Result<(), JournalError> {
        let spec = self.common.spec();
        let journal = &self.common.journal;
        let env = &inbound.message.envelope;
        let Body::PairRequest { pair_code, rules } = &inbound.message.body else {
            return Ok(());
        };
        // A sender with five wrong codes in 15 minutes is locked out for that long. Past
        // twenty wrong codes for the agent (many senders guessing) wrong codes are no longer
        // answered, but a correct code still pairs: nobody can lock pairing for everyone.
        let window = SystemTime::now() - Duration::from_secs(PAIR_WINDOW_SECS);
        let sender_locked =
            journal.pair_failures(&spec.name, Some(&env.from), window)? >= PAIR_SENDER_TRIES;
        let flooded = journal.pair_failures(&spec.name, None, window)? >= PAIR_AGENT_TRIES;
        let paired = if sender_locked {
            Err("too many wrong pair codes; try again in 15 minutes")
        } else {
            let codes = journal.live_pair_codes(&spec.name)?;
            let found = codes.iter().fold(None, |hit, (id, code)| {
                match constant_time_eq(code.as_bytes(), pair_code.trim().as_bytes()) {
                    true => Some(*id),
                    false => hit,
                }
            });
            match found {
                Some(id) if journal.consume_pair_code(id, &env.from)? => Ok(()),
                _ => {
                    journal.pair_failure(&spec.name, &env.from)?;
                    Err("invalid or expired pair code")
                }
            }
        };
        let (status, reason, state) = match paired {
            Ok(()) => {
                let mut rule = policy::Rule::sender(&env.from);
                if let Some(serde_json::Value::Object(map)) = rules {
                    for (k, v) in map {
                        let values: Vec<String> = match v {
                            serde_json::Value::Array(a) => a
                                .iter()
                                .filter_map(|x| x.as_str().map(str::to_string))
                                .collect(),
                            serde_json::Value::String(s) => vec![s.clone()],
                            _ => Vec::new(),
                        };
                        if !values.is_empty() {
                            rule.context.insert(k.clone(), values);
                        }
                    }
                }
                journal.add_policy(&spec.name, false, &rule, "pairing")?;
                tracing::info!(from = %env.from, "paired: the sender may now dispatch tasks");
                self.common.events.emit(
                    crate::events::Event::SenderPaired,
                    json!({"agent": spec.name, "from": env.from, "context": rule.context}),
                );
                (Status::Completed, None, TaskState::Answered)
            }
            Err(why) => {
                tracing::warn!(from = %env.from, reason = why, "pairing refused");
                self.common.events.emit(
                    crate::events::Event::PairRefused,
                    json!({"agent": spec.name, "from": env.from, "reason": why}),
                );
                (Status::Rejected, Some(why.to_string()), TaskState::Rejected)
            }
        };
        // Pairing answers have a budget of their own: refused dispatches cannot use it up.
        let answer = status == Status::Completed
            || (!flooded && self.may_answer("pair refusals", PAIR_REFUSALS_PER_HOUR));
        let reply = answer.then(|| {
            self.outbox.compose(
                env,
                key,
                Body::PairRespond {
                    status,
                    reason: reason.clone(),
                },
                0,
            )
        });
        self.record_answered(
            inbound,
            key,
            state,
            reason.as_deref().unwrap_or("pair.request"),
            reply.as_ref(),
        )?;
        self.outbox.wake();
        Ok(())
    }
}
