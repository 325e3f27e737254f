//! Mail in and out: the only code that knows a mailbox system (AAMP over JMAP and SMTP, AMP,
//! ASMTP, SAMP over MCP) and the shape of a mail. Each system lives in its own folder and is a
//! [`System`]: it opens an agent's mailbox as an [`Outlet`] (the outbound seam `dispatch`
//! sends through) and an [`Intake`] (new messages for the agent, parsed into the inbound
//! model). `kinds` chooses the system for a configured kind, one line per kind; `intake`
//! holds what every reading loop shares (the watch loop, health, one push supervisor).

pub mod aamp;
pub mod amp;
mod answer;
pub mod asmtp;
pub mod body;
pub(crate) mod error;
mod finding;
pub mod intake;
mod kinds;
pub mod link;
pub mod outlet;
pub mod samp;

pub use aamp::{replica_claims, Dispatcher};
pub use finding::{Finding, Verdict};
pub use kinds::{check, open, probe, system, try_login, LoginTried};
pub use outlet::{Answering, Intake, Outlet, Probe, System};

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

pub use error::{MailboxError, OpenError};

pub use crate::inbound::{Attachment, Inbound, Mail, Reply};

/// Ids seen lately, at most `cap` of them (the oldest forgotten first): the answers a
/// back-end without idempotency keys tried to post, so a retry reads its thread first.
#[derive(Debug, Default)]
pub(crate) struct RecentIds {
    set: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

impl RecentIds {
    /// Notes `id`; false when it was noted before (and is still kept).
    pub(crate) fn first(&mut self, id: &str, cap: usize) -> bool {
        if !self.set.insert(id.to_string()) {
            return false;
        }
        self.order.push_back(id.to_string());
        if self.order.len() > cap {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

/// A message from a mailbox system without AAMP headers (ASMTP, AMP), as a task for the agent:
/// a `task.dispatch` built from its parts, then taken through the same path as mail (rendered,
/// read back), so the journal stores and re-reads it like any other. `None` when it does not
/// survive that trip (not seen in practice; the intake skips it).
pub struct ForeignTask<'a> {
    /// The message's id in its system (the journal's email id).
    pub id: &'a str,
    pub task_id: String,
    /// The journal's key for it, `<id@system>`.
    pub message_id: String,
    pub from: &'a str,
    pub to: &'a str,
    pub title: &'a str,
    pub body: String,
    pub session_key: String,
    /// The thread the message answers, oldest first, as Message-IDs (`<id@system>`), so that
    /// an answer's `References` carries the whole chain.
    pub references: Vec<String>,
    /// Why the sender is believed (the system stamps it).
    pub believed_because: &'static str,
    /// How many agents passed this task on before (the system's own metadata carries it).
    pub hop_count: Option<u32>,
    /// The message is an agent bridge's answer (it carries the bridge's answer marker): it is
    /// marked `Auto-Submitted`, so it never starts a task, and two agents that allow each
    /// other do not answer each other's answers forever.
    pub is_answer: bool,
}

/// The AMP/ASMTP metadata key under which the bridge marks its answers and reads hop counts
/// (`{"aampBridge": {"answer": INTENT}}`, `{"aampBridge": {"hopCount": N}}`).
pub const FOREIGN_MARK: &str = "aampBridge";

impl ForeignTask<'_> {
    pub fn into_inbound(self) -> Option<Inbound> {
        let title = if self.title.trim().is_empty() {
            self.body
                .lines()
                .next()
                .unwrap_or("a message")
                .chars()
                .take(120)
                .collect()
        } else {
            self.title.to_string()
        };
        let mut msg = crate::protocol::AampMessage {
            envelope: crate::protocol::Envelope {
                version: crate::protocol::VERSION.into(),
                task_id: self.task_id,
                from: self.from.to_string(),
                to: vec![self.to.to_string()],
                message_id: self.message_id,
                subject: String::new(),
                in_reply_to: None,
                references: self.references,
                received_body: None,
            },
            body: crate::protocol::Body::Dispatch(crate::protocol::Dispatch {
                title,
                body_text: self.body,
                session_key: Some(self.session_key),
                hop_count: self.hop_count,
                ..crate::protocol::Dispatch::default()
            }),
        };
        msg.envelope.subject = msg.subject();
        let rendered = crate::protocol::rfc5322::render(&msg, SystemTime::now());
        let mut view = crate::protocol::rfc5322::parse_raw(&rendered.bytes)?;
        if self.is_answer {
            view.headers
                .push(("Auto-Submitted".into(), "auto-replied".into()));
        }
        let message = crate::protocol::AampMessage::parse(&view).ok()?;
        Some(Inbound {
            email_id: self.id.to_string(),
            message,
            view,
            sender_check: crate::inbound::SenderCheck::Verified(self.believed_because.into()),
            truncated: false,
            attachments: Vec::new(),
            refused: None,
        })
    }
}

/// The HTTP client for one mailbox's servers: certificates verified unless `insecure_tls`,
/// a connect timeout, and a total timeout unless `None` (long-lived streams). Verified clients
/// share one TLS configuration (the root store is parsed once per process, not per client:
/// it was most of a client's start-up time and memory); each client keeps its own connection
/// pool, bound to the runtime it runs on.
pub fn http_client(
    insecure_tls: bool,
    timeout: Option<Duration>,
) -> Result<reqwest::Client, MailboxError> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("aamp-bridge/", env!("CARGO_PKG_VERSION")));
    builder = if insecure_tls {
        builder.danger_accept_invalid_certs(true)
    } else {
        builder.use_preconfigured_tls(verified_tls().clone())
    };
    if let Some(timeout) = timeout {
        builder = builder.timeout(timeout);
    }
    builder.build().map_err(|e| MailboxError::Protocol {
        what: "HTTP client setup".into(),
        detail: e.to_string(),
    })
}

