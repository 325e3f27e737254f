//! The SAMP back-end ("Agent Mailbox", clement10601/agent-mailbox): an agent's mailbox on an
//! MCP server over Streamable HTTP, with a bearer `amk_` key per agent. Polled (`check_inbox`
//! lists the unread messages, oldest first, and marks nothing read): each message is handed
//! to `deliver` (the journal, which de-duplicates by the message id) BEFORE it is acked, as
//! `ack` clears its subject, body and data; a bridge killed in between reads it again and the
//! journal knows it. There is no position file: the server's unread state is the position.
//!
//! At start (and after a refused key) `initialize`, `tools/list` and `whoami`: the tools'
//! arguments are mapped from their input schemas ([`tools`]), the agent's name and limits
//! read. The sender of a message is stamped by the server from the sender's key, so it is
//! believed as the provider says.
//!
//! How SAMP maps onto the bridge's model: a message is a task (`task.dispatch`; the subject is
//! its title, the body its text, the thread its Session-Key) unless its `data` says otherwise:
//! `data.aamp` may carry `intent`, `taskId`, `sessionKey` and `hopCount`; a message whose
//! `data.aamp.intent` is not `task.dispatch` is an answer and never starts a task. Answers go
//! back with `send_message` to the sender, `in_reply_to` the task (so in its thread), the
//! structured result in `data.aamp`. The TaskId is `samp:<thread_id>:<message_id>` unless the
//! sender gave one.
//!
//! Limits (the SAMP README): subject 200 characters, body 32 KB, data 64 KB of JSON, 30 sends
//! a minute. A longer body is cut at 32 KB with a note saying how long the answer was (not
//! split: parts would each count against the recipient's 10 unread and the send rate, and a
//! retry could double some); data over 64 KB loses its structured result, with a note. Sends
//! are paced to the server's rate (from `whoami`, else 30 a minute); `rate_limited` is waited
//! out (`retry_after_seconds`) and tried again, `inbox_full` is retried by the outbox with
//! backoff; `blocked` and `unknown_recipient` are permanent.

mod replies;
mod rpc;
pub mod tools;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::error::OpenError;
use super::intake::{self, DeliverError, Health, IntakeError, Watched};
use super::outlet::{Intake, Opening, Outlet, Probe, System};
use super::{Inbound, Mail, MailboxError};
use crate::backend::BackendError;
use crate::config::SampAccount;
use crate::error::{Classify, ErrorClass};
use crate::events::Events;
use crate::protocol::Intent;
pub use replies::SampReplies;
use tools::Tools;

/// Subject, body and data limits (the SAMP README).
const SUBJECT_MAX_CHARS: usize = 200;
const BODY_MAX_BYTES: usize = 32 * 1024;
const DATA_MAX_BYTES: usize = 64 * 1024;
/// Sends a minute when `whoami` does not say.
const SENDS_PER_MINUTE: usize = 30;
/// Messages asked for per `check_inbox`.
const PAGE: u64 = 20;
/// The longest a send waits out `rate_limited` before the outbox retries it later.
const RATE_WAIT: Duration = Duration::from_secs(120);
/// Why the sender of a SAMP message is believed.
const BELIEVED: &str = "the SAMP server stamps the sender from its key";

