//! The config file's tables as serde reads and writes them: the top level, each agent, and
//! their defaults (each mailbox's table is in `mailboxes`).

use super::*;

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where cursors and task workspaces live. Default: `$XDG_STATE_HOME/aamp-bridge`.
    pub state_dir: Option<PathBuf>,
    /// Extra folder of profile files, searched before the user's and the built-in ones.
    pub profiles_dir: Option<PathBuf>,
    /// Tasks running at once across all agents (each agent also has its own limit); no
    /// limit when unset. Waiting tasks go by X-AAMP-Priority, then by arrival.
    pub max_concurrent_tasks: Option<usize>,
    /// After SIGTERM/SIGINT, how long running tasks get to finish before they are stopped
    /// and left in the journal for the next start.
    #[serde(default = "number::<_, 30>")]
    pub shutdown_grace_secs: u64,
    /// How long an ack or result that cannot be sent is retried (across restarts) before the
    /// bridge gives up on it.
    #[serde(default = "number::<_, 24>")]
    pub outbox_retry_hours: u64,
    /// Finished tasks are kept in the journal this many days (for duplicates and history).
    #[serde(default = "number::<_, 30>")]
    pub journal_retention_days: u64,
    /// The journal is kept under this size (MB): past it, the oldest finished tasks are
    /// forgotten first (never one still to be answered), checked every hour.
    #[serde(default = "number::<_, 1024>")]
    pub journal_max_size_mb: u64,
    /// `[mailboxes.NAME]`, each read by its `kind` (see [`MailboxConfig`]).
    #[serde(default, deserialize_with = "mailboxes::deserialize_mailboxes")]
    pub mailboxes: BTreeMap<String, MailboxConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<AgentConfig>,
    /// The live view in the browser (`aamp-bridge ui`): served by `start` only when set.
    pub ui: Option<UiConfig>,
    /// `[sender_budget]`: what each sender may spend across all agents together.
    pub sender_budget: Option<Budget>,
    /// `[prices."MODEL"]`: dollars per million tokens, for reports that state no cost (a
    /// model's name as the agent reports it, or a prefix ending in `*`). None built in.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
}

/// `[ui]`: where the live view listens, and who may reach it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UiConfig {
    /// `IP:PORT`; a loopback address unless `allow_remote` says otherwise. Port 0 picks a
    /// free one (`aamp-bridge ui` reads which).
    pub listen: std::net::SocketAddr,
    /// Listen on an address other machines can reach. Off by default: the page can answer
    /// questions and cancel tasks, so it is for this machine (or an SSH tunnel) unless the
    /// config says so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_remote: bool,
    /// `Host` header values accepted besides the listen address (and `localhost:PORT` on a
    /// loopback address), e.g. the name a remote browser uses. Any other `Host` is refused
    /// (no DNS rebinding).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

/// A number key's default, written at the key: `#[serde(default = "number::<_, 30>")]`.
fn number<T: From<u16>, const N: u16>() -> T {
    T::from(N)
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Lower-case letters, digits, `-` and `_`.
    pub name: String,
    /// A key of `[mailboxes]`; default: the agent's name.
    pub mailbox: Option<String>,
    /// A profile name (from the profile folders) or a path to a profile file.
    pub profile: String,
    /// Senders allowed to dispatch tasks: addresses, `*@domain` or `@domain`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_from: Vec<String>,
    /// Tasks this agent runs at once; the rest wait in order.
    #[serde(default = "number::<_, 1>")]
    pub max_concurrent_tasks: usize,
    /// A one-line summary of what the agent does, for the AAMP service's directory.
    pub summary: Option<String>,
    /// The agent's card (markdown) for the directory, inline or ...
    pub card: Option<String>,
    /// ... in a file.
    pub card_file: Option<PathBuf>,
    /// Tasks running or waiting at most; further dispatches are answered "busy".
    #[serde(default = "number::<_, 100>")]
    pub max_queued_tasks: usize,
    /// Allow rules with dispatch-context conditions (`[[agents.senders]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub senders: Vec<policy::Rule>,
    /// Allow rules in the reference bridges' text form (`allow_from: ...` and
    /// `context_equals: key=value` lines).
    pub sender_policy: Option<String>,
    /// Senders refused whatever else allows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_from: Vec<String>,
    /// What a sender the policy refuses hears: `reject` (a rejected result) or `ignore`.
    #[serde(default)]
    pub unknown_senders: policy::UnknownSenders,
    /// Rejections sent to refused senders per hour at most (the rest get nothing), so the
    /// bridge cannot be used to send mail to addresses of someone else's choosing.
    #[serde(default = "number::<_, 20>")]
    pub max_refusals_per_hour: u32,
    /// Tasks one sender may dispatch to this agent per hour.
    #[serde(default = "number::<_, 1000>")]
    pub max_tasks_per_sender_per_hour: u32,
    /// Tasks this agent takes per 24 hours at most (no limit when unset).
    pub daily_task_budget: Option<u32>,
    /// `[agents.budget]`: what this agent may spend, all senders together.
    pub budget: Option<Budget>,
    /// `[agents.sender_budget]`: what each sender may spend on this agent.
    pub sender_budget: Option<Budget>,
    /// Turns one conversation (Session-Key) may take.
    #[serde(default = "number::<_, 100>")]
    pub max_turns_per_session: u32,
    /// A dispatch that agents passed on this many times (`X-AAMP-Hop-Count`) is rejected
    /// instead of run: two agents handing each other work stop there.
    #[serde(default = "number::<_, 8>")]
    pub max_hops: u32,
    /// The addresses this agent's tasks may hand work to with the `delegate` tool
    /// (`docs/delegation.md`); none when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delegate_to: Vec<String>,
    /// How a cancelled task is answered: `result` (rejected, "cancelled") or `silent`.
    #[serde(default)]
    pub cancel_reply: policy::CancelReply,
}

impl AgentConfig {
    /// The mailbox the agent reads: its `mailbox`, else the mailbox of its own name.
    pub fn mailbox_name(&self) -> &str {
        self.mailbox.as_deref().unwrap_or(&self.name)
    }

    /// The agent's sender policy from the config (rules added with `aamp-bridge policy` or by
    /// pairing live in the journal and are added by the engine, `dispatch::Engine`).
    pub fn sender_policy(&self) -> policy::SenderPolicy {
        let text_rules = self
            .sender_policy
            .as_deref()
            .and_then(|t| policy::parse_text(t).ok())
            .unwrap_or_default();
        policy::SenderPolicy::new(&self.allow_from)
            .with_rules(self.senders.iter().cloned().chain(text_rules))
            .with_denied(self.deny_from.iter().cloned())
    }
}
