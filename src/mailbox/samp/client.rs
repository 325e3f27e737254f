//! One agent's SAMP mailbox as the bridge calls it: the session made ready once (`initialize`,
//! the tools mapped, `whoami`), the inbox read and acked, threads read, and sends paced to
//! the server's rate; with what it remembers of the messages it read and the answers it sent.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::error::SampError;
use super::rpc::Rpc;
use super::tools::Tools;
use super::wire::SampMessage;
use crate::config::SampAccount;
use crate::error::{Classify, ErrorClass};
use crate::mailbox::{MailboxError, Questions, RecentIds, UnreadableLog};

/// Sends a minute when `whoami` does not say.
const SENDS_PER_MINUTE: usize = 30;
/// Messages asked for per `check_inbox`.
const PAGE: u64 = 20;
/// The longest a send waits out `rate_limited` before the outbox retries it later.
const RATE_WAIT: Duration = Duration::from_secs(120);

/// What `initialize`, `tools/list` and `whoami` told.
#[derive(Clone, Debug)]
pub(super) struct Ready {
    pub(super) tools: Tools,
    pub(super) me: String,
    sends_per_minute: usize,
}

/// Messages this process read (their subject and thread), answers it tried, questions the
/// agent posted.
#[derive(Default)]
pub(super) struct Recent {
    read: VecDeque<(String, String, String)>,
    attempted: RecentIds,
    pub(super) questions: Questions,
    /// Every answer the server confirmed: the posted id and the bridge's Message-ID, kept on
    /// disk, so an acked answer of ours that the bridge never saw confirmed (a crash or a
    /// lost answer right after the send) is told apart from the ones it did.
    pub(super) sent: Questions,
}

const RECENT: usize = 4096;

impl Recent {
    pub(super) fn saw(&mut self, m: &SampMessage) {
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
    pub(super) fn message(&self, id: &str) -> Option<(String, String)> {
        self.read
            .iter()
            .rev()
            .find(|(i, _, _)| i == id)
            .map(|(_, t, s)| (t.clone(), s.clone()))
    }

    pub(super) fn first_attempt(&mut self, message_id: &str) -> bool {
        self.attempted.first(message_id, RECENT)
    }
}

/// One agent's SAMP mailbox.
#[derive(Clone)]
pub struct SampClient {
    rpc: Arc<Rpc>,
    pub(super) account: SampAccount,
    ready: Arc<Mutex<Option<Ready>>>,
    pub(super) recent: Arc<Mutex<Recent>>,
    /// When the last sends went (pacing), held across a send so sends go one at a time.
    sends: Arc<tokio::sync::Mutex<VecDeque<tokio::time::Instant>>>,
    pub(super) unreadable: Arc<UnreadableLog>,
}

impl SampClient {
    pub fn new(account: SampAccount) -> Result<SampClient, MailboxError> {
        let http = crate::mailbox::http_client(account.insecure_tls, Some(account.timeout))?;
        Ok(SampClient {
            rpc: Arc::new(Rpc::new(http, account.url.clone(), account.key.clone())),
            account,
            ready: Arc::default(),
            recent: Arc::default(),
            sends: Arc::default(),
            unreadable: Arc::default(),
        })
    }

    /// Keeps the agent's questions in `path`, so replies to them are known after a restart.
    pub fn with_questions(self, path: std::path::PathBuf) -> SampClient {
        self.recent.lock().expect("recent lock").questions = Questions::open(path);
        self
    }

    /// Keeps the answers the server confirmed in the file `path`.
    pub fn with_sent(self, path: std::path::PathBuf) -> SampClient {
        self.recent.lock().expect("recent lock").sent = Questions::open(path);
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
    pub(super) async fn ready(&self) -> Result<Ready, SampError> {
        if let Some(ready) = self.ready.lock().expect("ready lock").clone() {
            return Ok(ready);
        }
        self.rpc.initialize().await?;
        let tools = super::tools::map(&self.rpc.list_tools().await?)?;
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
            crate::mailbox::decode_each::<SampMessage>(&page["messages"], "a SAMP inbox message")
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
    pub(super) async fn thread(&self, thread_id: &str) -> Result<Vec<Value>, SampError> {
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
    pub(super) async fn send(
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