/// Why a SAMP call did not go through, classed for the intake's health and the outbox.
#[derive(Debug, thiserror::Error)]
pub enum SampError {
    /// The HTTP link: unreachable, or an HTTP status (401: the key was refused).
    #[error(transparent)]
    Link(#[from] MailboxError),
    #[error("the SAMP server answered {method} with error {code}: {message}")]
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
    /// A tool's refusal (`isError`), with the server's code and words.
    #[error("SAMP {tool} refused: {code}: {message}")]
    Refused {
        tool: String,
        code: String,
        message: String,
        retry_after: Option<u64>,
    },
    /// A tool or argument the bridge needs and cannot find in `tools/list`.
    #[error("the SAMP server's tool {tool} cannot be used: {problem}")]
    Mapping { tool: String, problem: String },
    #[error("the SAMP server's answer to {what} was not understood: {detail}")]
    Protocol { what: String, detail: String },
}

impl Classify for SampError {
    fn class(&self) -> ErrorClass {
        match self {
            SampError::Link(e) => e.class(),
            // Internal errors may pass; a request the server does not take will not.
            SampError::Rpc { code, .. } => match code {
                -32603 => ErrorClass::Transient,
                _ => ErrorClass::Permanent,
            },
            SampError::Refused { code, .. } => match code.as_str() {
                "rate_limited" | "inbox_full" => ErrorClass::Transient,
                "unauthorized" | "agent_disabled" => ErrorClass::Auth,
                _ => ErrorClass::Permanent,
            },
            SampError::Mapping { .. } | SampError::Protocol { .. } => ErrorClass::Permanent,
        }
    }
}

impl From<SampError> for MailboxError {
    fn from(e: SampError) -> MailboxError {
        match e {
            SampError::Link(e) => e,
            e => MailboxError::Service {
                class: e.class(),
                detail: e.to_string(),
            },
        }
    }
}

impl From<SampError> for IntakeError {
    fn from(e: SampError) -> IntakeError {
        IntakeError::Mailbox(e.into())
    }
}

impl From<SampError> for BackendError {
    fn from(e: SampError) -> BackendError {
        let class = e.class();
        let message = match &e {
            SampError::Refused { code, .. } if code == "inbox_full" => format!(
                "{e} (the recipient has too many unread messages; the answer waits in the outbox and is sent once they read theirs)"
            ),
            _ => e.to_string(),
        };
        BackendError::new(class, message)
    }
}

/// A message as `check_inbox` returns it (guessed shape: tests/hosts/README.md).
#[derive(Clone, Debug, Deserialize)]
pub struct SampMessage {
    pub id: String,
    #[serde(default)]
    pub thread_id: Option<String>,
    #[serde(default)]
    pub in_reply_to: Option<String>,
    pub from: String,
    #[serde(default)]
    pub to: String,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub data: Option<Value>,
}

/// What `initialize`, `tools/list` and `whoami` told.
#[derive(Clone, Debug)]
struct Ready {
    tools: Tools,
    me: String,
    sends_per_minute: usize,
}

/// Messages this process read (their subject and thread), answers it tried, questions the
/// agent posted.
#[derive(Default)]
struct Recent {
    read: VecDeque<(String, String, String)>,
    attempted: super::RecentIds,
    questions: super::Questions,
    /// Every answer the server confirmed: the posted id and the bridge's Message-ID, kept on
    /// disk, so an acked answer of ours that the bridge never saw confirmed (a crash or a
    /// lost answer right after the send) is told apart from the ones it did.
    sent: super::Questions,
}

const RECENT: usize = 4096;

/// How far the server's clock may be behind the bridge's when an answer's send time is
/// compared with the time it was made.
const CLOCK_SKEW_SECS: i64 = 5;

impl Recent {
    fn saw(&mut self, m: &SampMessage) {
        if self.read.len() >= RECENT {
            self.read.pop_front();
        }
        self.read.push_back((
            m.id.clone(),
            m.thread_id.clone().unwrap_or_default(),
            m.subject.clone().unwrap_or_default(),
        ));
    }

    /// The thread and subject of message `id`, when this process read it.
    fn message(&self, id: &str) -> Option<(String, String)> {
        self.read
            .iter()
            .rev()
            .find(|(i, _, _)| i == id)
            .map(|(_, t, s)| (t.clone(), s.clone()))
    }

    fn first_attempt(&mut self, message_id: &str) -> bool {
        self.attempted.first(message_id, RECENT)
    }
}

/// One agent's SAMP mailbox.
#[derive(Clone)]
pub struct SampClient {
    rpc: Arc<rpc::Rpc>,
    account: SampAccount,
    ready: Arc<Mutex<Option<Ready>>>,
    recent: Arc<Mutex<Recent>>,
    /// When the last sends went (pacing), held across a send so sends go one at a time.
    sends: Arc<tokio::sync::Mutex<VecDeque<tokio::time::Instant>>>,
    unreadable: Arc<super::UnreadableLog>,
}

impl SampClient {
    pub fn new(account: SampAccount) -> Result<SampClient, MailboxError> {
        let http = super::http_client(account.insecure_tls, Some(account.timeout))?;
        Ok(SampClient {
            rpc: Arc::new(rpc::Rpc::new(
                http,
                account.url.clone(),
                account.key.clone(),
            )),
            account,
            ready: Arc::default(),
            recent: Arc::default(),
            sends: Arc::default(),
            unreadable: Arc::default(),
        })
    }

