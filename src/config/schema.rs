//! The config file's tables as serde reads and writes them: the top level, each mailbox, each
//! agent, and their defaults.

use super::*;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where cursors and task workspaces live. Default: `$XDG_STATE_HOME/aamp-bridge`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// Extra folder of profile files, searched before the user's and the built-in ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profiles_dir: Option<PathBuf>,
    /// Tasks running at once across all agents (each agent also has its own limit); no
    /// limit when unset. Waiting tasks go by X-AAMP-Priority, then by arrival.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_tasks: Option<usize>,
    /// After SIGTERM/SIGINT, how long running tasks get to finish before they are stopped
    /// and left in the journal for the next start.
    #[serde(default = "default_grace_secs")]
    pub shutdown_grace_secs: u64,
    /// How long an ack or result that cannot be sent is retried (across restarts) before the
    /// bridge gives up on it.
    #[serde(default = "default_outbox_hours")]
    pub outbox_retry_hours: u64,
    /// Finished tasks are kept in the journal this many days (for duplicates and history).
    #[serde(default = "default_journal_days")]
    pub journal_retention_days: u64,
    #[serde(default)]
    pub mailboxes: BTreeMap<String, MailboxConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<AgentConfig>,
    /// The live view in the browser (`aamp-bridge ui`): served by `start` only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ui: Option<UiConfig>,
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

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PushTransport {
    #[default]
    Auto,
    Websocket,
    Eventsource,
}

/// The evidence a mailbox needs before it believes a mail's `From:`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SenderAuth {
    /// Authenticated submission on this server, or (with `authserv_id`) its
    /// Authentication-Results.
    #[default]
    Auto,
    /// Only: this server accepted the mail from an authenticated submission by that address.
    Submission,
    /// Only: this server's Authentication-Results (`authserv_id`) pass for the From domain.
    AuthenticationResults,
    /// Believe the From header as it is. Anyone who can put mail in the Inbox can then act
    /// as any allowed sender.
    None,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    /// Upgrade with STARTTLS, and refuse to send if the server does not offer it.
    #[default]
    Starttls,
    /// Implicit TLS from the first byte (usually port 465).
    Tls,
    /// No TLS at all. Allowed only to a loopback host.
    Plain,
}

impl SmtpSecurity {
    /// As the config spells it.
    pub fn name(self) -> &'static str {
        match self {
            SmtpSecurity::Starttls => "starttls",
            SmtpSecurity::Tls => "tls",
            SmtpSecurity::Plain => "plain",
        }
    }

    pub fn default_port(self) -> u16 {
        match self {
            SmtpSecurity::Starttls | SmtpSecurity::Plain => 587,
            SmtpSecurity::Tls => 465,
        }
    }
}

/// Which mailbox system a mailbox lives in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MailboxKind {
    /// AAMP: JMAP to read, SMTP to send, an optional AAMP service (the default).
    #[default]
    Aamp,
    /// AMP (Agent Mailer Protocol): an HTTP broker, polled (README: "AMP mailboxes").
    Amp,
    /// ASMTP (Agent Simple Mail Transfer Protocol): an operator with push (README: "ASMTP
    /// mailboxes").
    Asmtp,
    /// SAMP (Agent Mailbox): an MCP server over Streamable HTTP, polled (README: "SAMP
    /// mailboxes").
    Samp,
}

