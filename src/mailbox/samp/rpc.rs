//! The few MCP calls the SAMP back-end makes (`initialize`, `tools/list`, `tools/call`), as
//! JSON-RPC over Streamable HTTP: each request a POST of one JSON-RPC message, answered with
//! JSON or with an event stream whose events carry JSON-RPC messages (the answer is the one
//! with the request's id). A session id the server gives (`Mcp-Session-Id`) is sent back;
//! a server that forgot it (404) is initialized again once.
//!
//! Not the `rmcp` crate, for size rather than need. rmcp (3.1) takes its Streamable HTTP
//! client as a trait (`StreamableHttpClient`: post a message, open an event stream, delete a
//! session) with one implementation on reqwest 0.13 behind its
//! `transport-streamable-http-client-reqwest` feature and one on hyper for Unix sockets only;
//! the trait itself needs neither. Using rmcp here would mean implementing that trait over
//! this tree's reqwest 0.12 client (event-stream framing included) and taking rmcp's service
//! layer, for three calls that this file makes whole. Worth weighing again once rmcp is in the
//! tree for the server side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};

use super::error::SampError;
use crate::config::Secret;
use crate::mailbox::MailboxError;

/// The MCP protocol version the bridge asks for (the server may answer another it speaks).
const PROTOCOL: &str = "2025-06-18";

/// The largest answer read (a page of 100 messages of 32 KB bodies and 64 KB data is under
/// 10 MB).
const MAX_ANSWER: usize = 16 << 20;

pub struct Rpc {
    http: reqwest::Client,
    url: url::Url,
    key: Secret,
    next_id: AtomicU64,
    session: Mutex<Session>,
}

#[derive(Default)]
struct Session {
    id: Option<String>,
    protocol: Option<String>,
    initialized: bool,
}

impl Rpc {
    pub fn new(http: reqwest::Client, url: url::Url, key: Secret) -> Rpc {
        Rpc {
            http,
            url,
            key,
            next_id: AtomicU64::new(1),
            session: Mutex::default(),
        }
    }

    /// Forgets the session: the next call initializes again (after a refused key, say).
    pub fn reset(&self) {
        *self.session.lock().expect("session lock") = Session::default();
    }

