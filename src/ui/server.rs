//! The live view's HTTP/1.1 server: every request's `Host` is checked first; the page, its
//! script and style (which hold no data) are served to anyone who passes it, everything else
//! needs the token as `Authorization: Bearer` (the page reads it from its link's fragment;
//! see [`super::auth`]); actions are POSTs that also need a same-origin `Origin` and the CSRF
//! token the page read from its feed. Connections are bounded (`super::conns`: idle ones
//! make room) and live on the daemon's task tracker; the bridge's stop ends them (and their
//! feeds).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt as _, Full, Limited, StreamBody};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::auth::{self, Hosts};
use super::conns::{Conns, Slot};
use super::feed::Feed;
use super::{Action, Context, UiError};
use crate::config::UiConfig;
use crate::paths::StateDir;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// An action's JSON body at most.
const MAX_BODY: usize = 16 * 1024;
/// How long a client has to send its request's header, from its connection's start.
const HEADER_WAIT: Duration = Duration::from_secs(5);
/// The header the page sends its CSRF token in.
const CSRF_HEADER: &str = "x-aamp-csrf";

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/style.css");

/// The page's address, bound, with its secrets.
pub struct Server {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    token: String,
    hosts: Hosts,
}

/// What every connection's requests share.
struct Shared {
    context: Arc<Context>,
    token: String,
    /// Made anew at each start; the page reads it from its feed.
    csrf: Arc<str>,
    hosts: Hosts,
    stop: CancellationToken,
}

