//! The AAMP helper API: the HTTP service hosted AAMP deployments run beside the mail server
//! (`/.well-known/aamp`, actions as `/api/aamp?action=...` with HTTP Basic auth). Here: task
//! streams, the live progress a dispatcher can watch while a task runs.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use url::Url;

use super::MailboxError;
use crate::config::Account;

/// A text batch goes out at this many characters ...
const FLUSH_AT: usize = 120;
/// ... or at a sentence end once it has this many ...
const SENTENCE_AT: usize = 32;
/// ... or this long after its first delta.
const FLUSH_AFTER: Duration = Duration::from_millis(250);

pub struct HelperApi {
    http: reqwest::Client,
    api_url: Url,
    /// Where a task stream's events are read (SSE), with `{streamId}` in it.
    subscribe: Url,
    insecure_tls: bool,
    login: String,
    password: crate::config::Secret,
}

impl HelperApi {
    /// Reads `api.url` from `{base}/.well-known/aamp` (a relative URL is resolved).
    pub async fn discover(base: &Url, account: &Account) -> Result<HelperApi, MailboxError> {
        let http =
            crate::mailbox::http_client(account.insecure_tls, Some(Duration::from_secs(30)))?;
        let (api_url, subscribe) = endpoints(&http, base).await?;
        Ok(HelperApi {
            http,
            api_url,
            subscribe,
            insecure_tls: account.insecure_tls,
            login: account.login.clone(),
            password: account.password.clone(),
        })
    }

    async fn action(&self, action: &str, body: Value) -> Result<Value, MailboxError> {
        let mut url = self.api_url.clone();
        url.query_pairs_mut().append_pair("action", action);
        let request = self
            .http
            .post(url.clone())
            .basic_auth(&self.login, Some(self.password.value()))
            .json(&body);
        crate::mailbox::fetch_json(request, url.as_str()).await
    }

    /// Reads a task stream (server-sent events) from the start and hands each event (`{type,
    /// payload, ...}`) to `each`, until the service closes it.
    pub async fn follow(
        &self,
        stream_id: &str,
        mut each: impl FnMut(Value),
    ) -> Result<(), MailboxError> {
        /// A frame longer than this is dropped (a broken or hostile service).
        const MAX_FRAME: usize = 1 << 20;
        let url = self
            .subscribe
            .as_str()
            .replace(
                "%7BstreamId%7D",
                &crate::protocol::codec::encode_uri_component(stream_id),
            )
            .replace(
                "{streamId}",
                &crate::protocol::codec::encode_uri_component(stream_id),
            );
        // No total timeout: a stream lasts as long as its task.
        let http = crate::mailbox::http_client(self.insecure_tls, None)?;
        let mut response = http
            .get(&url)
            .basic_auth(&self.login, Some(self.password.value()))
            .header("Accept", "text/event-stream")
            .send()
            .await
            .map_err(MailboxError::network(url.clone()))?;
        if !response.status().is_success() {
            return Err(MailboxError::Http {
                url,
                status: response.status().as_u16(),
                body: String::new(),
            });
        }
        let mut reader = crate::protocol::sse::SseReader::new(MAX_FRAME);
        loop {
            let chunk = response
                .chunk()
                .await
                .map_err(MailboxError::network(url.clone()))?;
            let events = match &chunk {
                Some(chunk) => reader.feed(chunk),
                None => reader.finish().into_iter().collect(),
            };
            for event in events {
                if let Ok(value) = serde_json::from_str::<Value>(&event.data) {
                    each(value);
                }
            }
            if chunk.is_none() {
                return Ok(());
            }
        }
    }

    /// Creates the stream for a task; returns its id.
    pub async fn create_stream(&self, task_id: &str, peer: &str) -> Result<String, MailboxError> {
        let state = self
            .action(
                "aamp.stream.create",
                json!({ "taskId": task_id, "peerEmail": peer }),
            )
            .await?;
        crate::mailbox::required_text(&state["streamId"], "aamp.stream.create", "streamId")
    }

    pub async fn append(
        &self,
        stream_id: &str,
        kind: &str,
        payload: &Value,
    ) -> Result<(), MailboxError> {
        self.action(
            "aamp.stream.append",
            json!({ "streamId": stream_id, "type": kind, "payload": payload }),
        )
        .await
        .map(|_| ())
    }

    /// A GET action; `None` when the service answers 404 (no such task or stream).
    async fn get_action(
        &self,
        action: &str,
        params: &[(&str, &str)],
    ) -> Result<Option<Value>, MailboxError> {
        let mut url = self.api_url.clone();
        url.query_pairs_mut()
            .append_pair("action", action)
            .extend_pairs(params);
        let response = self
            .http
            .get(url.clone())
            .basic_auth(&self.login, Some(self.password.value()))
            .send()
            .await
            .map_err(MailboxError::network(url.to_string()))?;
        if response.status().as_u16() == 404 {
            return Ok(None);
        }
        crate::mailbox::read_json(response, url.as_str())
            .await
            .map(Some)
    }

