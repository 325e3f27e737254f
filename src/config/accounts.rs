//! Mailboxes resolved for use: each kind's values checked (with the key and the fix in every
//! error), secrets read from 0600 files, URLs checked (plain http only to loopback unless
//! the mailbox says so), and AAMP service registrations.

use super::*;

/// A mailbox with its password resolved.
#[derive(Clone)]
pub struct Account {
    pub name: String,
    pub email: String,
    pub jmap_url: url::Url,
    pub login: String,
    /// The password, read again at a reload or when the server refused it.
    pub password: Secret,
    pub smtp_host: String,
    pub smtp_port: u16,
    pub smtp_security: SmtpSecurity,
    pub insecure_tls: bool,
    pub poll_interval: std::time::Duration,
    pub push: bool,
    pub push_transport: PushTransport,
    pub reconcile_interval: std::time::Duration,
    pub save_sent: bool,
    pub aamp_url: Option<url::Url>,
    pub sender_auth: SenderAuth,
    pub authserv_id: Option<String>,
    /// This bridge's name among the replicas serving the mailbox, and the claims' lease.
    pub replica: Option<Replica>,
}

/// One of several bridges serving a mailbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// Lowercase letters, digits and `-`.
    pub name: String,
    /// How long a claim holds unless renewed.
    pub lease: std::time::Duration,
}

impl fmt::Debug for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Account")
            .field("name", &self.name)
            .field("email", &self.email)
            .field("jmap_url", &self.jmap_url.as_str())
            .field("smtp", &format!("{}:{}", self.smtp_host, self.smtp_port))
            .finish_non_exhaustive()
    }
}

/// An AMP mailbox, checked and with its API key read.
#[derive(Clone, Debug)]
pub struct AmpAccount {
    pub name: String,
    pub url: url::Url,
    pub address: String,
    pub agent_id: String,
    /// The API key, read again at a reload or when the broker refused it.
    pub api_key: Secret,
    pub poll_interval: std::time::Duration,
    /// How long one HTTP call may take.
    pub timeout: std::time::Duration,
    /// How often the newest messages are read although the counts did not change (`None`:
    /// only at each start).
    pub recheck: Option<std::time::Duration>,
    pub insecure_tls: bool,
    /// The largest message body taken as a task; a larger one is answered rejected.
    pub max_message_bytes: u64,
}

/// A SAMP mailbox (Agent Mailbox, an MCP server), checked and with its key read. The agent's
/// name is not configured: the server's `whoami` tells it.
#[derive(Clone, Debug)]
pub struct SampAccount {
    pub name: String,
    /// The MCP endpoint (`.../mcp`).
    pub url: url::Url,
    /// The `amk_` bearer key, read again at a reload or when the server refused it.
    pub key: Secret,
    pub poll_interval: std::time::Duration,
    /// How long one HTTP call may take.
    pub timeout: std::time::Duration,
    pub insecure_tls: bool,
}

/// What every kind's checked account tells, whatever the kind.
pub trait Checked {
    /// The address mail to the mailbox (configured as `name`) goes to.
    fn address(&self, name: &str) -> String;
    /// The mailbox's secret (password, key or token).
    fn secret(&self) -> &Secret;
}

impl Checked for Account {
    fn address(&self, _: &str) -> String {
        self.email.clone()
    }
    fn secret(&self) -> &Secret {
        &self.password
    }
}

impl Checked for AmpAccount {
    fn address(&self, _: &str) -> String {
        self.address.clone()
    }
    fn secret(&self) -> &Secret {
        &self.api_key
    }
}

/// The agent's name is the server's to tell, so the address is the bridge's own name for the
/// mailbox, `MAILBOX@HOST`.
impl Checked for SampAccount {
    fn address(&self, name: &str) -> String {
        format!("{name}@{}", self.url.host_str().unwrap_or("samp"))
    }
    fn secret(&self) -> &Secret {
        &self.key
    }
}