    /// `initialize`, then `notifications/initialized`; the server's info.
    pub async fn initialize(&self) -> Result<Value, SampError> {
        self.reset();
        let result = self
            .request_once(
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "aamp-bridge", "version": env!("CARGO_PKG_VERSION")},
                }),
            )
            .await?;
        {
            let mut session = self.session.lock().expect("session lock");
            session.protocol = result["protocolVersion"].as_str().map(str::to_string);
            session.initialized = true;
        }
        self.post(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            None,
        )
        .await?;
        Ok(result)
    }

    /// The tools the server offers (every page of `tools/list`).
    pub async fn list_tools(&self) -> Result<Vec<Value>, SampError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..20 {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let page = self.request("tools/list", params).await?;
            if let Some(list) = page["tools"].as_array() {
                tools.extend(list.iter().cloned());
            }
            cursor = page["nextCursor"].as_str().map(str::to_string);
            if cursor.is_none() {
                break;
            }
        }
        Ok(tools)
    }

    /// Calls tool `name`: its JSON answer (the first text content read as JSON, or the
    /// structured content), or its refusal (`isError`) as [`SampError::Refused`].
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<Value, SampError> {
        let result = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        let text = result["content"]
            .as_array()
            .and_then(|c| c.iter().find_map(|part| part["text"].as_str()));
        let body = match (
            text.map(serde_json::from_str::<Value>),
            &result["structuredContent"],
        ) {
            (_, structured) if structured.is_object() => structured.clone(),
            (Some(Ok(value)), _) => value,
            (Some(Err(_)), _) => json!({"message": text.unwrap_or_default()}),
            (None, _) => Value::Null,
        };
        if result["isError"].as_bool() == Some(true) {
            let code = body["error"].as_str().unwrap_or("error").to_string();
            let message: String = body["message"]
                .as_str()
                .or(text)
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect();
            return Err(SampError::Refused {
                tool: name.to_string(),
                code,
                message,
                retry_after: body["retry_after_seconds"].as_u64(),
            });
        }
        Ok(body)
    }

    /// A request and its result, initializing first when no session is open, and again
    /// once when the server no longer knows the session.
    async fn request(&self, method: &str, params: Value) -> Result<Value, SampError> {
        let ready = self.session.lock().expect("session lock").initialized;
        if !ready && method != "initialize" {
            self.initialize().await?;
        }
        match self.request_once(method, params.clone()).await {
            Err(SampError::Link(MailboxError::Http { status: 404, .. }))
                if method != "initialize"
                    && self.session.lock().expect("session lock").id.is_some() =>
            {
                tracing::debug!("the SAMP server forgot the session; initializing again");
                self.initialize().await?;
                self.request_once(method, params).await
            }
            other => other,
        }
    }

    async fn request_once(&self, method: &str, params: Value) -> Result<Value, SampError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let answer = self
            .post(
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
                Some(id),
            )
            .await?
            .ok_or_else(|| SampError::Protocol {
                what: method.to_string(),
                detail: "no answer".into(),
            })?;
        if let Some(error) = answer.get("error") {
            return Err(SampError::Rpc {
                method: method.to_string(),
                code: error["code"].as_i64().unwrap_or_default(),
                message: error["message"]
                    .as_str()
                    .unwrap_or_default()
                    .chars()
                    .take(300)
                    .collect(),
            });
        }
        Ok(answer.get("result").cloned().unwrap_or(Value::Null))
    }

    /// POSTs one message; the answer to request `id` (`None` for a notification).
    async fn post(&self, message: Value, id: Option<u64>) -> Result<Option<Value>, SampError> {
        let (session, protocol) = {
            let s = self.session.lock().expect("session lock");
            (s.id.clone(), s.protocol.clone())
        };
        let mut request = self
            .http
            .post(self.url.clone())
            .bearer_auth(self.key.value())
            .header(
                reqwest::header::ACCEPT,
                "application/json, text/event-stream",
            )
            .json(&message);
        if let Some(session) = session {
            request = request.header("Mcp-Session-Id", session);
        }
        if let Some(protocol) = protocol {
            request = request.header("MCP-Protocol-Version", protocol);
        }
        let url = self.url.to_string();
        let mut response = request
            .send()
            .await
            .map_err(MailboxError::network(url.clone()))?;
        let status = response.status();
        if let Some(session) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            self.session.lock().expect("session lock").id = Some(session.to_string());
        }
        let event_stream = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        // Counted while read, whatever the server says of its length (issue 43 item 2); an
        // event stream's answer ends the reading once it is in: the stream may stay open.
        let answered =
            |body: &[u8]| event_stream && id.is_some_and(|id| find_answer(body, id).is_some());
        let body =
            crate::mailbox::body::read_capped(&mut response, &url, MAX_ANSWER, answered).await?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(MailboxError::Http {
                url,
                status: status.as_u16(),
                body: text
                    .chars()
                    .take(300)
                    .collect::<String>()
                    .trim()
                    .to_string(),
            }
            .into());
        }
        let Some(id) = id else {
            return Ok(None);
        };
        let answer = if event_stream {
            find_answer(&body, id)
        } else {
            serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| match v {
                    Value::Array(batch) => batch.into_iter().find(|m| m["id"] == id),
                    one => Some(one),
                })
        };
        answer.map(Some).ok_or_else(|| SampError::Protocol {
            what: url,
            detail: "no JSON-RPC answer in the server's reply".into(),
        })
    }
}

/// The JSON-RPC answer to `id` among the events of an event stream read so far.
fn find_answer(stream: &[u8], id: u64) -> Option<Value> {
    let text = String::from_utf8_lossy(stream);
    let mut data = String::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if let Ok(message) = serde_json::from_str::<Value>(&data) {
                if message["id"] == id
                    && (message.get("result").is_some() || message.get("error").is_some())
                {
                    return Some(message);
                }
            }
            data.clear();
        } else if let Some(rest) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_found_among_the_events() {
        let stream = b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\r\n\r\nid: 1\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"ok\":true}}\n\n";
        assert_eq!(find_answer(stream, 7).unwrap()["result"]["ok"], true);
        assert!(find_answer(stream, 8).is_none());
        assert!(
            find_answer(b"data: {\"id\":7,\"result\":1}", 7).is_none(),
            "not ended yet"
        );
    }
}
