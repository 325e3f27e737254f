//! The daemon's end of the delegation socket: requests checked against the running tasks'
//! grants, then run by the grant's engine.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::MAX_LINE;
use crate::dispatch::delegations::Registry;
use crate::dispatch::RUN_VAR;

/// Binds the socket at `path` (a stale one from a crashed bridge replaced), owner-only.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answers connections until `stop`.
pub async fn serve(listener: UnixListener, registry: Arc<Registry>, stop: CancellationToken) {
    let tasks = tokio_util::task::TaskTracker::new();
    loop {
        let conn = tokio::select! {
            _ = stop.cancelled() => break,
            conn = listener.accept() => conn,
        };
        match conn {
            Ok((stream, _)) => {
                let registry = registry.clone();
                tasks.spawn(async move {
                    if let Err(e) = answer(stream, &registry).await {
                        tracing::debug!(error = %e, "a delegation tool connection ended");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "the delegation socket could not accept");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
    tasks.close();
}

/// The grant a request may use, or why it is refused, before any tool runs (/proc read off
/// the runtime).
async fn checked(
    registry: &Registry,
    request: &Value,
    peer_pid: Option<i32>,
) -> Result<crate::dispatch::delegations::Grant, String> {
    let token = request["token"].as_str().unwrap_or_default().to_string();
    let grant = registry
        .grant(&token)
        .ok_or("this credential is not a running task's (the task ended, or it was never one)")?;
    let tag = grant.run_tag.clone();
    let tagged = tokio::task::spawn_blocking(move || {
        peer_pid.is_some_and(|pid| crate::runner::process::has_tag(pid, RUN_VAR, &tag))
    })
    .await
    .unwrap_or(false);
    if !tagged {
        return Err("this process is not one of the task's own (its run tag is missing)".into());
    }
    Ok(grant)
}

async fn answer(stream: UnixStream, registry: &Registry) -> std::io::Result<()> {
    let cred = stream.peer_cred()?;
    if cred.uid() != nix::unistd::getuid().as_raw() {
        return Ok(());
    }
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read.take(MAX_LINE as u64));
    let mut line = String::new();
    lines.read_line(&mut line).await?;
    let reply = match serde_json::from_str::<Value>(&line) {
        Err(e) => json!({"ok": false, "error": format!("not a request: {e}")}),
        Ok(request) => match checked(registry, &request, cred.pid()).await {
            Err(why) => json!({"ok": false, "error": why}),
            Ok(grant) => {
                let tool = request["tool"].as_str().unwrap_or_default();
                let args = request["args"].clone();
                // A caller that went away (its agent stopped) stops the wait for it; what
                // was journaled stays.
                let gone = async {
                    let mut probe = [0u8; 64];
                    while matches!(lines.read(&mut probe).await, Ok(n) if n > 0) {}
                };
                tokio::select! {
                    answer = grant.engine.call(&grant, tool, args) => match answer {
                        Ok(text) => json!({"ok": true, "text": text}),
                        Err(error) => json!({"ok": false, "error": error}),
                    },
                    () = gone => return Ok(()),
                }
            }
        },
    };
    let mut out = reply.to_string();
    out.push('\n');
    write.write_all(out.as_bytes()).await?;
    write.shutdown().await
}