/// An ASMTP mailbox, checked and with its token read.
#[derive(Clone, Debug)]
pub struct AsmtpAccount {
    pub name: String,
    pub url: url::Url,
    pub handle: String,
    /// The bearer token, read again at a reload or when the operator refused it.
    pub token: Secret,
    pub poll_interval: std::time::Duration,
    /// How long one HTTP call may take.
    pub timeout: std::time::Duration,
    pub insecure_tls: bool,
    /// At the first start, skip the unread envelopes already waiting.
    pub skip_backlog: bool,
    /// The largest envelope fetched; a larger one is answered rejected.
    pub max_message_bytes: u64,
}

impl Checked for AsmtpAccount {
    fn address(&self, _: &str) -> String {
        self.handle.clone()
    }
    fn secret(&self) -> &Secret {
        &self.token
    }
}

impl LoadedConfig {
    /// Plain `http://` to a host that is not loopback sends the mailbox's password in clear:
    /// refused unless the mailbox says `insecure_http = true`.
    fn refuse_cleartext(
        &self,
        key: &str,
        field: &str,
        url: &url::Url,
        allowed: bool,
    ) -> Result<(), ConfigError> {
        if url.scheme() == "http" && !allowed && !url.host_str().is_some_and(is_loopback) {
            return Err(self.error(
                format!("{key}.{field}"),
                format!(
                    "plain http to {} would send the password unencrypted",
                    url.host_str().unwrap_or_default()
                ),
                "use https; or, only on a network you trust, set insecure_http = true on this mailbox",
            ));
        }
        Ok(())
    }

    /// A secret read from a 0600 file named by `key` (relative to the config's folder), for
    /// mailbox `mailbox`.
    fn secret_file(
        &self,
        mailbox: &str,
        key: &str,
        file: Option<&PathBuf>,
        what: &str,
        form: SecretForm,
    ) -> Result<Secret, ConfigError> {
        let file = file.ok_or_else(|| {
            self.error(
                key,
                "missing",
                format!("set it to a file holding {what} (mode 0600)"),
            )
        })?;
        let file = self.path.parent().unwrap_or(Path::new(".")).join(file);
        Secret::from_file(mailbox, &file, form).map_err(|e| match e {
            SecretError::NotPrivate(_) => self.error(
                key,
                format!("{} can be read by other users", file.display()),
                format!("run `chmod 600 {}`", file.display()),
            ),
            e => self.error(
                key,
                e.to_string(),
                format!("point it at a readable file that holds only {what}"),
            ),
        })
    }

