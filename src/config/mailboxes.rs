//! `[mailboxes.NAME]`: each kind of mailbox has its own type holding only its keys, plus the
//! keys every mailbox has ([`MailboxCommon`]). The table is read by its `kind` (absent:
//! `aamp`), so a key of another kind, or of none, is refused here, naming the key, the kind it
//! belongs to and the mailbox; it is written back as users write it, `kind` first.
//!
//! The kinds are listed once, in the `mailbox_kinds!` call below: a new back-end adds its
//! keys' struct here and one line there.

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess};
use toml::{Table, Value};

use super::*;

macro_rules! mailbox_kinds {
    ($($(#[$attr:meta])* $kind:ident($keys:ident) = $tag:literal, $name:literal;)+) => {
        /// Which mailbox system a mailbox lives in: its `kind` key.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
        pub enum MailboxKind {
            $($(#[$attr])* #[serde(rename = $tag)] $kind,)+
        }

        /// One `[mailboxes.NAME]` table: the keys of its kind.
        #[derive(Clone, Debug, Serialize)]
        #[serde(tag = "kind")]
        pub enum MailboxConfig {
            $(#[serde(rename = $tag)] $kind($keys),)+
        }

        impl MailboxKind {
            /// Every kind.
            pub const ALL: &'static [MailboxKind] = &[$(MailboxKind::$kind),+];

            /// As people write it: "AAMP", "ASMTP", ...
            pub fn name(self) -> &'static str {
                match self {
                    $(MailboxKind::$kind => $name,)+
                }
            }

            /// As the config spells it: `kind = "asmtp"`.
            pub fn tag(self) -> &'static str {
                match self {
                    $(MailboxKind::$kind => $tag,)+
                }
            }

            /// The keys of this kind, besides `kind` and the common ones.
            fn keys(self) -> &'static [&'static str] {
                match self {
                    $(MailboxKind::$kind => field_names::<$keys>(),)+
                }
            }
        }

        impl MailboxConfig {
            pub fn kind(&self) -> MailboxKind {
                match self {
                    $(MailboxConfig::$kind(_) => MailboxKind::$kind,)+
                }
            }

            /// The keys every kind of mailbox has.
            pub fn common(&self) -> &MailboxCommon {
                match self {
                    $(MailboxConfig::$kind(m) => &m.common,)+
                }
            }

            pub fn common_mut(&mut self) -> &mut MailboxCommon {
                match self {
                    $(MailboxConfig::$kind(m) => &mut m.common,)+
                }
            }

            /// A mailbox of `kind` from its own keys (`kind` and the common keys taken out).
            fn read_kind(
                kind: MailboxKind,
                common: MailboxCommon,
                keys: Table,
            ) -> Result<MailboxConfig, KeyError> {
                match kind {
                    $(MailboxKind::$kind => {
                        let mut m: $keys = read(keys)?;
                        m.common = common;
                        Ok(MailboxConfig::$kind(m))
                    })+
                }
            }
        }

        $(impl Default for $keys {
            /// Every key at its default, as an empty table reads.
            fn default() -> Self {
                read(Table::new()).expect("every key of a mailbox has a default")
            }
        })+
    };
}

mailbox_kinds! {
    /// AAMP: JMAP to read, SMTP to send, an optional AAMP service (the default).
    #[default]
    Aamp(AampMailbox) = "aamp", "AAMP";
    /// AMP (Agent Mailer Protocol): an HTTP broker, polled (docs/mailboxes/amp.md).
    Amp(AmpMailbox) = "amp", "AMP";
    /// ASMTP (Agent Simple Mail Transfer Protocol): an operator with push
    /// (docs/mailboxes/asmtp.md).
    Asmtp(AsmtpMailbox) = "asmtp", "ASMTP";
    /// SAMP (Agent Mailbox): an MCP server over Streamable HTTP, polled
    /// (docs/mailboxes/samp.md).
    Samp(SampMailbox) = "samp", "SAMP";
}

impl MailboxConfig {
    /// A mailbox of `kind` with every key of its own at its default: what a mailbox becomes
    /// when it changes kind (keeping `common`).
    pub fn new(kind: MailboxKind, common: MailboxCommon) -> MailboxConfig {
        MailboxConfig::read_kind(kind, common, Table::new())
            .expect("every key of a mailbox has a default")
    }

    /// The AAMP mailbox's keys, when it is one.
    pub fn aamp(&self) -> Option<&AampMailbox> {
        match self {
            MailboxConfig::Aamp(m) => Some(m),
            _ => None,
        }
    }

    pub fn aamp_mut(&mut self) -> Option<&mut AampMailbox> {
        match self {
            MailboxConfig::Aamp(m) => Some(m),
            _ => None,
        }
    }

    /// Reads a mailbox table; an error names the key it is about (see [`KeyError`]).
    fn from_table(mut table: Table) -> Result<MailboxConfig, KeyError> {
        let given = table.remove("kind");
        let kind = match &given {
            None => MailboxKind::default(),
            Some(v) => MailboxKind::deserialize(v.clone()).map_err(|e| KeyError {
                key: Some("kind".to_string()),
                problem: e.message().to_string(),
                fix: Some(format!(
                    "write one of: {}",
                    MailboxKind::ALL
                        .iter()
                        .map(|k| format!("{:?}", k.tag()))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            })?,
        };
        let common_keys = field_names::<MailboxCommon>();
        if let Some(key) = table
            .keys()
            .find(|k| !common_keys.contains(&k.as_str()) && !kind.keys().contains(&k.as_str()))
        {
            return Err(KeyError::stray(key, kind, given.is_none()));
        }
        let (common, own): (Table, Table) = table
            .into_iter()
            .partition(|(k, _)| common_keys.contains(&k.as_str()));
        MailboxConfig::read_kind(kind, read(common)?, own)
    }
}

impl<'de> Deserialize<'de> for MailboxConfig {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Named(None).deserialize(d)
    }
}

/// `[mailboxes]`, each table read knowing its name, so that its errors say
/// `mailboxes.NAME.KEY`.
pub(super) fn deserialize_mailboxes<'de, D: de::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, MailboxConfig>, D::Error> {
    struct Mailboxes;
    impl<'de> de::Visitor<'de> for Mailboxes {
        type Value = BTreeMap<String, MailboxConfig>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table of mailboxes")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(name) = map.next_key::<String>()? {
                let mailbox = map.next_value_seed(Named(Some(&name)))?;
                out.insert(name, mailbox);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Mailboxes)
}

/// Reads one mailbox table, named in its errors when the name is known.
struct Named<'a>(Option<&'a str>);

impl<'de> DeserializeSeed<'de> for Named<'_> {
    type Value = MailboxConfig;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<MailboxConfig, D::Error> {
        let table = Table::deserialize(d)?;
        MailboxConfig::from_table(table).map_err(|e| de::Error::custom(e.said(self.0)))
    }
}

