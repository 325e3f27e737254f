//! JMAP push: one connection per mailbox, over WebSocket (RFC 8887) or EventSource (RFC 8620
//! §7.3), that turns the server's `StateChange`s for Email into wake-ups for the intake loop.
//! Push only says *that* something changed; the intake loop still reads the changes with
//! `Email/changes`, so a missed notice costs latency, never mail.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;
use url::Url;

use super::MailboxError;
use crate::error::ErrorClass;

/// How often we ping, and how long the connection may stay silent before it counts as lost.
const PING_EVERY: Duration = Duration::from_secs(30);
const SILENCE_LIMIT: Duration = Duration::from_secs(75);

/// Where and as whom to connect.
#[derive(Clone, Debug)]
pub struct PushTarget {
    /// What the server offers, in the order to try them.
    pub transports: Vec<Transport>,
    pub login: String,
    pub password: crate::config::Secret,
    pub account_id: String,
    pub insecure_tls: bool,
}

/// A way to receive push.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    WebSocket(Url),
    /// The event source URL with its template filled in.
    EventSource(Url),
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::WebSocket(url) => write!(f, "WebSocket {url}"),
            Transport::EventSource(url) => write!(f, "EventSource {url}"),
        }
    }
}

/// The WebSocket URL a session advertises, made absolute. Cyrus advertises `wss:/jmap/ws/`
/// with no host (and `wss` even on plain http); a WHATWG parser would read `jmap` as the host.
/// A URL without a host takes host and port from the session URL, and `ws` for an http session.
pub fn websocket_url(advertised: &str, session: &Url) -> Option<Url> {
    let secure = session.scheme() == "https";
    let scheme = if secure { "wss" } else { "ws" };
    let rest = advertised
        .strip_prefix("wss:")
        .or_else(|| advertised.strip_prefix("ws:"));
    let path = match rest {
        // A full URL with a host: use it as it is.
        Some(r) if r.starts_with("//") => return Url::parse(advertised).ok(),
        // A scheme with a bare path, or a relative reference: resolve against the session.
        Some(path) => path,
        None => advertised,
    };
    let mut url = session.join(path).ok()?;
    url.set_scheme(scheme).ok()?;
    Some(url)
}

/// The session's `eventSourceUrl` template for Email changes, no auto-close, a ping every 30 s.
pub fn event_source_url(template: &str, session: &Url) -> Option<Url> {
    let filled = template
        .replace("{types}", "Email")
        .replace("{closeafter}", "no")
        .replace("{ping}", "30");
    session.join(&filled).ok()
}

fn push_error(detail: impl Into<String>, class: ErrorClass) -> MailboxError {
    MailboxError::Push {
        detail: detail.into(),
        class,
    }
}

fn classify_status(status: u16) -> ErrorClass {
    match status {
        401 | 403 => ErrorClass::Auth,
        408 | 429 | 500..=599 => ErrorClass::Transient,
        _ => ErrorClass::Permanent,
    }
}

fn classify(e: WsError) -> MailboxError {
    match e {
        WsError::Http(response) => {
            let status = response.status().as_u16();
            push_error(
                format!("the WebSocket upgrade was answered HTTP {status}"),
                classify_status(status),
            )
        }
        WsError::Url(e) => push_error(format!("bad WebSocket URL: {e}"), ErrorClass::Permanent),
        other => push_error(other.to_string(), ErrorClass::Transient),
    }
}

/// TLS for `wss`: the usual web roots (webpki), verified. `insecure_tls` mailboxes are not
/// offered push over WebSocket TLS (EventSource honours the setting).
fn tls_connector() -> Result<tokio_tungstenite::Connector, MailboxError> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| push_error(format!("TLS setup: {e}"), ErrorClass::Permanent))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_tungstenite::Connector::Rustls(Arc::new(config)))
}

/// One push connection's ends: where it connects, the push state it resumes from and keeps
/// up to date, where every Email change for our account sends a wake-up (a full channel
/// already holds one, which is enough), and when it stops.
pub struct Listener<'a> {
    pub target: &'a PushTarget,
    pub push_state: &'a mut Option<String>,
    pub changed: &'a mpsc::Sender<()>,
    pub stop: &'a CancellationToken,
}

impl Listener<'_> {
    /// Wakes the intake when a StateChange names Email for our account.
    fn heard(&mut self, value: &Value) {
        if value["@type"] != "StateChange" {
            return;
        }
        if let Some(state) = value["pushState"].as_str() {
            *self.push_state = Some(state.to_string());
        }
        if value["changed"][&self.target.account_id]
            .get("Email")
            .is_some()
        {
            let _ = self.changed.try_send(());
        }
    }
}

/// Runs one push connection over `transport` until it fails (an error says how) or `stop` is
/// cancelled (`Ok`). `connected` is called once push is on.
pub async fn run(
    listener: Listener<'_>,
    transport: &Transport,
    connected: impl FnOnce(),
) -> Result<(), MailboxError> {
    match transport {
        Transport::WebSocket(url) => run_websocket(listener, url, connected).await,
        Transport::EventSource(url) => run_event_source(listener, url, connected).await,
    }
}