    /// A broker or operator URL: http(s), and plain http only to a loopback host (the
    /// credential would cross the network unencrypted).
    fn service_url(
        &self,
        key: &str,
        text: Option<&String>,
        example: &str,
    ) -> Result<url::Url, ConfigError> {
        let text = text
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| self.error(key, "missing", format!("set it, e.g. {example}")))?;
        let url = self.http_url(key, text, example)?;
        if url.scheme() == "http" && !url.host_str().is_some_and(is_loopback) {
            return Err(self.error(
                key,
                "plain http would send the credential unencrypted",
                "use https; http is only allowed to a loopback host",
            ));
        }
        Ok(url)
    }

    /// The named mailbox and its config key (`mailboxes.<name>`).
    fn mailbox(&self, name: &str) -> Result<(String, &MailboxConfig), ConfigError> {
        let key = format!("mailboxes.{name}");
        let m = self.config.mailboxes.get(name).ok_or_else(|| {
            self.error(
                &key,
                "no such mailbox",
                format!("use one of: {}", self.mailbox_names()),
            )
        })?;
        Ok((key, m))
    }

    /// The named mailbox is not of `wanted`, which the caller needs.
    fn not_of_kind(&self, key: &str, m: &MailboxConfig, wanted: MailboxKind) -> ConfigError {
        self.error(
            format!("{key}.kind"),
            format!(
                "is kind = {:?}, and this needs a mailbox of kind = {:?}",
                m.kind().tag(),
                wanted.tag()
            ),
            format!("this works with {} mailboxes only", wanted.name()),
        )
    }

    /// A mailbox's polling interval: at least a second.
    fn poll_interval(
        &self,
        key: &str,
        m: &MailboxCommon,
    ) -> Result<std::time::Duration, ConfigError> {
        if m.poll_interval_secs == 0 {
            return Err(self.error(
                format!("{key}.poll_interval_secs"),
                "must be at least 1",
                "set it to 1 or more seconds",
            ));
        }
        Ok(std::time::Duration::from_secs(m.poll_interval_secs))
    }

    /// How long one HTTP call to an AMP broker or ASMTP operator may take.
    fn call_timeout(
        &self,
        key: &str,
        timeout_secs: Option<u64>,
        default_secs: u64,
    ) -> Result<std::time::Duration, ConfigError> {
        match timeout_secs {
            Some(0) => Err(self.error(
                format!("{key}.timeout_secs"),
                "must be at least 1",
                "set it to 1 or more seconds, or leave it out for the default",
            )),
            secs => Ok(std::time::Duration::from_secs(secs.unwrap_or(default_secs))),
        }
    }

    /// The named ASMTP mailbox with its token read and its settings checked.
    pub fn asmtp_account(&self, name: &str) -> Result<AsmtpAccount, ConfigError> {
        let (key, m) = self.mailbox(name)?;
        let MailboxConfig::Asmtp(m) = m else {
            return Err(self.not_of_kind(&key, m, MailboxKind::Asmtp));
        };
        let url = self.service_url(
            &format!("{key}.asmtp_url"),
            m.asmtp_url.as_ref(),
            "https://asmtp.example.com",
        )?;
        let handle = m.handle.clone().unwrap_or_default();
        let valid = handle
            .strip_prefix('@')
            .and_then(|h| h.split_once('.'))
            .is_some_and(|(owner, agent)| {
                let ok = |s: &str| {
                    !s.is_empty()
                        && s.chars().all(|c| {
                            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
                        })
                };
                ok(owner) && ok(agent)
            });
        if !valid {
            return Err(self.error(
                format!("{key}.handle"),
                format!("{handle:?} is not an ASMTP handle"),
                "write the agent's handle, @owner.name (lower-case letters, digits, _ and -)",
            ));
        }
        let token = self.secret_file(
            name,
            &format!("{key}.token_file"),
            m.token_file.as_ref(),
            "the agent's bearer token",
            SecretForm::Trimmed,
        )?;
        let poll_interval = self.poll_interval(&key, &m.common)?;
        let timeout = self.call_timeout(&key, m.timeout_secs, 30)?;
        Ok(AsmtpAccount {
            name: name.to_string(),
            url,
            handle,
            token,
            poll_interval,
            timeout,
            insecure_tls: m.common.insecure_tls,
            skip_backlog: m.skip_backlog,
            max_message_bytes: m.max_message_bytes.unwrap_or(16 << 20),
        })
    }

    /// The named SAMP mailbox with its key read and its settings checked.
    pub fn samp_account(&self, name: &str) -> Result<SampAccount, ConfigError> {
        let (key, m) = self.mailbox(name)?;
        let MailboxConfig::Samp(m) = m else {
            return Err(self.not_of_kind(&key, m, MailboxKind::Samp));
        };
        let url = self.service_url(
            &format!("{key}.samp_url"),
            m.samp_url.as_ref(),
            "https://mailbox.example.com/mcp",
        )?;
        let secret = self.secret_file(
            name,
            &format!("{key}.key_file"),
            m.key_file.as_ref(),
            "the agent's amk_ key",
            SecretForm::Trimmed,
        )?;
        let poll_interval = self.poll_interval(&key, &m.common)?;
        let timeout = self.call_timeout(&key, m.timeout_secs, 60)?;
        Ok(SampAccount {
            name: name.to_string(),
            url,
            key: secret,
            poll_interval,
            timeout,
            insecure_tls: m.common.insecure_tls,
        })
    }

    /// The named AMP mailbox with its API key read and its settings checked.
    pub fn amp_account(&self, name: &str) -> Result<AmpAccount, ConfigError> {
        let (key, m) = self.mailbox(name)?;
        let MailboxConfig::Amp(m) = m else {
            return Err(self.not_of_kind(&key, m, MailboxKind::Amp));
        };
        let need = |field: &Option<String>, what: &str, fix: &str| {
            field
                .clone()
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| self.error(format!("{key}.{what}"), "missing", fix))
        };
        let url = self.service_url(
            &format!("{key}.amp_url"),
            m.amp_url.as_ref(),
            "https://amp.example.com",
        )?;
        let address = need(
            &m.address,
            "address",
            "set address = \"<name>@<user>.<broker domain>\"",
        )?;
        if !address.contains('@') {
            return Err(self.error(
                format!("{key}.address"),
                format!("{address:?} is not an AMP address"),
                "write the agent's full address, name@user.domain",
            ));
        }
        let agent_id = need(
            &m.agent_id,
            "agent_id",
            "set agent_id = \"<the id POST /agents/register gave>\"",
        )?;
        let api_key = self.secret_file(
            name,
            &format!("{key}.api_key_file"),
            m.api_key_file.as_ref(),
            "the user's amk_ API key",
            SecretForm::Trimmed,
        )?;
        let poll_interval = self.poll_interval(&key, &m.common)?;
        let timeout = self.call_timeout(&key, m.timeout_secs, 120)?;
        let recheck = match m.recheck_secs.unwrap_or(300) {
            0 => None,
            secs => Some(std::time::Duration::from_secs(secs)),
        };
        Ok(AmpAccount {
            name: name.to_string(),
            url,
            address,
            agent_id,
            api_key,
            poll_interval,
            timeout,
            recheck,
            insecure_tls: m.common.insecure_tls,
            max_message_bytes: m.max_message_bytes.unwrap_or(16 << 20),
        })
    }

    /// The named mailbox with its password read and its settings checked.
    pub fn account(&self, name: &str) -> Result<Account, ConfigError> {
        let (key, m) = self.mailbox(name)?;
        let MailboxConfig::Aamp(m) = m else {
            return Err(self.not_of_kind(&key, m, MailboxKind::Aamp));
        };
        let jmap_url = self.http_url(
            &format!("{key}.jmap_url"),
            &m.jmap_url,
            "https://mail.example.com/.well-known/jmap",
        )?;
        self.refuse_cleartext(&key, "jmap_url", &jmap_url, m.insecure_http)?;
        let (email, password) = self.aamp_login(name, &key, m)?;
        self.check_sending(&key, m, &email)?;
        let poll_interval = self.poll_interval(&key, &m.common)?;
        self.check_sender_auth(&key, m)?;
        let replica = self.replica(&key, m)?;
        let aamp_url = match &m.aamp_url {
            None => None,
            Some(text) => {
                let url =
                    self.http_url(&format!("{key}.aamp_url"), text, "https://aamp.example.com")?;
                self.refuse_cleartext(&key, "aamp_url", &url, m.insecure_http)?;
                Some(url)
            }
        };
        Ok(Account {
            replica,
            sender_auth: m.sender_auth,
            authserv_id: m.authserv_id.clone(),
            name: name.to_string(),
            login: m.login.clone().unwrap_or_else(|| email.clone()),
            email,
            jmap_url,
            password,
            smtp_host: m.smtp_host.clone(),
            smtp_port: m.smtp_port.unwrap_or(m.smtp_security.default_port()),
            smtp_security: m.smtp_security,
            insecure_tls: m.common.insecure_tls,
            poll_interval,
            push: m.push,
            push_transport: m.push_transport,
            save_sent: m.save_sent,
            aamp_url,
            reconcile_interval: std::time::Duration::from_secs(m.reconcile_interval_secs.max(1)),
        })
    }

    /// An http(s) URL with a host, or the error naming `key`.
    fn http_url(&self, key: &str, text: &str, example: &str) -> Result<url::Url, ConfigError> {
        url::Url::parse(text)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| {
                self.error(
                    key,
                    format!("{text:?} is not an http(s) URL"),
                    format!("write e.g. {example}"),
                )
            })
    }

    /// An AAMP mailbox's address and password: from its credentials file, or from `email`
    /// and one of `password` and `password_file`.
    fn aamp_login(
        &self,
        name: &str,
        key: &str,
        m: &AampMailbox,
    ) -> Result<(String, Secret), ConfigError> {
        let Some(file) = &m.credentials_file else {
            let email = m.email.clone().ok_or_else(|| {
                self.error(
                    key,
                    "no email",
                    "set email = \"<the mailbox's address>\", or credentials_file",
                )
            })?;
            return Ok((email, self.aamp_password(name, key, m)?));
        };
        if m.email.is_some() || m.password.is_some() || m.password_file.is_some() {
            return Err(self.error(
                key,
                "credentials_file is set together with email or a password",
                "keep credentials_file alone, or drop it and give email and password_file",
            ));
        }
        let field = format!("{key}.credentials_file");
        let file = self.path.parent().unwrap_or(Path::new(".")).join(file);
        let creds =
            read_credentials(&file).map_err(|(problem, fix)| self.error(&field, problem, fix))?;
        let password = Secret::from_file(name, &file, SecretForm::Credentials).map_err(|e| {
            self.error(
                &field,
                e.to_string(),
                "it holds {\"email\", \"mailboxToken\", \"smtpPassword\"}",
            )
        })?;
        Ok((creds.email, password))
    }

    /// The password of an AAMP mailbox without a credentials file: inline or in a file.
    fn aamp_password(&self, name: &str, key: &str, m: &AampMailbox) -> Result<Secret, ConfigError> {
        match (&m.password, &m.password_file) {
            (Some(_), Some(_)) => Err(self.error(
                key,
                "both password and password_file are set",
                "keep one of them (password_file is safer)",
            )),
            (None, None) => Err(self.error(
                key,
                "no password",
                "set password_file = \"<file holding the password>\" (mode 0600)",
            )),
            (Some(p), None) => Ok(Secret::fixed(name, p.clone())),
            (None, Some(file)) => self.secret_file(
                name,
                &format!("{key}.password_file"),
                Some(file),
                "the password",
                SecretForm::Line,
            ),
        }
    }

    /// The address is one, and plain-text SMTP only goes to a loopback host.
    fn check_sending(&self, key: &str, m: &AampMailbox, email: &str) -> Result<(), ConfigError> {
        if !email.contains('@') || email.trim() != email {
            return Err(self.error(
                format!("{key}.email"),
                format!("{email:?} is not an email address"),
                "write the mailbox's full address",
            ));
        }
        if m.smtp_security == SmtpSecurity::Plain && !is_loopback(&m.smtp_host) {
            return Err(self.error(
                format!("{key}.smtp_security"),
                format!("plain-text SMTP to {} would send the password unencrypted", m.smtp_host),
                "use \"starttls\" or \"tls\"; \"plain\" is only allowed to a loopback host (127.0.0.1, ::1, localhost)",
            ));
        }
        Ok(())
    }

    /// Believing `Authentication-Results` needs to know whose to believe.
    fn check_sender_auth(&self, key: &str, m: &AampMailbox) -> Result<(), ConfigError> {
        if m.sender_auth == SenderAuth::AuthenticationResults && m.authserv_id.is_none() {
            return Err(self.error(
                format!("{key}.authserv_id"),
                "sender_auth = \"authentication-results\" needs the server's authserv-id",
                "set authserv_id to the name your mail server writes first in its Authentication-Results headers",
            ));
        }
        Ok(())
    }

    /// This bridge as one of the mailbox's replicas, when it is one.
    fn replica(&self, key: &str, m: &AampMailbox) -> Result<Option<Replica>, ConfigError> {
        let Some(name) = &m.replica else {
            return Ok(None);
        };
        let ok = !name.is_empty()
            && name.len() <= 32
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !ok {
            return Err(self.error(
                format!("{key}.replica"),
                format!("{name:?} is not a replica name"),
                "use up to 32 letters, digits and '-' (the machine's name, say), different on each machine",
            ));
        }
        if m.lease_secs < 10 {
            return Err(self.error(
                format!("{key}.lease_secs"),
                format!("a lease of {}s is renewed too often", m.lease_secs),
                "use at least 10 (the default is 60)",
            ));
        }
        Ok(Some(Replica {
            name: name.to_ascii_lowercase(),
            lease: std::time::Duration::from_secs(m.lease_secs),
        }))
    }

    /// The secret of mailbox `name`, whatever its kind, read from its file now.
    pub fn mailbox_secret(&self, name: &str) -> Result<Secret, ConfigError> {
        Ok(self.checked(name)?.secret().clone())
    }

    /// Mailbox `name` checked, of whichever kind: the one place in the config a kind's
    /// checked account is chosen.
    pub fn checked(&self, name: &str) -> Result<Box<dyn Checked>, ConfigError> {
        Ok(match self.kind(name) {
            MailboxKind::Aamp => Box::new(self.account(name)?),
            MailboxKind::Amp => Box::new(self.amp_account(name)?),
            MailboxKind::Asmtp => Box::new(self.asmtp_account(name)?),
            MailboxKind::Samp => Box::new(self.samp_account(name)?),
        })
    }

    /// The registration a mailbox still needs: it has a `credentials_file` that does not exist
    /// yet, and an `aamp_url` to register with.
    pub fn registration(&self, name: &str) -> Option<Registration> {
        let m = self.config.mailboxes.get(name)?.aamp()?;
        let base = self.path.parent().unwrap_or(Path::new("."));
        let file = base.join(m.credentials_file.as_ref()?);
        if file.exists() {
            return None;
        }
        Some(Registration {
            aamp_url: url::Url::parse(m.aamp_url.as_deref()?).ok()?,
            slug: m.slug.clone().unwrap_or_else(|| name.replace('_', "-")),
            description: m
                .description
                .clone()
                .unwrap_or_else(|| format!("aamp-bridge mailbox {name}")),
            credentials_file: file,
            insecure_tls: m.common.insecure_tls,
        })
    }
}