    /// Keeps the agent's questions in `path`, so replies to them are known after a restart.
    pub fn with_questions(self, path: std::path::PathBuf) -> SampClient {
        self.recent.lock().expect("recent lock").questions = super::Questions::open(path);
        self
    }

    /// Keeps the answers the server confirmed in the file `path`.
    pub fn with_sent(self, path: std::path::PathBuf) -> SampClient {
        self.recent.lock().expect("recent lock").sent = super::Questions::open(path);
        self
    }

    pub fn secret(&self) -> &crate::config::Secret {
        &self.account.key
    }

    /// The server's host: what the bridge writes after an agent's name to make an address.
    pub fn domain(&self) -> String {
        self.account.url.host_str().unwrap_or("samp").to_string()
    }

    /// The agent's name on the server (once `whoami` told it), else the mailbox's.
    pub fn address(&self) -> String {
        match &*self.ready.lock().expect("ready lock") {
            Some(r) => r.me.clone(),
            None => self.account.name.clone(),
        }
    }

    /// `initialize`, `tools/list` (mapped) and `whoami`, once (again after a failure).
    async fn ready(&self) -> Result<Ready, SampError> {
        if let Some(ready) = self.ready.lock().expect("ready lock").clone() {
            return Ok(ready);
        }
        self.rpc.initialize().await?;
        let tools = tools::map(&self.rpc.list_tools().await?)?;
        let me = self.rpc.call_tool("whoami", json!({})).await?;
        let name = me["name"]
            .as_str()
            .or(me["agent"].as_str())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| SampError::Protocol {
                what: "whoami".into(),
                detail: "no agent name".into(),
            })?;
        let ready = Ready {
            tools,
            me: name.to_string(),
            sends_per_minute: me["limits"]["sends_per_minute"]
                .as_u64()
                .map_or(SENDS_PER_MINUTE, |n| n.max(1) as usize),
        };
        *self.ready.lock().expect("ready lock") = Some(ready.clone());
        Ok(ready)
    }

    /// A call, forgetting the session after a refused key (the next call starts over).
    async fn call(&self, tool: &str, arguments: Value) -> Result<Value, SampError> {
        let result = self.rpc.call_tool(tool, arguments).await;
        if let Err(e) = &result {
            if e.class() == ErrorClass::Auth {
                self.forget();
            }
        }
        result
    }

    fn forget(&self) {
        self.rpc.reset();
        *self.ready.lock().expect("ready lock") = None;
    }

    /// A page of unread messages, oldest first, and whether more wait.
    pub async fn check_inbox(&self) -> Result<(Vec<SampMessage>, bool), SampError> {
        let ready = self.ready().await.inspect_err(|_| self.forget())?;
        let mut args = Map::new();
        if let Some(limit) = &ready.tools.inbox_limit {
            args.insert(limit.clone(), json!(PAGE));
        }
        let page = self.call("check_inbox", Value::Object(args)).await?;
        let (messages, bad) =
            super::decode_each::<SampMessage>(&page["messages"], "a SAMP inbox message")
                .map_err(SampError::from)?;
        self.unreadable.note(bad);
        Ok((messages, page["has_more"].as_bool().unwrap_or(false)))
    }

    pub async fn ack(&self, ids: &[String]) -> Result<(), SampError> {
        if ids.is_empty() {
            return Ok(());
        }
        let ready = self.ready().await?;
        self.call("ack", json!({ ready.tools.ack_ids: ids }))
            .await
            .map(|_| ())
    }