/// Between a problem and its fix in an error's text; the loader splits them apart again.
pub(super) const FIX: &str = "\n  fix: ";

/// What is wrong with one key of a mailbox table (`key` is `None` for the table as a whole).
#[derive(Debug)]
struct KeyError {
    key: Option<String>,
    problem: String,
    fix: Option<String>,
}

impl KeyError {
    /// A key that mailboxes of `kind` do not take (`defaulted`: `kind` is not set).
    fn stray(key: &str, kind: MailboxKind, defaulted: bool) -> KeyError {
        let owners: Vec<MailboxKind> = MailboxKind::ALL
            .iter()
            .copied()
            .filter(|k| k.keys().contains(&key))
            .collect();
        let takes = format!(
            "kind = {:?} takes {} (and, like every mailbox, {})",
            kind.tag(),
            kind.keys().join(", "),
            field_names::<MailboxCommon>().join(", ")
        );
        let this = format!(
            "this mailbox is kind = {:?}{}",
            kind.tag(),
            if defaulted { " (kind is not set)" } else { "" }
        );
        let (problem, fix) = if owners.is_empty() {
            (
                format!("no mailbox takes this key ({this})"),
                format!("check its spelling; {takes}"),
            )
        } else {
            let names: Vec<String> = owners.iter().map(|k| k.name().to_string()).collect();
            let tags: Vec<String> = owners.iter().map(|k| format!("{:?}", k.tag())).collect();
            (
                format!(
                    "a key of {} mailboxes only, and {this}",
                    listed(&names, "and")
                ),
                format!(
                    "drop {key}, or set kind = {} if that is what the mailbox is; {takes}",
                    listed(&tags, "or")
                ),
            )
        };
        KeyError {
            key: Some(key.to_string()),
            problem,
            fix: Some(fix),
        }
    }

