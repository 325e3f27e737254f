//! Wires the layers for `aamp-bridge start`: the state directory's lock and journal, and per
//! agent a mailbox intake feeding an engine, whose tasks run agents and whose outbox
//! answers through the agent's sender. One stop token, one abort token and two task trackers
//! own everything that runs.

mod control;
mod signals;

use control::*;
pub use control::{ask_control, reload_over_control};
pub use signals::listen_for_signals;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::LoadedConfig;
use crate::dispatch::{AgentSpec, Engine, Journal, Settings, OWNER_VAR};
use crate::events::Events;
use crate::fsio::StateLock;
use crate::mailbox::{intake, Outlet};
use crate::runner::{self, Profile};

#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub json: bool,
    /// Only these agents (all when empty).
    pub agents: Vec<String>,
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

pub async fn run(config: LoadedConfig, opts: RunOptions, controls: Controls) -> anyhow::Result<()> {
    let stop = controls.stop.clone();
    let events = Events::new(opts.json);
    large_buffers_apart();
    let _lock = StateLock::acquire(&config.state_dir)?;
    let (journal, settings, upkeep) = open_state(&config)?;
    let grace = Duration::from_secs(config.config.shutdown_grace_secs);

    // Intake and outbox loops live on `services`, agent tasks on `tasks`: at a stop, intake
    // ends first, tasks drain, and the outbox sends what they answered before it ends.
    let loops = Loops {
        services: TaskTracker::new(),
        tasks: TaskTracker::new(),
        abort: controls.abort.clone(),
        outbox_stop: CancellationToken::new(),
        stop: stop.clone(),
    };
    let mut names = Vec::new();
    let mut engines = Vec::new();
    for agent in config.agents(&opts.agents)? {
        let engine = start_agent(&config, &agent, (&journal, &settings, events), &loops).await?;
        engines.push(engine);
        names.push(agent.name);
    }
    // Reloads asked over the control socket (`aamp-bridge reload`), one at a time.
    let (reload_tx, reload_rx) = tokio::sync::mpsc::channel::<ReloadRequest>(1);
    let live = live_figures(&config, &opts, &settings)?;
    serve_ui(&config, &journal, &live, &engines, &loops.services, &stop);
    serve_status(&config, &live, reload_tx, &loops);
    serve_delegation(&settings, &loops);
    events.emit(
        crate::events::Event::BridgeRunning,
        json!({"agents": names, "pid": std::process::id()}),
    );

    // Memory freed after a burst goes back to the system once no task runs.
    loops
        .services
        .spawn(trim_when_idle(settings.slots.clone(), stop.clone()));
    // Pruned while running too: at 3 tasks a second a month's retention is tens of GB.
    loops.services.spawn(crate::dispatch::journal::keep(
        journal.clone(),
        upkeep,
        JOURNAL_UPKEEP_EVERY,
        stop.clone(),
    ));
    let finished = CancellationToken::new();
    watch_reloads(
        &config, &controls, reload_rx, engines, events, &loops, &finished,
    );
    stop.cancelled().await;
    shut_down(&loops, grace, events).await;
    finished.cancel();
    loops.services.close();
    if tokio::time::timeout(LAST_ROUND + Duration::from_secs(5), loops.services.wait())
        .await
        .is_err()
    {
        tracing::warn!("the mailbox loops did not end in time");
    }
    events.emit(crate::events::Event::BridgeStopped, json!({}));
    crate::events::flush(Duration::from_secs(2));
    Ok(())
}

/// Where the bridge's loops run and what stops them.
struct Loops {
    /// Intake and outbox loops, the live view and the control socket.
    services: TaskTracker,
    /// The agents' tasks.
    tasks: TaskTracker,
    /// Stops the running tasks now (they run again at the next start).
    abort: CancellationToken,
    /// Ends the outbox workers, after the tasks.
    outbox_stop: CancellationToken,
    /// Stops taking mail.
    stop: CancellationToken,
}

