//! The owner-only control socket `aamp-bridge status` asks while the bridge runs.

use super::*;

/// Binds the control socket, owner-only. A socket left by a crashed bridge is replaced (the
/// state lock, held by now, says no other bridge uses this directory).
pub(super) fn control_socket(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// A reload asked over the control socket, answered with what it did.
pub(super) type ReloadRequest = tokio::sync::oneshot::Sender<serde_json::Value>;

/// How long a connection has to say what it wants (`status` or `reload`, one line) before it
/// is answered with the status, as clients that send nothing are.
const REQUEST_WAIT: Duration = Duration::from_millis(200);
/// How long a reload asked over the socket may take before the client is told it is still
/// under way.
const RELOAD_WAIT: Duration = Duration::from_secs(30);

/// Answers each connection with one JSON line, then closes it: the live status, or, for a
/// client that asked `reload`, what the reload did (the config, profiles and credentials read
/// again, as SIGHUP does). A reload's answer waits for the reload while status is still
/// answered; one reload at a time.
pub(super) async fn serve_control(
    listener: tokio::net::UnixListener,
    live: impl Fn() -> serde_json::Value,
    reloads: tokio::sync::mpsc::Sender<ReloadRequest>,
    stop: CancellationToken,
) {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _};
    // The answer to the reload under way, once it is done.
    let mut reloading: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
        None;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = async { reloading.as_mut().expect("checked").await }, if reloading.is_some() => {
                reloading = None;
                continue;
            }
            _ = stop.cancelled() => break,
        };
        match accepted {
            Ok((stream, _)) => {
                let (read, write) = stream.into_split();
                let mut request = String::new();
                let mut lines = tokio::io::BufReader::new(read.take(256));
                let _ = tokio::time::timeout(REQUEST_WAIT, lines.read_line(&mut request)).await;
                if request.trim() != "reload" {
                    answer(write, live()).await;
                    continue;
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                if reloading.is_some() || reloads.try_send(tx).is_err() {
                    answer(write, json!({"error": "a reload is already under way"})).await;
                    continue;
                }
                reloading = Some(Box::pin(async move {
                    let done = match tokio::time::timeout(RELOAD_WAIT, rx).await {
                        Ok(Ok(done)) => done,
                        _ => json!({"error": "the reload did not finish in time"}),
                    };
                    answer(write, done).await;
                }));
            }
            Err(e) => {
                tracing::warn!(error = %e, "control socket: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    if let Ok(addr) = listener.local_addr() {
        if let Some(path) = addr.as_pathname() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Writes one JSON line; a client that does not read is not waited for.
async fn answer(mut write: tokio::net::unix::OwnedWriteHalf, value: serde_json::Value) {
    use tokio::io::AsyncWriteExt as _;
    let mut line = value.to_string();
    line.push('\n');
    let _ = tokio::time::timeout(Duration::from_secs(1), write.write_all(line.as_bytes())).await;
}

/// Asks a running bridge for its live status over the control socket; `None` when none
/// answers within a second.
pub fn ask_control(state_dir: &std::path::Path) -> Option<serde_json::Value> {
    ask(state_dir, "status", Duration::from_secs(1))
}

/// Asks a running bridge to reload (the config, profiles and credentials, as SIGHUP does)
/// and waits for what it did: `{"agents": [...], "credentialsChanged": [...]}`, or
/// `{"error": ...}`. `None` when no bridge answers on the control socket.
pub fn reload_over_control(state_dir: &std::path::Path) -> Option<serde_json::Value> {
    ask(state_dir, "reload", RELOAD_WAIT + Duration::from_secs(5))
}

fn ask(state_dir: &std::path::Path, request: &str, wait: Duration) -> Option<serde_json::Value> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::os::unix::net::UnixStream::connect(
        crate::paths::StateDir::new(state_dir).control_socket(),
    )
    .ok()?;
    stream.set_read_timeout(Some(wait)).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(1)))
        .ok()?;
    stream.write_all(format!("{request}\n").as_bytes()).ok()?;
    let mut text = String::new();
    stream.take(1 << 20).read_to_string(&mut text).ok()?;
    serde_json::from_str(text.trim()).ok()
}