async fn run_websocket(
    mut l: Listener<'_>,
    url: &Url,
    connected: impl FnOnce(),
) -> Result<(), MailboxError> {
    let (target, stop) = (l.target, l.stop);
    let mut request = url.as_str().into_client_request().map_err(|e| {
        push_error(
            format!("bad WebSocket URL {url}: {e}"),
            ErrorClass::Permanent,
        )
    })?;
    use base64::Engine as _;
    let token = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        target.login,
        target.password.value()
    ));
    let headers = request.headers_mut();
    headers.insert("Sec-WebSocket-Protocol", HeaderValue::from_static("jmap"));
    headers.insert(
        "Authorization",
        HeaderValue::from_str(&format!("Basic {token}"))
            .map_err(|_| push_error("credentials cannot go in a header", ErrorClass::Permanent))?,
    );
    let connector = if url.scheme() == "wss" {
        Some(tls_connector()?)
    } else {
        None
    };
    let (mut socket, response) = tokio::select! {
        r = tokio_tungstenite::connect_async_tls_with_config(request, None, true, connector) => r.map_err(classify)?,
        _ = stop.cancelled() => return Ok(()),
    };
    let protocol = response
        .headers()
        .get("Sec-WebSocket-Protocol")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !protocol.split(',').any(|p| p.trim() == "jmap") {
        return Err(push_error(
            "the server did not accept the jmap WebSocket subprotocol",
            ErrorClass::Permanent,
        ));
    }
    // An explicit type list: Cyrus 3.6 turns push off for `"dataTypes": null`.
    let enable =
        json!({"@type": "WebSocketPushEnable", "dataTypes": ["Email"], "pushState": *l.push_state});
    socket
        .send(Message::text(enable.to_string()))
        .await
        .map_err(classify)?;
    connected();

    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    let mut last_heard = tokio::time::Instant::now();
    loop {
        tokio::select! {
            frame = socket.next() => {
                let frame = match frame {
                    Some(Ok(frame)) => frame,
                    Some(Err(e)) => return Err(classify(e)),
                    None => return Err(push_error("the server closed the push connection", ErrorClass::Transient)),
                };
                last_heard = tokio::time::Instant::now();
                match frame {
                    Message::Text(text) => {
                        if let Ok(value) = serde_json::from_str::<Value>(text.as_str()) {
                            l.heard(&value);
                        }
                    }
                    Message::Close(_) => return Err(push_error("the server closed the push connection", ErrorClass::Transient)),
                    _ => {}
                }
            }
            _ = ping.tick() => {
                if last_heard.elapsed() > SILENCE_LIMIT {
                    return Err(push_error("the push connection went silent", ErrorClass::Transient));
                }
                socket.send(Message::Ping(Vec::new().into())).await.map_err(classify)?;
            }
            _ = stop.cancelled() => {
                let _ = socket.close(None).await;
                return Ok(());
            }
        }
    }
}

/// EventSource: a long GET answered with `text/event-stream`; `state` events carry the
/// StateChange, `ping` events keep it alive.
async fn run_event_source(
    mut l: Listener<'_>,
    url: &Url,
    connected: impl FnOnce(),
) -> Result<(), MailboxError> {
    let (target, stop) = (l.target, l.stop);
    let http = crate::mailbox::http_client(target.insecure_tls, None)?;
    let request = http
        .get(url.clone())
        .basic_auth(&target.login, Some(target.password.value()))
        .header("Accept", "text/event-stream");
    let mut response = tokio::select! {
        r = request.send() => r.map_err(|e| push_error(format!("{url}: {e}"), ErrorClass::Transient))?,
        _ = stop.cancelled() => return Ok(()),
    };
    let status = response.status().as_u16();
    let is_stream = response
        .headers()
        .get("Content-Type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if status != 200 || !is_stream {
        // Debian's stock Cyrus answers 204: it advertises EventSource but has no push.
        return Err(push_error(
            format!("the event source answered HTTP {status}"),
            classify_status(status),
        ));
    }
    connected();
    // Bounded: a line this long is not an event we want.
    let mut reader = crate::protocol::sse::SseReader::new(1 << 20);
    loop {
        let chunk = tokio::select! {
            c = tokio::time::timeout(SILENCE_LIMIT, response.chunk()) => match c {
                Err(_) => return Err(push_error("the event source went silent", ErrorClass::Transient)),
                Ok(Err(e)) => return Err(push_error(e.to_string(), ErrorClass::Transient)),
                Ok(Ok(None)) => return Err(push_error("the server closed the event source", ErrorClass::Transient)),
                Ok(Ok(Some(chunk))) => chunk,
            },
            _ = stop.cancelled() => return Ok(()),
        };
        for event in reader.feed(&chunk) {
            if event.event == "state" {
                if let Ok(value) = serde_json::from_str::<Value>(&event.data) {
                    l.heard(&value);
                }
            }
        }
        if reader.overlong > 0 {
            return Err(push_error(
                "an event source line is too long",
                ErrorClass::Transient,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_source_templates_are_filled_and_resolved() {
        let session = Url::parse("http://127.0.0.1:18080/jmap/").unwrap();
        let url = event_source_url(
            "/jmap/eventsource/?types={types}&closeafter={closeafter}&ping={ping}",
            &session,
        )
        .unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:18080/jmap/eventsource/?types=Email&closeafter=no&ping=30"
        );
    }

    #[test]
    fn cyrus_host_less_urls_take_the_session_host() {
        let http = Url::parse("http://127.0.0.1:18080/jmap/").unwrap();
        assert_eq!(
            websocket_url("wss:/jmap/ws/", &http).unwrap().as_str(),
            "ws://127.0.0.1:18080/jmap/ws/"
        );
        let https = Url::parse("https://mail.example.com/jmap/").unwrap();
        assert_eq!(
            websocket_url("wss:/jmap/ws/", &https).unwrap().as_str(),
            "wss://mail.example.com/jmap/ws/"
        );
        assert_eq!(
            websocket_url("/jmap/ws", &https).unwrap().as_str(),
            "wss://mail.example.com/jmap/ws"
        );
        assert_eq!(
            websocket_url("wss://push.example.com/ws", &https)
                .unwrap()
                .as_str(),
            "wss://push.example.com/ws"
        );
    }
}
