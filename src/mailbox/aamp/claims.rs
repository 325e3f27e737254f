//! Claims on dispatches, for several bridges (replicas) serving one mailbox: the mail server
//! is the one place they share, and JMAP's `ifInState` (RFC 8620 §5.3) makes a change fail
//! with `stateMismatch` when anything changed since the state the client read, so of several
//! replicas setting their claim on one mail from the same state exactly one succeeds.
//!
//! A claim is keywords on the dispatch's mail, from a fixed set of names: `$aamp-claimed`,
//! `$aamp-by-NAME` (the replica), and the lease's end as [`LEASE_BITS`] bits, keyword
//! `$aamp-lease-bN` set for each bit N that is 1, counted in seconds from a day before the
//! mail's `receivedAt` (which the server keeps and never changes). `$aamp-done` says the task
//! was answered: nobody takes it over. The set of names is what matters: Cyrus keeps a
//! mailbox's keyword names in a table of 100 that is never emptied ("Too many user flags in
//! mailbox" past it, even once every mail is gone), so a name per lease (`$aamp-lease-SECS`,
//! as builds before this one wrote) stops claims for good after about a hundred. Here the
//! names are `3 + LEASE_BITS` plus one per replica, however many claims and renewals there
//! are. An old `$aamp-lease-SECS` is still read, and removed at the claim's next change.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::jmap::JmapClient;
use crate::mailbox::MailboxError;

pub const CLAIMED: &str = "$aamp-claimed";
pub const DONE: &str = "$aamp-done";
const BY: &str = "$aamp-by-";
/// One bit of the lease's end: `$aamp-lease-b0` is its lowest.
const LEASE_BIT: &str = "$aamp-lease-b";
/// The lease's end in Unix seconds, as builds before the bits wrote it (one name per lease).
const OLD_LEASE: &str = "$aamp-lease-";
/// Bits of the lease's end: seconds from a day before the mail arrived, so a lease reaches
/// 193 days past its mail's arrival (a later end is kept at that).
pub const LEASE_BITS: u32 = 24;
/// The lease is counted from this long before the mail's `receivedAt`: a replica whose clock
/// is behind the server's still writes an end after the count's start.
const BASE_SLACK: u64 = 86_400;

/// Every keyword name a claim on this mailbox can use, for `replicas` (the names
/// `doctor` checks the server takes).
pub fn names(replicas: &[&str]) -> Vec<String> {
    let mut out = vec![CLAIMED.to_string(), DONE.to_string()];
    out.extend((0..LEASE_BITS).map(|b| format!("{LEASE_BIT}{b}")));
    out.extend(replicas.iter().map(|r| format!("{BY}{r}")));
    out
}

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
    /// When the lease ends, Unix seconds.
    pub until: Option<u64>,
    pub done: bool,
    /// The lease bits set now (what a new lease changes).
    bits: u32,
    /// An old-style `$aamp-lease-SECS` keyword's value (removed at the next change).
    old_lease: Option<u64>,
    /// Where the lease is counted from (Unix seconds), when the mail's arrival is known.
    base: Option<u64>,
}