    /// The thread of a task, oldest first: `[{intent, from, bodyText, output, ...}]`. A task
    /// the service does not know gives an empty list.
    pub async fn thread(&self, task_id: &str) -> Result<Vec<Value>, MailboxError> {
        let body = self
            .get_action("aamp.mailbox.thread", &[("taskId", task_id)])
            .await?;
        Ok(body
            .and_then(|b| b["events"].as_array().cloned())
            .unwrap_or_default())
    }

    /// A task's stream state (`{streamId, status, latestEvent, ...}`); `None` when it has none.
    pub async fn stream_state(&self, task_id: &str) -> Result<Option<Value>, MailboxError> {
        self.get_action("aamp.stream.get", &[("taskId", task_id)])
            .await
    }

    /// Publishes the agent's card in the service's directory.
    pub async fn directory_upsert(
        &self,
        summary: Option<&str>,
        card_text: Option<&str>,
    ) -> Result<(), MailboxError> {
        self.action(
            "aamp.directory.upsert",
            json!({ "summary": summary, "cardText": card_text }),
        )
        .await
        .map(|_| ())
    }

    /// Closes the stream. It carries no terminal event: the task's end is the result mail.
    pub async fn close(&self, stream_id: &str, payload: &Value) -> Result<(), MailboxError> {
        self.action(
            "aamp.stream.close",
            json!({ "streamId": stream_id, "payload": payload }),
        )
        .await
        .map(|_| ())
    }

