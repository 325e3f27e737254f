//! A small JMAP client (RFC 8620/8621): session discovery, method calls, and the few mail
//! methods the bridge needs. Every request carries HTTP Basic auth.
//!
//! Over 600 lines with its tests: one protocol's requests and the parsing of their answers,
//! which read best next to each other.

use std::time::Duration;

use serde_json::{json, Value};
use url::Url;

use super::MailboxError;
use crate::config::Account;
use crate::protocol::message::normalize_message_id;
use crate::protocol::MailView;

const USING: [&str; 2] = ["urn:ietf:params:jmap:core", "urn:ietf:params:jmap:mail"];
/// Largest text body fetched per mail; longer bodies are cut and marked.
pub const MAX_BODY_BYTES: u64 = 1 << 20;
/// Mails fetched per `Email/get`, which bounds one response to about 16 MiB.
const GET_BATCH: usize = 16;
/// What is read of a mail.
const EMAIL_PROPERTIES: [&str; 12] = [
    "id",
    "mailboxIds",
    "messageId",
    "from",
    "to",
    "cc",
    "subject",
    "receivedAt",
    "headers",
    "textBody",
    "bodyValues",
    "attachments",
];

/// What the session resource tells us.
#[derive(Clone, Debug)]
pub struct Session {
    pub api_url: Url,
    pub account_id: String,
    /// The download URL template (`{accountId}`, `{blobId}`, `{name}`, `{type}`), resolved.
    pub download_url: String,
    /// The upload URL template (`{accountId}`), resolved.
    pub upload_url: String,
    /// JMAP over WebSocket (RFC 8887), when the server offers it with push.
    pub websocket_url: Option<Url>,
    /// The EventSource push URL (template filled in for Email), when advertised.
    pub event_source_url: Option<Url>,
}

/// One fetched mail: its JMAP id, where it is, and the parts the parser reads.
#[derive(Clone, Debug)]
pub struct Email {
    pub id: String,
    pub mailbox_ids: Vec<String>,
    pub received_at: String,
    pub view: MailView,
    pub truncated: bool,
    pub attachments: Vec<BlobRef>,
}

/// An attachment as JMAP lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobRef {
    pub blob_id: String,
    pub name: Option<String>,
    pub content_type: String,
    pub size: u64,
}

/// A download URL from the session's template (RFC 6570 level 1: values percent-encoded).
/// `{name}` only labels the download, and servers refuse some names (Cyrus answers 400 for
/// an encoded `/`), so the name in the URL keeps only `[A-Za-z0-9._-]`.
pub fn download_url(template: &str, account_id: &str, blob: &BlobRef) -> String {
    let enc = crate::protocol::codec::encode_uri_component;
    let name: String = blob
        .name
        .as_deref()
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = name.trim_start_matches('.');
    let name = if name.is_empty() { "attachment" } else { name };
    template
        .replace("{accountId}", &enc(account_id))
        .replace("{blobId}", &enc(&blob.blob_id))
        .replace("{name}", name)
        .replace("{type}", &enc(&blob.content_type))
}

/// A page of `Email/changes`.
#[derive(Clone, Debug)]
pub struct Changes {
    pub created: Vec<String>,
    pub new_state: String,
    pub has_more: bool,
}

pub struct JmapClient {
    http: reqwest::Client,
    login: String,
    password: crate::config::Secret,
    session_url: Url,
    session: Option<Session>,
}

impl JmapClient {
    pub fn new(account: &Account) -> Result<JmapClient, MailboxError> {
        let http =
            crate::mailbox::http_client(account.insecure_tls, Some(Duration::from_secs(60)))?;
        let mut session_url = account.jmap_url.clone();
        if session_url.path() == "/" || session_url.path().is_empty() {
            session_url.set_path("/.well-known/jmap");
        }
        Ok(JmapClient {
            http,
            login: account.login.clone(),
            password: account.password.clone(),
            session_url,
            session: None,
        })
    }

