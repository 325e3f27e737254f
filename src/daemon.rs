//! Wires the layers for `aamp-bridge start`: per agent, a mailbox intake loop feeds a
//! dispatcher, whose tasks run agents and answer through the agent's sender. One root
//! cancellation token and one task tracker own everything that runs.

use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::LoadedConfig;
use crate::dispatch::{AgentSpec, Dispatcher, Outbox, SenderPolicy};
use crate::error::{Classify, ErrorClass};
use crate::events::Events;
use crate::mailbox::link::Reach;
use crate::mailbox::push::{self, PushTarget};
use crate::mailbox::{jitter, Attachment, Cursor, Mailbox, MailboxError, Position, Sender};
use crate::protocol::AampMessage;
use crate::runner::Profile;
use std::sync::atomic::{AtomicBool, Ordering};

/// How far back to look when the server has lost our change cursor.
const BACKSCAN: usize = 100;
/// How long running tasks get to answer after a stop is requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub json: bool,
    /// Only these agents (all when empty).
    pub agents: Vec<String>,
}

impl Outbox for Sender {
    async fn send(&self, msg: &AampMessage) -> Result<String, MailboxError> {
        Sender::send(self, msg).await
    }

    async fn download(&self, attachment: &Attachment, max: u64) -> Result<Vec<u8>, MailboxError> {
        Sender::download(self, attachment, max).await
    }

    async fn open_stream(&self, task_id: &str, peer: &str) -> Option<String> {
        let created = match self.helper().await {
            Ok(Some(api)) => api.create_stream(task_id, peer).await,
            Ok(None) => return None,
            Err(e) => Err(e),
        };
        created.map_err(|e| tracing::warn!(error = %e, "could not open the task's stream; running without one")).ok()
    }