impl Held {
    /// The claim on a mail with `keywords` that arrived at `received_at` (JMAP `receivedAt`).
    pub fn of(keywords: &Map<String, Value>, received_at: Option<&str>) -> Held {
        let base = received_at
            .and_then(crate::protocol::time::parse)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs().saturating_sub(BASE_SLACK));
        let mut held = Held {
            base,
            ..Held::default()
        };
        let mut any_bit = false;
        for (key, on) in keywords {
            if on != &Value::Bool(true) {
                continue;
            }
            let key = key.to_ascii_lowercase();
            if key == DONE {
                held.done = true;
            } else if let Some(name) = key.strip_prefix(BY) {
                held.by = Some(name.to_string());
            } else if let Some(bit) = key.strip_prefix(LEASE_BIT) {
                if let Some(bit) = bit.parse::<u32>().ok().filter(|b| *b < LEASE_BITS) {
                    held.bits |= 1 << bit;
                    any_bit = true;
                }
            } else if let Some(secs) = key.strip_prefix(OLD_LEASE) {
                held.old_lease = secs.parse().ok().max(held.old_lease);
            }
        }
        let new_until = base.filter(|_| any_bit).map(|b| b + u64::from(held.bits));
        held.until = new_until.max(held.old_lease);
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

/// The keyword patch that makes `replica` the holder until `until`, removing what `old` had
/// (changing only the lease bits that differ). `None` when the mail's arrival is unknown, so
/// a lease cannot be written.
fn patch(old: &Held, replica: &str, until: u64) -> Option<Value> {
    let base = old.base?;
    let max = (1u64 << LEASE_BITS) - 1;
    let bits = until.saturating_sub(base).min(max) as u32;
    let mut p = Map::new();
    if let Some(by) = old.by.as_deref().filter(|by| *by != replica) {
        p.insert(format!("keywords/{BY}{by}"), Value::Null);
    }
    if let Some(u) = old.old_lease {
        p.insert(format!("keywords/{OLD_LEASE}{u}"), Value::Null);
    }
    for bit in 0..LEASE_BITS {
        let (was, now) = (old.bits >> bit & 1, bits >> bit & 1);
        if was != now {
            let value = if now == 1 { json!(true) } else { Value::Null };
            p.insert(format!("keywords/{LEASE_BIT}{bit}"), value);
        }
    }
    p.insert(format!("keywords/{CLAIMED}"), json!(true));
    p.insert(format!("keywords/{BY}{replica}"), json!(true));
    Some(Value::Object(p))
}

/// The properties a claim is read from.
const PROPERTIES: [&str; 2] = ["keywords", "receivedAt"];

/// Reads a mail's claim, and the Email state it was read in.
async fn read(jmap: &JmapClient, email_id: &str) -> Result<Option<(Held, String)>, MailboxError> {
    let got = jmap
        .call(
            "Email/get",
            json!({ "ids": [email_id], "properties": PROPERTIES }),
        )
        .await?;
    let state = got["state"].as_str().unwrap_or_default().to_string();
    let mail = &got["list"][0];
    Ok(mail["keywords"]
        .as_object()
        .map(|k| (Held::of(k, mail["receivedAt"].as_str()), state)))
}

/// Changes a mail's keywords only if nothing changed since `state`; `Ok(false)` when
/// something did. The server refusing this change of this mail (a JMAP SetError: its keyword
/// table is full, `serverFail`; the login may not change keywords, `forbidden`; ...) is
/// [`MailboxError::Refused`]: asking again gets the same answer.
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
            Some(why) => Err(MailboxError::Refused {
                what: "the claim's keywords".into(),
                kind: why["type"].as_str().unwrap_or("notUpdated").to_string(),
                description: why["description"].as_str().map(str::to_string),
            }),
            None => Ok(true),
        },
        Err(MailboxError::Method { kind, .. }) if kind == "stateMismatch" => Ok(false),
        Err(MailboxError::Method {
            kind, description, ..
        }) if kind == "forbidden" => Err(MailboxError::Refused {
            what: "the claim's keywords".into(),
            kind,
            description,
        }),
        Err(e) => Err(e),
    }
}

