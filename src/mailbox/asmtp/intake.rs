//! Reading an ASMTP mailbox: keyset catch-up from the watermark, woken by the operator's push
//! socket (kept by the shared push supervisor), polled while it is down.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::ErrorClass;
use crate::events::Events;
use crate::mailbox::intake::{self, DeliverError, Health, IntakeError, Watched};
use crate::mailbox::{Mail, MailboxError};

use super::client::{AsmtpClient, FIRST_START_READ};
use super::wire::{Header, Watermark, LAST_ID, PAGE};

/// The watermark file.
pub type WatermarkFile = crate::fsio::JsonFile<Watermark>;

/// The operator's mailbox for [`intake::watch`]: a catch-up from the watermark.
pub(super) struct AsmtpWatched<'a, D> {
    pub(super) client: &'a AsmtpClient,
    pub(super) watermark: &'a WatermarkFile,
    pub(super) deliver: D,
    pub(super) push_up: &'a std::sync::atomic::AtomicBool,
    pub(super) poll_interval: Duration,
    pub(super) agent: &'a str,
    pub(super) events: &'a Events,
}

impl<D: FnMut(Mail) -> Result<(), DeliverError> + Send> Watched for AsmtpWatched<'_, D> {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        let read = catch_up(self.client, self.watermark, &mut self.deliver).await;
        self.client.report_unreadable(self.agent, self.events);
        read.map(|()| 0)
    }

    fn next_read(&mut self, _taken: usize) -> Duration {
        if self.push_up.load(std::sync::atomic::Ordering::SeqCst) {
            // A safety catch-up now and then even with push up.
            Duration::from_secs(60)
        } else {
            self.poll_interval
        }
    }

    fn address(&self) -> String {
        self.client.handle().to_string()
    }
}

/// Reads the mailbox until `stop`: catch-up at start, on every push frame, after every
/// reconnection, and every `poll_interval_secs` while the push socket is down.
pub async fn run_intake(
    name: String,
    client: AsmtpClient,
    link: crate::mailbox::link::Link,
    watermark: WatermarkFile,
    deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
    events: Events,
    stop: CancellationToken,
) {
    let push_up = std::sync::atomic::AtomicBool::new(false);
    let pushed = AsmtpPush {
        client: &client,
        replaced: client.account.token.changes(),
    };
    let health = Health::new(
        &link,
        "the ASMTP operator",
        client.handle().to_string(),
        "token_file",
    )
    .with_secret(client.account.token.clone())
    .retry_refused_every(intake::KEY_REFUSED_RETRY);
    let mut watched = AsmtpWatched {
        client: &client,
        watermark: &watermark,
        deliver,
        push_up: &push_up,
        poll_interval: client.account.poll_interval,
        agent: &name,
        events: &events,
    };
    let token = &client.account.token;
    intake::watch_pushed(
        &name,
        events,
        health,
        &mut watched,
        token,
        Some(pushed),
        &push_up,
        &stop,
    )
    .await;
}