    /// As the loader says it: `mailboxes.NAME.KEY: problem`, then the fix after [`FIX`].
    fn said(&self, mailbox: Option<&str>) -> String {
        let path: Vec<String> = mailbox
            .map(|m| format!("mailboxes.{m}"))
            .into_iter()
            .chain(self.key.clone())
            .collect();
        let mut text = match path.is_empty() {
            true => self.problem.clone(),
            false => format!("{}: {}", path.join("."), self.problem),
        };
        if let Some(fix) = &self.fix {
            text.push_str(FIX);
            text.push_str(fix);
        }
        text
    }
}

/// "a", "a and b", "a, b and c".
fn listed(items: &[String], and: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} {and} {last}", rest.join(", ")),
    }
}

/// `T` from a table whose keys it takes; an error names the key whose value it is about.
fn read<T: DeserializeOwned>(table: Table) -> Result<T, KeyError> {
    let mut access = Keyed {
        entries: table.into_iter(),
        value: None,
        key: None,
    };
    T::deserialize(de::value::MapAccessDeserializer::new(&mut access)).map_err(|e| KeyError {
        key: access.key,
        problem: e.message().to_string(),
        fix: None,
    })
}

/// A table's entries for a struct to read, remembering the key being read.
struct Keyed {
    entries: toml::map::IntoIter<String, Value>,
    value: Option<Value>,
    /// The key whose value is being read; `None` once the entries are all read.
    key: Option<String>,
}

impl<'de> MapAccess<'de> for Keyed {
    type Error = toml::de::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((key, value)) = self.entries.next() else {
            self.key = None;
            return Ok(None);
        };
        self.value = Some(value);
        let read = seed.deserialize(key.as_str().into_deserializer());
        self.key = Some(key);
        read.map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        seed.deserialize(self.value.take().expect("a key comes before its value"))
    }
}

/// The keys a struct deserializes (serde hands them to `deserialize_struct`).
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> de::Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("only the field names were wanted"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// The keys every kind of mailbox has.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MailboxCommon {
    /// Accept invalid TLS certificates from this mailbox's hosts. Off unless set.
    #[serde(default)]
    pub insecure_tls: bool,
    /// Seconds between polls (AAMP: `Email/changes` polls when push is not available).
    #[serde(default = "default_poll_secs")]
    pub poll_interval_secs: u64,
}

impl Default for MailboxCommon {
    fn default() -> Self {
        MailboxCommon {
            insecure_tls: false,
            poll_interval_secs: default_poll_secs(),
        }
    }
}

/// `kind = "aamp"` (or no `kind`): a mail account, JMAP to read and SMTP to send.
#[serde_with::skip_serializing_none]
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AampMailbox {
    /// The mailbox's address; mail to it is the agent's work. Not needed with
    /// `credentials_file`.
    pub email: Option<String>,
    /// A credentials file (`{"email", "mailboxToken", "smtpPassword"}`, mode 0600) instead of
    /// email and password. When it does not exist and `aamp_url` is set, the bridge registers
    /// a mailbox with the AAMP service and writes it.
    pub credentials_file: Option<PathBuf>,
    /// For registration: the wanted address prefix (default: the mailbox's name).
    pub slug: Option<String>,
    /// For registration: what the mailbox is for.
    pub description: Option<String>,
    /// The JMAP session URL (`https://host/.well-known/jmap`) or the server's base URL.
    #[serde(default)]
    pub jmap_url: String,
    /// Login name for JMAP and SMTP; default: `email`.
    pub login: Option<String>,
    /// The password inline (the config file must then be private), or ...
    pub password: Option<String>,
    /// ... a file holding it (mode 0600), which is preferred.
    pub password_file: Option<PathBuf>,
    #[serde(default)]
    pub smtp_host: String,
    pub smtp_port: Option<u16>,
    #[serde(default)]
    pub smtp_security: SmtpSecurity,
    /// (Written here, among the AAMP keys, where it always was.)
    #[serde(flatten, skip_deserializing)]
    pub common: MailboxCommon,
    /// Allow plain `http://` in `jmap_url`/`aamp_url` to a host that is not loopback: the
    /// password then crosses the network unencrypted. Off unless set.
    #[serde(default, skip_serializing_if = "is_false")]
    pub insecure_http: bool,
    /// Use JMAP push when the server offers it.
    #[serde(default = "default_true")]
    pub push: bool,
    /// Which push: `auto` (WebSocket, else EventSource), `websocket` or `eventsource`.
    #[serde(default)]
    pub push_transport: PushTransport,
    /// The AAMP service in front of the mail server (its `/.well-known/aamp`), for live task
    /// streams. Without it tasks run without a stream.
    pub aamp_url: Option<String>,
    /// Keep a copy of every mail the bridge sends in this mailbox's Sent folder.
    #[serde(default = "default_true")]
    pub save_sent: bool,
    /// What makes a `From:` believable (see docs/security.md): `auto` (the
    /// default: this server's authenticated submission, or `Authentication-Results` from
    /// `authserv_id` when set), `submission`, `authentication-results`, or `none`.
    #[serde(default)]
    pub sender_auth: SenderAuth,
    /// The receiving server's RFC 8601 authserv-id, whose `Authentication-Results` are
    /// believed (dmarc=pass, or dkim/spf pass aligned with the From domain).
    pub authserv_id: Option<String>,
    /// While push is up, seconds between safety polls (a missed push costs at most this).
    #[serde(default = "default_reconcile_secs")]
    pub reconcile_interval_secs: u64,
    /// Several bridges serve this mailbox: this one's name among them (letters, digits and
    /// `-`). Each dispatch is claimed on the mail server before it is acknowledged, and run
    /// by the one replica that won the claim (see docs/durability.md). Only AAMP
    /// mailboxes have it: the other systems mark a message read for whoever asks, so two
    /// bridges there would both run a task.
    pub replica: Option<String>,
    /// With `replica`: seconds a claim holds without being renewed; a replica that stops
    /// renewing (it died) loses its tasks to the others after this.
    #[serde(default = "default_lease_secs")]
    pub lease_secs: u64,
}

