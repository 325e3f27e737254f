//! The command line: parses arguments and calls into the library. No logic of its own.

use std::io::Read as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::config::{default_config_path, LoadedConfig};
use crate::daemon::{self, RunOptions};
use crate::mailbox::{Mailbox, Sender};
use crate::protocol::{self, AampMessage, Body, Dispatch, Envelope, Priority, Status};

#[derive(Debug, Parser)]
#[command(
    name = "aamp-bridge",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("AAMP_BRIDGE_COMMIT"), ")"),
    about = "Hands tasks that arrive by mail (AAMP) to the coding agents on this machine, and mails back their results."
)]
pub struct Cli {
    /// The config file [default: $XDG_CONFIG_HOME/aamp-bridge/config.toml]
    #[arg(long, global = true, env = "AAMP_BRIDGE_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the bridge: watch every agent's mailbox and run the tasks that arrive.
    Start {
        /// Print runtime events as JSON lines on stdout.
        #[arg(long)]
        json: bool,
        /// Run only this agent (repeatable).
        #[arg(long = "agent", value_name = "NAME")]
        agents: Vec<String>,
    },
    /// Set up the bridge: the AAMP service, which agents answer mail, their mailboxes (tested
    /// live before anything is saved), who may send them tasks, and the background service.
    /// Run again to change the config; your other settings stay.
    Init {
        /// Take the answers from a file (JSON or TOML; `-` for stdin) instead of asking.
        #[arg(long, requires = "answers")]
        non_interactive: bool,
        #[arg(long, value_name = "FILE|-")]
        answers: Option<PathBuf>,
        /// Print what was done as JSON (with --non-interactive).
        #[arg(long)]
        json: bool,
    },
    /// Make this bridge's config from the reference bridges' (`~/.aamp/acp-bridge` and
    /// `~/.aamp/cli-bridge`): agents, credentials, sender policies, pairing codes, profiles.
    Import {
        /// The folder holding acp-bridge/ and cli-bridge/ [default: ~/.aamp]
        #[arg(long)]
        from: Option<PathBuf>,
        /// Print what would be written, and write nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
    },
    /// Profiles: how a command-line agent is run. Make one for your own agent, and test it.
    Profile {
        #[command(subcommand)]
        action: ProfileAction,
    },
    /// Send a task to an agent from one of the config's mailboxes, and wait for its result.
    Dispatch(DispatchArgs),
    /// List the agents this machine has: every profile, whether its command is installed,
    /// its version, and what is missing.
    Agents {
        #[arg(long)]
        json: bool,
        /// Also start each installed ACP agent and ask it to `initialize`.
        #[arg(long)]
        probe: bool,
    },
    /// Who may send an agent tasks: list the policy, or allow, deny or forget a sender. The
    /// rules are kept in the state directory and apply at once, also to a running bridge.
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// Make a one-time pairing code for an agent: whoever sends it back in a `pair.request`
    /// (from an app scanning the QR code, or `aamp-cli pair`) may then send the agent tasks.
    Pair {
        #[arg(long)]
        agent: String,
        /// How long the code is valid.
        #[arg(long, default_value_t = 300)]
        ttl_secs: u64,
        #[arg(long)]
        json: bool,
    },
    /// What each agent is doing: its mailbox link, queue, running tasks and unsent answers
    /// (read from the state directory; works whether the bridge runs or not).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The tasks the bridge received, newest first.
    Tasks {
        #[arg(long)]
        agent: Option<String>,
        /// received, acked, running, help_needed, answered, rejected, cancelled or expired.
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// One task's timeline, from the inbound mail to the reply.
    Task {
        #[command(subcommand)]
        action: TaskAction,
    },
    /// Check everything the bridge needs, each with OK / WARN / FAIL and the fix: the config,
    /// each mailbox (JMAP login, push, SMTP login, the AAMP service, the sender evidence its
    /// server writes) and each agent (installed, and its handshake).
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Run the bridge in the background: a systemd user service (Linux) or a launchd agent
    /// (macOS) that starts at login and after a failure.
    Service {
        #[command(subcommand)]
        action: ServiceAction,
    },
    /// Print a shell completion script: `aamp-bridge completions bash > ~/.local/share/bash-completion/completions/aamp-bridge`.
    Completions { shell: clap_complete::Shell },
    /// Read a mail file (.eml) and show it as AAMP.
    Inspect {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProfileAction {
    /// Every profile the bridge can use: yours first, then the built-in ones.
    List {
        #[arg(long)]
        json: bool,
    },
    /// A profile's file.
    Show { name: String },
    /// Make a profile for a command-line agent, find how its output is framed by running it
    /// once, and smoke-test it. Asks for what is not given when run in a terminal.
    New {
        name: String,
        /// The program (found on PATH; never run through a shell).
        #[arg(long)]
        command: Option<String>,
        /// An argument (repeatable); `{{prompt}}` is the task's text as one argument.
        #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
        args: Vec<String>,
        /// How the prompt reaches the agent.
        #[arg(long, value_enum, default_value = "stdin")]
        prompt_via: crate::wizard::profile_maker::PromptVia,
        /// The working directory [default: the task's own workspace].
        #[arg(long)]
        cwd: Option<String>,
        /// How its stdout is framed: auto (run it once to see), none, ndjson, sse, claude,
        /// codex, gemini.
        #[arg(long, default_value = "auto")]
        stream: String,
        #[arg(long, default_value_t = 1800)]
        timeout_secs: u64,
        /// An ACP agent (speaks the Agent Client Protocol on stdio) instead of a CLI.
        #[arg(long)]
        acp: bool,
        /// ACP: allow, read_only, deny or ask.
        #[arg(long)]
        permissions: Option<String>,
        #[arg(long)]
        description: Option<String>,
        /// The prompt for the detection run and the smoke test.
        #[arg(long, default_value = "Reply with the word OK.")]
        test_prompt: String,
        /// Write it without running it.
        #[arg(long)]
        no_test: bool,
        /// Replace a profile file of that name.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Run a profile once on a prompt, as the bridge would, and show what came back.
    Test {
        name: String,
        #[arg(long, default_value = "Reply with the word OK.")]
        prompt: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ServiceAction {
    /// Write the unit (or plist) for this binary and config, and enable it. Installing again
    /// changes nothing unless something changed.
    Install,
    /// Stop and remove the service (the config and the state stay).
    Uninstall,
    Start,
    Stop,
    /// Whether the installed service runs this binary with this config, and the fix if not.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The service's log (journalctl, or the launchd log file).
    Logs,
    /// Print the file `install` would write.
    Render {
        /// The macOS launchd agent, whatever this machine is.
        #[arg(long)]
        launchd: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum TaskAction {
    /// Everything the journal knows of a task: ids, state, runs and each step with its time.
    Show {
        /// The TaskId, the inbound Message-ID, or the journal's row number.
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// Show the agent's rules: from the config, and those added here or by pairing.
    List {
        #[arg(long)]
        agent: String,
        #[arg(long)]
        json: bool,
    },
    /// Allow a sender: an address, a glob (`disp-*@example.com`) or `@domain`.
    Allow {
        #[arg(long)]
        agent: String,
        sender: String,
        /// Only dispatches whose X-AAMP-Dispatch-Context has KEY=VALUE (repeatable; several
        /// values of one key are alternatives).
        #[arg(long = "context", value_name = "KEY=VALUE")]
        context: Vec<String>,
    },
    /// Refuse a sender, whatever else allows it.
    Deny {
        #[arg(long)]
        agent: String,
        sender: String,
    },
    /// Forget the rules added here (or by pairing) for a sender.
    Remove {
        #[arg(long)]
        agent: String,
        sender: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct DispatchArgs {
    /// The mailbox (a key of `[mailboxes]` in the config) to send from.
    #[arg(long)]
    pub from: String,
    /// The agent's address.
    #[arg(long)]
    pub to: String,
    #[arg(long, default_value = "Task from aamp-bridge")]
    pub title: String,
    #[arg(long)]
    pub session_key: Option<String>,
    /// Stop waiting for the result after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Send and exit without waiting for the result.
    #[arg(long)]
    pub no_wait: bool,
    /// Print the result as JSON (with --follow: one JSON line per stream event, then the
    /// result).
    #[arg(long)]
    pub json: bool,
    /// Print the task's live stream while waiting: text as it arrives, tool calls and todos
    /// as lines (needs the agent's mailbox to have an AAMP service).
    #[arg(long, conflicts_with = "no_wait")]
    pub follow: bool,
    /// The task text; `-` reads it from stdin.
    pub text: String,
}

/// The process exit code for a finished command.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let config_path = cli.config.clone().unwrap_or_else(default_config_path);
    match cli.command {
        Command::Start { json, agents } => {
            if !config_path.exists() {
                bail!(
                    "no config at {}: run `aamp-bridge init` to make one (or `aamp-bridge import` from the reference bridges), or pass --config FILE",
                    config_path.display()
                );
            }
            let config = LoadedConfig::load(&config_path)?;
            daemon::run(
                config,
                RunOptions { json, agents },
                CancellationToken::new(),
            )
            .await?;
            Ok(0)
        }
        Command::Init {
            non_interactive,
            answers,
            json,
        } => init(&config_path, non_interactive, answers, json).await,
        Command::Import {
            from,
            dry_run,
            json,
        } => import(&config_path, from, dry_run, json),
        Command::Profile { action } => profile(&config_path, action).await,
        Command::Dispatch(args) => dispatch(&LoadedConfig::load(&config_path)?, args).await,
        Command::Inspect { file, json } => inspect(&file, json),
        Command::Policy { action } => policy(&LoadedConfig::load(&config_path)?, action),
        Command::Status { json } => status(&LoadedConfig::load(&config_path)?, json),
        Command::Doctor { json } => doctor(&config_path, json).await,
        Command::Service { action } => service(&config_path, action),
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "aamp-bridge",
                &mut std::io::stdout(),
            );
            Ok(0)
        }
        Command::Tasks {
            agent,
            state,
            limit,
            json,
        } => tasks(
            &LoadedConfig::load(&config_path)?,
            agent,
            state,
            limit,
            json,
        ),
        Command::Task {
            action: TaskAction::Show { id, json },
        } => task_show(&LoadedConfig::load(&config_path)?, &id, json),
        Command::Pair {
            agent,
            ttl_secs,
            json,
        } => pair(&LoadedConfig::load(&config_path)?, &agent, ttl_secs, json),
        Command::Agents { json, probe } => agents(&config_path, json, probe).await,
    }
}

fn inspect(file: &PathBuf, json: bool) -> anyhow::Result<i32> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let view = protocol::parse_raw(&bytes)
        .with_context(|| format!("{} is not a mail (no header found)", file.display()))?;
    match AampMessage::parse(&view) {
        Ok(msg) if json => println!("{}", serde_json::to_string_pretty(&msg.to_json())?),
        Ok(msg) => {
            println!(
                "{} {} from {}",
                msg.intent(),
                msg.task_id(),
                msg.envelope.from
            );
            for (k, v) in msg.to_json().as_object().into_iter().flatten() {
                println!("  {k}: {v}");
            }
        }
        Err(reason) => {
            println!("not AAMP: {reason}");
            return Ok(1);
        }
    }
    Ok(0)
}

async fn dispatch(config: &LoadedConfig, args: DispatchArgs) -> anyhow::Result<i32> {
    let account = config.account(&args.from)?;
    let text = if args.text == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the task text from stdin")?;
        s
    } else {
        args.text.clone()
    };
    let sender = Sender::new(&account)?;
    let mut mailbox = Mailbox::new(account.clone())?;
    mailbox
        .connect()
        .await
        .with_context(|| format!("connecting to the mailbox {}", account.email))?;
    // Take the cursor before sending, so the answer cannot slip past it.
    let mut state = crate::mailbox::Position::at(mailbox.current_state().await?);
    let task_id = uuid::Uuid::new_v4().to_string();
    let mut msg = AampMessage {
        envelope: Envelope {
            version: protocol::VERSION.into(),
            task_id: task_id.clone(),
            from: account.email.clone(),
            to: vec![args.to.clone()],
            message_id: String::new(),
            subject: String::new(),
            in_reply_to: None,
            references: vec![],
            received_body: None,
        },
        body: Body::Dispatch(Dispatch {
            title: args.title.clone(),
            priority: Priority::Normal,
            session_key: args.session_key.clone(),
            // Run by an agent while it works on a task: one more hop than that task had.
            hop_count: std::env::var(crate::dispatch::HOPS_VAR)
                .ok()
                .and_then(|h| h.trim().parse::<u32>().ok())
                .map(|h| h.saturating_add(1)),
            body_text: text,
            ..Dispatch::default()
        }),
    };
    msg.envelope.subject = msg.subject();
    let message_id = sender.send(&msg).await.context("sending the dispatch")?;
    eprintln!("sent task {task_id} to {} ({message_id})", args.to);
    if args.no_wait {
        if args.json {
            println!(
                "{}",
                serde_json::json!({"taskId": task_id, "messageId": message_id})
            );
        }
        return Ok(0);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    // The stream follower, when there is one; aborted when the result is in.
    let mut following = tokio::task::JoinSet::new();
    let mut followed = false;
    loop {
        let (inbound, next) = mailbox.fetch_since(&state, 50).await?;
        state = next;
        for m in inbound
            .into_iter()
            .map(|i| i.message)
            .filter(|m| m.task_id() == task_id)
        {
            match &m.body {
                Body::StreamOpened { stream_id } if args.follow && !followed => {
                    followed = true;
                    match sender.helper().await {
                        Ok(Some(helper)) => {
                            let (stream_id, json) = (stream_id.clone(), args.json);
                            following.spawn(async move {
                                let mut printer = StreamPrinter::default();
                                let done =
                                    helper.follow(&stream_id, |e| printer.print(&e, json)).await;
                                printer.end();
                                if let Err(e) = done {
                                    eprintln!("the live stream ended: {e}");
                                }
                            });
                        }
                        Ok(None) => {
                            eprintln!("no live stream: the mailbox {} has no aamp_url", args.from)
                        }
                        Err(e) => eprintln!("no live stream: {e}"),
                    }
                }
                Body::Ack => eprintln!("acknowledged by {}", m.envelope.from),
                Body::HelpNeeded(h) => eprintln!("the agent needs help: {}", h.question),
                Body::Result(r) => {
                    // What the stream still has to say comes before the result.
                    if followed {
                        let _ = tokio::time::timeout(Duration::from_secs(5), following.join_next())
                            .await;
                        following.abort_all();
                    }
                    if args.json && args.follow {
                        println!("{}", serde_json::to_string(&m.to_json())?);
                    } else if args.json {
                        println!("{}", serde_json::to_string_pretty(&m.to_json())?);
                    } else if r.status == Status::Completed {
                        println!("{}", r.output);
                    } else {
                        eprintln!(
                            "rejected: {}",
                            r.error.as_deref().unwrap_or("no reason given")
                        );
                    }
                    return Ok(if r.status == Status::Completed { 0 } else { 1 });
                }
                _ => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("no result for task {task_id} within {}s (it may still come; the agent's mailbox is {})", args.timeout, args.to);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn agents(config_path: &std::path::Path, json: bool, probe: bool) -> anyhow::Result<i32> {
    use crate::runner::{acp, profile::ProfileKind, scan, Profile};
    // The config is optional here: without one, every profile is listed as not configured.
    let config = if config_path.exists() {
        Some(LoadedConfig::load(config_path)?)
    } else {
        None
    };
    let profile_dirs = match &config {
        Some(c) => c.profile_dirs(),
        None => vec![crate::config::default_config_dir().join("profiles")],
    };
    let (profiles, errors) = Profile::all(&profile_dirs);
    for e in &errors {
        eprintln!("warning: {e}");
    }
    let configured = config
        .as_ref()
        .map(crate::runner::scan::agent_profiles)
        .unwrap_or_default();
    let bin_dirs = scan::bin_dirs().await;
    let mut found = scan::scan(&profiles, &configured, &bin_dirs).await;
    if probe {
        let scratch = std::env::temp_dir();
        for (d, p) in found.iter_mut().zip(&profiles) {
            if d.path.is_some() && p.kind == ProfileKind::Acp {
                d.probe = Some(
                    acp::probe(p, &scratch, false)
                        .await
                        .map_err(|e| e.to_string()),
                );
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&found)?);
        return Ok(0);
    }
    println!(
        "{:<14} {:<4} {:<18} {:<10} DETAILS",
        "PROFILE", "KIND", "COMMAND", "STATUS"
    );
    for d in &found {
        let status = if d.path.is_some() {
            "installed"
        } else {
            "missing"
        };
        let mut details = Vec::new();
        if let Some(v) = &d.version {
            details.push(v.clone());
        }
        if let Some(p) = &d.path {
            details.push(p.display().to_string());
        } else if let Some(i) = &d.install {
            details.push(format!("install: {i}"));
        }
        if !d.configured.is_empty() {
            details.push(format!("used by {}", d.configured.join(", ")));
        }
        match &d.probe {
            Some(Ok(info)) => details.push(format!(
                "ACP ok: {}",
                info.agent.as_deref().unwrap_or("unnamed agent")
            )),
            Some(Err(e)) => details.push(format!("ACP probe failed: {e}")),
            None => {}
        }
        for w in &d.warnings {
            details.push(format!("warning: {w}"));
        }
        println!(
            "{:<14} {:<4} {:<18} {:<10} {}",
            d.profile,
            d.kind,
            d.command,
            status,
            details.join("; ")
        );
    }
    Ok(0)
}

fn policy(config: &LoadedConfig, action: PolicyAction) -> anyhow::Result<i32> {
    use crate::dispatch::policy::{normalize, Rule};
    let agent_name = match &action {
        PolicyAction::List { agent, .. }
        | PolicyAction::Allow { agent, .. }
        | PolicyAction::Deny { agent, .. }
        | PolicyAction::Remove { agent, .. } => agent.clone(),
    };
    let Some(agent) = config.config.agents.iter().find(|a| a.name == agent_name) else {
        bail!(
            "no agent {agent_name:?} in {}; the agents are: {}",
            config.path.display(),
            config
                .config
                .agents
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let journal = crate::dispatch::Journal::open(&config.state_dir.join("journal.sqlite3"))?;
    let check_sender = |sender: &str| {
        if sender.contains('@') {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "{sender:?} is not an address or a pattern: write a@b.com, disp-*@b.com or @b.com"
            ))
        }
    };
    match action {
        PolicyAction::List { json, .. } => {
            let from_config = agent.sender_policy();
            let (allow, deny) = journal.policy(&agent.name)?;
            let mut rows = Vec::new();
            for rule in from_config.rules() {
                rows.push(serde_json::json!({"kind": "allow", "sender": rule.sender, "context": rule.context, "source": "config"}));
            }
            for pattern in from_config.denied() {
                rows.push(
                    serde_json::json!({"kind": "deny", "sender": pattern, "source": "config"}),
                );
            }
            for (rule, source) in allow {
                rows.push(serde_json::json!({"kind": "allow", "sender": rule.sender, "context": rule.context, "source": source}));
            }
            for (pattern, source) in deny {
                rows.push(serde_json::json!({"kind": "deny", "sender": pattern, "source": source}));
            }
            if json {
                println!("{}", serde_json::Value::Array(rows));
            } else if rows.is_empty() {
                println!("agent {}: nobody may send tasks yet (aamp-bridge policy allow --agent {} ADDRESS)", agent.name, agent.name);
            } else {
                for row in rows {
                    let context = match row["context"].as_object() {
                        Some(c) if !c.is_empty() => {
                            format!(" when {}", serde_json::Value::Object(c.clone()))
                        }
                        _ => String::new(),
                    };
                    println!(
                        "{:<5} {}{context}  ({})",
                        row["kind"].as_str().unwrap_or_default(),
                        row["sender"].as_str().unwrap_or_default(),
                        row["source"].as_str().unwrap_or_default()
                    );
                }
            }
        }
        PolicyAction::Allow {
            sender, context, ..
        } => {
            check_sender(&sender)?;
            let mut rule = Rule::sender(&sender);
            for pair in context {
                let (k, v) = pair
                    .split_once('=')
                    .with_context(|| format!("--context {pair:?}: write KEY=VALUE"))?;
                rule.context
                    .entry(k.trim().to_string())
                    .or_default()
                    .push(v.trim().to_string());
            }
            journal.add_policy(&agent.name, false, &rule, "cli")?;
            println!(
                "agent {}: {} may send tasks",
                agent.name,
                normalize(&sender)
            );
        }
        PolicyAction::Deny { sender, .. } => {
            check_sender(&sender)?;
            journal.add_policy(&agent.name, true, &Rule::sender(&sender), "cli")?;
            println!("agent {}: {} is refused", agent.name, normalize(&sender));
        }
        PolicyAction::Remove { sender, .. } => {
            let n = journal.remove_policy(&agent.name, &sender)?;
            if n == 0 {
                println!(
                    "agent {}: no rule for {} was added here (rules in the config are changed there)",
                    agent.name,
                    normalize(&sender)
                );
                return Ok(1);
            }
            println!(
                "agent {}: forgot {n} rule(s) for {}",
                agent.name,
                normalize(&sender)
            );
        }
    }
    Ok(0)
}

fn pair(config: &LoadedConfig, agent_name: &str, ttl_secs: u64, json: bool) -> anyhow::Result<i32> {
    let Some(agent) = config.config.agents.iter().find(|a| a.name == agent_name) else {
        bail!("no agent {agent_name:?} in {}", config.path.display());
    };
    let mailbox = agent.mailbox.clone().unwrap_or_else(|| agent.name.clone());
    let email = config.mailbox_address(&mailbox)?;
    let journal = crate::dispatch::Journal::open(&config.state_dir.join("journal.sqlite3"))?;
    let code = crate::dispatch::new_pair_code();
    let expires = journal.add_pair_code(&agent.name, &code, Duration::from_secs(ttl_secs))?;
    let url = format!(
        "aamp://connect?mailbox={}&pair_code={}",
        protocol::codec::encode_uri_component(&email),
        code
    );
    let expires_at = protocol::time::format_utc(expires);
    if json {
        println!(
            "{}",
            serde_json::json!({"agent": agent.name, "mailbox": email, "code": code, "url": url, "expiresAt": expires_at})
        );
        return Ok(0);
    }
    let qr = qrcode::QrCode::new(url.as_bytes())
        .map(|q| {
            q.render::<qrcode::render::unicode::Dense1x2>()
                .quiet_zone(true)
                .build()
        })
        .unwrap_or_default();
    println!("{qr}");
    println!("Pair with agent {} ({email}):", agent.name);
    println!("  {url}");
    println!("  code {code}, valid until {expires_at} (once)");
    println!("The bridge must be running to answer the pair request.");
    Ok(0)
}

fn open_journal(config: &LoadedConfig) -> anyhow::Result<crate::dispatch::Journal> {
    let path = config.state_dir.join("journal.sqlite3");
    if !path.exists() {
        bail!(
            "no task journal at {} yet: the bridge has not run with this state directory (aamp-bridge start)",
            path.display()
        );
    }
    Ok(crate::dispatch::Journal::open(&path)?)
}

fn ms_time(ms: i64) -> String {
    protocol::time::format_utc_ms(std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

fn tasks(
    config: &LoadedConfig,
    agent: Option<String>,
    state: Option<String>,
    limit: usize,
    json: bool,
) -> anyhow::Result<i32> {
    use crate::dispatch::TaskState;
    let state = match state {
        Some(s) => Some(TaskState::parse(&s).with_context(|| {
            format!(
                "--state {s:?}: one of {}",
                TaskState::ALL.map(TaskState::as_str).join(", ")
            )
        })?),
        None => None,
    };
    let rows = open_journal(config)?.tasks(agent.as_deref(), state, limit)?;
    if json {
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(0);
    }
    if rows.is_empty() {
        println!("no tasks");
    }
    for t in rows {
        println!(
            "{:>5}  {}  {:<10} {:<11} {}  from {}{}",
            t.id,
            ms_time(t.received_at_ms),
            t.agent,
            t.state,
            t.task_id,
            t.sender,
            t.reason
                .map(|r| format!("  ({})", r.chars().take(80).collect::<String>()))
                .unwrap_or_default()
        );
    }
    Ok(0)
}

fn task_show(config: &LoadedConfig, id: &str, json: bool) -> anyhow::Result<i32> {
    let journal = open_journal(config)?;
    let found = journal.find_tasks(id)?;
    if found.is_empty() {
        eprintln!(
            "no task {id:?} in {} (aamp-bridge tasks lists them)",
            journal.path().display()
        );
        return Ok(1);
    }
    let mut shown = Vec::new();
    for task in found {
        let steps = journal.timeline(task.id)?;
        shown.push(serde_json::json!({"task": task, "timeline": steps}));
    }
    if json {
        println!("{}", serde_json::Value::Array(shown));
        return Ok(0);
    }
    for item in shown {
        let t = &item["task"];
        println!(
            "task {} (journal row {})",
            t["taskId"].as_str().unwrap_or_default(),
            t["id"]
        );
        println!("  agent       {}", t["agent"].as_str().unwrap_or_default());
        println!("  from        {}", t["sender"].as_str().unwrap_or_default());
        println!(
            "  message id  {}",
            t["messageId"].as_str().unwrap_or_default()
        );
        println!(
            "  state       {} after {} run(s)",
            t["state"].as_str().unwrap_or_default(),
            t["runs"]
        );
        if let Some(reason) = t["reason"].as_str() {
            println!("  reason      {reason}");
        }
        let start = item["timeline"][0]["atMs"].as_i64().unwrap_or(0);
        for step in item["timeline"].as_array().into_iter().flatten() {
            let at = step["atMs"].as_i64().unwrap_or(0);
            println!(
                "  {}  +{:>7} ms  {}{}",
                ms_time(at),
                at - start,
                step["what"].as_str().unwrap_or_default(),
                step["detail"]
                    .as_str()
                    .map(|d| format!(": {}", d.replace('\n', "\n        ")))
                    .unwrap_or_default()
            );
        }
    }
    Ok(0)
}

fn status(config: &LoadedConfig, json: bool) -> anyhow::Result<i32> {
    let running = crate::fsio::StateLock::holder(&config.state_dir);
    // Live figures from the running bridge, when it answers on its control socket.
    let live = running
        .as_ref()
        .and_then(|_| daemon::ask_control(&config.state_dir));
    let journal_path = config.state_dir.join("journal.sqlite3");
    let journal = journal_path
        .exists()
        .then(|| crate::dispatch::Journal::open(&journal_path))
        .transpose()?;
    let counts = match &journal {
        Some(j) => j.counts()?,
        None => Vec::new(),
    };
    let now = std::time::SystemTime::now();
    let mut agents = Vec::new();
    for agent in &config.config.agents {
        let mailbox = agent.mailbox.clone().unwrap_or_else(|| agent.name.clone());
        let email = config.mailbox_address(&mailbox).unwrap_or_default();
        let link: serde_json::Value = std::fs::read(
            config
                .state_dir
                .join("agents")
                .join(&agent.name)
                .join("link.json"),
        )
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
        let count = |state: &str| {
            counts
                .iter()
                .find(|(a, s, _)| *a == agent.name && s == state)
                .map_or(0, |(_, _, n)| *n)
        };
        let running_tasks = match &journal {
            Some(j) => j
                .tasks(Some(&agent.name), Some(crate::dispatch::TaskState::Running), 100)?
                .into_iter()
                .chain(j.tasks(Some(&agent.name), Some(crate::dispatch::TaskState::HelpNeeded), 100)?)
                .map(|t| {
                    let age = now
                        .duration_since(std::time::UNIX_EPOCH + Duration::from_millis(t.updated_at_ms.max(0) as u64))
                        .unwrap_or_default();
                    serde_json::json!({"taskId": t.task_id, "state": t.state, "from": t.sender, "ageSecs": age.as_secs()})
                })
                .collect::<Vec<_>>(),
            None => Vec::new(),
        };
        let slots = live.as_ref().and_then(|l| {
            l["agents"]
                .as_array()?
                .iter()
                .find(|a| a["agent"] == agent.name.as_str())
                .cloned()
        });
        agents.push(serde_json::json!({
            "agent": agent.name, "mailbox": email, "link": link,
            "queued": count("received") + count("acked"), "running": running_tasks,
            "unsent": count("unsent"), "slots": slots,
        }));
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"running": running.is_some(), "pid": running, "stateDir": config.state_dir,
                "source": if live.is_some() { "daemon" } else { "state files" },
                "daemon": live, "agents": agents})
        );
        return Ok(0);
    }
    match &running {
        Some(pid) => println!(
            "aamp-bridge is running (pid {pid}{}), state in {}",
            live.as_ref()
                .map(|l| format!(
                    ", up {} s, version {}",
                    l["uptimeSecs"],
                    l["version"].as_str().unwrap_or("?")
                ))
                .unwrap_or_default(),
            config.state_dir.display()
        ),
        None => println!(
            "aamp-bridge is not running (state in {}); what it last knew:",
            config.state_dir.display()
        ),
    }
    for a in &agents {
        let link = &a["link"];
        let reach = link["mailbox"].as_str().unwrap_or("never connected");
        println!(
            "{}  <{}>  mailbox {reach} since {}, {}",
            a["agent"].as_str().unwrap_or_default(),
            a["mailbox"].as_str().unwrap_or_default(),
            link["since"].as_str().unwrap_or("-"),
            match link["push"].as_str() {
                Some("polling") | None => "polling".to_string(),
                Some(p) => format!("push over {p}"),
            }
        );
        if let Some(error) = link["lastError"].as_str() {
            println!("    last error: {error}");
        }
        println!(
            "    {} queued, {} running, {} answers waiting to be sent",
            a["queued"],
            a["running"].as_array().map_or(0, Vec::len),
            a["unsent"]
        );
        for t in a["running"].as_array().into_iter().flatten() {
            println!(
                "    - {} ({}, {} s, from {})",
                t["taskId"].as_str().unwrap_or_default(),
                t["state"].as_str().unwrap_or_default(),
                t["ageSecs"],
                t["from"].as_str().unwrap_or_default()
            );
        }
    }
    Ok(0)
}

/// One line of `doctor`.
#[derive(serde::Serialize)]
struct Check {
    check: String,
    status: &'static str,
    detail: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    fix: String,
}

fn check(
    check: impl Into<String>,
    status: &'static str,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Check {
    Check {
        check: check.into(),
        status,
        detail: detail.into(),
        fix: fix.into(),
    }
}

async fn doctor(config_path: &std::path::Path, json: bool) -> anyhow::Result<i32> {
    use crate::error::{Classify, ErrorClass};
    use crate::runner::{acp, profile::ProfileKind, scan, Profile};
    use crate::wizard::Progress as _;
    let spinner = crate::wizard::prompt::Spinner::new();
    let mut checks = Vec::new();
    let config = match LoadedConfig::load(config_path) {
        Ok(c) => {
            checks.push(check(
                "config",
                "ok",
                format!("{} loads", c.path.display()),
                "",
            ));
            Some(c)
        }
        Err(e) => {
            checks.push(check("config", "fail", e.problem.clone(), e.fix.clone()));
            None
        }
    };
    if let Some(config) = &config {
        match crate::fsio::StateLock::holder(&config.state_dir) {
            Some(pid) => checks.push(check("bridge", "ok", format!("running (pid {pid})"), "")),
            None => checks.push(check(
                "bridge",
                "warn",
                "not running",
                "aamp-bridge start, or install it as a service",
            )),
        }
        let mut mailboxes: Vec<String> = config
            .config
            .agents
            .iter()
            .map(|a| a.mailbox.clone().unwrap_or_else(|| a.name.clone()))
            .collect();
        mailboxes.dedup();
        for name in mailboxes {
            spinner.step(&format!("checking mailbox {name}"));
            let what = |part: &str| format!("mailbox {name}: {part}");
            if let Some(probe) = crate::mailbox::probe_other_kind(config, &name).await {
                match probe {
                    Err(e) => checks.push(check(
                        what("config"),
                        "fail",
                        e.problem.clone(),
                        e.fix.clone(),
                    )),
                    Ok(probe) => match probe.result {
                        Ok(read) => checks.push(check(what(probe.system), "ok", read, "")),
                        Err(e) => checks.push(check(
                            what(probe.system),
                            "fail",
                            e.to_string(),
                            match e.class() {
                                ErrorClass::Auth => probe.auth_fix,
                                _ => probe.other_fix,
                            },
                        )),
                    },
                }
                continue;
            }
            let account = match config.account(&name) {
                Ok(a) => a,
                Err(e) => {
                    checks.push(check(
                        what("config"),
                        "fail",
                        e.problem.clone(),
                        e.fix.clone(),
                    ));
                    continue;
                }
            };
            let fix_of = |e: &crate::mailbox::MailboxError, auth: &str, other: &str| -> String {
                match e.class() {
                    ErrorClass::Auth => auth.to_string(),
                    _ => other.to_string(),
                }
            };
            let mut mailbox = crate::mailbox::Mailbox::new(account.clone())?;
            match mailbox.connect().await {
                Ok(()) => {
                    checks.push(check(
                        what("JMAP"),
                        "ok",
                        format!("logged in as {} at {}", account.login, account.jmap_url),
                        "",
                    ));
                    let cleartext: Vec<&url::Url> = std::iter::once(&account.jmap_url)
                        .chain(account.aamp_url.as_ref())
                        .filter(|u| {
                            u.scheme() == "http"
                                && !u.host_str().is_some_and(crate::config::is_loopback)
                        })
                        .collect();
                    if let Some(url) = cleartext.first() {
                        checks.push(check(
                            what("transport"),
                            "warn",
                            format!("{url} is plain http: the password crosses the network unencrypted (insecure_http = true)"),
                            "use https for jmap_url and aamp_url, and drop insecure_http",
                        ));
                    }
                    match (account.push, mailbox.push_target()) {
                        (false, _) => checks.push(check(what("push"), "warn", format!("push is off in the config: polling every {} s", account.poll_interval.as_secs()), "set push = true unless the server's push is broken")),
                        (true, Some(target)) => checks.push(check(what("push"), "ok", format!("offered: {}", target.transports.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")), "")),
                        (true, None) => checks.push(check(what("push"), "warn", format!("the server offers no JMAP push: polling every {} s", account.poll_interval.as_secs()), "lower poll_interval_secs for quicker answers, or enable WebSocket/EventSource push on the server")),
                    }
                    match mailbox.newest_headers().await {
                        Ok(Some(headers)) => {
                            let ev = crate::mailbox::auth::evidence(&headers);
                            let mut found = Vec::new();
                            if ev.authenticated_submission {
                                found.push("authenticated submission".to_string());
                            }
                            for id in &ev.authserv_ids {
                                found.push(format!("Authentication-Results from {id}"));
                            }
                            let mode = account.sender_auth;
                            if mode == crate::config::SenderAuth::None {
                                checks.push(check(
                                    what("sender evidence"),
                                    "warn",
                                    "sender_auth = \"none\": any From is believed",
                                    "set sender_auth = \"auto\" if the server writes evidence",
                                ));
                            } else if let Some(problem) = &ev.problem {
                                checks.push(check(
                                    what("sender evidence"),
                                    "warn",
                                    format!("the newest Inbox mail is not believed whoever sent it: {problem}"),
                                    "mail whose top Received fields the bridge cannot read is ignored; if the server writes them that way, report the field",
                                ));
                            } else if ev.login_not_recorded && ev.authserv_ids.is_empty() {
                                checks.push(check(what("sender evidence"), "warn", "the server records authenticated submissions (ESMTPA) but not the login, so no From can be checked and mail like it is ignored", "Postfix: smtpd_sasl_authenticated_header = yes on the submission service; or OpenDKIM/OpenDMARC and authserv_id"));
                            } else if found.is_empty() {
                                checks.push(check(what("sender evidence"), "warn", "the newest Inbox mail carries no evidence this bridge can check, so mail like it is ignored", "Postfix: smtpd_sasl_authenticated_header = yes on the submission service; or OpenDKIM/OpenDMARC and authserv_id; or sender_auth = \"none\" (not advised)"));
                            } else {
                                checks.push(check(
                                    what("sender evidence"),
                                    "ok",
                                    format!("the server writes: {}", found.join(", ")),
                                    "",
                                ));
                            }
                        }
                        Ok(None) => checks.push(check(
                            what("sender evidence"),
                            "warn",
                            "no mail in the Inbox yet to look at",
                            "run doctor again after the first dispatch",
                        )),
                        Err(e) => {
                            checks.push(check(what("sender evidence"), "warn", e.to_string(), ""))
                        }
                    }
                }
                Err(e) => {
                    let detail = e.to_string();
                    let fix = if detail.contains("certificate") {
                        "the server's TLS certificate is not trusted: give it one from a trusted CA, or set insecure_tls = true on this mailbox (only for a host you control)".to_string()
                    } else {
                        fix_of(
                            &e,
                            "the server refused the login: fix the password (password_file) or login",
                            "check jmap_url and that the server runs and is reachable from here",
                        )
                    };
                    checks.push(check(what("JMAP"), "fail", detail, fix));
                }
            }
            match crate::mailbox::Sender::new(&account) {
                Ok(sender) => match sender.check_smtp().await {
                    Ok(()) => checks.push(check(
                        what("SMTP"),
                        "ok",
                        format!(
                            "EHLO and login at {}:{} ({:?})",
                            account.smtp_host, account.smtp_port, account.smtp_security
                        ),
                        "",
                    )),
                    Err(e) => {
                        let fix = fix_of(&e, "the server refused the login: fix the password (password_file) or login", "check smtp_host, smtp_port and smtp_security, and that the server runs");
                        checks.push(check(what("SMTP"), "fail", e.to_string(), fix));
                    }
                },
                Err(e) => checks.push(check(
                    what("SMTP"),
                    "fail",
                    e.to_string(),
                    "check smtp_security and the host name",
                )),
            }
            if let Some(base) = &account.aamp_url {
                match crate::mailbox::helper::HelperApi::discover(base, &account).await {
                    Ok(_) => checks.push(check(
                        what("AAMP service"),
                        "ok",
                        format!("{base} answers /.well-known/aamp"),
                        "",
                    )),
                    Err(e) => checks.push(check(
                        what("AAMP service"),
                        "warn",
                        e.to_string(),
                        "check aamp_url; without the service tasks run without live streams",
                    )),
                }
            }
        }
        let dirs = config.profile_dirs();
        let bin_dirs = scan::bin_dirs().await;
        for agent in &config.config.agents {
            spinner.step(&format!("checking agent {}", agent.name));
            let what = format!("agent {}", agent.name);
            let profile = match Profile::find(&config.profile_ref(&agent.profile), &dirs) {
                Ok(p) => p,
                Err(e) => {
                    checks.push(check(
                        what,
                        "fail",
                        e.to_string(),
                        "fix the agent's profile in the config (aamp-bridge agents lists them)",
                    ));
                    continue;
                }
            };
            let command = profile.command.render(&Default::default());
            let Some(path) = scan::find(&command, &bin_dirs) else {
                checks.push(check(
                    what,
                    "fail",
                    format!("{command:?} (profile {}) is not installed", profile.name),
                    profile
                        .install
                        .clone()
                        .unwrap_or_else(|| format!("install {command}, or pick another profile")),
                ));
                continue;
            };
            if profile.kind == ProfileKind::Acp {
                match acp::probe(&profile, &std::env::temp_dir(), false).await {
                    Ok(info) => checks.push(check(what, "ok", format!("{} answers ACP initialize ({info:?})", path.display()).chars().take(300).collect::<String>(), "")),
                    Err(e) => checks.push(check(what, "fail", format!("{}: {e}", path.display()), "run the agent by hand to see why; `aamp-bridge agents --probe` tries it too")),
                }
            } else {
                let version = scan::version(&path)
                    .await
                    .unwrap_or_else(|| "no --version answer".into());
                checks.push(check(
                    what,
                    "ok",
                    format!("{} ({version})", path.display()),
                    "",
                ));
            }
        }
    }
    let failed = checks.iter().any(|c| c.status == "fail");
    spinner.clear();
    if json {
        println!("{}", serde_json::to_string(&checks)?);
    } else {
        for c in &checks {
            println!("{:<4}  {}: {}", c.status.to_uppercase(), c.check, c.detail);
            if !c.fix.is_empty() {
                println!("      fix: {}", c.fix);
            }
        }
    }
    Ok(if failed { 1 } else { 0 })
}

fn service(config_path: &std::path::Path, action: ServiceAction) -> anyhow::Result<i32> {
    use crate::service::{Kind, Service};
    // The service runs `start` with this config: it must load.
    let config = LoadedConfig::load(config_path)?;
    let launchd = matches!(action, ServiceAction::Render { launchd: true });
    let svc = Service::for_this_machine(&config.path, launchd)?;
    match action {
        ServiceAction::Render { .. } => print!("{}", svc.render()),
        ServiceAction::Install => {
            let changed = svc.install()?;
            if changed {
                println!(
                    "installed {} (runs {} --config {})",
                    svc.file.display(),
                    svc.exe.display(),
                    svc.config.display()
                );
            } else {
                println!("already installed: {}", svc.file.display());
            }
            if svc.kind == Kind::Systemd {
                println!("start it with `aamp-bridge service start`; to keep it running while you are logged out: `loginctl enable-linger $USER`");
            } else {
                println!("start it with `aamp-bridge service start`");
            }
        }
        ServiceAction::Uninstall => {
            if svc.uninstall()? {
                println!(
                    "removed {} (the config and the state directory stay)",
                    svc.file.display()
                );
            } else {
                println!("no service was installed");
            }
        }
        ServiceAction::Start => svc.start()?,
        ServiceAction::Stop => svc.stop()?,
        ServiceAction::Status { json } => {
            let problems = svc.problems();
            if json {
                let list: Vec<_> = problems
                    .iter()
                    .map(|(p, f)| serde_json::json!({"problem": p, "fix": f}))
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"file": svc.file, "ok": problems.is_empty(), "problems": list})
                );
            } else if problems.is_empty() {
                println!(
                    "{} runs this binary with {}",
                    svc.file.display(),
                    svc.config.display()
                );
                if svc.kind == Kind::Systemd {
                    let _ = std::process::Command::new("systemctl")
                        .args(["--user", "--no-pager", "status", "aamp-bridge.service"])
                        .status();
                }
            } else {
                for (problem, fix) in &problems {
                    println!("{problem}\n  fix: {fix}");
                }
            }
            return Ok(if problems.is_empty() { 0 } else { 1 });
        }
        ServiceAction::Logs => {
            let status = match svc.kind {
                Kind::Systemd => std::process::Command::new("journalctl")
                    .args([
                        "--user",
                        "-u",
                        "aamp-bridge.service",
                        "-n",
                        "200",
                        "--no-pager",
                    ])
                    .status(),
                Kind::Launchd => std::process::Command::new("tail")
                    .args(["-n", "200"])
                    .arg(
                        std::path::Path::new(&std::env::var("HOME").unwrap_or_default())
                            .join("Library/Logs/aamp-bridge/aamp-bridge.log"),
                    )
                    .status(),
            };
            return Ok(status.map(|s| s.code().unwrap_or(1)).unwrap_or(1));
        }
    }
    Ok(0)
}

async fn init(
    config_path: &std::path::Path,
    non_interactive: bool,
    answers: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<i32> {
    use crate::wizard::{self, prompt};
    let answers = match (non_interactive, answers) {
        (true, Some(file)) => {
            let text = if file.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read the answers file {}", file.display()))?
            };
            wizard::Answers::parse(&text)?
        }
        (false, Some(_)) => bail!("--answers goes with --non-interactive"),
        _ => match prompt::ask(config_path).await {
            Ok(Some(a)) => a,
            Ok(None) => {
                println!("Nothing was written.");
                return Ok(1);
            }
            Err(e) if e.is::<prompt::Cancelled>() => {
                println!("{e}");
                return Ok(130);
            }
            Err(e) => return Err(e),
        },
    };
    let spinner = prompt::Spinner::new();
    let applied = wizard::apply(&answers, config_path, &spinner).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&applied)?);
        return Ok(0);
    }
    wizard::print_applied(&applied);
    if !non_interactive {
        if let Some(done) = prompt::offer_service(config_path)? {
            println!("service: {done}");
        }
        println!(
            "Check everything with `aamp-bridge doctor`; see each task with `aamp-bridge tasks`."
        );
    }
    Ok(0)
}

fn import(
    config_path: &std::path::Path,
    from: Option<PathBuf>,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<i32> {
    use crate::wizard::{self, import};
    let from = from.unwrap_or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(".aamp")
    });
    let existing = wizard::existing(config_path)?.map(|c| c.config);
    let plan = import::plan(&from, config_path, existing)?;
    let text = crate::config::render(plan.config.as_ref().expect("a plan has a config"));
    if !dry_run {
        import::write(&plan, config_path)?;
    }
    if json {
        let files: Vec<serde_json::Value> = plan
            .files
            .iter()
            .map(|(p, _, mode)| serde_json::json!({"path": p, "mode": format!("{mode:o}")}))
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "config": config_path, "written": !dry_run, "sources": plan.sources,
                "files": files, "pairCodes": plan.pair_codes.iter().map(|(a, _, _)| a).collect::<Vec<_>>(),
                "notes": plan.notes, "text": text,
            })
        );
        return Ok(0);
    }
    for source in &plan.sources {
        println!("read {}", source.display());
    }
    if dry_run {
        println!("\nwould write {}:\n", config_path.display());
        print!("{text}");
        for (path, bytes, mode) in &plan.files {
            println!(
                "\nwould write {} (mode {mode:o}, {} bytes)",
                path.display(),
                bytes.len()
            );
        }
    } else {
        println!("wrote {}", config_path.display());
        for (path, _, mode) in &plan.files {
            println!("wrote {} (mode {mode:o})", path.display());
        }
    }
    for (agent, _, left) in &plan.pair_codes {
        println!(
            "pairing code of {agent} carried over (valid {} more minutes)",
            left.as_secs() / 60
        );
    }
    for note in &plan.notes {
        println!("note: {note}");
    }
    if !dry_run {
        println!("next: `aamp-bridge doctor`, then `aamp-bridge start`; stop the old bridges first, or both answer the same mail");
    }
    Ok(0)
}

async fn profile(config_path: &std::path::Path, action: ProfileAction) -> anyhow::Result<i32> {
    use crate::runner::Profile;
    use crate::wizard::profile_maker as maker;
    let dirs = match crate::wizard::existing(config_path)? {
        Some(c) => c.profile_dirs(),
        None => vec![crate::config::default_config_dir().join("profiles")],
    };
    match action {
        ProfileAction::List { json } => {
            let (profiles, errors) = Profile::all(&dirs);
            for e in &errors {
                eprintln!("warning: {e}");
            }
            if json {
                let list: Vec<serde_json::Value> = profiles
                    .iter()
                    .map(|p| serde_json::json!({"name": p.name, "kind": format!("{:?}", p.kind).to_lowercase(), "command": p.command.render(&Default::default()), "description": p.description, "origin": p.origin}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                for p in &profiles {
                    println!(
                        "{:<14} {:<4} {:<12} {}  ({})",
                        p.name,
                        format!("{:?}", p.kind).to_lowercase(),
                        p.command.render(&Default::default()),
                        p.description,
                        p.origin
                    );
                }
            }
            Ok(0)
        }
        ProfileAction::Show { name } => {
            let p = Profile::find(&name, &dirs)?;
            match crate::runner::profile::source_text(&name, &dirs) {
                Some(text) => print!("{text}"),
                None => bail!("profile {name} has no file to show ({})", p.origin),
            }
            Ok(0)
        }
        ProfileAction::Test { name, prompt, json } => {
            let p = Profile::find(&name, &dirs)?;
            let spinner = crate::wizard::prompt::Spinner::new();
            use crate::wizard::Progress as _;
            spinner.step(&format!("running {} on {prompt:?}", p.name));
            let report = maker::smoke_test(&p, &prompt).await;
            spinner.done(&format!("{} answered in {} ms", p.name, report.duration_ms));
            print_report(&report, json)?;
            Ok(if report.ok { 0 } else { 1 })
        }
        ProfileAction::New {
            name,
            command,
            args,
            prompt_via,
            cwd,
            stream,
            timeout_secs,
            acp,
            permissions,
            description,
            test_prompt,
            no_test,
            force,
            json,
        } => {
            if !crate::config::valid_name(&name) {
                bail!("profile name {name:?}: use lower-case letters, digits, - and _");
            }
            let command = match command {
                Some(c) => c,
                None => bail!("give the agent's program with --command (and its arguments with --arg, `{{{{prompt}}}}` for the task's text)"),
            };
            let stream = match stream.as_str() {
                "auto" => None,
                other => Some(
                    serde_json::from_value::<crate::runner::stream::StreamFormat>(serde_json::Value::String(other.into()))
                        .map_err(|_| anyhow::anyhow!("--stream {other:?}: use auto, none, ndjson, sse, claude, codex or gemini"))?,
                ),
            };
            let mut new = maker::NewProfile {
                description: description
                    .unwrap_or_else(|| format!("{command} (made with profile new)")),
                name: name.clone(),
                command,
                args,
                prompt_via,
                cwd,
                stream,
                timeout_secs,
                acp,
                permissions,
            };
            let spinner = crate::wizard::prompt::Spinner::new();
            use crate::wizard::Progress as _;
            let format = match (new.stream, new.acp || no_test) {
                (Some(f), _) => f,
                (None, true) => crate::runner::stream::StreamFormat::None,
                (None, false) => {
                    spinner.step(&format!("running {} once to see its output", new.command));
                    let f = maker::detect(&new, &test_prompt).await?;
                    spinner.done(&format!("its output is framed as: {}", f.as_str()));
                    f
                }
            };
            new.stream = Some(format);
            let text = maker::render(&new, format);
            let path = maker::target(&dirs, &name);
            maker::write(&path, &text, force)?;
            for warning in Profile::parse(&text, &name, "the new profile")?.warnings() {
                eprintln!("warning: {warning}");
            }
            let report = if no_test {
                None
            } else {
                let p = Profile::find(&path.display().to_string(), &dirs)?;
                spinner.step("smoke test");
                let r = maker::smoke_test(&p, &test_prompt).await;
                spinner.done(&format!(
                    "smoke test: {}",
                    if r.ok { "ok" } else { "failed" }
                ));
                Some(r)
            };
            if json {
                println!(
                    "{}",
                    serde_json::json!({"profile": name, "path": path, "stream": format.as_str(), "test": report})
                );
            } else {
                println!("wrote {}:\n{text}", path.display());
                if let Some(r) = &report {
                    print_report(r, false)?;
                }
                println!("use it: `profile = \"{name}\"` in an [[agents]] table, or pick it in `aamp-bridge init`");
            }
            Ok(match report {
                Some(r) if !r.ok => 1,
                _ => 0,
            })
        }
    }
}

fn print_report(report: &crate::wizard::profile_maker::Report, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    if report.ok {
        println!("OK    answered in {} ms", report.duration_ms);
    } else {
        println!("FAIL  {}", report.error.as_deref().unwrap_or("no answer"));
    }
    if !report.events.is_empty() {
        let events: Vec<String> = report
            .events
            .iter()
            .map(|(k, v)| format!("{k} ×{v}"))
            .collect();
        println!("      stream events: {}", events.join(", "));
    }
    let shown: String = report.output.chars().take(500).collect();
    if !shown.is_empty() {
        println!("      answer: {}", shown.trim());
    }
    Ok(())
}

/// Prints a task's live stream for a person (or as JSON lines).
#[derive(Default)]
struct StreamPrinter {
    /// Text was printed without a line end yet.
    mid_line: bool,
}

impl StreamPrinter {
    fn line(&mut self, text: &str) {
        if self.mid_line {
            println!();
            self.mid_line = false;
        }
        println!("{text}");
    }

    fn print(&mut self, event: &serde_json::Value, json: bool) {
        use std::io::Write as _;
        if json {
            println!("{event}");
            return;
        }
        let payload = &event["payload"];
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        match event["type"].as_str().unwrap_or_default() {
            "text.delta" => {
                let t = text(&payload["text"]);
                print!("{t}");
                let _ = std::io::stdout().flush();
                self.mid_line = !t.ends_with('\n');
            }
            "tool_call" => self.line(&format!(
                "• {} ({})",
                text(&payload["label"]),
                text(&payload["status"])
            )),
            "todo" => {
                for item in payload["items"].as_array().into_iter().flatten() {
                    let mark = match item["status"].as_str() {
                        Some("completed") => "[x]",
                        Some("in_progress") => "[>]",
                        _ => "[ ]",
                    };
                    self.line(&format!("{mark} {}", text(&item["content"])));
                }
            }
            "artifact" => self.line(&format!("+ file {}", text(&payload["filename"]))),
            other => self.line(&format!("[{other}] {payload}")),
        }
    }

    fn end(&mut self) {
        if self.mid_line {
            println!();
            self.mid_line = false;
        }
    }
}
