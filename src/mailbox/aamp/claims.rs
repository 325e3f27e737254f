//! Claims on dispatches, for several bridges (replicas) serving one mailbox: the mail server
//! is the one place they share, and JMAP's `ifInState` (RFC 8620 §5.3) makes a change fail
//! with `stateMismatch` when anything changed since the state the client read, so of several
//! replicas setting their claim on one mail from the same state exactly one succeeds.
//!
//! A claim is three keywords on the dispatch's mail: `$aamp-claimed`, `$aamp-by-NAME` (the
//! replica) and `$aamp-lease-SECS` (when it ends, Unix seconds; renewed while the task runs).
//! `$aamp-done` says the task was answered: nobody takes it over. Keywords are what every
//! JMAP (and IMAP) server keeps per mail, so any of them can hold a claim.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::jmap::JmapClient;
use crate::mailbox::MailboxError;

pub const CLAIMED: &str = "$aamp-claimed";
pub const DONE: &str = "$aamp-done";
const BY: &str = "$aamp-by-";
const LEASE: &str = "$aamp-lease-";

/// How a claim went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This replica holds it (now, or already did: a claim survives its replica's restart).
    Won,
    /// This replica holds it now, after replica `from` held it and stopped renewing.
    TakenOver { from: String },
    /// Another replica holds it, or it was answered (`by` is then `None`).
    Lost { by: Option<String> },
}

/// A claim as the keywords say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub by: Option<String>,
    pub until: Option<u64>,
    pub done: bool,
}

impl Held {
    pub fn of(keywords: &Map<String, Value>) -> Held {
        let mut held = Held::default();
        for key in keywords.keys() {
            let key = key.to_ascii_lowercase();
            if key == DONE {
                held.done = true;
            } else if let Some(name) = key.strip_prefix(BY) {
                held.by = Some(name.to_string());
            } else if let Some(secs) = key.strip_prefix(LEASE) {
                held.until = secs.parse().ok().max(held.until);
            }
        }
        held
    }

    /// Whether someone holds it at `now` (Unix seconds).
    pub fn live(&self, now: u64) -> bool {
        !self.done && self.by.is_some() && self.until.is_some_and(|u| u > now)
    }
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The keyword patch that makes `replica` the holder until `until`, removing what `old` had.
fn patch(old: &Held, replica: &str, until: u64) -> Value {
    let mut p = Map::new();
    if let Some(by) = &old.by {
        p.insert(format!("keywords/{BY}{by}"), Value::Null);
    }
    if let Some(u) = old.until {
        p.insert(format!("keywords/{LEASE}{u}"), Value::Null);
    }
    p.insert(format!("keywords/{CLAIMED}"), json!(true));
    p.insert(format!("keywords/{BY}{replica}"), json!(true));
    p.insert(format!("keywords/{LEASE}{until}"), json!(true));
    Value::Object(p)
}

/// Reads a mail's claim, and the Email state it was read in.
async fn read(jmap: &JmapClient, email_id: &str) -> Result<Option<(Held, String)>, MailboxError> {
    let got = jmap
        .call(
            "Email/get",
            json!({ "ids": [email_id], "properties": ["keywords"] }),
        )
        .await?;
    let state = got["state"].as_str().unwrap_or_default().to_string();
    Ok(got["list"][0]["keywords"]
        .as_object()
        .map(|k| (Held::of(k), state)))
}

/// Changes a mail's keywords only if nothing changed since `state`; `Ok(false)` when
/// something did.
async fn set_if(
    jmap: &JmapClient,
    state: &str,
    email_id: &str,
    patch: Value,
) -> Result<bool, MailboxError> {
    match jmap
        .call(
            "Email/set",
            json!({ "ifInState": state, "update": { email_id: patch } }),
        )
        .await
    {
        Ok(set) => match set["notUpdated"].get(email_id) {
            Some(why) => Err(MailboxError::Method {
                method: "Email/set".into(),
                kind: why["type"].as_str().unwrap_or("notUpdated").to_string(),
                description: why["description"].as_str().map(str::to_string),
            }),
            None => Ok(true),
        },
        Err(MailboxError::Method { kind, .. }) if kind == "stateMismatch" => Ok(false),
        Err(e) => Err(e),
    }
}

/// Attempts at a conditional change before giving up (each lost attempt means another change
/// won: the mailbox moved on, and the claim is read again).
const ATTEMPTS: usize = 50;

/// Claims `email_id` for `replica` for `lease`: won by exactly one of the replicas that try
/// at once. A mail that is gone (deleted) is lost.
pub async fn claim(
    jmap: &JmapClient,
    email_id: &str,
    replica: &str,
    lease: Duration,
) -> Result<Claim, MailboxError> {
    for attempt in 0..ATTEMPTS {
        let Some((held, state)) = read(jmap, email_id).await? else {
            return Ok(Claim::Lost { by: None });
        };
        let now = now_secs();
        if held.done {
            return Ok(Claim::Lost { by: held.by });
        }
        if held.by.as_deref() == Some(replica) && held.live(now) {
            return Ok(Claim::Won);
        }
        if held.live(now) {
            return Ok(Claim::Lost { by: held.by });
        }
        if set_if(
            jmap,
            &state,
            email_id,
            patch(&held, replica, now + lease.as_secs()),
        )
        .await?
        {
            return Ok(match held.by {
                Some(from) if from != replica => Claim::TakenOver { from },
                _ => Claim::Won,
            });
        }
        // Another change came first; a short, growing pause spreads the replicas out.
        tokio::time::sleep(Duration::from_millis(5 * (attempt as u64 % 8 + 1))).await;
    }
    Err(MailboxError::Method {
        method: "Email/set".into(),
        kind: "stateMismatch".into(),
        description: Some(format!(
            "the mailbox kept changing over {ATTEMPTS} attempts to claim a mail"
        )),
    })
}

/// Renews this replica's claim for another `lease`; `Ok(false)` when it is not this
/// replica's any more (another took it over after the lease ran out).
pub async fn renew(
    jmap: &JmapClient,
    email_id: &str,
    replica: &str,
    lease: Duration,
) -> Result<bool, MailboxError> {
    for _ in 0..ATTEMPTS {
        let Some((held, state)) = read(jmap, email_id).await? else {
            return Ok(false);
        };
        if held.by.as_deref() != Some(replica) || held.done {
            return Ok(false);
        }
        if set_if(
            jmap,
            &state,
            email_id,
            patch(&held, replica, now_secs() + lease.as_secs()),
        )
        .await?
        {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(true)
}

/// Marks the task answered: nobody takes it over.
pub async fn finish(jmap: &JmapClient, email_id: &str) -> Result<(), MailboxError> {
    jmap.call(
        "Email/set",
        json!({ "update": { email_id: { format!("keywords/{DONE}"): true } } }),
    )
    .await
    .map(drop)
}

/// The claims on `inbox` not yet answered, at most `limit`: each mail's id and claim.
async fn open_claims(
    jmap: &JmapClient,
    inbox: &str,
    limit: usize,
) -> Result<Vec<(String, Held)>, MailboxError> {
    let found = jmap
        .call(
            "Email/query",
            json!({
                "filter": { "inMailbox": inbox, "hasKeyword": CLAIMED, "notKeyword": DONE },
                "limit": limit
            }),
        )
        .await?;
    let ids: Vec<Value> = found["ids"].as_array().cloned().unwrap_or_default();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let got = jmap
        .call(
            "Email/get",
            json!({ "ids": ids, "properties": ["keywords"] }),
        )
        .await?;
    Ok(got["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["id"].as_str()?.to_string(),
                Held::of(e["keywords"].as_object()?),
            ))
        })
        .collect())
}