/// The process's one TLS client configuration with the Mozilla roots (webpki-roots).
fn verified_tls() -> &'static rustls::ClientConfig {
    static CONFIG: std::sync::OnceLock<rustls::ClientConfig> = std::sync::OnceLock::new();
    CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    })
}

/// Sends `request` and reads its JSON answer (see [`read_json`]); a failure to reach the
/// server is a `Network` error naming `url`.
pub async fn fetch_json(
    request: reqwest::RequestBuilder,
    url: &str,
) -> Result<serde_json::Value, MailboxError> {
    let response = request
        .send()
        .await
        .map_err(MailboxError::network(url.to_string()))?;
    read_json(response, url).await
}

/// Reads a JSON answer: a status other than 2xx is an `Http` error carrying the start of the
/// body, an answer over [`body::MAX_ANSWER`] an `Oversized` one (counted while it is read),
/// and an answer that is not JSON a `Protocol` error.
pub async fn read_json(
    response: reqwest::Response,
    url: &str,
) -> Result<serde_json::Value, MailboxError> {
    let mut response = body::success(response, url).await?;
    let bytes = body::read_capped(&mut response, url, body::MAX_ANSWER, |_| false).await?;
    serde_json::from_slice(&bytes).map_err(|e| MailboxError::Protocol {
        what: url.to_string(),
        detail: e.to_string(),
    })
}

/// A text an answer must hold, or a `Protocol` error saying that `what` came with no `name`.
pub fn required_text(
    value: &serde_json::Value,
    what: &str,
    name: &str,
) -> Result<String, MailboxError> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| MailboxError::Protocol {
            what: what.into(),
            detail: format!("no {name}"),
        })
}

/// The files attached to a rendered mail (an answer's `FILE:` files), as the systems without
/// MIME mail send them: name, content type (lower case; `application/octet-stream` when the
/// part names none), bytes.
pub(crate) fn attached_files(bytes: &[u8]) -> Vec<(String, String, Vec<u8>)> {
    use mail_parser::MimeHeaders;
    let Some(message) = mail_parser::MessageParser::default().parse(bytes) else {
        return Vec::new();
    };
    message
        .attachments()
        .map(|part| {
            let content_type = part
                .content_type()
                .map(|ct| match ct.subtype() {
                    Some(sub) => format!("{}/{sub}", ct.ctype()),
                    None => ct.ctype().to_string(),
                })
                .unwrap_or_else(|| "application/octet-stream".into())
                .to_ascii_lowercase();
            (
                part.attachment_name().unwrap_or("file").to_string(),
                content_type,
                part.contents().to_vec(),
            )
        })
        .collect()
}

