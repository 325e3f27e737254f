//! The process's signals as the daemon's `Controls`: the binary's part, not the daemon's.

use super::*;

/// Ties `controls` to the process's signals until `done`: the first SIGTERM or SIGINT stops,
/// a second aborts; SIGHUP reloads.
pub async fn listen_for_signals(controls: Controls, done: CancellationToken) {
    let hangups = {
        let (reload, done) = (controls.reload.clone(), done.clone());
        async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else {
                tracing::warn!("cannot listen for SIGHUP; config changes need a restart");
                return;
            };
            loop {
                tokio::select! {
                    Some(()) = hup.recv() => reload.notify_one(),
                    _ = done.cancelled() => return,
                }
            }
        }
    };
    let stops = async {
        tokio::select! {
            _ = wait_for_signal() => controls.stop.cancel(),
            _ = controls.stop.cancelled() => {}
            _ = done.cancelled() => return,
        }
        tokio::select! {
            _ = wait_for_signal() => {
                tracing::warn!("second signal: stopping the running tasks now");
                controls.abort.cancel();
            }
            _ = done.cancelled() => {}
        }
    };
    tokio::join!(hangups, stops);
}

pub(super) async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; stop with Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received; stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received; stopping"),
    }
}
