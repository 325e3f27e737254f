//! The live view's HTTP/1.1 server: every request's `Host` is checked first, then its token
//! (the `?token=` link once, which sets the cookie and redirects to drop it from the address,
//! then the cookie); actions are POSTs that also need a same-origin `Origin` and the CSRF
//! token the page read from its feed. Connections are bounded and live on the daemon's task
//! tracker; the bridge's stop ends them (and their feeds).

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
use super::feed::Feed;
use super::{Context, UiError};
use crate::config::UiConfig;
use crate::paths::StateDir;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Pages (and feeds) open at once at most; more wait to be accepted.
const CONNECTIONS: usize = 32;
/// An action's JSON body at most.
const MAX_BODY: usize = 16 * 1024;
/// How long a client has to send its request's header.
const HEADER_WAIT: Duration = Duration::from_secs(10);
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
    port: u16,
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
            port: self.addr.port(),
            stop: stop.clone(),
        });
        tracing::info!(address = %self.addr, "the live view is served (aamp-bridge ui prints its link)");
        let permits = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
        loop {
            let permit = tokio::select! {
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
                () = stop.cancelled() => break,
            };
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
            let shared = shared.clone();
            let stop = stop.clone();
            tracker.spawn(
                async move {
                    let _permit = permit;
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(with_headers(handle(req, &shared).await)) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(HEADER_WAIT)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    let done = tokio::select! {
                        done = conn.as_mut() => done,
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
                .instrument(tracing::debug_span!("ui", %peer)),
            );
        }
        let _ = std::fs::remove_file(shared.context.config.state().ui_address());
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

async fn handle(req: Request<Incoming>, shared: &Shared) -> Response<Body> {
    // DNS rebinding: a page of another site whose name now points here sends its own Host.
    let Some(host) = header_str(&req, header::HOST).filter(|h| shared.hosts.allows(Some(h))) else {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "this Host is not the bridge's",
        );
    };
    let host = host.to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default();
    // The link `aamp-bridge ui` prints: the token becomes a cookie, and leaves the address.
    if req.method() == Method::GET && path == "/" {
        if let Some(token) = auth::query_param(query, "token") {
            if !auth::same_secret(token, &shared.token) {
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    "wrong token: open the link `aamp-bridge ui` prints",
                );
            }
            let mut response = full(StatusCode::SEE_OTHER, "text/plain", "");
            let h = response.headers_mut();
            h.insert(header::LOCATION, HeaderValue::from_static("/"));
            if let Ok(cookie) = HeaderValue::from_str(&auth::set_cookie(shared.port, &shared.token))
            {
                h.insert(header::SET_COOKIE, cookie);
            }
            return response;
        }
    }
    let cookie = header_str(&req, header::COOKIE)
        .and_then(|c| auth::cookie(c, &auth::cookie_name(shared.port)));
    if !cookie.is_some_and(|c| auth::same_secret(c, &shared.token)) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "no access token: open the link `aamp-bridge ui` prints",
        );
    }
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/") => full(StatusCode::OK, "text/html; charset=utf-8", INDEX),
        (Method::GET, "/app.js") => full(StatusCode::OK, "text/javascript; charset=utf-8", SCRIPT),
        (Method::GET, "/style.css") => full(StatusCode::OK, "text/css; charset=utf-8", STYLE),
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
        (Method::POST, "/api/answer" | "/api/cancel") => {
            if !auth::same_origin(header_str(&req, header::ORIGIN), &host) {
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
            act(&path, &action, shared)
        }
        (_, "/" | "/app.js" | "/style.css" | "/events" | "/api/task") => {
            refuse(StatusCode::METHOD_NOT_ALLOWED, "not with this method")
        }
        _ => refuse(StatusCode::NOT_FOUND, "no such page"),
    }
}

/// An action the page asks: which task, and for an answer, the answer.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Action {
    agent: String,
    from: String,
    task_id: String,
    #[serde(default)]
    answer: Option<String>,
}

fn act(path: &str, action: &Action, shared: &Shared) -> Response<Body> {
    let operator = &shared.context.operator;
    let done = match (path, &action.answer) {
        ("/api/answer", Some(answer)) => {
            operator.answer(&action.agent, &action.from, &action.task_id, answer)
        }
        ("/api/answer", None) => return refuse(StatusCode::BAD_REQUEST, "no answer"),
        _ => operator.cancel(&action.agent, &action.from, &action.task_id),
    };
    match done {
        Ok(()) => json(StatusCode::OK, &serde_json::json!({"ok": true})),
        Err(e) => json(
            StatusCode::CONFLICT,
            &serde_json::json!({"ok": false, "error": e.to_string()}),
        ),
    }
}