/// One item of a server's list answer that the bridge could not read: what it knows of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    /// The item's id, when it has one.
    pub id: Option<String>,
    /// Why it could not be read, in the decoder's words.
    pub reason: String,
}

/// `request` with one file as its `multipart/form-data` body (the form field `file`), as
/// the AMP broker and the ASMTP operator take uploads.
pub(crate) fn with_file(
    request: reqwest::RequestBuilder,
    filename: &str,
    content_type: &str,
    bytes: &[u8],
) -> reqwest::RequestBuilder {
    let boundary = format!("aamp-bridge-{}", uuid::Uuid::new_v4().simple());
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: {content_type}\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    request
        .header(
            reqwest::header::CONTENT_TYPE,
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
}

/// Decodes each item of the JSON list `list` on its own: an item the bridge does not
/// understand costs that item only (it is returned in the second list), never the page.
/// `what` names the list for the error when `list` is not a list at all.
pub fn decode_each<T: serde::de::DeserializeOwned>(
    list: &serde_json::Value,
    what: &str,
) -> Result<(Vec<T>, Vec<Unreadable>), MailboxError> {
    let items = list.as_array().ok_or_else(|| MailboxError::Protocol {
        what: what.to_string(),
        detail: format!("expected a list, got {}", kind_of(list)),
    })?;
    let mut read = Vec::with_capacity(items.len());
    let mut unreadable = Vec::new();
    for item in items {
        match T::deserialize(item) {
            Ok(value) => read.push(value),
            Err(e) => unreadable.push(Unreadable {
                id: item
                    .get("id")
                    .and_then(|v| v.as_str())
                    .map(|s| s.chars().take(200).collect()),
                reason: format!("{what}: {e}"),
            }),
        }
    }
    Ok((read, unreadable))
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "nothing",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Items a back-end could not read, kept until the intake reports them, each once: a server
/// that returns the same bad item at every read is not told about at every read.
#[derive(Default)]
pub struct UnreadableLog {
    inner: std::sync::Mutex<UnreadableInner>,
}

#[derive(Default)]
struct UnreadableInner {
    pending: Vec<Unreadable>,
    told: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

/// How many reported items [`UnreadableLog`] remembers.
const UNREADABLE_KEPT: usize = 4096;

impl UnreadableLog {
    /// Notes `items`; those reported before are left out.
    pub fn note(&self, items: Vec<Unreadable>) {
        let mut inner = self.inner.lock().expect("unreadable lock");
        for item in items {
            let key = format!(
                "{}\n{}",
                item.id.as_deref().unwrap_or_default(),
                item.reason
            );
            if !inner.told.insert(key.clone()) {
                continue;
            }
            inner.order.push_back(key);
            while inner.order.len() > UNREADABLE_KEPT {
                if let Some(old) = inner.order.pop_front() {
                    inner.told.remove(&old);
                }
            }
            if inner.pending.len() < 100 {
                inner.pending.push(item);
            }
        }
    }

    /// What is still to be reported.
    pub fn take(&self) -> Vec<Unreadable> {
        std::mem::take(&mut self.inner.lock().expect("unreadable lock").pending)
    }

    /// Reports what is pending: a warning and a `message.ignored` event each.
    pub fn report(&self, agent: &str, system: &str, events: &crate::events::Events) {
        report_unreadable(self.take(), agent, system, events);
    }
}

/// Reports items a `system` server returned that could not be read: a warning and a
/// `message.ignored` event each.
pub fn report_unreadable(
    items: Vec<Unreadable>,
    agent: &str,
    system: &str,
    events: &crate::events::Events,
) {
    for item in items {
        tracing::warn!(id = ?item.id, reason = %item.reason, "the {system} server returned an item the bridge cannot read; skipped, the rest read as usual");
        events.emit(
            crate::events::Event::MessageIgnored,
            serde_json::json!({"agent": agent, "messageId": item.id, "intent": null,
                               "reason": format!("the {system} server's item could not be read ({})", item.reason)}),
        );
    }
}

/// Questions an agent posted (`task.help_needed`) on a back-end whose replies name what they
/// answer by the back-end's own id (AMP `parent_id`, ASMTP `in_reply_to`), not by mail
/// headers: the posted id and the Message-ID the bridge gave the question, so that a reply to
/// one is taken as its answer, never as a task. Kept in a file beside the mailbox's position
/// when one is given, so a reply that comes after a restart is still known for what it is (an
/// answer, to a question no task waits on any more), not run as a new task.
#[derive(Default)]
pub struct Questions {
    kept: std::collections::VecDeque<(String, String)>,
    file: Option<crate::fsio::JsonFile<Vec<(String, String)>>>,
}

/// How many questions [`Questions`] remembers: a question is answered within its task's
/// `ask_timeout_secs`, so the newest thousand are more than any mailbox has open.
const QUESTIONS_KEPT: usize = 1024;

impl Questions {
    /// The questions kept in `path` (none when it is missing or unreadable), kept there from
    /// now on.
    pub fn open(path: PathBuf) -> Questions {
        let file: crate::fsio::JsonFile<Vec<(String, String)>> = crate::fsio::JsonFile::new(path);
        let kept = match file.load() {
            Ok(found) => found.unwrap_or_default().into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %e, "the agent's earlier questions cannot be read; replies to them may be taken as tasks");
                std::collections::VecDeque::new()
            }
        };
        Questions {
            kept,
            file: Some(file),
        }
    }

    /// Notes that `posted_id` asks the question `message_id`.
    pub fn asked(&mut self, posted_id: &str, message_id: &str) {
        while self.kept.len() >= QUESTIONS_KEPT {
            self.kept.pop_front();
        }
        self.kept
            .push_back((posted_id.to_string(), message_id.to_string()));
        if let Some(file) = &self.file {
            let all: Vec<(String, String)> = self.kept.iter().cloned().collect();
            if let Err(e) = file.save(&all) {
                tracing::warn!(error = %e, "could not keep the agent's question on disk; a reply after a restart may be taken as a task");
            }
        }
    }

    /// The Message-ID of the question posted as `posted_id`.
    pub fn question(&self, posted_id: &str) -> Option<String> {
        self.kept
            .iter()
            .rev()
            .find(|(id, _)| id == posted_id)
            .map(|(_, m)| m.clone())
    }
}

#[cfg(test)]
mod questions_tests {
    use super::Questions;

    #[test]
    fn questions_outlive_a_restart_and_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("questions");
        let mut q = Questions::open(path.clone());
        for i in 0..1100 {
            q.asked(&format!("posted-{i}"), &format!("<q{i}@x>"));
        }
        let again = Questions::open(path.clone());
        assert_eq!(again.question("posted-1099").as_deref(), Some("<q1099@x>"));
        assert_eq!(again.question("posted-0"), None, "the oldest are let go");
        assert_eq!(again.kept.len(), super::QUESTIONS_KEPT);
        assert!(std::fs::metadata(&path).unwrap().len() < 64 * 1024);
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(Questions::open(path).question("posted-1"), None);
    }
}

#[cfg(test)]
mod decode_tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Item {
        id: String,
        from: String,
    }

    #[test]
    fn one_bad_item_costs_that_item_only() {
        let list = serde_json::json!([
            {"id": "a", "from": "x"},
            {"id": "b"},
            "garbage",
            {"id": "c", "from": "y"}
        ]);
        let (read, bad) = decode_each::<Item>(&list, "envelopes").unwrap();
        assert_eq!(
            read.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
            ["a", "c"]
        );
        assert_eq!(bad.len(), 2);
        assert_eq!(bad[0].id.as_deref(), Some("b"));
        assert!(bad[0].reason.contains("missing field `from`"), "{bad:?}");
        assert!(decode_each::<Item>(&serde_json::json!({"x": 1}), "envelopes").is_err());
        let log = UnreadableLog::default();
        log.note(bad.clone());
        log.note(bad);
        assert_eq!(log.take().len(), 2, "each reported once");
        assert!(log.take().is_empty());
    }
}