/// The state directory's journal (pruned as the config says), with what agents a crashed
/// bridge left behind stopped, and the engines' settings.
fn open_state(
    config: &LoadedConfig,
) -> anyhow::Result<(Arc<Journal>, Settings, crate::dispatch::journal::Upkeep)> {
    let state_dir = &config.state_dir;
    let journal =
        Arc::new(Journal::open(&config.state().journal()).context("opening the task journal")?);
    let upkeep = journal_upkeep(config);
    match journal.upkeep(&upkeep, std::time::SystemTime::now()) {
        Ok(kept) => crate::dispatch::journal::log_kept(&kept),
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
        delegation: Some(crate::dispatch::delegations::Registry::new(
            config.state().delegate_socket(),
        )),
    };
    Ok((journal, settings, upkeep))
}

/// One agent's mailbox opened and its engine made: the journal's tasks picked up, its
/// outbox worker, its credentials' watch and its intake started.
async fn start_agent(
    config: &LoadedConfig,
    agent: &crate::config::AgentConfig,
    (journal, settings, events): (&Arc<Journal>, &Settings, Events),
    loops: &Loops,
) -> anyhow::Result<Engine<Outlet>> {
    let services = &loops.services;
    import_sessions(
        journal,
        &agent.name,
        &config.state().legacy_sessions(&agent.name),
    );
    let (outlet, intake) =
        crate::mailbox::open(config, agent, events, services, &loops.outbox_stop).await?;
    let engine = Engine::new(
        agent_spec(config, agent)?,
        outlet,
        journal.clone(),
        events,
        settings.clone(),
        loops.tasks.clone(),
        loops.abort.clone(),
    );
    let span = tracing::info_span!("agent", agent = %agent.name);
    recover(&engine, &agent.name, &span)?;
    let outbox = engine.outbox().clone();
    services.spawn(
        outbox
            .clone()
            .run(loops.outbox_stop.clone(), LAST_ROUND)
            .instrument(span.clone()),
    );
    services.spawn(
        retry_on_new_credentials(engine.clone(), loops.outbox_stop.clone())
            .instrument(span.clone()),
    );
    let deliverer = engine.clone();
    let deliver = move |inbound| {
        deliverer
            .deliver(inbound)
            .map_err(|e| Box::new(e) as intake::DeliverError)
    };
    // The mailbox answering again is the outbox's cue to try its server at once.
    let link = crate::mailbox::link::Link::new(config.state().link(&agent.name))
        .on_back(move || outbox.server_back());
    let name = agent.name.clone();
    services.spawn(
        intake
            .run(name, link, deliver, events, loops.stop.clone())
            .instrument(span),
    );
    Ok(engine)
}

/// The daemon's live figures (pid, uptime, slots per agent), as the control socket and the
/// live view answer them.
fn live_figures(
    config: &LoadedConfig,
    opts: &RunOptions,
    settings: &Settings,
) -> anyhow::Result<Arc<dyn Fn() -> serde_json::Value + Send + Sync>> {
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
    Ok(Arc::new(live))
}

/// The socket the agents' MCP servers reach the delegation tools through. A socket that cannot
/// be made is logged; the bridge runs on, and a tool call says the bridge is not reachable.
fn serve_delegation(settings: &Settings, loops: &Loops) {
    let Some(registry) = settings.delegation.clone() else {
        return;
    };
    match crate::delegate::relay::bind(&registry.socket) {
        Ok(listener) => {
            loops.services.spawn(crate::delegate::relay::serve(
                listener,
                registry,
                loops.stop.clone(),
            ));
        }
        Err(e) => tracing::warn!(error = %e, socket = %registry.socket.display(),
            "no delegation socket: agents cannot delegate"),
    }
}