/// Dispatches in `inbox` that a replica claimed and stopped renewing (its lease ran out), not
/// answered: the ids of those a replica should take over.
pub async fn expired(jmap: &JmapClient, inbox: &str) -> Result<Vec<String>, MailboxError> {
    let now = now_secs();
    Ok(open_claims(jmap, inbox, 256)
        .await?
        .into_iter()
        .filter(|(_, held)| !held.live(now))
        .map(|(id, _)| id)
        .collect())
}

/// The claims on `inbox` not yet answered (at most 1,000), for `status`.
pub async fn held(jmap: &JmapClient, inbox: &str) -> Result<Vec<Held>, MailboxError> {
    Ok(open_claims(jmap, inbox, 1000)
        .await?
        .into_iter()
        .map(|(_, held)| held)
        .collect())
}

/// Who holds what: per replica, its live claims and those whose lease ran out; from
/// [`held`] at `now` (Unix seconds), by name.
pub fn by_replica(held: &[Held], now: u64) -> std::collections::BTreeMap<String, (usize, usize)> {
    let mut out = std::collections::BTreeMap::new();
    for h in held {
        let Some(by) = &h.by else { continue };
        let entry: &mut (usize, usize) = out.entry(by.clone()).or_default();
        if h.live(now) {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_read_from_its_keywords() {
        let k: Map<String, Value> = serde_json::from_value(json!({
            "$seen": true, "$aamp-claimed": true, "$aamp-by-host-2": true, "$aamp-lease-1000": true
        }))
        .unwrap();
        let held = Held::of(&k);
        assert_eq!(held.by.as_deref(), Some("host-2"));
        assert_eq!(held.until, Some(1000));
        assert!(held.live(999));
        assert!(!held.live(1000), "the lease ends at its second");
        let done: Map<String, Value> = serde_json::from_value(
            json!({"$aamp-by-a": true, "$aamp-lease-5000": true, "$aamp-done": true}),
        )
        .unwrap();
        assert!(
            !Held::of(&done).live(0),
            "an answered task is held by nobody"
        );
        assert!(!Held::of(&Map::new()).live(0));
    }

    #[test]
    fn a_new_claim_removes_the_old_holder_and_lease() {
        let old = Held {
            by: Some("a".into()),
            until: Some(10),
            done: false,
        };
        let p = patch(&old, "b", 70);
        assert_eq!(p["keywords/$aamp-by-a"], Value::Null);
        assert_eq!(p["keywords/$aamp-lease-10"], Value::Null);
        assert_eq!(p["keywords/$aamp-by-b"], json!(true));
        assert_eq!(p["keywords/$aamp-lease-70"], json!(true));
        assert_eq!(p["keywords/$aamp-claimed"], json!(true));
    }
}
