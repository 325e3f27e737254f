//! SMTP submission with lettre: STARTTLS required by default, implicit TLS by config, plain
//! text only to loopback (the config refuses anything else). Certificates are verified unless
//! the mailbox is marked `insecure_tls`.

use std::time::{Duration, Instant};

use lettre::address::Envelope;
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::Address;

use super::MailboxError;
use crate::config::{Account, SmtpSecurity};
use crate::error::ErrorClass;
use crate::protocol::RenderedMail;

/// How long one SMTP exchange (connect and log in, or one mail) may take.
const EXCHANGE: Duration = Duration::from_secs(60);
/// A connection idle this long is closed rather than reused (servers time idle ones out).
const IDLE: Duration = Duration::from_secs(50);

/// One account's SMTP submission: a connection kept open between mails (EHLO, TLS and AUTH
/// once, not per mail), with `TCP_NODELAY`, since lettre writes a mail's end (`.`) apart from
/// its body and Nagle's algorithm then waits for the server's delayed ACK (40 ms a mail).
pub struct SmtpSender {
    host: String,
    port: u16,
    security: SmtpSecurity,
    tls: Option<TlsParameters>,
    login: String,
    /// Read at each login, so a replaced password is used by the next connection.
    password: crate::config::Secret,
    hello: ClientId,
    server: String,
    /// The open connection and when it was last used.
    open: tokio::sync::Mutex<Option<(AsyncSmtpConnection, Instant)>>,
}

impl SmtpSender {
    pub fn new(account: &Account) -> Result<SmtpSender, MailboxError> {
        let server = format!("{}:{}", account.smtp_host, account.smtp_port);
        let tls = match account.smtp_security {
            SmtpSecurity::Plain => None,
            SmtpSecurity::Starttls | SmtpSecurity::Tls => Some(
                TlsParameters::builder(account.smtp_host.clone())
                    .dangerous_accept_invalid_certs(account.insecure_tls)
                    .dangerous_accept_invalid_hostnames(account.insecure_tls)
                    .build_rustls()
                    .map_err(|e| MailboxError::Smtp {
                        server: server.clone(),
                        detail: format!("TLS setup: {e}"),
                        class: ErrorClass::Permanent,
                        certificate: false,
                    })?,
            ),
        };
        Ok(SmtpSender {
            host: account.smtp_host.clone(),
            port: account.smtp_port,
            security: account.smtp_security,
            tls,
            login: account.login.clone(),
            password: account.password.clone(),
            hello: ClientId::default(),
            server,
            open: tokio::sync::Mutex::new(None),
        })
    }

    fn error(&self, e: &lettre::transport::smtp::Error) -> MailboxError {
        MailboxError::Smtp {
            server: self.server.clone(),
            detail: crate::mailbox::error::explain(e),
            class: classify(e),
            certificate: crate::mailbox::error::certificate_refused(e),
        }
    }

    fn timed_out(&self, what: &str) -> MailboxError {
        MailboxError::Smtp {
            server: self.server.clone(),
            detail: format!("{what} took longer than {}s", EXCHANGE.as_secs()),
            class: ErrorClass::Transient,
            certificate: false,
        }
    }