    /// The messages of a thread, oldest first (acked ones without content); empty when the
    /// server has no `read_thread`.
    async fn thread(&self, thread_id: &str) -> Result<Vec<Value>, SampError> {
        let ready = self.ready().await?;
        let Some(field) = ready.tools.thread_id else {
            return Ok(Vec::new());
        };
        let answer = self
            .call("read_thread", json!({ field: thread_id }))
            .await?;
        Ok(answer["messages"].as_array().cloned().unwrap_or_default())
    }

    /// Sends one message, paced to the server's rate; `rate_limited` is waited out (up to
    /// [`RATE_WAIT`] in all) and tried again. The posted message's id.
    async fn send(
        &self,
        to: &str,
        subject: &str,
        body: &str,
        data: Option<Value>,
        in_reply_to: &str,
    ) -> Result<String, SampError> {
        let ready = self.ready().await?;
        let f = &ready.tools.send;
        let mut args = Map::new();
        args.insert(f.to.clone(), json!(to));
        if let Some(s) = &f.subject {
            args.insert(s.clone(), json!(subject));
        }
        args.insert(f.body.clone(), json!(body));
        if let (Some(d), Some(data)) = (&f.data, data) {
            args.insert(d.clone(), data);
        }
        args.insert(f.in_reply_to.clone(), json!(in_reply_to));
        let args = Value::Object(args);
        let mut sends = self.sends.lock().await;
        let mut waited = Duration::ZERO;
        loop {
            // Pacing: no more than the rate in any minute.
            let minute = Duration::from_secs(60);
            let now = tokio::time::Instant::now();
            while sends
                .front()
                .is_some_and(|t| now.duration_since(*t) >= minute)
            {
                sends.pop_front();
            }
            if sends.len() >= ready.sends_per_minute {
                let until = sends[sends.len() - ready.sends_per_minute] + minute;
                tracing::info!(
                    wait_s = until.duration_since(now).as_secs(),
                    "pacing sends to the SAMP server's rate ({} a minute)",
                    ready.sends_per_minute
                );
                tokio::time::sleep_until(until).await;
                continue;
            }
            sends.push_back(now);
            while sends.len() > 1000 {
                sends.pop_front();
            }
            match self.call("send_message", args.clone()).await {
                Ok(sent) => {
                    return Ok(sent["message_id"]
                        .as_str()
                        .or(sent["id"].as_str())
                        .unwrap_or_default()
                        .to_string())
                }
                Err(SampError::Refused {
                    code, retry_after, ..
                }) if code == "rate_limited" && waited < RATE_WAIT => {
                    let wait = Duration::from_secs(retry_after.unwrap_or(10).clamp(1, 120));
                    tracing::info!(
                        wait_s = wait.as_secs(),
                        "the SAMP server says sends are over its rate; waiting as it asks"
                    );
                    waited += wait;
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The AAMP fields a message carries in `data.aamp`.
#[derive(Debug, Default, PartialEq, Eq)]
struct AampData {
    intent: Option<String>,
    task_id: Option<String>,
    session_key: Option<String>,
    hop_count: Option<u32>,
    /// `hopCount` was given but is not a whole number of hops (a string, a fraction, less
    /// than 0): what it was. Such a task is refused, never run as one that passed no agent
    /// before (the loop guard counts on it).
    bad_hop_count: Option<String>,
}

fn aamp_data(data: Option<&Value>) -> AampData {
    let a = data.map(|d| &d["aamp"]).unwrap_or(&Value::Null);
    let text = |k: &str| {
        a[k].as_str()
            .map(|s| s.trim().chars().take(200).collect::<String>())
            .filter(|s| !s.is_empty() && !s.chars().any(char::is_control))
    };
    AampData {
        intent: text("intent"),
        task_id: text("taskId"),
        session_key: text("sessionKey"),
        hop_count: a["hopCount"].as_u64().and_then(|n| u32::try_from(n).ok()),
        bad_hop_count: match &a["hopCount"] {
            Value::Null => None,
            n if n.as_u64().is_some_and(|n| u32::try_from(n).is_ok()) => None,
            other => Some(other.to_string().chars().take(40).collect()),
        },
    }
}

/// The TaskId of a message without one of its own: its thread and its id.
fn task_id(m: &SampMessage) -> String {
    format!("samp:{}:{}", m.thread_id.as_deref().unwrap_or(""), m.id)
}

/// The message id a TaskId made by [`task_id`] names.
fn parse_task_id(task_id: &str) -> Option<(&str, &str)> {
    let rest = task_id.strip_prefix("samp:")?;
    let (thread, id) = rest.rsplit_once(':')?;
    (!id.is_empty()).then_some((thread, id))
}

fn message_id(id: &str) -> String {
    format!("<{id}@samp>")
}

/// A SAMP message as a task for the agent (or, with an answer's intent, a message that never
/// starts one).
/// Senders are agent names; the bridge's model (and the sender policy) takes addresses, so a
/// name is written `NAME@HOST` with the server's host (`domain`), and the host dropped again
/// when an answer goes back.
pub fn to_inbound(m: &SampMessage, domain: &str) -> Option<Inbound> {
    let (from, to) = (format!("{}@{domain}", m.from), format!("{}@{domain}", m.to));
    let aamp = aamp_data(m.data.as_ref());
    let is_answer = aamp
        .intent
        .as_deref()
        .is_some_and(|i| i != Intent::TaskDispatch.as_str())
        || m.data
            .as_ref()
            .is_some_and(|d| d[super::FOREIGN_MARK]["answer"].is_string());
    let bad_hop_count = aamp.bad_hop_count.clone();
    let mut inbound = super::ForeignTask {
        id: &m.id,
        task_id: aamp.task_id.unwrap_or_else(|| task_id(m)),
        message_id: message_id(&m.id),
        from: &from,
        to: &to,
        title: m.subject.as_deref().unwrap_or_default(),
        body: m.body.clone().unwrap_or_default(),
        session_key: aamp
            .session_key
            .unwrap_or_else(|| format!("samp:{}", m.thread_id.as_deref().unwrap_or(&m.id))),
        references: Vec::new(),
        believed_because: BELIEVED,
        hop_count: aamp.hop_count,
        is_answer,
    }
    .into_inbound()?;
    if let Some(given) = bad_hop_count.filter(|_| !is_answer) {
        inbound.refused = Some(format!(
            "data.aamp.hopCount must be a whole number of hops (0 or more), not {given}; send it as a JSON number"
        ));
    }
    Some(inbound)
}

/// The inbox for [`intake::watch`].
struct SampWatched<'a, D> {
    client: SampClient,
    deliver: D,
    link: &'a super::link::Link,
    agent: &'a str,
    events: Events,
}

impl<D: FnMut(Mail) -> Result<(), DeliverError> + Send> Watched for SampWatched<'_, D> {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        let mut taken = 0;
        // A few pages at most per read; the rest at the next one, at once.
        for _ in 0..5 {
            let (messages, more) = self.client.check_inbox().await?;
            let mut handled = Vec::new();
            for m in &messages {
                hand_on(&self.client, m, &mut self.deliver)?;
                handled.push(m.id.clone());
            }
            // Unreadable ones are reported and acked too: left unread they would fill the
            // inbox (10 unread refuse every sender).
            let bad = self.client.unreadable.take();
            handled.extend(bad.iter().filter_map(|b| b.id.clone()));
            super::report_unreadable(bad, self.agent, "SAMP", &self.events);
            // Only now, with every one in the journal: ack clears their content.
            self.client.ack(&handled).await?;
            taken += messages.len();
            if !more || handled.is_empty() {
                break;
            }
        }
        Ok(taken)
    }

    fn next_read(&mut self, taken: usize) -> Duration {
        self.link.push("polling");
        if taken > 0 {
            Duration::ZERO
        } else {
            self.client.account.poll_interval
        }
    }

    fn address(&self) -> String {
        self.client.address()
    }
}

/// Hands one message to the journal: an answer to a question the agent asked as a reply,
/// anything else as a task.
fn hand_on(
    client: &SampClient,
    m: &SampMessage,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<(), IntakeError> {
    let question = {
        let mut recent = client.recent.lock().expect("recent lock");
        recent.saw(m);
        m.in_reply_to
            .as_deref()
            .and_then(|parent| recent.questions.question(parent))
    };
    if let Some(question) = question {
        let reply = crate::inbound::Reply {
            email_id: m.id.clone(),
            from: format!("{}@{}", m.from, client.domain()),
            message_id: message_id(&m.id),
            in_reply_to: Some(question),
            references: Vec::new(),
            text: m.body.clone().unwrap_or_default(),
            sender_check: crate::inbound::SenderCheck::Verified(BELIEVED.into()),
            auto_submitted: false,
        };
        return deliver(Mail::Reply(reply)).map_err(IntakeError::Deliver);
    }
    match to_inbound(m, &client.domain()) {
        Some(inbound) => deliver(Mail::Aamp(Box::new(inbound))).map_err(IntakeError::Deliver),
        None => {
            tracing::warn!(id = %m.id, "a SAMP message that cannot be read as a task; skipped");
            Ok(())
        }
    }
}

/// The mailbox system SAMP.
pub(crate) const SYSTEM: System = System {
    open: |o| Box::pin(open(o)),
    probe: Some(|config, name| Box::pin(probe(config, name))),
};

/// Opens an agent's SAMP mailbox: `send_message` replies out, the inbox polled in.
async fn open(o: Opening<'_>) -> Result<(Outlet, Intake), OpenError> {
    let agent = &o.agent.name;
    let client = SampClient::new(o.config.samp_account(o.agent.mailbox_name())?)
        .map_err(|source| OpenError::mailbox(format!("agent {agent:?}: SAMP setup"), source))?
        .with_questions(o.config.state().mailbox_file(agent, "samp", "questions"))
        .with_sent(o.config.state().mailbox_file(agent, "samp", "sent"));
    let outlet = Outlet::new(SampReplies::new(client.clone()));
    let intake = Intake::new(move |r| {
        Box::pin(run_intake(
            r.name, client, r.link, r.deliver, r.events, r.stop,
        ))
    });
    Ok((outlet, intake))
}

/// Polls the inbox until `stop` (SAMP has no push the bridge uses).
pub async fn run_intake(
    name: String,
    client: SampClient,
    link: super::link::Link,
    deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
    events: Events,
    stop: CancellationToken,
) {
    let health = Health::new(
        &link,
        "the SAMP server",
        client.account.name.clone(),
        "key_file (then `aamp-bridge reload`)",
    )
    // A refused key is asked about again only every 5 minutes (the default), not every few
    // seconds as AMP's and ASMTP's: the SAMP server locks out the whole address after a few
    // failed keys (the README: a per-IP lockout), and with it every other agent of the
    // machine. A key written to the file is still tried at once.
    .with_secret(client.account.key.clone());
    let mut watched = SampWatched {
        client,
        deliver,
        link: &link,
        agent: &name,
        events,
    };
    intake::watch(&name, events, health, &mut watched, None, &stop).await;
}

/// `doctor` and `init`: the server's tools mapped, `whoami` and the inbox read once.
async fn probe(
    config: &crate::config::LoadedConfig,
    name: &str,
) -> Result<Probe, crate::config::ConfigError> {
    let account = config.samp_account(name)?;
    let url = account.url.clone();
    let result = match SampClient::new(account) {
        Ok(client) => async {
            let ready = client.ready().await?;
            let (messages, more) = client.check_inbox().await?;
            Ok::<_, SampError>((ready, messages.len(), more))
        }
        .await
        .map_err(MailboxError::from),
        Err(e) => Err(e),
    };
    let address = result
        .as_ref()
        .map(|(r, _, _)| r.me.clone())
        .unwrap_or_else(|_| name.to_string());
    Ok(Probe {
        system: "SAMP",
        address,
        result: result.map(|(r, n, more)| {
            format!(
                "agent {} at {url}: tools mapped, {n}{} unread; SAMP has no push: polling",
                r.me,
                if more { "+" } else { "" }
            )
        }),
        auth_fix: "the server refused the key: put a working amk_ key in key_file (mode 0600), then `aamp-bridge reload`",
        other_fix: "check samp_url (the server's /mcp endpoint) and that the server runs",
    })
}

#[cfg(test)]
mod tests;