    /// Fetches the session resource (following redirects) and resolves its URLs.
    pub async fn connect(&mut self) -> Result<&Session, MailboxError> {
        let url = self.session_url.to_string();
        let response = self
            .http
            .get(self.session_url.clone())
            .basic_auth(&self.login, Some(self.password.value()))
            .send()
            .await
            .map_err(MailboxError::network(url.clone()))?;
        let final_url = response.url().clone();
        let body = crate::mailbox::read_json(response, &url).await?;
        let api_url = body["apiUrl"]
            .as_str()
            .ok_or_else(|| protocol("JMAP session", "no apiUrl"))?;
        let api_url = final_url
            .join(api_url)
            .map_err(|e| protocol("JMAP session apiUrl", &e.to_string()))?;
        let account_id = body["primaryAccounts"]["urn:ietf:params:jmap:mail"]
            .as_str()
            .map(str::to_string)
            .or_else(|| {
                body["accounts"]
                    .as_object()
                    .and_then(|a| a.keys().next().cloned())
            })
            .ok_or_else(|| protocol("JMAP session", "no mail account"))?;
        // Templates keep their braces, so they are resolved against the session URL as text.
        let resolve = |template: &str| -> String {
            if template.contains("://") {
                template.to_string()
            } else {
                let origin = final_url.origin().ascii_serialization();
                if template.starts_with('/') {
                    format!("{origin}{template}")
                } else {
                    format!("{origin}/{template}")
                }
            }
        };
        let download_url = resolve(
            body["downloadUrl"]
                .as_str()
                .unwrap_or("/jmap/download/{accountId}/{blobId}/{name}"),
        );
        let upload_url = resolve(
            body["uploadUrl"]
                .as_str()
                .unwrap_or("/jmap/upload/{accountId}/"),
        );
        let websocket = &body["capabilities"]["urn:ietf:params:jmap:websocket"];
        let websocket_url = match (
            websocket["url"].as_str(),
            websocket["supportsPush"].as_bool(),
        ) {
            (Some(url), Some(true)) => super::push::websocket_url(url, &final_url),
            _ => None,
        };
        self.session = Some(Session {
            api_url,
            account_id,
            download_url,
            upload_url,
            websocket_url,
            event_source_url: body["eventSourceUrl"]
                .as_str()
                .and_then(|t| super::push::event_source_url(t, &final_url)),
        });
        Ok(self.session.as_ref().expect("just set"))
    }

    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// Drops the session, so the next use discovers it again.
    pub fn forget_session(&mut self) {
        self.session = None;
    }

    fn require_session(&self) -> Result<&Session, MailboxError> {
        self.session
            .as_ref()
            .ok_or_else(|| protocol("JMAP", "no session yet"))
    }

    /// Calls one method and returns its arguments; a method-level error becomes a typed error.
    pub async fn call(&self, method: &str, args: Value) -> Result<Value, MailboxError> {
        self.calls(vec![(method, args)])
            .await?
            .pop()
            .expect("one answer per call")
    }

    /// Calls several methods in one request (later ones may refer to earlier ones' results by
    /// `#name` back-references to `"0"`, `"1"`, ...) and returns each one's arguments or typed
    /// error, in order.
    pub(super) async fn calls(
        &self,
        methods: Vec<(&str, Value)>,
    ) -> Result<Vec<Result<Value, MailboxError>>, MailboxError> {
        let session = self.require_session()?;
        let calls: Vec<Value> = methods
            .iter()
            .enumerate()
            .map(|(i, (method, args))| {
                let mut args = args.clone();
                args["accountId"] = json!(session.account_id);
                json!([method, args, i.to_string()])
            })
            .collect();
        let request = json!({ "using": USING, "methodCalls": calls });
        let url = session.api_url.to_string();
        let request = self
            .http
            .post(session.api_url.clone())
            .basic_auth(&self.login, Some(self.password.value()))
            .json(&request);
        let mut body = crate::mailbox::fetch_json(request, &url).await?;
        let mut out = Vec::with_capacity(methods.len());
        for (i, (method, _)) in methods.iter().enumerate() {
            let mut reply = body["methodResponses"]
                .get_mut(i)
                .map(Value::take)
                .ok_or_else(|| protocol(method, "no methodResponses"))?;
            let args = reply[1].take();
            out.push(if reply[0] == "error" {
                let kind = args["type"].as_str().unwrap_or("unknown").to_string();
                Err(if kind == "cannotCalculateChanges" {
                    MailboxError::CannotCalculateChanges
                } else {
                    MailboxError::Method {
                        method: method.to_string(),
                        kind,
                        description: args["description"].as_str().map(str::to_string),
                    }
                })
            } else {
                Ok(args)
            });
        }
        Ok(out)
    }