/// The control socket `aamp-bridge status` asks while the bridge runs (and `reload` sends
/// its requests to). A socket that cannot be made is logged; the bridge runs on.
fn serve_status(
    config: &LoadedConfig,
    live: &Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
    reload_tx: tokio::sync::mpsc::Sender<ReloadRequest>,
    loops: &Loops,
) {
    match control_socket(&config.state().control_socket()) {
        Ok(listener) => {
            let live = live.clone();
            loops.services.spawn(serve_control(
                listener,
                move || live(),
                reload_tx,
                loops.stop.clone(),
            ));
        }
        Err(e) => {
            tracing::warn!(error = %e, "no control socket: `aamp-bridge status` reads the state files instead")
        }
    }
}

/// A reload (asked by the caller's `reload`, or over the control socket): read the config
/// and profiles again, one at a time, until `finished`.
fn watch_reloads(
    config: &LoadedConfig,
    controls: &Controls,
    mut reload_rx: tokio::sync::mpsc::Receiver<ReloadRequest>,
    engines: Vec<Engine<Outlet>>,
    events: Events,
    loops: &Loops,
    finished: &CancellationToken,
) {
    let (path, reload, done) = (
        config.path.clone(),
        controls.reload.clone(),
        finished.clone(),
    );
    loops.services.spawn(async move {
        loop {
            tokio::select! {
                _ = reload.notified() => {
                    reload_config(&path, &engines, events).await;
                }
                Some(asked) = reload_rx.recv() => {
                    let _ = asked.send(reload_config(&path, &engines, events).await);
                }
                _ = done.cancelled() => return,
            }
        }
    });
}

/// The stop: running tasks get `grace` to finish (what has not finished then is stopped and
/// left in the journal for the next start), then the outbox workers make their last round.
async fn shut_down(loops: &Loops, grace: Duration, events: Events) {
    let (tasks, abort) = (&loops.tasks, &loops.abort);
    events.emit(
        crate::events::Event::BridgeStopping,
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
    loops.outbox_stop.cancel();
}

/// The live view (`[ui]` in the config): served on `services` until `stop`, with the
/// engines as its operator. A page that cannot be served is logged; the bridge runs on.
fn serve_ui(
    config: &LoadedConfig,
    journal: &Arc<Journal>,
    live: &Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
    engines: &[Engine<Outlet>],
    services: &TaskTracker,
    stop: &CancellationToken,
) {
    let server = match crate::ui::bind(config) {
        None => return,
        Some(Ok(server)) => server,
        Some(Err(e)) => {
            tracing::error!("{e}; the bridge runs without its live view");
            return;
        }
    };
    let context = crate::ui::Context {
        config: config.clone(),
        journal: journal.clone(),
        live: live.clone(),
        operator: Arc::new(engines.to_vec()),
    };
    services.spawn(
        server
            .serve(Arc::new(context), services.clone(), stop.clone())
            .instrument(tracing::info_span!("ui")),
    );
}

/// Picks up what the journal holds for one agent from the bridge's last life.
fn recover(engine: &Engine<Outlet>, agent: &str, span: &tracing::Span) -> anyhow::Result<()> {
    let _enter = span.enter();
    let picked = engine
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

/// Whenever the mailbox's credentials change (a reload, or a read after a refusal found
/// others), or work again after a refusal (a key made active again, seen by the intake's
/// next read), what waits in the agent's outbox is sent at once. The intake hears a change
/// itself.
async fn retry_on_new_credentials(engine: Engine<Outlet>, stop: CancellationToken) {
    let secret = engine.backend().secret();
    let (mut changes, mut recoveries) = (secret.changes(), secret.recoveries());
    loop {
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                engine.outbox().retry_now();
            }
            recovered = recoveries.changed() => {
                if recovered.is_err() {
                    return;
                }
                engine.outbox().retry_now();
            }
            _ = stop.cancelled() => return,
        }
    }
}