/// Reads every envelope after the watermark, a page at a time: each page is delivered, then
/// the watermark is saved after it.
pub(super) async fn catch_up(
    client: &AsmtpClient,
    watermark: &WatermarkFile,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<(), IntakeError> {
    let mut w = match watermark.load()? {
        Some(w) => w,
        None => first_start(client, watermark, deliver).await?,
    };
    drain_backlog(client, watermark, &mut w, deliver).await?;
    let mut mark = Some(w).filter(|w| !w.envelope_id.is_empty());
    // The first page starts just before the watermark's millisecond (an envelope of the same
    // millisecond may sort before the one read last); what was delivered there is skipped.
    let mut after: Option<(i64, String)> = mark
        .as_ref()
        .map(|w| (w.created_at - 1, LAST_ID.to_string()));
    loop {
        let position = after.as_ref().map(|(at, id)| (*at, id.as_str()));
        let (headers, more) = client.headers_after(position, PAGE).await?;
        let Some(last) = headers.last() else {
            return Ok(());
        };
        let delivered = |h: &Header| {
            mark.as_ref().is_some_and(|w| {
                h.created_at < w.created_at
                    || (h.created_at == w.created_at
                        && (w.ids_at.contains(&h.id) || w.envelope_id == h.id))
            })
        };
        let fresh: Vec<&Header> = headers.iter().filter(|h| !delivered(h)).collect();
        deliver_page(client, &fresh, deliver).await?;
        let next = advance(mark.take(), &headers, last);
        watermark.save(&next)?;
        after = Some((last.created_at, last.id.clone()));
        mark = Some(next);
        if !more {
            return Ok(());
        }
    }
}

/// First start: new work is what arrives from the newest envelope on; the unread envelopes
/// already waiting are the backlog, answered first (unless the mailbox says skip_backlog).
/// The newest is read first: what arrives after it is read by the catch-up, what arrives
/// while the unread are listed may be in both (the journal knows it the second time).
async fn first_start(
    client: &AsmtpClient,
    watermark: &WatermarkFile,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<Watermark, IntakeError> {
    let mut w = client
        .newest()
        .await?
        .map(|h| Watermark {
            created_at: h.created_at,
            ids_at: vec![h.id.clone()],
            envelope_id: h.id,
            backlog: Vec::new(),
        })
        .unwrap_or_default();
    if !client.account.skip_backlog {
        // Those over the size limit are answered now, never fetched.
        let limit = client.account.max_message_bytes;
        // The unread, then those read before the first start (a person looked at them) that
        // the agent never answered.
        let mut waiting = client.unread_headers().await?;
        for header in client.read_unanswered(FIRST_START_READ).await? {
            if !waiting.iter().any(|h| h.id == header.id) {
                waiting.push(header);
            }
        }
        for header in waiting {
            match header.bytes().filter(|size| *size > limit) {
                Some(size) => {
                    if let Some(mail) = client.refused(&header, size) {
                        deliver(mail).map_err(IntakeError::Deliver)?;
                    }
                }
                None => w.backlog.push(header.id),
            }
        }
    }
    if !w.backlog.is_empty() {
        tracing::info!(
            unread = w.backlog.len(),
            "first start: answering the unread envelopes already waiting"
        );
    }
    watermark.save(&w)?;
    Ok(w)
}

/// The backlog, a page at a time; each page leaves the file once the journal holds it.
async fn drain_backlog(
    client: &AsmtpClient,
    watermark: &WatermarkFile,
    w: &mut Watermark,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<(), IntakeError> {
    while !w.backlog.is_empty() {
        let page: Vec<String> = w.backlog.iter().take(PAGE.min(100)).cloned().collect();
        let bodies = client.fetch(&page).await?;
        for id in &page {
            match bodies
                .iter()
                .find(|b| &b.id == id)
                .and_then(|e| client.inbound(e))
            {
                Some(mail) => deliver(mail).map_err(IntakeError::Deliver)?,
                None => {
                    tracing::warn!(%id, "a backlog envelope that cannot be read as a task; skipped")
                }
            }
        }
        w.backlog.drain(..page.len());
        watermark.save(w)?;
    }
    Ok(())
}

/// Fetches and delivers the envelopes of a page not delivered before. One over the
/// mailbox's size limit is not fetched: one message must not cost the bridge its size
/// several times over in memory. It is answered rejected.
async fn deliver_page(
    client: &AsmtpClient,
    fresh: &[&Header],
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<(), IntakeError> {
    let limit = client.account.max_message_bytes;
    let too_large = |h: &Header| h.bytes().is_some_and(|size| size > limit);
    let ids: Vec<String> = fresh
        .iter()
        .filter(|h| !too_large(h))
        .map(|h| h.id.clone())
        .collect();
    let bodies = client.fetch(&ids).await?;
    for header in fresh {
        if too_large(header) {
            let size = header.bytes().unwrap_or_default();
            tracing::warn!(id = %header.id, size, limit, "an ASMTP envelope over max_message_bytes; not fetched, answered rejected");
            match client.refused(header, size) {
                Some(mail) => deliver(mail).map_err(IntakeError::Deliver)?,
                None => {
                    tracing::warn!(id = %header.id, "an oversized envelope without a sender; skipped")
                }
            }
            continue;
        }
        match bodies.iter().find(|b| b.id == header.id) {
            Some(envelope) => match client.inbound(envelope) {
                Some(mail) => deliver(mail).map_err(IntakeError::Deliver)?,
                None => {
                    tracing::warn!(id = %header.id, "an ASMTP envelope that cannot be read as a task; skipped")
                }
            },
            None => {
                tracing::warn!(id = %header.id, "the operator listed an envelope it would not return; skipped")
            }
        }
    }
    Ok(())
}

/// The watermark after a page ending at `last`: its position, with every id at its
/// millisecond (those of `mark` too, when it was at the same one).
fn advance(mark: Option<Watermark>, headers: &[Header], last: &Header) -> Watermark {
    let mut next = match mark {
        Some(w) if w.created_at == last.created_at => w,
        _ => Watermark {
            created_at: last.created_at,
            ..Watermark::default()
        },
    };
    next.envelope_id = last.id.clone();
    for h in headers.iter().filter(|h| h.created_at == last.created_at) {
        if !next.ids_at.contains(&h.id) {
            next.ids_at.push(h.id.clone());
        }
    }
    next
}

/// The operator's push socket for the supervisor: one way (`/connect`), closed by the bridge
/// when the token is replaced.
pub(super) struct AsmtpPush<'a> {
    pub(super) client: &'a AsmtpClient,
    pub(super) replaced: tokio::sync::watch::Receiver<u64>,
}

impl intake::Pushed for AsmtpPush<'_> {
    fn transport(&self) -> &'static str {
        "websocket"
    }

    async fn connect(
        &mut self,
        wake: &mpsc::Sender<()>,
        stop: &CancellationToken,
        connected: impl FnOnce() + Send,
    ) -> Result<intake::Closed, MailboxError> {
        let closed = run_push(self.client, wake, stop, &mut self.replaced, connected).await?;
        Ok(match closed {
            _ if stop.is_cancelled() => intake::Closed::Stopped,
            Some(why) if why == REPLACED => intake::Closed::Replaced,
            why => intake::Closed::ByServer(why),
        })
    }
}

/// Why [`run_push`] closed a socket itself: its token was replaced.
pub(super) const REPLACED: &str = "closed by the bridge: the token was replaced";

/// One push connection: every `envelope.notify` frame wakes the catch-up; other frames
/// (`monitor.fact`, for senders that asked) are let go. `Ok` when the operator closed it (with
/// its close code and reason, as the reference sends `1001 operator shutting down` when it
/// stops) or `stop` was cancelled.
pub(super) async fn run_push(
    client: &AsmtpClient,
    wake: &mpsc::Sender<()>,
    stop: &CancellationToken,
    replaced: &mut tokio::sync::watch::Receiver<u64>,
    connected: impl FnOnce(),
) -> Result<Option<String>, MailboxError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::HeaderValue;
    use tokio_tungstenite::tungstenite::Message;
    let push_error = |detail: String, class: ErrorClass| MailboxError::Push { detail, class };
    let url = client.connect_url();
    replaced.borrow_and_update();
    let mut request = url.as_str().into_client_request().map_err(|e| {
        push_error(
            format!("bad WebSocket URL {url}: {e}"),
            ErrorClass::Permanent,
        )
    })?;
    request.headers_mut().insert(
        "Authorization",
        HeaderValue::from_str(&format!("Bearer {}", client.account.token.value())).map_err(
            |_| {
                push_error(
                    "the token cannot go in a header".into(),
                    ErrorClass::Permanent,
                )
            },
        )?,
    );
    let (mut socket, _) = tokio::select! {
        r = tokio_tungstenite::connect_async(request) => r.map_err(|e| {
            // A refused token is the operator's 401 on the upgrade: waited out like any
            // refused credentials, not retried every few seconds.
            let class = match &e {
                tokio_tungstenite::tungstenite::Error::Http(response)
                    if matches!(response.status().as_u16(), 401 | 403) =>
                {
                    ErrorClass::Auth
                }
                _ => ErrorClass::Transient,
            };
            push_error(e.to_string(), class)
        })?,
        _ = stop.cancelled() => return Ok(None),
    };
    connected();
    loop {
        let frame = tokio::select! {
            f = socket.next() => f,
            Ok(()) = replaced.changed() => {
                let _ = socket.close(None).await;
                return Ok(Some(REPLACED.into()));
            }
            _ = stop.cancelled() => return Ok(None),
        };
        match frame {
            None => return Ok(None),
            Some(Err(e)) => return Err(push_error(e.to_string(), ErrorClass::Transient)),
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
                if value["op"] == "envelope.notify" {
                    let _ = wake.try_send(());
                }
            }
            Some(Ok(Message::Close(frame))) => {
                return Ok(frame.map(|f| {
                    let code = u16::from(f.code);
                    let reason: String = f.reason.chars().filter(|c| !c.is_control()).collect();
                    format!("{code} {reason}")
                }))
            }
            Some(Ok(_)) => {}
        }
    }
}