impl fmt::Debug for AampMailbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AampMailbox")
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

/// `kind = "amp"`: a mailbox on an AMP broker.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmpMailbox {
    /// The broker's base URL.
    pub amp_url: Option<String>,
    /// The agent's address on the broker (`name@user.domain`).
    pub address: Option<String>,
    /// The agent's id on the broker (from `POST /agents/register`).
    pub agent_id: Option<String>,
    /// A file holding the user's API key (`amk_...`), mode 0600.
    pub api_key_file: Option<PathBuf>,
    /// A message body larger than this is not taken as a task; it is answered rejected,
    /// saying so (default 16 MiB).
    pub max_message_bytes: Option<u64>,
    /// Every this many seconds (and at each start) the newest messages are read even when
    /// the inbox's counts did not change, for an arrival that a message archived or trashed
    /// at the same time hid from them (default 300; 0: never).
    pub recheck_secs: Option<u64>,
    /// Seconds one HTTP call to the broker may take (default 120, since the broker renders
    /// every message it returns).
    pub timeout_secs: Option<u64>,
    #[serde(flatten, skip_deserializing)]
    pub common: MailboxCommon,
}

/// `kind = "asmtp"`: a mailbox on an ASMTP operator.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AsmtpMailbox {
    /// The operator's base URL.
    pub asmtp_url: Option<String>,
    /// The agent's handle (`@owner.name`).
    pub handle: Option<String>,
    /// A file holding the agent's bearer token, mode 0600.
    pub token_file: Option<PathBuf>,
    /// At the first start, begin with what arrives from then on instead of answering the
    /// unread envelopes already waiting.
    #[serde(default, skip_serializing_if = "is_false")]
    pub skip_backlog: bool,
    /// An envelope larger than this (by the operator's `size_hint`) is not fetched; it is
    /// answered rejected, saying so (default 16 MiB), so one message cannot cost the bridge
    /// more than that.
    pub max_message_bytes: Option<u64>,
    /// Seconds one HTTP call to the operator may take (default 30).
    pub timeout_secs: Option<u64>,
    #[serde(flatten, skip_deserializing)]
    pub common: MailboxCommon,
}

/// `kind = "samp"`: a mailbox on a SAMP server (Agent Mailbox, over MCP).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SampMailbox {
    /// The server's MCP endpoint (`https://.../mcp`).
    pub samp_url: Option<String>,
    /// A file holding the agent's `amk_...` bearer key, mode 0600.
    pub key_file: Option<PathBuf>,
    /// Seconds one HTTP call to the server may take (default 60).
    pub timeout_secs: Option<u64>,
    #[serde(flatten, skip_deserializing)]
    pub common: MailboxCommon,
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

fn default_poll_secs() -> u64 {
    5
}