    async fn pump_stream(
        &self,
        stream_id: &str,
        events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> usize {
        match self.helper().await {
            Ok(Some(api)) => api.pump(stream_id, events).await,
            _ => 0,
        }
    }

    async fn thread(&self, task_id: &str) -> Vec<crate::dispatch::prompt::Earlier> {
        let events = match self.helper().await {
            Ok(Some(api)) => api.thread(task_id).await,
            Ok(None) => return Vec::new(),
            Err(e) => Err(e),
        };
        match events {
            Ok(events) => events
                .iter()
                .map(|e| crate::dispatch::prompt::Earlier {
                    intent: e["intent"].as_str().unwrap_or("message").to_string(),
                    from: e["from"].as_str().unwrap_or_default().to_string(),
                    text: ["output", "question", "bodyText", "errorMsg"]
                        .iter()
                        .find_map(|k| e[*k].as_str().filter(|t| !t.is_empty()))
                        .unwrap_or_default()
                        .to_string(),
                })
                .collect(),
            Err(e) => {
                tracing::warn!(task_id, error = %e, "could not read the parent task's thread; going on without it");
                Vec::new()
            }
        }
    }

    async fn close_stream(&self, stream_id: &str, payload: serde_json::Value) {
        if let Ok(Some(api)) = self.helper().await {
            if let Err(e) = api.close(stream_id, &payload).await {
                tracing::warn!(stream_id, error = %e, "could not close the task's stream");
            }
        }
    }
}

/// Runs until SIGINT or SIGTERM, or until `stop` is cancelled.
pub async fn run(
    config: LoadedConfig,
    opts: RunOptions,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let events = Events::new(opts.json);
    let tracker = TaskTracker::new();
    let agents = config.agents(&opts.agents)?;
    let mut names = Vec::new();
    for agent in agents {
        let mailbox_name = agent.mailbox.clone().unwrap_or_else(|| agent.name.clone());
        if let Some(registration) = config.registration(&mailbox_name) {
            let credentials = crate::mailbox::helper::register(&registration)
                .await
                .with_context(|| {
                    format!(
                        "registering mailbox {mailbox_name:?} with {}",
                        registration.aamp_url
                    )
                })?;
            crate::config::write_credentials(&registration.credentials_file, &credentials)
                .with_context(|| {
                    format!(
                        "saving the credentials to {}",
                        registration.credentials_file.display()
                    )
                })?;
            tracing::info!(mailbox = %mailbox_name, email = %credentials.email, file = %registration.credentials_file.display(), "registered a new mailbox");
            events.emit(
                "mailbox.registered",
                json!({"mailbox": mailbox_name, "email": credentials.email}),
            );
        }
        let account = config.account(&mailbox_name)?;
        let profile = Profile::find(&config.profile_ref(&agent.profile), &config.profile_dirs())
            .with_context(|| {
                format!(
                    "{}: agent {:?}: profile {:?}",
                    config.path.display(),
                    agent.name,
                    agent.profile
                )
            })?;
        let agent_dir = config.state_dir.join("agents").join(&agent.name);
        let spec = AgentSpec {
            name: agent.name.clone(),
            email: account.email.clone(),
            policy: SenderPolicy::new(&agent.allow_from),
            max_concurrent: agent.max_concurrent_tasks,
            max_queued: agent.max_queued_tasks,
            profile,
            workspace_root: agent_dir.join("tasks"),
            sessions: crate::dispatch::sessions::SessionStore::new(agent_dir.join("sessions.json")),
        };
        if spec.policy.is_empty() {
            tracing::warn!(agent = %agent.name, "allow_from is empty: every dispatch to this agent will be rejected");
        }
        let sender =
            Sender::new(&account).with_context(|| format!("agent {:?}: SMTP setup", agent.name))?;
        publish_card(&config, &agent, &sender, events).await;
        let mailbox =
            Mailbox::new(account).with_context(|| format!("agent {:?}: JMAP setup", agent.name))?;
        let dispatcher = Dispatcher::new(spec, sender, events, tracker.clone(), stop.clone());
        let cursor = Cursor::new(agent_dir.join("jmap-email-state"));
        let span = tracing::info_span!("agent", agent = %agent.name);
        tracker.spawn(
            intake(
                agent.name.clone(),
                mailbox,
                cursor,
                crate::mailbox::link::Link::new(agent_dir.join("link.json")),
                dispatcher,
                events,
                stop.clone(),
            )
            .instrument(span),
        );
        names.push(agent.name);
    }
    events.emit(
        "bridge.running",
        json!({"agents": names, "pid": std::process::id()}),
    );

    let signals = stop.clone();
    tracker.spawn(async move {
        tokio::select! {
            _ = wait_for_signal() => signals.cancel(),
            _ = signals.cancelled() => {}
        }
    });
    stop.cancelled().await;
    events.emit("bridge.stopping", json!({}));
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "some tasks did not finish within {}s of the stop",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    events.emit("bridge.stopped", json!({}));
    Ok(())
}

/// Publishes the agent's summary and card in the AAMP service's directory, when it has them.
/// A failure is reported; it does not stop the agent.
async fn publish_card(
    config: &LoadedConfig,
    agent: &crate::config::AgentConfig,
    sender: &Sender,
    events: Events,
) {
    if agent.summary.is_none() && agent.card.is_none() && agent.card_file.is_none() {
        return;
    }
    let card = match (&agent.card, &agent.card_file) {
        (Some(card), _) => Some(card.clone()),
        (None, Some(file)) => {
            let path = config
                .path
                .parent()
                .unwrap_or(std::path::Path::new("."))
                .join(file);
            match std::fs::read_to_string(&path) {
                Ok(text) => Some(text),
                Err(e) => {
                    tracing::warn!(agent = %agent.name, file = %path.display(), error = %e, "cannot read the agent's card_file");
                    None
                }
            }
        }
        (None, None) => None,
    };
    match sender.helper().await {
        Ok(Some(api)) => match api
            .directory_upsert(agent.summary.as_deref(), card.as_deref())
            .await
        {
            Ok(()) => events.emit("agent.card", json!({"agent": agent.name})),
            Err(e) => {
                tracing::warn!(agent = %agent.name, error = %e, "could not publish the agent's card")
            }
        },
        Ok(None) => {
            tracing::warn!(agent = %agent.name, "summary and card are published through the AAMP service: set aamp_url on the agent's mailbox")
        }
        Err(e) => {
            tracing::warn!(agent = %agent.name, error = %e, "could not reach the AAMP service to publish the agent's card")
        }
    }
}

async fn wait_for_signal() {
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

#[derive(Debug, thiserror::Error)]
enum IntakeError {
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
    #[error("cannot read or write the cursor file: {0}")]
    Cursor(#[from] std::io::Error),
}

impl Classify for IntakeError {
    fn class(&self) -> ErrorClass {
        match self {
            IntakeError::Mailbox(e) => e.class(),
            IntakeError::Cursor(_) => ErrorClass::Permanent,
        }
    }
}

/// Watches one mailbox and hands its AAMP mail to the dispatcher, until `stop`. Two loops
/// share the work: the poll loop reads changes (`Email/changes` from the saved cursor), on a
/// timer and whenever the push loop wakes it; the push loop keeps a JMAP WebSocket open when
/// the server offers one. With push up, the timer only reconciles (`reconcile_interval`);
/// without it, it polls (`poll_interval`).
async fn intake<O: Outbox>(
    name: String,
    mut mailbox: Mailbox,
    cursor: Cursor,
    link: crate::mailbox::link::Link,
    dispatcher: Dispatcher<O>,
    events: Events,
    stop: CancellationToken,
) {
    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (target_tx, mut target_rx) = tokio::sync::watch::channel::<Option<PushTarget>>(None);
    let push_up = AtomicBool::new(false);
    let use_push = mailbox.account.push;
    let poll_secs = mailbox.account.poll_interval.as_secs();

    let polling = async {
        let mut state: Option<Position> = None;
        let mut ready = false;
        let mut failures: u32 = 0;
        let mut auth_reported = false;
        loop {
            let poll = tokio::select! {
                result = poll_once(&mut mailbox, &cursor, &mut state, &dispatcher) => result,
                _ = stop.cancelled() => return,
            };
            let wait = match poll {
                Ok(()) => {
                    if !ready {
                        ready = true;
                        events.emit(
                            "agent.ready",
                            json!({"agent": name, "email": mailbox.email()}),
                        );
                    }
                    if failures > 0 {
                        tracing::info!("mailbox reachable again");
                    }
                    failures = 0;
                    auth_reported = false;
                    link.mailbox(Reach::Connected, None);
                    if use_push {
                        let target = mailbox.push_target();
                        target_tx.send_if_modified(|current| {
                            let changed = current.as_ref().map(|t| &t.transports)
                                != target.as_ref().map(|t| &t.transports);
                            if changed {
                                *current = target;
                            }
                            changed
                        });
                    }
                    if push_up.load(Ordering::SeqCst) {
                        mailbox.account.reconcile_interval
                    } else {
                        mailbox.account.poll_interval
                    }
                }
                Err(e) => {
                    failures += 1;
                    mailbox.disconnect();
                    let reach = if e.class() == ErrorClass::Auth {
                        Reach::AuthFailed
                    } else {
                        Reach::Unreachable
                    };
                    link.mailbox(reach, Some(e.to_string()));
                    match e.class() {
                        ErrorClass::Auth => {
                            if !auth_reported {
                                tracing::error!(error = %e, "the mail server refused the credentials of {}; fix the password in the config; retrying every 5 minutes", mailbox.email());
                                auth_reported = true;
                            }
                            Duration::from_secs(300)
                        }
                        ErrorClass::Permanent => {
                            tracing::error!(error = %e, "mailbox error; retrying in 60s");
                            Duration::from_secs(60)
                        }
                        _ => {
                            let delay = Duration::from_secs(1u64 << failures.min(6))
                                .min(Duration::from_secs(60));
                            tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "mailbox unreachable");
                            jitter(delay)
                        }
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                Some(()) = wake_rx.recv() => tracing::debug!("woken by push"),
                _ = stop.cancelled() => return,
            }
        }
    };

    let pushing = async {
        if !use_push {
            return;
        }
        let mut push_state: Option<String> = None;
        let mut failures: u32 = 0;
        // Which of the target's transports is in use; a permanent failure moves to the next.
        let mut which = 0;
        loop {
            // The poll loop publishes where to connect once it has a session.
            let target = loop {
                if let Some(target) = target_rx.borrow_and_update().clone() {
                    break target;
                }
                which = 0;
                tokio::select! {
                    changed = target_rx.changed() => if changed.is_err() { return },
                    _ = stop.cancelled() => return,
                }
            };
            let Some(transport) = target.transports.get(which).cloned() else {
                // Every transport failed for good: poll, and look again when the session changes.
                tokio::select! {
                    _ = target_rx.changed() => which = 0,
                    _ = tokio::time::sleep(Duration::from_secs(600)) => which = 0,
                    _ = stop.cancelled() => return,
                }
                continue;
            };
            let connected = || {
                push_up.store(true, Ordering::SeqCst);
                tracing::info!(%transport, "push connected");
                let kind = match transport {
                    push::Transport::WebSocket(_) => "websocket",
                    push::Transport::EventSource(_) => "eventsource",
                };
                link.push(kind);
                events.emit(
                    "mailbox.push",
                    json!({"agent": name, "connected": true, "transport": kind}),
                );
                // Catch up on whatever changed while push was down.
                let _ = wake_tx.try_send(());
            };
            let result = push::run(
                &target,
                &transport,
                &mut push_state,
                &wake_tx,
                &stop,
                connected,
            )
            .await;
            let was_up = push_up.swap(false, Ordering::SeqCst);
            if was_up {
                link.push("polling");
                events.emit("mailbox.push", json!({"agent": name, "connected": false}));
            }
            let Err(e) = result else { return };
            failures = if was_up { 1 } else { failures + 1 };
            let delay = match e.class() {
                ErrorClass::Auth => Duration::from_secs(300),
                ErrorClass::Permanent => {
                    which += 1;
                    match target.transports.get(which) {
                        Some(next) => {
                            tracing::info!(error = %e, %transport, %next, "push is not available this way; trying the next")
                        }
                        None => {
                            tracing::info!(error = %e, "push is not available; polling every {poll_secs}s")
                        }
                    }
                    Duration::ZERO
                }
                _ => {
                    let delay = jitter(
                        Duration::from_secs(1u64 << failures.min(6)).min(Duration::from_secs(60)),
                    );
                    tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "push connection lost; polling meanwhile");
                    delay
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = target_rx.changed() => which = 0,
                _ = stop.cancelled() => return,
            }
        }
    };
    tokio::join!(polling, pushing);
}

async fn poll_once<O: Outbox>(
    mailbox: &mut Mailbox,
    cursor: &Cursor,
    state: &mut Option<Position>,
    dispatcher: &Dispatcher<O>,
) -> Result<(), IntakeError> {
    if !mailbox.is_connected() {
        mailbox.connect().await?;
        tracing::info!(email = mailbox.email(), "connected to the mailbox");
    }
    let since = match state.clone() {
        Some(s) => s,
        None => match cursor.load()? {
            Some(s) => s,
            None => {
                // First start: work begins with mail that arrives from now on.
                let s = Position::at(mailbox.current_state().await?);
                cursor.save(&s)?;
                s
            }
        },
    };
    let (inbound, new_state) = mailbox.fetch_since(&since, BACKSCAN).await?;
    for message in inbound {
        dispatcher.handle(message);
    }
    if new_state != since {
        cursor.save(&new_state)?;
    }
    *state = Some(new_state);
    Ok(())
}
