//! A small JMAP client (RFC 8620/8621): session discovery, method calls, and the few mail
//! methods the bridge needs. Every request carries HTTP Basic auth.

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

/// What the session resource tells us.
#[derive(Clone, Debug)]
pub struct Session {
    pub api_url: Url,
    pub account_id: String,
    pub download_url: String,
    /// JMAP over WebSocket (RFC 8887), when the server offers it with push.
    pub websocket_url: Option<Url>,
}

/// One fetched mail: its JMAP id, where it is, and the parts the parser reads.
#[derive(Clone, Debug)]
pub struct Email {
    pub id: String,
    pub mailbox_ids: Vec<String>,
    pub received_at: String,
    pub view: MailView,
    pub truncated: bool,
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
    password: String,
    session_url: Url,
    session: Option<Session>,
}

impl JmapClient {
    pub fn new(account: &Account) -> Result<JmapClient, MailboxError> {
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(account.insecure_tls)
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("aamp-bridge/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| MailboxError::Protocol {
                what: "HTTP client setup".into(),
                detail: e.to_string(),
            })?;
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
            .basic_auth(&self.login, Some(&self.password))
            .send()
            .await
            .map_err(|source| MailboxError::Network {
                url: url.clone(),
                source,
            })?;
        let final_url = response.url().clone();
        let body = read_json(response, &url).await?;
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
        let download_url = body["downloadUrl"].as_str().unwrap_or_default().to_string();
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
            websocket_url,
        });
        Ok(self.session.as_ref().expect("just set"))
    }

    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    fn require_session(&self) -> Result<&Session, MailboxError> {
        self.session
            .as_ref()
            .ok_or_else(|| protocol("JMAP", "no session yet"))
    }

    /// Calls one method and returns its arguments; a method-level error becomes a typed error.
    pub async fn call(&self, method: &str, mut args: Value) -> Result<Value, MailboxError> {
        let session = self.require_session()?;
        args["accountId"] = json!(session.account_id);
        let request = json!({ "using": USING, "methodCalls": [[method, args, "0"]] });
        let url = session.api_url.to_string();
        let response = self
            .http
            .post(session.api_url.clone())
            .basic_auth(&self.login, Some(&self.password))
            .json(&request)
            .send()
            .await
            .map_err(|source| MailboxError::Network {
                url: url.clone(),
                source,
            })?;
        let mut body = read_json(response, &url).await?;
        let mut reply = body["methodResponses"]
            .get_mut(0)
            .map(Value::take)
            .ok_or_else(|| protocol(method, "no methodResponses"))?;
        let name = reply[0].as_str().unwrap_or_default().to_string();
        let args = reply[1].take();
        if name == "error" {
            let kind = args["type"].as_str().unwrap_or("unknown").to_string();
            if kind == "cannotCalculateChanges" {
                return Err(MailboxError::CannotCalculateChanges);
            }
            return Err(MailboxError::Method {
                method: method.to_string(),
                kind,
                description: args["description"].as_str().map(str::to_string),
            });
        }
        Ok(args)
    }

    /// The id of the mailbox with role `inbox`.
    pub async fn inbox_id(&self) -> Result<String, MailboxError> {
        let reply = self
            .call(
                "Mailbox/get",
                json!({ "ids": null, "properties": ["id", "role", "name"] }),
            )
            .await?;
        reply["list"]
            .as_array()
            .and_then(|list| list.iter().find(|m| m["role"].as_str() == Some("inbox")))
            .and_then(|m| m["id"].as_str())
            .map(str::to_string)
            .ok_or_else(|| protocol("Mailbox/get", "no mailbox has the inbox role"))
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

    pub async fn changes(&self, since: &str) -> Result<Changes, MailboxError> {
        let reply = self
            .call(
                "Email/changes",
                json!({ "sinceState": since, "maxChanges": 256 }),
            )
            .await?;
        let ids = |key: &str| -> Vec<String> {
            reply[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(Changes {
            created: ids("created"),
            new_state: reply["newState"]
                .as_str()
                .ok_or_else(|| protocol("Email/changes", "no newState"))?
                .to_string(),
            has_more: reply["hasMoreChanges"].as_bool().unwrap_or(false),
        })
    }

    /// The newest `limit` mails in a mailbox, newest first.
    pub async fn query_mailbox(
        &self,
        mailbox_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, MailboxError> {
        let reply = self
            .call(
                "Email/query",
                json!({
                    "filter": { "inMailbox": mailbox_id },
                    "sort": [{ "property": "receivedAt", "isAscending": false }],
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
                        "properties": ["id", "mailboxIds", "messageId", "from", "to", "cc", "subject",
                                       "receivedAt", "headers", "textBody", "bodyValues"],
                        "fetchTextBodyValues": true,
                        "maxBodyValueBytes": MAX_BODY_BYTES,
                    }),
                )
                .await?;
            for email in reply["list"].as_array().into_iter().flatten() {
                out.push(email_from_json(email)?);
            }
        }
        Ok(out)
    }
}

async fn read_json(response: reqwest::Response, url: &str) -> Result<Value, MailboxError> {
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(MailboxError::Http {
            url: url.to_string(),
            status: status.as_u16(),
            body: body
                .chars()
                .take(200)
                .collect::<String>()
                .trim()
                .to_string(),
        });
    }
    response.json().await.map_err(|e| MailboxError::Protocol {
        what: url.to_string(),
        detail: e.to_string(),
    })
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