impl Server {
    /// Binds `[ui] listen`, makes the token (0600) if there is none, and writes the address
    /// `aamp-bridge ui` reads.
    pub fn bind(ui: &UiConfig, state: &StateDir) -> Result<Server, UiError> {
        let token = auth::load_or_create_token(&state.ui_token())?;
        let bind = |source| UiError::Bind {
            addr: ui.listen,
            source,
        };
        let listener = std::net::TcpListener::bind(ui.listen).map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let addr = listener.local_addr().map_err(bind)?;
        let path = state.ui_address();
        std::fs::write(&path, format!("{addr}\n"))
            .map_err(|source| UiError::Write { path, source })?;
        Ok(Server {
            listener,
            addr,
            token,
            hosts: Hosts::new(addr, &ui.hosts),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `stop`; each connection is a task on `tracker`.
    pub async fn serve(self, context: Arc<Context>, tracker: TaskTracker, stop: CancellationToken) {
        let listener = match tokio::net::TcpListener::from_std(self.listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "the live view cannot listen");
                return;
            }
        };
        let csrf: Arc<str> = match auth::random_hex() {
            Ok(c) => c.into(),
            Err(e) => {
                tracing::error!(error = %e, "no random source for the live view's CSRF token");
                return;
            }
        };
        let shared = Arc::new(Shared {
            context,
            token: self.token,
            csrf,
            hosts: self.hosts,
            stop: stop.clone(),
        });
        tracing::info!(address = %self.addr, "the live view is served (aamp-bridge ui prints its link)");
        let conns = Arc::new(Conns::default());
        loop {
            let (stream, peer) = tokio::select! {
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "the live view could not accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = stop.cancelled() => break,
            };
            let Some(slot) = conns.admit(peer.ip()) else {
                tracing::info!(%peer, "every live view connection is in use; one more was closed");
                continue;
            };
            tracker.spawn(
                connection(stream, slot, shared.clone())
                    .instrument(tracing::debug_span!("ui", %peer)),
            );
        }
        let _ = std::fs::remove_file(shared.context.config.state().ui_address());
    }
}

/// Serves one connection until it ends, the bridge stops, or it is closed for a newcomer.
async fn connection(stream: tokio::net::TcpStream, slot: Slot, shared: Arc<Shared>) {
    let slot = Arc::new(slot);
    let stop = shared.stop.clone();
    let close = slot.close.clone();
    let service = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        let slot = slot.clone();
        async move {
            slot.busy();
            let (response, trusted) = handle(req, &shared).await;
            slot.done(trusted);
            Ok::<_, Infallible>(with_headers(response))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_WAIT)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(conn);
    let done = tokio::select! {
        done = conn.as_mut() => done,
        () = close.cancelled() => Ok(()),
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(Duration::from_secs(2), conn)
                .await
                .unwrap_or(Ok(()))
        }
    };
    if let Err(e) = done {
        tracing::debug!(error = %e, "a live view connection ended");
    }
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn refuse(status: StatusCode, why: &'static str) -> Response<Body> {
    tracing::info!(status = status.as_u16(), why, "live view request refused");
    full(status, "text/plain; charset=utf-8", format!("{why}\n"))
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    full(
        status,
        "application/json",
        crate::events::json_text(value).unwrap_or_default(),
    )
}

/// What every answer carries: nothing is cached, framed, sniffed or sent as a referrer, and
/// the page runs only its own script.
fn with_headers(mut response: Response<Body>) -> Response<Body> {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

fn header_str(req: &Request<Incoming>, name: impl header::AsHeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The answer to one request, and whether it carried the token.
async fn handle(req: Request<Incoming>, shared: &Shared) -> (Response<Body>, bool) {
    // DNS rebinding: a page of another site whose name now points here sends its own Host.
    let Some(host) = header_str(&req, header::HOST).filter(|h| shared.hosts.allows(Some(h))) else {
        return (
            refuse(
                StatusCode::MISDIRECTED_REQUEST,
                "this Host is not the bridge's",
            ),
            false,
        );
    };
    let host = host.to_string();
    let path = req.uri().path().to_string();
    // The page itself holds no data: it reads its token from its link and asks with it.
    let page = match path.as_str() {
        "/" => Some(("text/html; charset=utf-8", INDEX)),
        "/app.js" => Some(("text/javascript; charset=utf-8", SCRIPT)),
        "/style.css" => Some(("text/css; charset=utf-8", STYLE)),
        _ => None,
    };
    if let Some((content_type, text)) = page {
        if req.method() != Method::GET {
            return (
                refuse(StatusCode::METHOD_NOT_ALLOWED, "not with this method"),
                false,
            );
        }
        return (full(StatusCode::OK, content_type, text), false);
    }
    let token = header_str(&req, header::AUTHORIZATION).and_then(auth::bearer);
    if !token.is_some_and(|t| auth::same_secret(t, &shared.token)) {
        return (
            refuse(
                StatusCode::UNAUTHORIZED,
                "no access token: open the link `aamp-bridge ui` prints",
            ),
            false,
        );
    }
    (data(req, shared, &host, &path).await, true)
}

/// What only a holder of the token gets: the feed, a task, and the actions.
async fn data(req: Request<Incoming>, shared: &Shared, host: &str, path: &str) -> Response<Body> {
    let query = req.uri().query().unwrap_or_default();
    match (req.method().clone(), path) {
        (Method::GET, "/events") => {
            let feed = Feed::new(
                shared.context.clone(),
                shared.stop.clone(),
                shared.csrf.clone(),
            );
            let mut response = Response::new(StreamBody::new(feed.frames()).boxed_unsync());
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            response
        }
        (Method::GET, "/api/task") => {
            let Some(id) = auth::query_param(query, "id") else {
                return refuse(StatusCode::BAD_REQUEST, "which task? (?id=ROW)");
            };
            match super::snapshot::task_details(&shared.context.journal, id) {
                Ok(found) => json(StatusCode::OK, &serde_json::Value::Array(found)),
                Err(e) => {
                    tracing::warn!(error = %e, "the live view could not read a task");
                    refuse(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the journal could not be read",
                    )
                }
            }
        }
        (Method::GET, "/api/usage") => {
            match super::usage::live(&shared.context.journal, std::time::SystemTime::now()) {
                Ok(usage) => json(StatusCode::OK, &usage),
                Err(e) => {
                    tracing::warn!(error = %e, "the live view could not read the usage");
                    refuse(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the journal could not be read",
                    )
                }
            }
        }
        (Method::POST, "/api/answer" | "/api/cancel") => {
            if !auth::same_origin(header_str(&req, header::ORIGIN), host) {
                return refuse(StatusCode::FORBIDDEN, "a cross-site request");
            }
            let csrf = header_str(&req, CSRF_HEADER).unwrap_or_default();
            if !auth::same_secret(csrf, &shared.csrf) {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "no CSRF token, or a stale one: reload the page",
                );
            }
            let Ok(body) = Limited::new(req.into_body(), MAX_BODY).collect().await else {
                return refuse(StatusCode::PAYLOAD_TOO_LARGE, "the request is too large");
            };
            let Ok(action) = serde_json::from_slice::<Action>(&body.to_bytes()) else {
                return refuse(StatusCode::BAD_REQUEST, "not an action");
            };
            act(path, &action, shared)
        }
        (_, "/events" | "/api/task" | "/api/usage") => {
            refuse(StatusCode::METHOD_NOT_ALLOWED, "not with this method")
        }
        _ => refuse(StatusCode::NOT_FOUND, "no such page"),
    }
}

fn act(path: &str, action: &Action, shared: &Shared) -> Response<Body> {
    let operator = &shared.context.operator;
    let done = match (path, &action.answer) {
        ("/api/answer", Some(answer)) => operator.answer(action, answer),
        ("/api/answer", None) => return refuse(StatusCode::BAD_REQUEST, "no answer"),
        _ => operator.cancel(action),
    };
    match done {
        Ok(()) => json(StatusCode::OK, &serde_json::json!({"ok": true})),
        Err(e) => json(
            StatusCode::CONFLICT,
            &serde_json::json!({"ok": false, "error": e.to_string()}),
        ),
    }
}
