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
/// again, as SIGHUP does).
pub(super) async fn serve_control(
    listener: tokio::net::UnixListener,
    live: impl Fn() -> serde_json::Value,
    reloads: tokio::sync::mpsc::Sender<ReloadRequest>,
    stop: CancellationToken,
) {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => break,
        };
        match accepted {
            Ok((stream, _)) => {
                let (read, mut write) = stream.into_split();
                let mut request = String::new();
                let mut lines = tokio::io::BufReader::new(read.take(256));
                let _ = tokio::time::timeout(REQUEST_WAIT, lines.read_line(&mut request)).await;
                let answer = if request.trim() == "reload" {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let asked = reloads.try_send(tx).is_ok();
                    match tokio::time::timeout(RELOAD_WAIT, rx).await {
                        Ok(Ok(done)) if asked => done,
                        _ if !asked => json!({"error": "a reload is already under way"}),
                        _ => json!({"error": "the reload did not finish in time"}),
                    }
                } else {
                    live()
                };
                let mut line = answer.to_string();
                line.push('\n');
                // A client that does not read is not waited for.
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), write.write_all(line.as_bytes()))
                        .await;
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
