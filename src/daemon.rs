//! Wires the layers for `aamp-bridge start`: the state directory's lock and journal, and per
//! agent a mailbox intake feeding a dispatcher, whose tasks run agents and whose outbox
//! answers through the agent's sender. One stop token, one abort token and two task trackers
//! own everything that runs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::LoadedConfig;
use crate::dispatch::{AgentSpec, Dispatcher, Journal, Outbox, OutboxError, Settings, OWNER_VAR};
use crate::events::Events;
use crate::fsio::StateLock;
use crate::mailbox::{intake, Attachment, Cursor, Mailbox, Sender};
use crate::protocol::RenderedMail;
use crate::runner::{self, Profile};

#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub json: bool,
    /// Only these agents (all when empty).
    pub agents: Vec<String>,
}

/// A mailbox back-end's error as dispatch sees it: its class and what it says.
impl From<crate::mailbox::MailboxError> for OutboxError {
    fn from(e: crate::mailbox::MailboxError) -> OutboxError {
        use crate::error::Classify as _;
        OutboxError::new(e.class(), e.to_string())
    }
}

/// Where one agent's answers go: its mailbox back-end. `dispatch` sees only [`Outbox`].
pub enum Outlet {
    /// AAMP: SMTP submission, Sent copies, the AAMP service's streams and threads.
    Aamp(Box<Sender>),
    /// AMP: replies on the broker.
    Amp(Box<crate::mailbox::amp::AmpOutbox>),
    /// ASMTP: reply envelopes with client ids.
    Asmtp(Box<crate::mailbox::asmtp::AsmtpOutbox>),
}

impl Outbox for Outlet {
    async fn submit(&self, mail: &RenderedMail) -> Result<(), OutboxError> {
        match self {
            Outlet::Aamp(s) => Outbox::submit(s.as_ref(), mail).await,
            Outlet::Amp(a) => Ok(a.submit(mail).await?),
            Outlet::Asmtp(a) => Ok(a.submit(mail).await?),
        }
    }

    async fn download(&self, attachment: &Attachment, max: u64) -> Result<Vec<u8>, OutboxError> {
        match self {
            Outlet::Aamp(s) => Outbox::download(s.as_ref(), attachment, max).await,
            Outlet::Amp(_) | Outlet::Asmtp(_) => Err(OutboxError::new(
                crate::error::ErrorClass::Permanent,
                "AMP and ASMTP messages carry no attachments the bridge fetches",
            )),
        }
    }

    async fn open_stream(&self, task_id: &str, peer: &str) -> Option<String> {
        match self {
            Outlet::Aamp(s) => Outbox::open_stream(s.as_ref(), task_id, peer).await,
            Outlet::Amp(_) | Outlet::Asmtp(_) => None,
        }
    }

    async fn pump_stream(
        &self,
        stream_id: &str,
        events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> usize {
        match self {
            Outlet::Aamp(s) => Outbox::pump_stream(s.as_ref(), stream_id, events).await,
            Outlet::Amp(_) | Outlet::Asmtp(_) => 0,
        }
    }

    async fn thread(&self, task_id: &str) -> Vec<crate::dispatch::prompt::Earlier> {
        match self {
            Outlet::Aamp(s) => Outbox::thread(s.as_ref(), task_id).await,
            Outlet::Amp(_) | Outlet::Asmtp(_) => Vec::new(),
        }
    }

    async fn close_stream(&self, stream_id: &str, payload: serde_json::Value) {
        if let Outlet::Aamp(s) = self {
            Outbox::close_stream(s.as_ref(), stream_id, payload).await
        }
    }
}

impl Outbox for Sender {
    async fn submit(&self, mail: &RenderedMail) -> Result<(), OutboxError> {
        Ok(Sender::submit(self, mail).await?)
    }

