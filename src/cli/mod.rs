//! The command line: the arguments (here) and one file per command family, each calling into
//! the library. What a file does besides printing (doctor's checks, status's figures, the
//! mail loop of `dispatch`) is its command's own; nothing another entry point needs lives
//! here.

use crate::output::{errln, out, outln};

mod agents;
mod dispatch;
mod doctor;
mod man;
mod policy;
mod profile;
mod service;
mod setup;
mod status;
mod stream_printer;
mod tasks;
mod usage;

use std::io::Read as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::config::{default_config_path, LoadedConfig};
use crate::daemon::{self, RunOptions};
use crate::protocol::{self, AampMessage, Body, Dispatch, Priority, Status};

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
    /// The MCP server an agent the bridge runs starts to delegate work (stdio); it finds the
    /// bridge and its task's credential in its environment (`docs/delegation.md`).
    #[command(hide = true)]
    Mcp,
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
    /// Exits 0 when it completed, 1 when it was rejected (or on an error), 3 when the server
    /// reported that the dispatch could not be delivered (an address that does not exist).
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
    /// Make the running bridge read its config, profiles and credentials files again (as
    /// SIGHUP does), and say what changed: a mailbox whose credentials changed is retried at
    /// once.
    Reload {
        #[arg(long)]
        json: bool,
    },
    /// The live view's address with its access token (the bridge serves it when the config
    /// has `[ui] listen = "127.0.0.1:PORT"`): agents, queues and tasks as they stream,
    /// questions answered and tasks cancelled from the page.
    Ui {
        /// Open it in the browser (xdg-open, or open on macOS) as well.
        #[arg(long)]
        open: bool,
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
        /// received, acked, running, help_needed, answered, rejected, cancelled or expired; or
        /// undelivered: tasks whose answer the server refused for good.
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// What the agents' model calls cost (tokens by kind, and money where the agent stated it
    /// or the config prices its model), summed by agent, sender, model or day, with the total
    /// at the end: this month (UTC) by default. A cost nobody stated is "unknown", never 0, and
    /// the models without one are named. Read from the journal: the bridge may run or not.
    Usage {
        /// From when: a date (2026-11-01), a time (2026-11-01T08:00:00Z) or a span back from
        /// now (90m, 12h, 7d, 2w) [default: the start of this month, UTC]
        #[arg(long, value_name = "DATE|DURATION")]
        since: Option<String>,
        /// Up to when, in the same forms [default: now]
        #[arg(long, value_name = "DATE|DURATION")]
        until: Option<String>,
        /// One row per agent, sender, model or day (UTC).
        #[arg(long, default_value = "agent", value_parser = ["agent", "sender", "model", "day"])]
        by: String,
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Comma-separated values (RFC 4180), a header line first and the total last.
        #[arg(long)]
        csv: bool,
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
    /// Print the manual page (roff): `aamp-bridge man > aamp-bridge.1`; with `--dir DIR`,
    /// write one page per command and subcommand there (aamp-bridge-start.1 …), as the
    /// packages install them.
    #[command(hide = true)]
    Man {
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
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
    New(NewProfileArgs),
    /// Run a profile once on a prompt, as the bridge would, and show what came back.
    Test {
        name: String,
        #[arg(long, default_value = "Reply with the word OK.")]
        prompt: String,
        /// Show every stream event in order (text.delta, tool_call, todo), then the answer.
        #[arg(long)]
        events: bool,
        #[arg(long)]
        json: bool,
    },
}

// The arguments of `profile new` (its help is the variant's doc comment).
#[derive(Debug, clap::Args)]
pub struct NewProfileArgs {
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
    /// A variable the agent needs, KEY=VALUE (repeatable): used for the test runs and kept
    /// in NAME.env beside the profile (0600, named by its env_file), never in the profile.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// The prompt for the detection run and the smoke test.
    #[arg(long, default_value = "Reply with the word OK.")]
    test_prompt: String,
    /// Write it without running it.
    #[arg(long)]
    no_test: bool,
    /// How long each try of a resume flag may take (the first turn of that check: three
    /// times this; a real agent's turn on a busy machine takes tens of seconds); a try past
    /// it is stopped, its whole process group killed.
    #[arg(long, default_value_t = 60)]
    resume_try_secs: u64,
    /// Replace a profile file of that name.
    #[arg(long)]
    force: bool,
    #[arg(long)]
    json: bool,
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
    /// Reads the config, profiles and credentials files again (SIGHUP), without a restart.
    Reload,
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
    let config = || LoadedConfig::load(&config_path);
    match cli.command {
        Command::Mcp => Ok(crate::delegate::stdio::run().await.map(|()| 0)?),
        Command::Start { json, agents } => {
            if let Some(why) = crate::service::launchd_start() {
                errln!("aamp-bridge: {why}");
                return Ok(0);
            }
            if !config_path.exists() {
                bail!(
                    "no config at {}: run `aamp-bridge init` to make one (or `aamp-bridge import` from the reference bridges), or pass --config FILE",
                    config_path.display()
                );
            }
            let config = config()?;
            crate::telemetry::fall_back_to(config.state().log());
            let controls = daemon::Controls::default();
            let done = CancellationToken::new();
            let signals = tokio::spawn(daemon::listen_for_signals(controls.clone(), done.clone()));
            let ran = daemon::run(config, RunOptions { json, agents }, controls).await;
            done.cancel();
            let _ = signals.await;
            ran?;
            Ok(0)
        }
        Command::Init {
            non_interactive,
            answers,
            json,
        } => setup::init(&config_path, non_interactive, answers, json).await,
        Command::Import {
            from,
            dry_run,
            json,
        } => setup::import(&config_path, from, dry_run, json),
        Command::Profile { action } => profile::profile(&config_path, action).await,
        Command::Dispatch(args) => dispatch::dispatch(&config()?, args).await,
        Command::Inspect { file, json } => setup::inspect(&file, json),
        Command::Policy { action } => policy::policy(&config()?, action),
        Command::Ui { open } => ui(&config()?, open),
        Command::Status { json } => status::status(&config()?, json).await,
        Command::Reload { json } => status::reload(&config()?, json),
        Command::Doctor { json } => doctor::doctor(&config_path, json).await,
        Command::Service { action } => service::service(&config_path, action),
        Command::Man { dir } => {
            use clap::CommandFactory as _;
            man::man(Cli::command(), dir.as_deref())
        }
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "aamp-bridge", &mut script);
            let script = completion_fixes(shell, &String::from_utf8_lossy(&script));
            out!("{script}");
            Ok(0)
        }
        Command::Tasks {
            agent,
            state,
            limit,
            json,
        } => tasks::tasks(&config()?, agent, state, limit, json),
        Command::Task {
            action: TaskAction::Show { id, json },
        } => tasks::task_show(&config()?, &id, json),
        Command::Usage {
            since,
            until,
            by,
            json,
            csv,
        } => usage::usage(
            &config()?,
            usage::Args {
                since,
                until,
                by,
                json,
                csv,
            },
        ),
        Command::Pair {
            agent,
            ttl_secs,
            json,
        } => policy::pair(&config()?, &agent, ttl_secs, json),
        Command::Agents { json, probe } => agents::agents(&config_path, json, probe).await,
    }
}

