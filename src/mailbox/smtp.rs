//! SMTP submission with lettre: STARTTLS required by default, implicit TLS by config, plain
//! text only to loopback (the config refuses anything else). Certificates are verified unless
//! the mailbox is marked `insecure_tls`.

use std::time::Duration;

use lettre::address::Envelope;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{Address, AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use super::MailboxError;
use crate::config::{Account, SmtpSecurity};
use crate::error::ErrorClass;
use crate::protocol::RenderedMail;

pub struct SmtpSender {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    server: String,
}

impl SmtpSender {
    pub fn new(account: &Account) -> Result<SmtpSender, MailboxError> {
        let server = format!("{}:{}", account.smtp_host, account.smtp_port);
        let tls = || {
            TlsParameters::builder(account.smtp_host.clone())
                .dangerous_accept_invalid_certs(account.insecure_tls)
                .dangerous_accept_invalid_hostnames(account.insecure_tls)
                .build_rustls()
                .map_err(|e| MailboxError::Smtp {
                    server: server.clone(),
                    detail: format!("TLS setup: {e}"),
                    class: ErrorClass::Permanent,
                })
        };
        let tls = match account.smtp_security {
            SmtpSecurity::Starttls => Tls::Required(tls()?),
            SmtpSecurity::Tls => Tls::Wrapper(tls()?),
            SmtpSecurity::Plain => Tls::None,
        };
        let transport =
            AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(account.smtp_host.clone())
                .port(account.smtp_port)
                .tls(tls)
                .credentials(Credentials::new(
                    account.login.clone(),
                    account.password.clone(),
                ))
                .timeout(Some(Duration::from_secs(60)))
                .build();
        Ok(SmtpSender { transport, server })
    }

    /// Connects, says EHLO, upgrades to TLS as configured, logs in, and quits: what sending
    /// needs, without sending anything.
    pub async fn check(&self) -> Result<(), MailboxError> {
        match self.transport.test_connection().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(MailboxError::Smtp {
                server: self.server.clone(),
                detail: "the server did not answer NOOP".into(),
                class: ErrorClass::Transient,
            }),
            Err(e) => Err(MailboxError::Smtp {
                server: self.server.clone(),
                detail: e.to_string(),
                class: classify(&e),
            }),
        }
    }

    /// Submits one rendered mail.
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
        self.transport
            .send_raw(&envelope, &mail.bytes)
            .await
            .map(|_| ())
            .map_err(|e| {
                let class = classify(&e);
                MailboxError::Smtp {
                    server: self.server.clone(),
                    detail: e.to_string(),
                    class,
                }
            })
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