    async fn download(&self, attachment: &Attachment, max: u64) -> Result<Vec<u8>, OutboxError> {
        Ok(Sender::download(self, attachment, max).await?)
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

/// Runs until SIGINT or SIGTERM, or until `stop` is cancelled. The first signal (or `stop`)
/// stops taking mail and lets running tasks finish within `shutdown_grace_secs`; what has not
/// finished then is stopped and left in the journal for the next start. A second signal
/// stops the tasks at once.
/// How the bridge is told to stop, abort or reload. The binary ties them to signals
/// ([`listen_for_signals`]); a test or an embedding program drives them itself.
#[derive(Clone, Debug, Default)]
pub struct Controls {
    /// Stop taking mail, let running tasks finish (within `shutdown_grace_secs`), send what
    /// they answered, and return.
    pub stop: CancellationToken,
    /// Stop running tasks now (they run again at the next start).
    pub abort: CancellationToken,
    /// Read the config and profiles again.
    pub reload: Arc<tokio::sync::Notify>,
}

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

pub async fn run(config: LoadedConfig, opts: RunOptions, controls: Controls) -> anyhow::Result<()> {
    let stop = controls.stop.clone();
    let events = Events::new(opts.json);
    let state_dir = &config.state_dir;
    let _lock = StateLock::acquire(state_dir)?;
    let journal =
        Arc::new(Journal::open(&config.state().journal()).context("opening the task journal")?);
    let retention = Duration::from_secs(config.config.journal_retention_days * 86_400);
    match journal.prune(std::time::SystemTime::now() - retention) {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            tasks = n,
            "forgot finished tasks older than the journal's retention"
        ),
        Err(e) => tracing::warn!(error = %e, "could not prune the task journal"),
    }
    let owner_tag = state_dir
        .canonicalize()
        .unwrap_or_else(|_| state_dir.clone())
        .display()
        .to_string();
    stop_leftovers(&journal, &owner_tag);
    let settings = Settings {
        retry_for: Duration::from_secs(config.config.outbox_retry_hours * 3600),
        owner_tag,
        slots: crate::dispatch::slots::Slots::new(config.config.max_concurrent_tasks),
    };
    let grace = Duration::from_secs(config.config.shutdown_grace_secs);

    // Intake and outbox loops live on `services`, agent tasks on `tasks`: at a stop, intake
    // ends first, tasks drain, and the outbox sends what they answered before it ends.
    let services = TaskTracker::new();
    let tasks = TaskTracker::new();
    let abort = controls.abort.clone();
    let outbox_stop = CancellationToken::new();
    let agents = config.agents(&opts.agents)?;
    let mut names = Vec::new();
    let mut dispatchers = Vec::new();
    for agent in agents {
        let agent_dir = config.state().agent(&agent.name);
        let (outlet, intake) = open_backend(
            &config,
            &agent,
            &agent_dir,
            &journal,
            events,
            &services,
            &outbox_stop,
        )
        .await?;
        let dispatcher = Dispatcher::new(
            agent_spec(&config, &agent)?,
            outlet,
            journal.clone(),
            events,
            settings.clone(),
            tasks.clone(),
            abort.clone(),
        );
        dispatchers.push(dispatcher.clone());
        let span = tracing::info_span!("agent", agent = %agent.name);
        recover(&dispatcher, &agent.name, &span)?;
        services.spawn(
            dispatcher
                .clone()
                .send_outbox(outbox_stop.clone(), LAST_ROUND)
                .instrument(span.clone()),
        );
        let deliver = move |inbound| {
            dispatcher
                .deliver(inbound)
                .map_err(|e| Box::new(e) as intake::DeliverError)
        };
        let link = crate::mailbox::link::Link::new(config.state().link(&agent.name));
        let name = agent.name.clone();
        match intake {
            Intake::Aamp(mailbox) => services.spawn(
                intake::run(
                    name,
                    *mailbox,
                    Cursor::new(agent_dir.join("jmap-email-state")),
                    link,
                    deliver,
                    events,
                    stop.clone(),
                )
                .instrument(span),
            ),
            Intake::Asmtp(client) => services.spawn(
                crate::mailbox::asmtp::run_intake(
                    name,
                    client,
                    link,
                    crate::mailbox::asmtp::WatermarkFile::new(agent_dir.join("asmtp-watermark")),
                    deliver,
                    events,
                    stop.clone(),
                )
                .instrument(span),
            ),
            Intake::Amp(client, poll) => services.spawn(
                crate::mailbox::amp::run_intake(
                    name,
                    client,
                    link,
                    deliver,
                    events,
                    poll,
                    stop.clone(),
                )
                .instrument(span),
            ),
        };
        names.push(agent.name);
    }
    // The control socket `aamp-bridge status` asks while the bridge runs.
    {
        let limits: Vec<(String, usize)> = config
            .agents(&opts.agents)?
            .iter()
            .map(|a| (a.name.clone(), a.max_concurrent_tasks.max(1)))
            .collect();
        let slots = settings.slots.clone();
        let started = std::time::SystemTime::now();
        let live = move || {
            let snapshot = slots.snapshot();
            let agents: Vec<serde_json::Value> = limits
                .iter()
                .map(|(name, limit)| {
                    let (free, waiting) = snapshot
                        .iter()
                        .find(|(a, _, _)| a == name)
                        .map_or((*limit, 0), |(_, f, w)| (*f, *w));
                    json!({"agent": name, "running": limit.saturating_sub(free), "waitingForSlot": waiting, "maxConcurrent": limit})
                })
                .collect();
            json!({
                "pid": std::process::id(),
                "version": env!("CARGO_PKG_VERSION"),
                "startedAt": crate::protocol::time::format_utc_ms(started),
                "uptimeSecs": started.elapsed().map(|d| d.as_secs()).unwrap_or(0),
                "agents": agents,
            })
        };
        match control_socket(&config.state().control_socket()) {
            Ok(listener) => {
                services.spawn(serve_control(listener, live, stop.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "no control socket: `aamp-bridge status` reads the state files instead")
            }
        }
    }
    events.emit(
        "bridge.running",
        json!({"agents": names, "pid": std::process::id()}),
    );

    // Memory freed after a burst goes back to the system once no task runs.
    services.spawn(trim_when_idle(settings.slots.clone(), stop.clone()));

    // A reload: read the config and profiles again.
    let finished = CancellationToken::new();
    {
        let (path, reload, done) = (
            config.path.clone(),
            controls.reload.clone(),
            finished.clone(),
        );
        services.spawn(async move {
            loop {
                tokio::select! {
                    _ = reload.notified() => reload_config(&path, &dispatchers, events).await,
                    _ = done.cancelled() => return,
                }
            }
        });
    }
    stop.cancelled().await;
    events.emit(
        "bridge.stopping",
        json!({"graceSecs": grace.as_secs(), "running": tasks.len()}),
    );
    tasks.close();
    tokio::select! {
        _ = tasks.wait() => {}
        _ = tokio::time::sleep(grace) => tracing::warn!(
            running = tasks.len(),
            "tasks did not finish within {}s of the stop; stopping them (they run again at the next start)",
            grace.as_secs()
        ),
        _ = abort.cancelled() => {}
    }
    abort.cancel();
    if tokio::time::timeout(Duration::from_secs(15), tasks.wait())
        .await
        .is_err()
    {
        tracing::error!(running = tasks.len(), "tasks did not stop");
    }
    outbox_stop.cancel();
    finished.cancel();
    services.close();
    if tokio::time::timeout(LAST_ROUND + Duration::from_secs(5), services.wait())
        .await
        .is_err()
    {
        tracing::warn!("the mailbox loops did not end in time");
    }
    events.emit("bridge.stopped", json!({}));
    crate::events::flush(Duration::from_secs(2));
    Ok(())
}

/// How an agent's mail comes in, once its dispatcher exists.
enum Intake {
    Aamp(Box<Mailbox>),
    Asmtp(crate::mailbox::asmtp::AsmtpClient),
    Amp(crate::mailbox::amp::AmpClient, Duration),
}

/// An agent's mailbox back-end: where its answers go and how its mail comes in. For AAMP,
/// the mailbox is registered first when it has to be, and its Sent-copy worker and directory
/// card are set up.
async fn open_backend(
    config: &LoadedConfig,
    agent: &crate::config::AgentConfig,
    agent_dir: &std::path::Path,
    journal: &Journal,
    events: Events,
    services: &TaskTracker,
    outbox_stop: &CancellationToken,
) -> anyhow::Result<(Outlet, Intake)> {
    let mailbox_name = agent.mailbox_name().to_string();
    if config.is_asmtp(&mailbox_name) {
        let client = crate::mailbox::asmtp::AsmtpClient::new(config.asmtp_account(&mailbox_name)?)
            .with_context(|| format!("agent {:?}: ASMTP setup", agent.name))?;
        let outlet = Outlet::Asmtp(Box::new(crate::mailbox::asmtp::AsmtpOutbox::new(
            client.clone(),
        )));
        return Ok((outlet, Intake::Asmtp(client)));
    }
    if config.is_amp(&mailbox_name) {
        let account = config.amp_account(&mailbox_name)?;
        let poll = account.poll_interval;
        let client = crate::mailbox::amp::AmpClient::new(account)
            .with_context(|| format!("agent {:?}: AMP setup", agent.name))?;
        let outlet = Outlet::Amp(Box::new(crate::mailbox::amp::AmpOutbox::new(
            client.clone(),
        )));
        return Ok((outlet, Intake::Amp(client, poll)));
    }
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
    if account.sender_auth == crate::config::SenderAuth::None {
        tracing::warn!(agent = %agent.name, mailbox = %mailbox_name, "sender_auth = \"none\": the From header is believed as it is, so anyone who can put mail in this Inbox can act as an allowed sender");
    }
    import_sessions(journal, &agent.name, &agent_dir.join("sessions.json"));
    let mut sender =
        Sender::new(&account).with_context(|| format!("agent {:?}: SMTP setup", agent.name))?;
    // Sent copies are kept beside the outbox, never on a reply's path.
    if let Some(copies) = sender
        .sent_copies()
        .with_context(|| format!("agent {:?}: JMAP setup", agent.name))?
    {
        services.spawn(copies.run(outbox_stop.clone()));
    }
    publish_card(config, agent, &sender, events).await;
    let mailbox =
        Mailbox::new(account).with_context(|| format!("agent {:?}: JMAP setup", agent.name))?;
    Ok((
        Outlet::Aamp(Box::new(sender)),
        Intake::Aamp(Box::new(mailbox)),
    ))
}

/// Picks up what the journal holds for one agent from the bridge's last life.
fn recover(
    dispatcher: &Dispatcher<Outlet>,
    agent: &str,
    span: &tracing::Span,
) -> anyhow::Result<()> {
    let _enter = span.enter();
    let picked = dispatcher
        .recover()
        .with_context(|| format!("agent {agent:?}: reading the task journal"))?;
    if picked > 0 {
        tracing::info!(
            tasks = picked,
            "picked up unfinished tasks from the journal"
        );
    }
    Ok(())
}

/// How often an idle bridge gives freed memory back.
const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Every [`TRIM_EVERY`], when no task holds a slot, hands the heap memory the allocator keeps
/// after a burst (big mails, long outputs) back to the system, so a bridge returns to its
/// idle size instead of staying at its peak. glibc only; elsewhere the allocator decides.
async fn trim_when_idle(slots: Arc<crate::dispatch::slots::Slots>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TRIM_EVERY) => {}
            _ = stop.cancelled() => return,
        }
        if slots.busy() {
            continue;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free heap pages; it is thread-safe in glibc.
        unsafe {
            nix::libc::malloc_trim(0);
        }
    }
}

/// What dispatch needs of an agent's config: its address, policy, limits and profile. (Public
/// for the in-process tests, which run a dispatcher from a config without a daemon.)
pub fn agent_spec(
    config: &LoadedConfig,
    agent: &crate::config::AgentConfig,
) -> anyhow::Result<AgentSpec> {
    let mailbox_name = agent.mailbox_name().to_string();
    let email = config.mailbox_address(&mailbox_name)?;
    let profile = Profile::find(&config.profile_ref(&agent.profile), &config.profile_dirs())
        .with_context(|| {
            format!(
                "{}: agent {:?}: profile {:?}",
                config.path.display(),
                agent.name,
                agent.profile
            )
        })?;
    let card = match (&agent.card, &agent.card_file) {
        (Some(card), _) => Some(card.clone()),
        (None, Some(file)) => std::fs::read_to_string(
            config
                .path
                .parent()
                .unwrap_or(std::path::Path::new("."))
                .join(file),
        )
        .ok(),
        (None, None) => None,
    };
    let spec = AgentSpec {
        name: agent.name.clone(),
        email,
        policy: agent.sender_policy(),
        limits: crate::dispatch::admission::Limits {
            per_sender_per_hour: Some(agent.max_tasks_per_sender_per_hour),
            daily_budget: agent.daily_task_budget,
            turns_per_session: Some(agent.max_turns_per_session),
        },
        unknown_senders: agent.unknown_senders,
        refusals_per_hour: agent.max_refusals_per_hour,
        max_hops: agent.max_hops,
        cancel_reply: agent.cancel_reply,
        card: (agent.summary.is_some() || card.is_some()).then(|| {
            (
                agent.summary.clone().unwrap_or_else(|| agent.name.clone()),
                card.unwrap_or_default(),
            )
        }),
        max_concurrent: agent.max_concurrent_tasks,
        max_queued: agent.max_queued_tasks,
        profile,
        workspace_root: config.state().workspaces(&agent.name),
    };
    if spec.policy.is_empty() {
        tracing::warn!(agent = %agent.name, "allow_from is empty: every dispatch to this agent will be rejected");
    }
    for warning in spec.profile.warnings() {
        tracing::warn!(agent = %agent.name, "{warning}");
    }
    Ok(spec)
}

/// Reads the config and profiles again and hands each running agent its new settings. A
/// config that does not load changes nothing (and says why); agents added or removed wait
/// for a restart.
async fn reload_config(path: &std::path::Path, dispatchers: &[Dispatcher<Outlet>], events: Events) {
    tracing::info!(config = %path.display(), "SIGHUP: reloading the config and profiles");
    let config = match LoadedConfig::load(path) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("the config was not reloaded: {e}");
            events.emit("bridge.reload_failed", json!({"error": e.to_string()}));
            return;
        }
    };
    let mut reloaded = Vec::new();
    for dispatcher in dispatchers {
        let name = dispatcher.name();
        let Some(agent) = config.config.agents.iter().find(|a| a.name == name) else {
            tracing::warn!(agent = %name, "the agent is no longer in the config; it stops at the next restart");
            continue;
        };
        match agent_spec(&config, agent) {
            Ok(spec) => {
                dispatcher.reload(spec);
                if let Outlet::Aamp(sender) = dispatcher.outbox() {
                    publish_card(&config, agent, sender, events).await;
                }
                reloaded.push(name);
            }
            Err(e) => tracing::error!(agent = %name, "the agent keeps its old settings: {e:#}"),
        }
    }
    let added: Vec<&str> = config
        .config
        .agents
        .iter()
        .filter(|a| !dispatchers.iter().any(|d| d.name() == a.name))
        .map(|a| a.name.as_str())
        .collect();
    if !added.is_empty() {
        tracing::warn!(?added, "new agents start at the next restart");
    }
    events.emit("bridge.reloaded", json!({"agents": reloaded}));
}