/// A mailbox still to be registered with its AAMP service.
#[derive(Clone, Debug)]
pub struct Registration {
    pub aamp_url: url::Url,
    pub slug: String,
    pub description: String,
    /// Where to write the credentials.
    pub credentials_file: PathBuf,
    pub insecure_tls: bool,
}

/// What a credentials file holds (the AAMP bridges' format).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    pub email: String,
    pub mailbox_token: String,
    pub smtp_password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("email", &self.email)
            .finish_non_exhaustive()
    }
}

/// Reads a credentials file, which must be private; errors as (problem, fix).
fn read_credentials(file: &Path) -> Result<Credentials, (String, String)> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        (format!("cannot read {}: {e}", file.display()), "set aamp_url so the bridge registers the mailbox and writes it, or point credentials_file at an existing file".to_string())
    })?;
    if !is_private(file) {
        return Err((
            format!("{} can be read by other users", file.display()),
            format!("run `chmod 600 {}`", file.display()),
        ));
    }
    serde_json::from_str(&text).map_err(|e| {
        (
            format!("{} is not a credentials file: {e}", file.display()),
            "it holds {\"email\", \"mailboxToken\", \"smtpPassword\"}".to_string(),
        )
    })
}

/// Writes a credentials file atomically with mode 0600.
pub fn write_credentials(file: &Path, credentials: &Credentials) -> std::io::Result<()> {
    crate::fsio::write_atomic(
        file,
        &serde_json::to_vec_pretty(credentials).expect("credentials serialize"),
        0o600,
    )
}