/// Has every heap block over 128 KiB (a large mail's body, a long output, a big header)
/// mapped on its own and unmapped when freed. glibc otherwise raises that threshold to the
/// largest block freed so far: after one 2 MiB body, the next ones came from the shared heap,
/// which they left in pieces that the idle trim could not give back (the fault suite's 520
/// hostile mails kept 8 MiB over idle; with a fixed threshold, none). glibc only.
fn large_buffers_apart() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocation threshold; glibc takes its own lock for it.
    unsafe {
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
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
/// for the in-process tests, which run an engine from a config without a daemon.)
/// How often the journal is pruned and its size checked while the bridge runs.
const JOURNAL_UPKEEP_EVERY: Duration = Duration::from_secs(3600);

/// How the config says the journal is kept.
pub fn journal_upkeep(config: &LoadedConfig) -> crate::dispatch::journal::Upkeep {
    crate::dispatch::journal::Upkeep {
        retention: Duration::from_secs(config.config.journal_retention_days * 86_400),
        max_bytes: config.config.journal_max_size_mb.saturating_mul(1 << 20),
    }
}

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
        delegate_to: agent.delegate_to.clone(),
        replica: config
            .account(&mailbox_name)
            .ok()
            .and_then(|a| a.replica)
            .map(|r| crate::dispatch::ReplicaSpec {
                name: r.name,
                lease: r.lease,
            }),
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
        budgets: crate::dispatch::budget::Budgets::new(
            agent.budget.as_ref(),
            agent.sender_budget.as_ref(),
            config.config.sender_budget.as_ref(),
            &config.config.prices,
        ),
    };
    if spec.policy.is_empty() {
        tracing::warn!(agent = %agent.name, "allow_from is empty: every dispatch to this agent will be rejected");
    }
    for warning in spec.profile.warnings() {
        tracing::warn!(agent = %agent.name, "{warning}");
    }
    Ok(spec)
}

/// Reads the config, profiles and credentials again and hands each running agent its new
/// settings; a mailbox whose credentials changed is retried at once. A config that does not
/// load changes nothing but the credentials (and says why); agents added or removed wait for
/// a restart. Returns what it did: `{"agents": [reloaded], "credentialsChanged": [mailboxes]}`
/// (with `"error"` when the config did not load).
async fn reload_config(
    path: &std::path::Path,
    engines: &[Engine<Outlet>],
    events: Events,
) -> serde_json::Value {
    let mut changed = Vec::new();
    tracing::info!(config = %path.display(), "reloading the config, profiles and credentials");
    let config = match LoadedConfig::load(path) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("the config was not reloaded: {e}");
            // The credentials files are still read again, as they were named.
            for engine in engines {
                let secret = engine.backend().secret();
                match secret.reread() {
                    Ok(true) => changed.push(secret.mailbox().to_string()),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(agent = %engine.name(), "the credentials of {} were not reloaded: {e}", secret.mailbox())
                    }
                }
            }
            events.emit(
                crate::events::Event::BridgeReloadFailed,
                json!({"error": e.to_string()}),
            );
            return json!({"agents": [], "credentialsChanged": changed, "error": e.to_string()});
        }
    };
    let mut reloaded = Vec::new();
    // What did not take effect, and why: the person who asked for the reload is told, not
    // only the log.
    let mut failed = Vec::new();
    let bin_dirs = runner::scan::bin_dirs().await;
    for engine in engines {
        let name = engine.name();
        let Some(agent) = config.config.agents.iter().find(|a| a.name == name) else {
            tracing::warn!(agent = %name, "the agent is no longer in the config; it stops at the next restart");
            failed.push(json!({"agent": name, "error": "no longer in the config, but it runs until the next restart"}));
            continue;
        };
        match reload_agent(&config, engine, agent, (&bin_dirs, events), &mut changed).await {
            Ok(()) => reloaded.push(name),
            Err(e) => failed.push(json!({"agent": name, "error": e})),
        }
    }
    for added in config
        .config
        .agents
        .iter()
        .filter(|a| !engines.iter().any(|d| d.name() == a.name))
    {
        tracing::warn!(agent = %added.name, "a new agent starts at the next restart, not at a reload");
        failed.push(json!({"agent": added.name, "error": "not started: a new agent starts at the next restart (aamp-bridge service restart, or stop and start the bridge), not at a reload"}));
    }
    // Every mailbox's, not only those that changed here: the bridge may have read a new
    // file itself already (after a refusal), and credentials revoked on the server are no
    // change of the file.
    let mut mailboxes: Vec<String> = Vec::new();
    for engine in engines {
        let name = engine.backend().secret().mailbox().to_string();
        if !mailboxes.contains(&name) {
            mailboxes.push(name);
        }
    }
    let credentials = try_credentials(&config, &mailboxes).await;
    let done = json!({"agents": reloaded, "credentialsChanged": changed, "failed": failed, "credentials": credentials});
    events.emit(crate::events::Event::BridgeReloaded, done.clone());
    done
}