/// A mail whose arrival the server does not say: no lease can be written on it.
fn no_base() -> MailboxError {
    MailboxError::Refused {
        what: "a claim".into(),
        kind: "noReceivedAt".into(),
        description: Some(
            "the server gave no receivedAt for the mail, which a lease counts from".into(),
        ),
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
    let Some(copies) = copies_filter(jmap, email_id).await? else {
        return Ok(Claim::Lost { by: None });
    };
    for attempt in 0..ATTEMPTS {
        let Some((held, others, state)) = read_with_copies(jmap, email_id, &copies).await? else {
            return Ok(Claim::Lost { by: None });
        };
        let now = now_secs();
        if held.done {
            return Ok(Claim::Lost { by: held.by });
        }
        // Another copy of the same dispatch (delivered twice) claimed or answered: the task
        // is that claim's, whichever copy this replica saw first.
        if let Some(other) = others.iter().find(|o| o.done || o.live(now)) {
            return Ok(Claim::Lost {
                by: other.by.clone(),
            });
        }
        if held.by.as_deref() == Some(replica) && held.live(now) {
            return Ok(Claim::Won);
        }
        if held.live(now) {
            return Ok(Claim::Lost { by: held.by });
        }
        let change = patch(&held, replica, now + lease.as_secs()).ok_or_else(no_base)?;
        if set_if(jmap, &state, email_id, change).await? {
            return Ok(match held.by {
                Some(from) if from != replica => Claim::TakenOver { from },
                _ => Claim::Won,
            });
        }
        // Another change came first; a short, growing pause spreads the replicas out.
        tokio::time::sleep(Duration::from_millis(5 * (attempt as u64 % 8 + 1))).await;
    }
    Err(kept_changing("claim a mail"))
}

/// How to find the other copies of a mail's dispatch in its mailbox: the same Message-ID, or
/// the same `X-AAMP-TaskId` from the same sender (JMAP's header and from conditions match
/// by substring, so what comes back is compared exactly in [`read_with_copies`]). `None`
/// when the mail is gone.
async fn copies_filter(jmap: &JmapClient, email_id: &str) -> Result<Option<Copies>, MailboxError> {
    let got = jmap
        .call(
            "Email/get",
            json!({ "ids": [email_id],
                    "properties": ["messageId", "from", "mailboxIds", "receivedAt", "header:X-AAMP-TaskId:asText"] }),
        )
        .await?;
    let mail = &got["list"][0];
    if mail.is_null() {
        return Ok(None);
    }
    Ok(Some(Copies::of(mail)))
}

/// What makes two mails copies of one dispatch (see [`copies_filter`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Copies {
    message_id: Option<String>,
    task: Option<(String, String)>,
    mailbox: Option<String>,
    /// The copies looked for arrived within a day of this one, either way (RFC 3339 times):
    /// the server matches headers by reading each mail, and its dates from its index, so the
    /// window keeps a claim's cost from growing with the whole mailbox (about 10 ms against
    /// 45 ms in an Inbox of 2,000 on the test Cyrus). A copy a day apart from the first is
    /// known to every replica that saw the first from its journal.
    window: Option<(String, String)>,
}

impl Copies {
    fn of(mail: &Value) -> Copies {
        let message_id = mail["messageId"][0].as_str().map(str::to_string);
        let task_id = mail["header:X-AAMP-TaskId:asText"]
            .as_str()
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let from = mail["from"][0]["email"].as_str();
        Copies {
            message_id,
            task: task_id
                .zip(from)
                .map(|(t, f)| (t.to_string(), f.to_ascii_lowercase())),
            mailbox: mail["mailboxIds"]
                .as_object()
                .and_then(|m| m.keys().next().cloned()),
            window: mail["receivedAt"]
                .as_str()
                .and_then(crate::protocol::time::parse)
                .map(|t| {
                    let day = Duration::from_secs(COPY_WINDOW_SECS);
                    (
                        crate::protocol::time::format_utc(t - day),
                        crate::protocol::time::format_utc(t + day),
                    )
                }),
        }
    }

    /// The JMAP filter that finds them (and more: matching is by substring).
    fn filter(&self) -> Option<Value> {
        let mut any = Vec::new();
        if let Some(id) = &self.message_id {
            any.push(json!({ "header": ["Message-ID", id] }));
        }
        if let Some((task_id, from)) = &self.task {
            any.push(json!({ "operator": "AND", "conditions": [
                { "header": ["X-AAMP-TaskId", task_id] }, { "from": from } ] }));
        }
        if any.is_empty() {
            return None;
        }
        let mut all = vec![json!({ "operator": "OR", "conditions": any })];
        if let Some(m) = &self.mailbox {
            all.push(json!({ "inMailbox": m }));
        }
        if let Some((after, before)) = &self.window {
            all.push(json!({ "after": after, "before": before }));
        }
        Some(json!({ "operator": "AND", "conditions": all }))
    }

    /// Whether `other` (a mail as read with [`COPY_PROPERTIES`]) is a copy of this one.
    fn matches(&self, other: &Copies) -> bool {
        (self.message_id.is_some() && self.message_id == other.message_id)
            || (self.task.is_some() && self.task == other.task)
    }
}

/// How far apart (seconds) two copies of a dispatch are looked for.
const COPY_WINDOW_SECS: u64 = 86_400;

const COPY_PROPERTIES: [&str; 6] = [
    "keywords",
    "receivedAt",
    "messageId",
    "from",
    "mailboxIds",
    "header:X-AAMP-TaskId:asText",
];