    /// Appends a task's events to its stream in order, one request at a time, joining
    /// consecutive `text.delta`s. Ends when `events` closes (after sending what is left), or
    /// early and quietly when the server says the stream is closed (409). Returns the number
    /// of appends made.
    pub async fn pump(
        &self,
        stream_id: &str,
        mut events: mpsc::Receiver<(&'static str, Value)>,
    ) -> usize {
        let mut appends = 0;
        let mut text = String::new();
        let mut deadline: Option<tokio::time::Instant> = None;
        let mut open = true;
        loop {
            let next = match deadline {
                Some(at) => tokio::select! {
                    event = events.recv() => Some(event),
                    _ = tokio::time::sleep_until(at) => None,
                },
                None => Some(events.recv().await),
            };
            let (flush_text, event, done) = match next {
                None => (true, None, false),
                Some(None) => (true, None, true),
                Some(Some(("text.delta", payload))) => {
                    text.push_str(payload["text"].as_str().unwrap_or_default());
                    deadline.get_or_insert_with(|| tokio::time::Instant::now() + FLUSH_AFTER);
                    let sentence = text.ends_with(['\n', '.', '!', '?', '。', '！', '？']);
                    (
                        text.chars().count() >= FLUSH_AT
                            || (sentence && text.chars().count() >= SENTENCE_AT),
                        None,
                        false,
                    )
                }
                Some(Some(other)) => (true, Some(other), false),
            };
            if flush_text && !text.is_empty() && open {
                open = self
                    .send(
                        stream_id,
                        "text.delta",
                        &json!({ "text": std::mem::take(&mut text) }),
                        &mut appends,
                    )
                    .await;
            }
            if flush_text {
                text.clear();
                deadline = None;
            }
            if let (Some((kind, payload)), true) = (event, open) {
                open = self.send(stream_id, kind, &payload, &mut appends).await;
            }
            if done {
                return appends;
            }
        }
    }

    /// One append; `false` once the stream is closed for good.
    async fn send(
        &self,
        stream_id: &str,
        kind: &str,
        payload: &Value,
        appends: &mut usize,
    ) -> bool {
        match self.append(stream_id, kind, payload).await {
            Ok(()) => {
                *appends += 1;
                true
            }
            Err(MailboxError::Http { status: 409, .. }) => {
                tracing::info!(
                    stream_id,
                    "the stream was closed by the server; dropping further events"
                );
                false
            }
            Err(e) => {
                tracing::warn!(stream_id, error = %e, "a stream append failed; the event is dropped");
                true
            }
        }
    }
}

/// The service's action endpoint and stream subscription template, from its discovery
/// document.
async fn endpoints(http: &reqwest::Client, base: &Url) -> Result<(Url, Url), MailboxError> {
    let (discovery, body) = discover_document(http, base).await?;
    let resolve = |text: &str| {
        // `{streamId}` survives URL parsing as %7BstreamId%7D; put it back when used.
        discovery.join(text).map_err(|e| MailboxError::Protocol {
            what: discovery.to_string(),
            detail: e.to_string(),
        })
    };
    // `discover_document` checked that api.url is there.
    let api = resolve(body["api"]["url"].as_str().unwrap_or_default())?;
    let subscribe = resolve(
        body["capabilities"]["stream"]["subscribeUrlTemplate"]
            .as_str()
            .unwrap_or("/api/aamp/streams/{streamId}/events"),
    )?;
    Ok((api, subscribe))
}

/// `{base}/.well-known/aamp` (no auth): its URL and the document.
async fn discover_document(
    http: &reqwest::Client,
    base: &Url,
) -> Result<(Url, Value), MailboxError> {
    let discovery = base
        .join("/.well-known/aamp")
        .map_err(|e| MailboxError::Protocol {
            what: base.to_string(),
            detail: e.to_string(),
        })?;
    let body = crate::mailbox::fetch_json(http.get(discovery.clone()), discovery.as_str()).await?;
    if body["api"]["url"].as_str().is_none() {
        return Err(MailboxError::Protocol {
            what: discovery.to_string(),
            detail: "no api.url: this is not an AAMP service".into(),
        });
    }
    Ok((discovery, body))
}

/// The service's action endpoint: `api.url` from `{base}/.well-known/aamp`, resolved.
async fn api_url(http: &reqwest::Client, base: &Url) -> Result<Url, MailboxError> {
    endpoints(http, base).await.map(|(api, _)| api)
}

/// Registers a new mailbox with an AAMP service (`aamp.mailbox.register`, then the code
/// exchanged with `aamp.mailbox.credentials`; neither needs auth) and returns its credentials.
pub async fn register(
    registration: &crate::config::Registration,
) -> Result<crate::config::Credentials, MailboxError> {
    let http =
        crate::mailbox::http_client(registration.insecure_tls, Some(Duration::from_secs(60)))?;
    let api = api_url(&http, &registration.aamp_url).await?;

    let mut url = api.clone();
    url.query_pairs_mut()
        .append_pair("action", "aamp.mailbox.register");
    let request = http
        .post(url.clone())
        .json(&json!({ "slug": registration.slug, "description": registration.description }));
    let registered = crate::mailbox::fetch_json(request, url.as_str()).await?;
    let code = crate::mailbox::required_text(
        &registered["registrationCode"],
        "aamp.mailbox.register",
        "registrationCode",
    )?;

    let mut url = api;
    url.query_pairs_mut()
        .append_pair("action", "aamp.mailbox.credentials")
        .append_pair("code", &code);
    // The URL carries the one-time code: errors name the action instead.
    let creds =
        crate::mailbox::fetch_json(http.get(url.clone()), "aamp.mailbox.credentials").await?;
    let field =
        |v: &Value, name: &str| crate::mailbox::required_text(v, "aamp.mailbox.credentials", name);
    Ok(crate::config::Credentials {
        email: field(&creds["email"], "email")?,
        mailbox_token: field(&creds["mailbox"]["token"], "mailbox.token")?,
        smtp_password: field(&creds["smtp"]["password"], "smtp.password")?,
    })
}

/// What an AAMP service says of itself at `/.well-known/aamp`, for `init` and `doctor`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ServiceInfo {
    pub version: Option<String>,
    /// Live task streams (SSE).
    pub streams: bool,
    /// Mailbox registration (`aamp.mailbox.register`), when the document lists its actions;
    /// assumed when it does not.
    pub registration: bool,
    pub directory: bool,
}

impl ServiceInfo {
    /// One line for a person: "AAMP 1.1: task streams, mailbox registration".
    pub fn describe(&self) -> String {
        let mut offers = Vec::new();
        if self.streams {
            offers.push("live task streams");
        }
        if self.registration {
            offers.push("mailbox registration");
        }
        if self.directory {
            offers.push("agent directory");
        }
        format!(
            "AAMP {}: {}",
            self.version.as_deref().unwrap_or("(no version)"),
            if offers.is_empty() {
                "no optional features".to_string()
            } else {
                offers.join(", ")
            }
        )
    }
}

/// Reads `{base}/.well-known/aamp` (no auth) and says what the service offers.
pub async fn probe(base: &Url, insecure_tls: bool) -> Result<ServiceInfo, MailboxError> {
    let http = crate::mailbox::http_client(insecure_tls, Some(Duration::from_secs(15)))?;
    let (_, body) = discover_document(&http, base).await?;
    let actions: Option<Vec<&str>> = body["api"]["actions"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect());
    let has = |name: &str| actions.as_ref().is_none_or(|a| a.contains(&name));
    Ok(ServiceInfo {
        version: body["version"].as_str().map(str::to_string),
        streams: body["capabilities"]["stream"]["transport"] == "sse",
        registration: has("aamp.mailbox.register"),
        directory: actions
            .as_ref()
            .is_some_and(|a| a.contains(&"aamp.directory.upsert")),
    })
}