    /// Connects, says EHLO, sets up TLS as configured, and logs in.
    async fn connect(&self) -> Result<AsyncSmtpConnection, MailboxError> {
        let work = async {
            let mut connection = match (self.security, &self.tls) {
                (SmtpSecurity::Tls, Some(tls)) => AsyncSmtpConnection::connect_tokio1(
                    (self.host.as_str(), self.port),
                    Some(EXCHANGE),
                    &self.hello,
                    Some(tls.clone()),
                    None,
                )
                .await
                .map_err(|e| self.error(&e))?,
                _ => {
                    let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
                        .await
                        .map_err(|e| MailboxError::Smtp {
                            server: self.server.clone(),
                            detail: format!(
                                "cannot connect: {}",
                                crate::mailbox::error::explain(&e)
                            ),
                            class: ErrorClass::Transient,
                            certificate: false,
                        })?;
                    let _ = tcp.set_nodelay(true);
                    let mut connection =
                        AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &self.hello)
                            .await
                            .map_err(|e| self.error(&e))?;
                    if let (SmtpSecurity::Starttls, Some(tls)) = (self.security, &self.tls) {
                        if !connection.can_starttls() {
                            return Err(MailboxError::Smtp {
                                server: self.server.clone(),
                                detail: "the server does not offer STARTTLS, and smtp_security = \"starttls\" requires it".into(),
                                class: ErrorClass::Permanent,
                                certificate: false,
                            });
                        }
                        connection
                            .starttls(tls.clone(), &self.hello)
                            .await
                            .map_err(|e| self.error(&e))?;
                    }
                    connection
                }
            };
            connection
                .auth(
                    &[Mechanism::Plain, Mechanism::Login],
                    &Credentials::new(self.login.clone(), self.password.value()),
                )
                .await
                .map_err(|e| self.error(&e))?;
            Ok(connection)
        };
        tokio::time::timeout(EXCHANGE, work)
            .await
            .map_err(|_| self.timed_out("connecting and logging in"))?
    }

    /// Connects, says EHLO, upgrades to TLS as configured, logs in, and quits: what sending
    /// needs, without sending anything.
    pub async fn check(&self) -> Result<(), MailboxError> {
        let mut connection = self.connect().await?;
        let _ = connection.quit().await;
        Ok(())
    }

    /// Submits one rendered mail, on the open connection when there is a live one.
    pub async fn send(&self, mail: &RenderedMail) -> Result<(), MailboxError> {
        let parse = |a: &str| {
            a.parse::<Address>()
                .map_err(|e| MailboxError::Address(format!("{a:?} is not a usable address: {e}")))
        };
        let to = mail
            .to
            .iter()
            .map(|a| parse(a))
            .collect::<Result<Vec<_>, _>>()?;
        let envelope = Envelope::new(Some(parse(&mail.from)?), to)
            .map_err(|e| MailboxError::Address(e.to_string()))?;
        let mut open = self.open.lock().await;
        let kept = open
            .take()
            .filter(|(c, used)| !c.has_broken() && used.elapsed() < IDLE);
        let reused = kept.is_some();
        let mut connection = match kept {
            Some((c, _)) => c,
            None => self.connect().await?,
        };
        let sent = tokio::time::timeout(EXCHANGE, connection.send(&envelope, &mail.bytes)).await;
        match sent {
            Ok(Ok(_)) => {
                *open = Some((connection, Instant::now()));
                Ok(())
            }
            // A kept connection the server closed meanwhile fails before the mail is taken:
            // once more on a new one.
            Ok(Err(e)) if reused && !e.is_permanent() && e.status().is_none() => {
                tracing::debug!(error = %e, "the kept SMTP connection is gone; connecting again");
                let mut connection = self.connect().await?;
                match tokio::time::timeout(EXCHANGE, connection.send(&envelope, &mail.bytes)).await
                {
                    Ok(Ok(_)) => {
                        *open = Some((connection, Instant::now()));
                        Ok(())
                    }
                    Ok(Err(e)) => Err(self.error(&e)),
                    Err(_) => Err(self.timed_out("sending a mail")),
                }
            }
            Ok(Err(e)) => {
                // A refused mail leaves the connection usable; anything else does not.
                if e.status().is_some() && !connection.has_broken() {
                    *open = Some((connection, Instant::now()));
                }
                Err(self.error(&e))
            }
            Err(_) => Err(self.timed_out("sending a mail")),
        }
    }
}

fn classify(e: &lettre::transport::smtp::Error) -> ErrorClass {
    let code = e.status().map(|c| c.to_string());
    match code.as_deref() {
        Some("535") | Some("530") | Some("534") | Some("454")
            if e.is_permanent() || code.as_deref() == Some("454") =>
        {
            // 454 is "temporary authentication failure"; 53x are refused credentials.
            if code.as_deref() == Some("454") {
                ErrorClass::Transient
            } else {
                ErrorClass::Auth
            }
        }
        _ if e.is_permanent() => ErrorClass::Permanent,
        _ if e.is_tls() => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}