/// Reads a mail's claim, the claims on its other copies, and the Email state all were read
/// in (one request, so one state: a claim set `ifInState` it fails when any copy changed).
async fn read_with_copies(
    jmap: &JmapClient,
    email_id: &str,
    copies: &Copies,
) -> Result<Option<(Held, Vec<Held>, String)>, MailboxError> {
    let Some(filter) = copies.filter() else {
        return Ok(read(jmap, email_id)
            .await?
            .map(|(held, state)| (held, Vec::new(), state)));
    };
    let mut answers = jmap
        .calls(vec![
            ("Email/query", json!({ "filter": filter, "limit": 256 })),
            (
                "Email/get",
                json!({ "#ids": { "resultOf": "0", "name": "Email/query", "path": "/ids" },
                        "properties": COPY_PROPERTIES }),
            ),
            (
                "Email/get",
                json!({ "ids": [email_id], "properties": COPY_PROPERTIES }),
            ),
        ])
        .await?;
    let mine = answers.pop().expect("three answers")?;
    let found = answers.pop().expect("three answers")?;
    answers.pop().expect("three answers")?;
    let state = mine["state"].as_str().unwrap_or_default().to_string();
    let Some(keywords) = mine["list"][0]["keywords"].as_object() else {
        return Ok(None);
    };
    let held = Held::of(keywords, mine["list"][0]["receivedAt"].as_str());
    let others = found["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["id"].as_str() != Some(email_id) && copies.matches(&Copies::of(e)))
        .filter_map(|e| {
            Some(Held::of(
                e["keywords"].as_object()?,
                e["receivedAt"].as_str(),
            ))
        })
        .collect();
    Ok(Some((held, others, state)))
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
        let change = patch(&held, replica, now_secs() + lease.as_secs()).ok_or_else(no_base)?;
        if set_if(jmap, &state, email_id, change).await? {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Not renewed: said so (the caller tries again at its next renewal), where this once
    // answered that it was, and the lease aged unseen.
    Err(kept_changing("renew a claim"))
}

/// Marks the task answered, so nobody takes it over: only while `replica` holds its claim
/// (its lease may have run out, as long as nobody took it over), and only if nothing changed
/// since the claim was read (`ifInState`, as a claim is set), so a takeover made meanwhile is
/// never marked done under its new holder. `Ok(false)` when another replica holds the claim
/// now (it took the task over and answers it), or answered it; `Ok(true)` when it is marked,
/// or was already marked by this replica (or the mail is gone: nothing to take over).
pub async fn finish(
    jmap: &JmapClient,
    email_id: &str,
    replica: &str,
) -> Result<bool, MailboxError> {
    for attempt in 0..ATTEMPTS {
        let Some((held, state)) = read(jmap, email_id).await? else {
            return Ok(true);
        };
        if held.by.as_deref().is_some_and(|by| by != replica) {
            return Ok(false);
        }
        if held.done {
            return Ok(true);
        }
        let change = json!({ format!("keywords/{DONE}"): true });
        if set_if(jmap, &state, email_id, change).await? {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(5 * (attempt as u64 % 8 + 1))).await;
    }
    Err(kept_changing("mark a claim done"))
}

/// The mailbox changed under every one of [`ATTEMPTS`] conditional changes (a transient
/// error: asked again later).
fn kept_changing(what: &str) -> MailboxError {
    MailboxError::Method {
        method: "Email/set".into(),
        kind: "stateMismatch".into(),
        description: Some(format!(
            "the mailbox kept changing over {ATTEMPTS} attempts to {what}"
        )),
    }
}

/// Whether the server takes every keyword a claim of `replica` can write (for `doctor`): they
/// are set on an answered task's mail in `inbox` (which nobody claims any more) and removed
/// again. `Ok(false)` when there is no such mail to try them on; the server's refusal is
/// [`MailboxError::Refused`].
pub async fn check(jmap: &JmapClient, inbox: &str, replica: &str) -> Result<bool, MailboxError> {
    let found = jmap
        .call(
            "Email/query",
            json!({ "filter": { "inMailbox": inbox, "hasKeyword": DONE }, "limit": 1 }),
        )
        .await?;
    let Some(id) = found["ids"][0].as_str() else {
        return Ok(false);
    };
    let got = jmap
        .call(
            "Email/get",
            json!({ "ids": [id], "properties": ["keywords"] }),
        )
        .await?;
    let had = got["list"][0]["keywords"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let added: Vec<String> = names(&[replica])
        .into_iter()
        .filter(|n| !had.contains_key(n))
        .collect();
    let change = |on: bool| {
        Value::Object(
            added
                .iter()
                .map(|n| {
                    (
                        format!("keywords/{n}"),
                        if on { json!(true) } else { Value::Null },
                    )
                })
                .collect(),
        )
    };
    let tried = jmap
        .call("Email/set", json!({ "update": { id: change(true) } }))
        .await?;
    // Whatever was taken comes off again, refused or not.
    jmap.call("Email/set", json!({ "update": { id: change(false) } }))
        .await?;
    match tried["notUpdated"].get(id) {
        Some(why) => Err(MailboxError::Refused {
            what: format!("the {} keyword names a claim uses", added.len()),
            kind: why["type"].as_str().unwrap_or("notUpdated").to_string(),
            description: why["description"].as_str().map(str::to_string),
        }),
        None => Ok(true),
    }
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
        .call("Email/get", json!({ "ids": ids, "properties": PROPERTIES }))
        .await?;
    Ok(got["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["id"].as_str()?.to_string(),
                Held::of(e["keywords"].as_object()?, e["receivedAt"].as_str()),
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

    const ARRIVED: &str = "2026-12-01T00:00:00Z";
    /// Where ARRIVED's leases are counted from.
    const BASE: u64 = 1_796_083_200 - BASE_SLACK;

    fn keywords(v: Value) -> Map<String, Value> {
        serde_json::from_value(v).unwrap()
    }

    /// The keywords `patch` leaves on a mail that had `before`.
    fn apply(before: &Map<String, Value>, patch: &Value) -> Map<String, Value> {
        let mut after = before.clone();
        for (path, value) in patch.as_object().unwrap() {
            let key = path.strip_prefix("keywords/").unwrap().to_string();
            if value.is_null() {
                after.remove(&key);
            } else {
                after.insert(key, value.clone());
            }
        }
        after
    }

    #[test]
    fn a_claim_is_read_from_its_keywords() {
        // 1000 s past the base: bits 3, 5, 6, 7, 8, 9.
        let k = keywords(json!({
            "$seen": true, "$aamp-claimed": true, "$aamp-by-host-2": true,
            "$aamp-lease-b3": true, "$aamp-lease-b5": true, "$aamp-lease-b6": true,
            "$aamp-lease-b7": true, "$aamp-lease-b8": true, "$aamp-lease-b9": true
        }));
        let held = Held::of(&k, Some(ARRIVED));
        assert_eq!(held.by.as_deref(), Some("host-2"));
        assert_eq!(held.until, Some(BASE + 1000));
        assert!(held.live(BASE + 999));
        assert!(!held.live(BASE + 1000), "the lease ends at its second");
        let done =
            keywords(json!({"$aamp-by-a": true, "$aamp-lease-b20": true, "$aamp-done": true}));
        assert!(
            !Held::of(&done, Some(ARRIVED)).live(0),
            "an answered task is held by nobody"
        );
        assert!(!Held::of(&Map::new(), Some(ARRIVED)).live(0));
        assert!(
            !Held::of(&k, None).live(0),
            "bits without the mail's arrival say no time"
        );
    }

    #[test]
    fn a_lease_written_by_an_older_build_is_read_and_replaced() {
        let k = keywords(
            json!({"$aamp-claimed": true, "$aamp-by-a": true, "$aamp-lease-1796100000": true}),
        );
        let held = Held::of(&k, Some(ARRIVED));
        assert_eq!(held.until, Some(1_796_100_000));
        let p = patch(&held, "a", 1_796_100_060).unwrap();
        assert_eq!(p["keywords/$aamp-lease-1796100000"], Value::Null);
        let after = Held::of(&apply(&k, &p), Some(ARRIVED));
        assert_eq!(after.until, Some(1_796_100_060));
        assert_eq!(after.old_lease, None);
    }

    #[test]
    fn a_new_claim_removes_the_old_holder_and_changes_only_the_bits_that_differ() {
        let mut k = Map::new();
        let held = Held::of(&k, Some(ARRIVED));
        let p = patch(&held, "a", BASE + 0b1010).unwrap();
        assert_eq!(p["keywords/$aamp-claimed"], json!(true));
        assert_eq!(p["keywords/$aamp-by-a"], json!(true));
        assert_eq!(p["keywords/$aamp-lease-b1"], json!(true));
        assert_eq!(p["keywords/$aamp-lease-b3"], json!(true));
        assert_eq!(p.as_object().unwrap().len(), 4);
        k = apply(&k, &p);
        let p = patch(&Held::of(&k, Some(ARRIVED)), "b", BASE + 0b0110).unwrap();
        assert_eq!(p["keywords/$aamp-by-a"], Value::Null);
        assert_eq!(p["keywords/$aamp-by-b"], json!(true));
        assert_eq!(p["keywords/$aamp-lease-b2"], json!(true));
        assert_eq!(p["keywords/$aamp-lease-b3"], Value::Null);
        assert!(p.get("keywords/$aamp-lease-b1").is_none(), "unchanged");
        k = apply(&k, &p);
        let held = Held::of(&k, Some(ARRIVED));
        assert_eq!(
            (held.by.as_deref(), held.until),
            (Some("b"), Some(BASE + 6))
        );
    }

    #[test]
    fn any_number_of_leases_uses_the_same_few_names() {
        let mut k = Map::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut until = BASE + BASE_SLACK;
        for n in 0..5_000u64 {
            until += 1 + n % 97;
            let replica = if n % 3 == 0 { "r1" } else { "r2" };
            let p = patch(&Held::of(&k, Some(ARRIVED)), replica, until).unwrap();
            k = apply(&k, &p);
            seen.extend(k.keys().cloned());
            let held = Held::of(&k, Some(ARRIVED));
            assert_eq!(
                (held.by.as_deref(), held.until),
                (Some(replica), Some(until))
            );
        }
        let allowed: std::collections::BTreeSet<String> =
            names(&["r1", "r2"]).into_iter().collect();
        assert!(seen.is_subset(&allowed), "{seen:?}");
        assert!(allowed.len() <= 3 + LEASE_BITS as usize + 2);
    }

    #[test]
    fn copies_of_a_dispatch_are_its_message_id_or_its_senders_task_id() {
        let mail = |id: &str, task: &str, from: &str| {
            Copies::of(&json!({"messageId": [id], "from": [{"email": from}],
                "mailboxIds": {"inbox": true}, "receivedAt": ARRIVED,
                "header:X-AAMP-TaskId:asText": format!(" {task}")}))
        };
        let first = mail("m1@x", "t1", "Boss@X.test");
        assert!(first.matches(&mail("m1@x", "t2", "other@x.test")));
        assert!(first.matches(&mail("m2@x", "t1", "boss@x.test")));
        assert!(!first.matches(&mail("m2@x", "t1", "other@x.test")));
        assert!(!first.matches(&mail("m2@x", "t11", "boss@x.test")));
        let filter = first.filter().unwrap().to_string();
        for part in [
            r#"{"header":["Message-ID","m1@x"]}"#,
            r#"{"header":["X-AAMP-TaskId","t1"]}"#,
            r#"{"from":"boss@x.test"}"#,
            r#"{"inMailbox":"inbox"}"#,
            r#""after":"2026-11-30T00:00:00Z""#,
            r#""before":"2026-12-02T00:00:00Z""#,
        ] {
            assert!(filter.contains(part), "{part} in {filter}");
        }
        assert_eq!(Copies::of(&json!({})).filter(), None, "nothing to match by");
    }

    #[test]
    fn a_lease_past_the_bits_is_kept_at_their_end() {
        let far = BASE + (1 << LEASE_BITS) + 5;
        let p = patch(&Held::of(&Map::new(), Some(ARRIVED)), "a", far).unwrap();
        let held = Held::of(&apply(&Map::new(), &p), Some(ARRIVED));
        assert_eq!(held.until, Some(BASE + (1 << LEASE_BITS) - 1));
        assert!(patch(&Held::of(&Map::new(), None), "a", far).is_none());
    }
}