    /// The id of the mailbox with role `inbox`.
    pub async fn inbox_id(&self) -> Result<String, MailboxError> {
        self.mailbox_with_role("inbox").await
    }

    /// The id of the mailbox with a role (`inbox`, `sent`, ...).
    pub async fn mailbox_with_role(&self, role: &str) -> Result<String, MailboxError> {
        let reply = self
            .call(
                "Mailbox/get",
                json!({ "ids": null, "properties": ["id", "role", "name"] }),
            )
            .await?;
        reply["list"]
            .as_array()
            .and_then(|list| list.iter().find(|m| m["role"].as_str() == Some(role)))
            .and_then(|m| m["id"].as_str())
            .map(str::to_string)
            .ok_or_else(|| protocol("Mailbox/get", &format!("no mailbox has the {role} role")))
    }

    /// Uploads bytes (RFC 8620 §6.1); returns the blob id.
    pub async fn upload(&self, bytes: Vec<u8>, content_type: &str) -> Result<String, MailboxError> {
        let session = self.require_session()?;
        let url = session.upload_url.replace(
            "{accountId}",
            &crate::protocol::codec::encode_uri_component(&session.account_id),
        );
        let request = self
            .http
            .post(&url)
            .basic_auth(&self.login, Some(self.password.value()))
            .header("Content-Type", content_type)
            .body(bytes);
        let body = crate::mailbox::fetch_json(request, &url).await?;
        body["blobId"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| protocol("upload", "no blobId"))
    }

    /// Downloads a blob, retrying while the server does not have it yet (blobs can lag the
    /// message): 404, 429 and 503 are retried with backoff, about 15 s in all. More than
    /// `max` bytes is an error.
    pub async fn download(&self, url: &str, max: u64) -> Result<Vec<u8>, MailboxError> {
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(8));
        for attempt in 1.. {
            let response = self
                .http
                .get(url)
                .basic_auth(&self.login, Some(self.password.value()))
                .send()
                .await
                .map_err(MailboxError::network(url.to_string()))?;
            let status = response.status().as_u16();
            if matches!(status, 404 | 429 | 503) && attempt < 6 {
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
            let mut response = crate::mailbox::body::success(response, url).await?;
            // An honest length over the cap is refused before reading; a lying one (or none)
            // is caught by the count kept while reading.
            let cap = usize::try_from(max).unwrap_or(usize::MAX);
            if let Some(length) = response.content_length().filter(|n| *n > max) {
                return Err(crate::mailbox::body::oversized(
                    url.to_string(),
                    length,
                    cap,
                ));
            }
            return crate::mailbox::body::read_capped(&mut response, url, cap, |_| false).await;
        }
        unreachable!("the loop returns")
    }

    /// The current Email state string: the cursor to follow changes from.
    pub async fn email_state(&self) -> Result<String, MailboxError> {
        let reply = self
            .call("Email/get", json!({ "ids": [], "properties": ["id"] }))
            .await?;
        reply["state"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| protocol("Email/get", "no state"))
    }

