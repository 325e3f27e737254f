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

/// Answers each connection with one JSON line of live status, then closes it.
pub(super) async fn serve_control(
    listener: tokio::net::UnixListener,
    live: impl Fn() -> serde_json::Value,
    stop: CancellationToken,
) {
    use tokio::io::AsyncWriteExt as _;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => break,
        };
        match accepted {
            Ok((mut stream, _)) => {
                let mut line = live().to_string();
                line.push('\n');
                // A client that does not read is not waited for.
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), stream.write_all(line.as_bytes()))
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
    use std::io::Read as _;
    let stream = std::os::unix::net::UnixStream::connect(
        crate::paths::StateDir::new(state_dir).control_socket(),
    )
    .ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut text = String::new();
    stream.take(1 << 20).read_to_string(&mut text).ok()?;
    serde_json::from_str(text.trim()).ok()
}