/// How long the outbox may try to send at a stop before leaving the rest for the next start.
const LAST_ROUND: Duration = Duration::from_secs(5);

/// Stops agent processes that a crashed bridge on this state directory left behind: every
/// process carrying this bridge's tag, and the recorded process groups whose leader still
/// carries it.
fn stop_leftovers(journal: &Journal, owner_tag: &str) {
    let mut stopped = runner::process::kill_tagged(OWNER_VAR, owner_tag);
    match journal.recorded_pgids() {
        Ok(groups) => {
            for pgid in groups {
                if runner::process::kill_group_if_tagged(pgid, OWNER_VAR, owner_tag) {
                    stopped += 1;
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not read the recorded process groups"),
    }
    if stopped > 0 {
        tracing::warn!(
            processes = stopped,
            "stopped agent processes left running by the bridge's last life"
        );
    }
}

/// Session ids kept by older versions in `sessions.json` move into the journal once.
fn import_sessions(journal: &Journal, agent: &str, file: &std::path::Path) {
    let Ok(bytes) = std::fs::read(file) else {
        return;
    };
    let map: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&bytes).unwrap_or_default();
    for (key, id) in &map {
        if let Err(e) = journal.set_session(agent, key, id) {
            tracing::warn!(error = %e, "could not import the saved session ids");
            return;
        }
    }
    let _ = std::fs::rename(file, file.with_extension("json.imported"));
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

/// Binds the control socket, owner-only. A socket left by a crashed bridge is replaced (the
/// state lock, held by now, says no other bridge uses this directory).
fn control_socket(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answers each connection with one JSON line of live status, then closes it.
async fn serve_control(
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