    /// Email changes since a state and the created mails, in one request (the mails by a
    /// back-reference): one round trip for a push. At most `GET_BATCH` changes, so the answer
    /// stays small. A state the server no longer knows, or rejects outright (Cyrus answers
    /// `invalidArguments` for a state it cannot read), is `CannotCalculateChanges`: either way
    /// the caller must recover without it.
    pub async fn changes_and_emails(
        &self,
        since: &str,
    ) -> Result<(Changes, Vec<Email>), MailboxError> {
        let mut answers = self
            .calls(vec![
                (
                    "Email/changes",
                    json!({ "sinceState": since, "maxChanges": GET_BATCH }),
                ),
                (
                    "Email/get",
                    json!({
                        "#ids": { "resultOf": "0", "name": "Email/changes", "path": "/created" },
                        "properties": EMAIL_PROPERTIES,
                        "fetchTextBodyValues": true,
                        "maxBodyValueBytes": MAX_BODY_BYTES,
                    }),
                ),
            ])
            .await?
            .into_iter();
        let changes = match answers.next().expect("two answers") {
            Err(MailboxError::Method { kind, .. }) if kind == "invalidArguments" => {
                return Err(MailboxError::CannotCalculateChanges)
            }
            other => other?,
        };
        let got = answers.next().expect("two answers")?;
        let created: Vec<String> = changes["created"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let emails = emails_of(&got["list"]);
        Ok((
            Changes {
                created,
                new_state: changes["newState"]
                    .as_str()
                    .ok_or_else(|| protocol("Email/changes", "no newState"))?
                    .to_string(),
                has_more: changes["hasMoreChanges"].as_bool().unwrap_or(false),
            },
            emails,
        ))
    }

    /// The newest `limit` mails in a mailbox, newest first.
    pub async fn query_mailbox(
        &self,
        mailbox_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, MailboxError> {
        self.query(json!({ "inMailbox": mailbox_id }), false, limit)
            .await
    }

    /// Mails in a mailbox received after `after` (RFC 3339), oldest first, at most `limit`.
    /// Ids of mail in `mailbox_id` received after `after`, oldest first, from `position` on.
    pub async fn query_mailbox_after(
        &self,
        mailbox_id: &str,
        after: &str,
        position: usize,
        limit: usize,
    ) -> Result<Vec<String>, MailboxError> {
        self.query_from(
            json!({ "inMailbox": mailbox_id, "after": after }),
            true,
            position,
            limit,
        )
        .await
    }

    /// `Email/query` sorted by arrival; the ids.
    async fn query(
        &self,
        filter: Value,
        oldest_first: bool,
        limit: usize,
    ) -> Result<Vec<String>, MailboxError> {
        self.query_from(filter, oldest_first, 0, limit).await
    }

    async fn query_from(
        &self,
        filter: Value,
        oldest_first: bool,
        position: usize,
        limit: usize,
    ) -> Result<Vec<String>, MailboxError> {
        let reply = self
            .call(
                "Email/query",
                json!({
                    "filter": filter,
                    "sort": [{ "property": "receivedAt", "isAscending": oldest_first }],
                    "position": position,
                    "limit": limit,
                }),
            )
            .await?;
        Ok(reply["ids"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Fetches mails by id, in batches. Mails that vanished in between are skipped.
    pub async fn get_emails(&self, ids: &[String]) -> Result<Vec<Email>, MailboxError> {
        let mut out = Vec::with_capacity(ids.len());
        for batch in ids.chunks(GET_BATCH) {
            let reply = self
                .call(
                    "Email/get",
                    json!({
                        "ids": batch,
                        "properties": EMAIL_PROPERTIES,
                        "fetchTextBodyValues": true,
                        "maxBodyValueBytes": MAX_BODY_BYTES,
                    }),
                )
                .await?;
            out.extend(emails_of(&reply["list"]));
        }
        Ok(out)
    }
}

fn protocol(what: &str, detail: &str) -> MailboxError {
    MailboxError::Protocol {
        what: what.to_string(),
        detail: detail.to_string(),
    }
}

fn addresses(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x["email"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The mails of an `Email/get` list, each read on its own: one the bridge cannot read (a
/// server's entry without an id) costs that entry only, never the whole read (issue 36 item
/// 1, as for AMP messages and ASMTP envelopes).
fn emails_of(list: &Value) -> Vec<Email> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|email| match email_from_json(email) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::warn!(error = %e, "the mail server returned a mail the bridge cannot read; skipped, the rest read as usual");
                None
            }
        })
        .collect()
}

/// Turns an `Email/get` entry into what the AAMP parser reads.
pub fn email_from_json(email: &Value) -> Result<Email, MailboxError> {
    let id = email["id"]
        .as_str()
        .ok_or_else(|| protocol("Email/get", "a mail without id"))?
        .to_string();
    let mut truncated = false;
    let mut body = Vec::new();
    for part in email["textBody"].as_array().into_iter().flatten() {
        if let Some(value) = part["partId"]
            .as_str()
            .and_then(|p| email["bodyValues"].get(p))
        {
            truncated |= value["isTruncated"].as_bool().unwrap_or(false);
            body.push(value["value"].as_str().unwrap_or_default().to_string());
        }
    }
    let mut to = addresses(&email["to"]);
    to.extend(addresses(&email["cc"]));
    Ok(Email {
        mailbox_ids: email["mailboxIds"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default(),
        received_at: email["receivedAt"].as_str().unwrap_or_default().to_string(),
        truncated,
        attachments: email["attachments"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| {
                Some(BlobRef {
                    blob_id: a["blobId"].as_str()?.to_string(),
                    name: a["name"].as_str().map(str::to_string),
                    content_type: a["type"]
                        .as_str()
                        .unwrap_or("application/octet-stream")
                        .to_string(),
                    size: a["size"].as_u64().unwrap_or(0),
                })
            })
            .collect(),
        view: MailView {
            from: addresses(&email["from"])
                .into_iter()
                .next()
                .unwrap_or_default(),
            to,
            message_id: email["messageId"][0]
                .as_str()
                .map(normalize_message_id)
                .unwrap_or_default(),
            subject: email["subject"].as_str().unwrap_or_default().to_string(),
            body_text: body.join("\n").replace("\r\n", "\n"),
            headers: email["headers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|h| {
                    Some((
                        h["name"].as_str()?.to_string(),
                        h["value"].as_str()?.to_string(),
                    ))
                })
                .collect(),
        },
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> JmapClient {
        JmapClient {
            http: reqwest::Client::new(),
            login: "a@x".into(),
            password: crate::config::Secret::fixed("m", "pw"),
            session_url: Url::parse("http://127.0.0.1/.well-known/jmap").unwrap(),
            session: None,
        }
    }

    /// Issue 43 item 2: a blob is read with its cap counted while it is read: a server that
    /// sends no length, and never ends, is cut at the cap; a blob of exactly the cap is read.
    #[tokio::test]
    async fn a_blob_download_stops_at_its_cap() {
        let serve = crate::mailbox::body::tests::serve;
        let url = serve(
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".into(),
            vec![b'x'; 5000],
        )
        .await;
        let err = tokio::time::timeout(Duration::from_secs(10), client().download(&url, 4096))
            .await
            .expect("stopped at the cap, not at the end")
            .unwrap_err();
        assert!(
            matches!(err, MailboxError::Oversized { at_least, limit: 4096, .. } if at_least > 4096),
            "{err}"
        );
        let url = serve(
            "HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n".into(),
            vec![b'y'; 4096],
        )
        .await;
        assert_eq!(client().download(&url, 4096).await.unwrap().len(), 4096);
    }

    #[test]
    fn a_mail_without_an_id_costs_that_mail_only() {
        let list = json!([
            {"subject": "no id", "messageId": ["<a@x>"]},
            {"id": "M1", "subject": "fine", "messageId": ["<b@x>"], "from": [{"email": "b@x"}]}
        ]);
        let emails = emails_of(&list);
        assert_eq!(emails.len(), 1);
        assert_eq!(emails[0].view.subject, "fine");
        assert!(emails_of(&json!("not a list")).is_empty());
    }

    #[test]
    fn download_urls_fill_the_template_with_safe_values() {
        let blob = BlobRef {
            blob_id: "G1/2".into(),
            name: Some("../../a b.sh".into()),
            content_type: "text/x-sh".into(),
            size: 1,
        };
        let url = download_url(
            "http://h/jmap/download/{accountId}/{blobId}/{name}?accept={type}",
            "me@x.test",
            &blob,
        );
        assert_eq!(
            url,
            "http://h/jmap/download/me%40x.test/G1%2F2/_.._a_b.sh?accept=text%2Fx-sh"
        );
        let unnamed = BlobRef { name: None, ..blob };
        assert!(download_url("/d/{name}", "a", &unnamed).ends_with("/d/attachment"));
    }

    #[test]
    fn cyrus_email_json_becomes_a_mail_view() {
        let email = json!({
            "id": "M1", "mailboxIds": {"inbox1": true},
            "messageId": ["abc@x.test"], "from": [{"name": null, "email": "a@x.test"}],
            "to": [{"name": "B", "email": "b@x.test"}], "cc": null, "subject": "[AAMP Task] hi",
            "receivedAt": "2026-11-29T10:00:00Z",
            "headers": [{"name": "X-AAMP-Intent", "value": " task.dispatch"}, {"name": "X-AAMP-TaskId", "value": " t1"}],
            "textBody": [{"partId": "1"}], "bodyValues": {"1": {"value": "body\r\n", "isTruncated": true}}
        });
        let e = email_from_json(&email).unwrap();
        assert_eq!(e.view.message_id, "<abc@x.test>");
        assert_eq!(e.view.to, vec!["b@x.test"]);
        assert_eq!(e.view.body_text, "body\n");
        assert!(e.truncated);
        let msg = crate::protocol::AampMessage::parse(&e.view).unwrap();
        assert_eq!(msg.task_id(), "t1");
    }
}