/// `aamp-bridge: WHAT` on stderr, for the binary's last word; a closed stderr is ignored
/// (`eprintln!` would panic on it).
pub fn error_line(what: std::fmt::Arguments<'_>) {
    crate::output::stderr(format_args!("aamp-bridge: {what}\n"));
}

pub(super) fn open_journal(config: &LoadedConfig) -> anyhow::Result<crate::dispatch::Journal> {
    let path = config.state().journal();
    if !path.exists() {
        bail!(
            "no task journal at {} yet: the bridge has not run with this state directory (aamp-bridge start)",
            path.display()
        );
    }
    Ok(crate::dispatch::Journal::open(&path)?)
}

pub(super) fn ms_time(ms: i64) -> String {
    protocol::time::format_utc_ms(std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

/// The completion script as shells need it, past two generator faults:
/// - bash: with a hyphenated name, the generator names each subcommand's case one way where it
///   sets it (`aamp__bridge__subcmd__start`) and another where it reads it
///   (`aamp__subcmd__bridge__subcmd__start`), so nothing past the first word completed
///   (clap-rs/clap#6421);
/// - fish: an option spec without a short flag (`config=`) is refused by fish before 3.2
///   (Debian 11's 3.1: "Invalid option spec 'config=' at char 'o'"); `c-config=` (a short
///   letter that only names its variable) is read the same by every fish since 3.0.
pub fn completion_fixes(shell: clap_complete::Shell, script: &str) -> String {
    match shell {
        clap_complete::Shell::Bash => script.replace("aamp__subcmd__bridge", "aamp__bridge"),
        clap_complete::Shell::Fish => {
            script
                .lines()
                .map(
                    |line| match line.trim_start().strip_prefix("string join \\n ") {
                        Some(specs) => {
                            let indent = &line[..line.len() - line.trim_start().len()];
                            let used: std::collections::BTreeSet<char> = specs
                                .split(' ')
                                .filter(|s| s.chars().nth(1) == Some('/'))
                                .filter_map(|s| s.chars().next())
                                .collect();
                            let mut taken = used.clone();
                            let fixed: Vec<String> = specs
                                .split(' ')
                                .map(|spec| {
                                    let name = spec.trim_end_matches('=');
                                    if spec.contains('/') || name.chars().count() <= 1 {
                                        return spec.to_string();
                                    }
                                    let short = name
                                        .chars()
                                        .chain('a'..='z')
                                        .chain('A'..='Z')
                                        .find(|c| c.is_ascii_alphabetic() && !taken.contains(c))
                                        .unwrap_or('#');
                                    taken.insert(short);
                                    format!("{short}-{spec}")
                                })
                                .collect();
                            format!("{indent}string join \\n {}", fixed.join(" "))
                        }
                        None => line.to_string(),
                    },
                )
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
        }
        _ => script.to_string(),
    }
}

/// `aamp-bridge ui`: prints the live view's link (with its token), and opens it if asked.
/// Exit 1 when the config has no `[ui]` or no bridge serves it now.
fn ui(config: &LoadedConfig, open: bool) -> anyhow::Result<i32> {
    if config.config.ui.is_none() {
        errln!(
            "no live view: add to {}\n\n[ui]\nlisten = \"127.0.0.1:8765\"\n\nand restart the bridge (aamp-bridge reload does not start it)",
            config.path.display()
        );
        return Ok(1);
    }
    let serving = crate::fsio::StateLock::holder(&config.state_dir).is_some();
    let Some(link) = serving.then(|| crate::ui::address(config)).flatten() else {
        errln!(
            "the bridge on {} does not serve its live view now: start it (aamp-bridge start), and see its log if it still does not",
            config.state_dir.display()
        );
        return Ok(1);
    };
    outln!("{link}");
    if open {
        let opener = if cfg!(target_os = "macos") {
            "open"
        } else {
            "xdg-open"
        };
        // Not the link itself: a command line is readable by any local user (/proc), so the
        // opener gets an owner-only page that sends the browser on to it.
        let page = match crate::ui::opener_page(config, &link) {
            Ok(page) => page,
            Err(e) => {
                errln!("{e}; open the link above yourself");
                return Ok(1);
            }
        };
        let url = url::Url::from_file_path(&page)
            .map(String::from)
            .unwrap_or_else(|()| format!("file://{}", page.display()));
        if let Err(e) = std::process::Command::new(opener).arg(&url).status() {
            errln!("could not run {opener}: {e}; open the link above yourself");
        }
    }
    Ok(0)
}
