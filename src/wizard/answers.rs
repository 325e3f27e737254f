//! What `init` asks, as data: the questions ([`super::prompt`]), an answers file and the
//! reference bridges' files ([`super::import`]) all come down to [`Answers`].

use std::path::PathBuf;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::config::{MailboxKind, SmtpSecurity};

/// Everything `init` asks, as a file (`init --non-interactive --answers FILE`, JSON or TOML).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Answers {
    /// The AAMP service (its `/.well-known/aamp`): registration and live task streams.
    pub aamp_url: Option<String>,
    /// Where the journal and workspaces go (default: `$XDG_STATE_HOME/aamp-bridge`).
    pub state_dir: Option<PathBuf>,
    #[serde(default)]
    pub agents: Vec<AgentAnswers>,
    /// A mailbox of the person's own, to send tasks from (`aamp-bridge dispatch --from me`).
    pub own_mailbox: Option<OwnMailbox>,
    /// Install and start the background service afterwards.
    #[serde(default)]
    pub service: bool,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentAnswers {
    pub name: String,
    /// A profile name (`aamp-bridge agents`) or a profile file.
    pub profile: String,
    pub mailbox: MailboxAnswers,
    /// Who may send tasks (addresses, `*@domain`, `@domain`).
    #[serde(default)]
    pub allow_from: Vec<String>,
    /// Make a pairing code (and show its QR code) for the person who will send tasks.
    #[serde(default)]
    pub pair: bool,
    pub summary: Option<String>,
}

/// The person's own mailbox: a `[mailboxes.NAME]` no agent answers, the `--from` of
/// `aamp-bridge dispatch`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OwnMailbox {
    /// Its key in `[mailboxes]` (default `me`).
    #[serde(default = "default_own_name")]
    pub name: String,
    pub mailbox: MailboxAnswers,
    /// Add its address to every agent's allow list (default yes).
    #[serde(default = "yes")]
    pub allow: bool,
}

fn default_own_name() -> String {
    "me".to_string()
}

fn yes() -> bool {
    true
}

/// Where an agent's mail lives.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum MailboxAnswers {
    /// A new mailbox registered with the AAMP service (`aamp_url`).
    Register {
        slug: Option<String>,
        description: Option<String>,
        #[serde(flatten)]
        servers: Servers,
    },
    /// An account that exists: its address and password.
    Existing {
        email: String,
        login: Option<String>,
        /// The password; saved in a file of mode 0600 beside the config ...
        password: Option<String>,
        /// ... or a file that already holds it.
        password_file: Option<PathBuf>,
        #[serde(flatten)]
        servers: Servers,
    },
    /// The mailbox the config already has for this agent.
    Keep,
    /// A mailbox on an ASMTP operator; the token is in a file (mode 0600) already.
    Asmtp {
        asmtp_url: String,
        handle: String,
        token_file: PathBuf,
        #[serde(default)]
        insecure_tls: bool,
    },
    /// A mailbox on an AMP broker; the API key is in a file (mode 0600) already.
    Amp {
        amp_url: String,
        address: String,
        agent_id: String,
        api_key_file: PathBuf,
        #[serde(default)]
        insecure_tls: bool,
    },
    /// A mailbox on a SAMP server (Agent Mailbox, over MCP); the `amk_...` key is in a file
    /// (mode 0600) already.
    Samp {
        samp_url: String,
        key_file: PathBuf,
        #[serde(default)]
        insecure_tls: bool,
    },
}

/// The servers of a mailbox; for a registered one they default to the AAMP service's host.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Servers {
    pub jmap_url: Option<String>,
    pub smtp_host: Option<String>,
    pub smtp_port: Option<u16>,
    pub smtp_security: Option<SmtpSecurity>,
    #[serde(default)]
    pub insecure_tls: bool,
}

impl MailboxAnswers {
    /// The kind of mailbox these answers make; `None` for the one the config has already.
    pub fn kind(&self) -> Option<MailboxKind> {
        match self {
            MailboxAnswers::Keep => None,
            MailboxAnswers::Register { .. } | MailboxAnswers::Existing { .. } => {
                Some(MailboxKind::Aamp)
            }
            MailboxAnswers::Asmtp { .. } => Some(MailboxKind::Asmtp),
            MailboxAnswers::Amp { .. } => Some(MailboxKind::Amp),
            MailboxAnswers::Samp { .. } => Some(MailboxKind::Samp),
        }
    }
}

impl Answers {
    /// Reads answers from JSON or TOML text (JSON when it starts with `{`).
    pub fn parse(text: &str) -> anyhow::Result<Answers> {
        if text.trim_start().starts_with('{') {
            serde_json::from_str(text).context("the answers are not valid JSON for init")
        } else {
            toml::from_str(text).context("the answers are not valid TOML for init")
        }
    }
}