#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MailboxConfig {
    /// `aamp` (the default) or `amp`.
    #[serde(default)]
    pub kind: MailboxKind,
    /// AMP: the broker's base URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amp_url: Option<String>,
    /// AMP: the agent's address on the broker (`name@user.domain`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// AMP: the agent's id on the broker (from `POST /agents/register`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// AMP: a file holding the user's API key (`amk_...`), mode 0600.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<PathBuf>,
    /// SAMP: the server's MCP endpoint (`https://.../mcp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samp_url: Option<String>,
    /// SAMP: a file holding the agent's `amk_...` bearer key, mode 0600.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// ASMTP: the operator's base URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asmtp_url: Option<String>,
    /// ASMTP: the agent's handle (`@owner.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// ASMTP: a file holding the agent's bearer token, mode 0600.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// ASMTP: at the first start, begin with what arrives from then on instead of answering
    /// the unread envelopes already waiting.
    #[serde(default, skip_serializing_if = "is_false")]
    pub skip_backlog: bool,
    /// ASMTP: an envelope larger than this (by the operator's `size_hint`) is not fetched;
    /// it is answered rejected, saying so (default 16 MiB), so one message cannot cost the
    /// bridge more than that.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<u64>,
    /// AMP: every this many seconds (and at each start) the newest messages are read even
    /// when the inbox's counts did not change, for an arrival that a message archived or
    /// trashed at the same time hid from them (default 300; 0: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recheck_secs: Option<u64>,
    /// AMP and ASMTP: seconds one HTTP call to the broker or operator may take (default:
    /// AMP 120, since its broker renders every message it returns; ASMTP 30).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// The mailbox's address; mail to it is the agent's work. Not needed with
    /// `credentials_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// A credentials file (`{"email", "mailboxToken", "smtpPassword"}`, mode 0600) instead of
    /// email and password. When it does not exist and `aamp_url` is set, the bridge registers
    /// a mailbox with the AAMP service and writes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<PathBuf>,
    /// For registration: the wanted address prefix (default: the mailbox's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slug: Option<String>,
    /// For registration: what the mailbox is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JMAP session URL (`https://host/.well-known/jmap`) or the server's base URL.
    #[serde(default)]
    pub jmap_url: String,
    /// Login name for JMAP and SMTP; default: `email`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login: Option<String>,
    /// The password inline (the config file must then be private), or ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// ... a file holding it (mode 0600), which is preferred.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    #[serde(default)]
    pub smtp_host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smtp_port: Option<u16>,
    #[serde(default)]
    pub smtp_security: SmtpSecurity,
    /// Accept invalid TLS certificates from this mailbox's hosts. Off unless set.
    #[serde(default)]
    pub insecure_tls: bool,
    /// Allow plain `http://` in `jmap_url`/`aamp_url` to a host that is not loopback: the
    /// password then crosses the network unencrypted. Off unless set.
    #[serde(default, skip_serializing_if = "is_false")]
    pub insecure_http: bool,
    /// Seconds between `Email/changes` polls when push is not available.
    #[serde(default = "default_poll_secs")]
    pub poll_interval_secs: u64,
    /// Use JMAP push when the server offers it.
    #[serde(default = "default_true")]
    pub push: bool,
    /// Which push: `auto` (WebSocket, else EventSource), `websocket` or `eventsource`.
    #[serde(default)]
    pub push_transport: PushTransport,
    /// The AAMP service in front of the mail server (its `/.well-known/aamp`), for live task
    /// streams. Without it tasks run without a stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aamp_url: Option<String>,
    /// Keep a copy of every mail the bridge sends in this mailbox's Sent folder.
    #[serde(default = "default_true")]
    pub save_sent: bool,
    /// What makes a `From:` believable (see the README's security model): `auto` (the
    /// default: this server's authenticated submission, or `Authentication-Results` from
    /// `authserv_id` when set), `submission`, `authentication-results`, or `none`.
    #[serde(default)]
    pub sender_auth: SenderAuth,
    /// The receiving server's RFC 8601 authserv-id, whose `Authentication-Results` are
    /// believed (dmarc=pass, or dkim/spf pass aligned with the From domain).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authserv_id: Option<String>,
    /// While push is up, seconds between safety polls (a missed push costs at most this).
    #[serde(default = "default_reconcile_secs")]
    pub reconcile_interval_secs: u64,
    /// Several bridges serve this mailbox: this one's name among them (letters, digits and
    /// `-`). Each dispatch is claimed on the mail server before it is acknowledged, and run
    /// by the one replica that won the claim (see the README's "Several machines").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// With `replica`: seconds a claim holds without being renewed; a replica that stops
    /// renewing (it died) loses its tasks to the others after this.
    #[serde(default = "default_lease_secs")]
    pub lease_secs: u64,
}

fn default_lease_secs() -> u64 {
    60
}

fn default_true() -> bool {
    true
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_reconcile_secs() -> u64 {
    60
}

impl fmt::Debug for MailboxConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MailboxConfig")
            .field("email", &self.email)
            .field("jmap_url", &self.jmap_url)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_file", &self.password_file)
            .field("smtp_host", &self.smtp_host)
            .field("smtp_port", &self.smtp_port)
            .field("smtp_security", &self.smtp_security)
            .finish_non_exhaustive()
    }
}

fn default_refusals() -> u32 {
    20
}

fn default_per_sender() -> u32 {
    1000
}

fn default_hops() -> u32 {
    8
}

fn default_turns() -> u32 {
    100
}

fn default_grace_secs() -> u64 {
    30
}

fn default_outbox_hours() -> u64 {
    24
}

fn default_journal_days() -> u64 {
    30
}

fn default_poll_secs() -> u64 {
    5
}

fn default_concurrency() -> usize {
    1
}

fn default_queue() -> usize {
    100
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Lower-case letters, digits, `-` and `_`.
    pub name: String,
    /// A key of `[mailboxes]`; default: the agent's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mailbox: Option<String>,
    /// A profile name (from the profile folders) or a path to a profile file.
    pub profile: String,
    /// Senders allowed to dispatch tasks: addresses, `*@domain` or `@domain`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_from: Vec<String>,
    /// Tasks this agent runs at once; the rest wait in order.
    #[serde(default = "default_concurrency")]
    pub max_concurrent_tasks: usize,
    /// A one-line summary of what the agent does, for the AAMP service's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The agent's card (markdown) for the directory, inline or ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card: Option<String>,
    /// ... in a file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card_file: Option<PathBuf>,
    /// Tasks running or waiting at most; further dispatches are answered "busy".
    #[serde(default = "default_queue")]
    pub max_queued_tasks: usize,
    /// Allow rules with dispatch-context conditions (`[[agents.senders]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub senders: Vec<policy::Rule>,
    /// Allow rules in the reference bridges' text form (`allow_from: ...` and
    /// `context_equals: key=value` lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender_policy: Option<String>,
    /// Senders refused whatever else allows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_from: Vec<String>,
    /// What a sender the policy refuses hears: `reject` (a rejected result) or `ignore`.
    #[serde(default)]
    pub unknown_senders: policy::UnknownSenders,
    /// Rejections sent to refused senders per hour at most (the rest get nothing), so the
    /// bridge cannot be used to send mail to addresses of someone else's choosing.
    #[serde(default = "default_refusals")]
    pub max_refusals_per_hour: u32,
    /// Tasks one sender may dispatch to this agent per hour.
    #[serde(default = "default_per_sender")]
    pub max_tasks_per_sender_per_hour: u32,
    /// Tasks this agent takes per 24 hours at most (no limit when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daily_task_budget: Option<u32>,
    /// Turns one conversation (Session-Key) may take.
    #[serde(default = "default_turns")]
    pub max_turns_per_session: u32,
    /// A dispatch that agents passed on this many times (`X-AAMP-Hop-Count`) is rejected
    /// instead of run: two agents handing each other work stop there.
    #[serde(default = "default_hops")]
    pub max_hops: u32,
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