/// Reloads one agent: its mailbox's credentials (their mailbox noted in `changed` when they
/// changed) and its settings. What did not take effect is the error, in words for the person
/// who asked (the log says it too); an agent whose new profile cannot run keeps its old one.
async fn reload_agent(
    config: &LoadedConfig,
    engine: &Engine<Outlet>,
    agent: &crate::config::AgentConfig,
    (bin_dirs, events): (&[std::path::PathBuf], Events),
    changed: &mut Vec<String>,
) -> Result<(), String> {
    let name = &agent.name;
    // Credentials first: the mailbox is retried at once when they changed, and left alone
    // when not.
    let secret = engine.backend().secret();
    let credentials = match config.mailbox_secret(secret.mailbox()) {
        Ok(fresh) => {
            if secret.replace(&fresh) {
                changed.push(secret.mailbox().to_string());
            }
            Ok(())
        }
        Err(e) => {
            let e = format!(
                "the credentials of {} were not reloaded: {e}",
                secret.mailbox()
            );
            tracing::error!(agent = %name, "{e}");
            Err(e)
        }
    };
    let spec = agent_spec(config, agent)
        .map_err(|e| format!("not reloaded, it keeps its old settings: {e:#}"))
        .and_then(|spec| {
            let command = spec.profile.command.render(&Default::default());
            match runner::scan::find(&command, bin_dirs) {
                Some(_) => Ok(spec),
                None => Err(format!("not reloaded, it keeps its old settings: {command:?} (profile {}) is not installed", spec.profile.name)),
            }
        });
    let spec = spec.inspect_err(|e| tracing::error!(agent = %name, "{e}"))?;
    let waits = engine.reload(spec);
    engine.backend().republish(config, agent, events).await;
    if let Some(waits) = waits {
        return Err(format!("reloaded, but {waits}"));
    }
    credentials
}

/// How long trying a mailbox's new credentials may take before `reload` answers without.
const LOGIN_TRY: Duration = Duration::from_secs(10);

/// Tries each mailbox's new credentials once, all at once: `[{"mailbox", "works", "detail"}]`
/// (`works` null when they could not be tried), so `reload` says whether they work.
async fn try_credentials(config: &LoadedConfig, mailboxes: &[String]) -> Vec<serde_json::Value> {
    use crate::mailbox::LoginTried;
    let tries = mailboxes.iter().map(|name| async move {
        let tried = tokio::time::timeout(LOGIN_TRY, crate::mailbox::try_login(config, name))
            .await
            .unwrap_or_else(|_| {
                LoginTried::Untried(format!("no answer within {} s", LOGIN_TRY.as_secs()))
            });
        let (works, detail) = match tried {
            LoginTried::Works(read) => (Some(true), read),
            LoginTried::Refused(why) => (Some(false), why),
            LoginTried::Untried(why) => (None, why),
        };
        tracing::info!(mailbox = %name, ?works, %detail, "tried the reloaded credentials");
        json!({"mailbox": name, "works": works, "detail": detail})
    });
    futures::future::join_all(tries).await
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
