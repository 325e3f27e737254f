//! One open page's live feed, as Server-Sent Events: first a `snapshot` event (the read
//! model, and the CSRF token the page's actions carry), then every event line the bridge emits
//! (`start --json`'s, from the tap), in order, several to a frame when they come fast. A page
//! that falls more than the tap's bound behind is not buffered for: it gets a fresh snapshot
//! (`"resync": true`) and the events from then on. Idle, a comment every
//! [`KEEPALIVE`] keeps proxies and tunnels from closing it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Frame;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use super::Context;

/// A comment this often while no event comes.
pub const KEEPALIVE: Duration = Duration::from_secs(15);
/// A fresh snapshot this often (link states, logins and counts change without an event).
pub const REFRESH: Duration = Duration::from_secs(60);
/// Event lines put in one frame at most.
const BATCH: usize = 64;

/// The feed's state between frames.
pub struct Feed {
    context: Arc<Context>,
    lines: broadcast::Receiver<Arc<str>>,
    stop: CancellationToken,
    csrf: Arc<str>,
    /// The next frame is a snapshot: at the start, after a lag, and every [`REFRESH`].
    snapshot: Option<bool>,
    refresh: tokio::time::Instant,
}

impl Feed {
    /// Subscribes to the events before reading the snapshot, so nothing falls between them.
    pub fn new(context: Arc<Context>, stop: CancellationToken, csrf: Arc<str>) -> Feed {
        Feed {
            context,
            lines: crate::events::tap(),
            stop,
            csrf,
            snapshot: Some(false),
            refresh: tokio::time::Instant::now() + REFRESH,
        }
    }

    /// The frames until the bridge stops (or the page goes, which drops the stream).
    pub fn frames(
        self,
    ) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static {
        futures::stream::unfold(self, |mut feed| async move {
            let frame = feed.next().await?;
            Some((Ok(Frame::data(frame)), feed))
        })
    }

    async fn next(&mut self) -> Option<Bytes> {
        let first = loop {
            if let Some(resync) = self.snapshot.take() {
                let mut value = self.context.snapshot().await;
                value["csrf"] = serde_json::Value::from(&*self.csrf);
                value["resync"] = serde_json::Value::from(resync);
                self.refresh = tokio::time::Instant::now() + REFRESH;
                return Some(Bytes::from(format!(
                    "event: snapshot\ndata: {}\n\n",
                    crate::events::json_text(&value).unwrap_or_default()
                )));
            }
            tokio::select! {
                line = self.lines.recv() => break line,
                () = self.stop.cancelled() => return None,
                () = tokio::time::sleep(KEEPALIVE) => {
                    return Some(Bytes::from_static(b": keepalive\n\n"))
                }
                () = tokio::time::sleep_until(self.refresh) => self.snapshot = Some(false),
            }
        };
        let mut out = String::new();
        let mut line = first;
        for _ in 0..BATCH {
            match line {
                Ok(text) => {
                    out.push_str("data: ");
                    out.push_str(&text);
                    out.push_str("\n\n");
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::info!(
                        missed,
                        "a live view fell behind the events; it gets a fresh snapshot"
                    );
                    // From the newest event on, after the snapshot.
                    self.lines = self.lines.resubscribe();
                    self.snapshot = Some(true);
                    break;
                }
                Err(RecvError::Closed) => return None,
            }
            line = match self.lines.try_recv() {
                Ok(text) => Ok(text),
                Err(broadcast::error::TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                Err(_) => break,
            };
        }
        Some(Bytes::from(out))
    }
}
