//! What a mailbox system gives, whichever it is: a [`System`] (how an agent's mailbox on it is
//! opened, and how `doctor` reads one once), and an opened mailbox's [`Outlet`] (where answers
//! go, the one [`Backend`](crate::backend::Backend) dispatch sees) and [`Intake`] (how its mail
//! comes in). Each back-end's folder gives its `SYSTEM`; `mailbox::kinds` chooses one by the
//! mailbox's kind. Names no back-end.

use std::future::Future;
use std::pin::Pin;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::error::OpenError;
use super::intake::DeliverError;
use super::link::Link;
use super::MailboxError;
use crate::backend::{Backend, BackendError, ClaimOutcome, Earlier};
use crate::config::{AgentConfig, ConfigError, LoadedConfig, Secret};
use crate::error::{Classify as _, ErrorClass};
use crate::events::Events;
use crate::inbound::{Attachment, Mail};
use crate::protocol::RenderedMail;

/// A future a back-end hands out behind the outlet, boxed.
pub type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where each mail an intake reads goes (dispatch's `deliver`).
pub type Deliver = Box<dyn FnMut(Mail) -> Result<(), DeliverError> + Send>;

/// What opening an agent's mailbox is given.
pub struct Opening<'a> {
    pub config: &'a LoadedConfig,
    pub agent: &'a AgentConfig,
    pub events: Events,
    /// Where work a back-end keeps beside the outbox runs (AAMP's Sent copies).
    pub services: &'a TaskTracker,
    /// Stops that work.
    pub outbox_stop: &'a CancellationToken,
}

/// Opens an agent's mailbox on one system: its outlet and its intake.
pub type OpenFn = for<'a> fn(Opening<'a>) -> Boxed<'a, Result<(Outlet, Intake), OpenError>>;

/// Reads the named mailbox of one system once.
pub type ProbeFn = for<'a> fn(&'a LoadedConfig, &'a str) -> Boxed<'a, Result<Probe, ConfigError>>;

/// One mailbox system, as its folder gives it.
pub struct System {
    /// Opens an agent's mailbox on it: its outlet and its intake.
    pub open: OpenFn,
    /// Reads the named mailbox once, as `doctor` and `init` check one; `None` for a system
    /// checked its own way (AAMP: JMAP and SMTP, by `doctor` itself).
    pub probe: Option<ProbeFn>,
}

/// One read of a mailbox, as `doctor` and `init` check one.
pub struct Probe {
    /// `ASMTP`, `AMP`, `SAMP`.
    pub system: &'static str,
    /// The agent's address there.
    pub address: String,
    /// What was read, or why not.
    pub result: Result<String, MailboxError>,
    /// What to check when the read failed: for a refused credential, and otherwise.
    pub auth_fix: &'static str,
    pub other_fix: &'static str,
}

/// A back-end's outbound half: the seam, plus what the outlet asks of every back-end.
#[async_trait::async_trait]
pub trait Answering: Backend {
    /// The mailbox's credentials, which its intake shares.
    fn secret(&self) -> &Secret;

    /// What the back-end publishes about the agent (AAMP: its directory card), published
    /// again after a reload. Nothing by default.
    async fn republish(&self, config: &LoadedConfig, agent: &AgentConfig, events: Events) {
        let _ = (config, agent, events);
    }
}

/// Makes a back-end's replies type `$t` whose outlet only submits answers (AMP, ASMTP, SAMP:
/// a `client` field with the mailbox's `secret()`, and a `submit` of its own) the outbound
/// seam: no attachments, streams, threads or claims (the trait's defaults).
macro_rules! answers_only {
    ($t:ident) => {
        #[async_trait::async_trait]
        impl $crate::backend::Backend for $t {
            async fn submit(
                &self,
                mail: &$crate::protocol::RenderedMail,
            ) -> Result<(), $crate::backend::BackendError> {
                Ok($t::submit(self, mail).await?)
            }
        }

        impl $crate::mailbox::outlet::Answering for $t {
            fn secret(&self) -> &$crate::config::Secret {
                self.client.secret()
            }
        }
    };
}
pub(crate) use answers_only;

/// Where one agent's answers go: its mailbox back-end, whichever system it is on.
pub struct Outlet(Box<dyn Answering>);

impl Outlet {
    pub fn new(backend: impl Answering) -> Outlet {
        Outlet(Box::new(backend))
    }

    /// The mailbox's credentials, which its intake shares.
    pub fn secret(&self) -> &Secret {
        self.0.secret()
    }

    /// What the back-end publishes about the agent (AAMP: its directory card), published
    /// again after a reload.
    pub async fn republish(&self, config: &LoadedConfig, agent: &AgentConfig, events: Events) {
        self.0.republish(config, agent, events).await
    }
}

/// What an intake is given to run with.
pub struct Reading {
    /// The agent's name.
    pub name: String,
    /// The mailbox's link state, for `status`.
    pub link: Link,
    pub deliver: Deliver,
    pub events: Events,
    pub stop: CancellationToken,
}

/// How an agent's mail comes in: its back-end's reading loop, with where its reading stands.
pub struct Intake(Box<dyn FnOnce(Reading) -> Boxed<'static, ()> + Send>);

impl Intake {
    pub fn new(run: impl FnOnce(Reading) -> Boxed<'static, ()> + Send + 'static) -> Intake {
        Intake(Box::new(run))
    }

    /// Reads the mailbox until `stop`, handing each mail to `deliver`.
    pub async fn run(
        self,
        name: String,
        link: Link,
        deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send + 'static,
        events: Events,
        stop: CancellationToken,
    ) {
        (self.0)(Reading {
            name,
            link,
            deliver: Box::new(deliver),
            events,
            stop,
        })
        .await
    }
}

/// Forwards each method to the back-end; `submit` reads refused credentials again.
#[async_trait::async_trait]
impl Backend for Outlet {
    /// Refused credentials are read again from their file: when it holds others (replaced
    /// without a reload), the mail is sent again with them at once.
    async fn submit(&self, mail: &RenderedMail) -> Result<(), BackendError> {
        let secret = self.secret();
        let tried = secret.generation();
        match self.0.submit(mail).await {
            Ok(()) => {
                secret.worked(true);
                Ok(())
            }
            Err(e) if e.class() == ErrorClass::Auth => {
                if secret.generation() != tried {
                    // Replaced while this attempt was under way (a reload): sent again with
                    // the new one, not left for the 5-minute retry.
                    return self.0.submit(mail).await;
                }
                secret.worked(false);
                match secret.reread() {
                    Ok(true) => self.0.submit(mail).await,
                    Ok(false) => Err(e),
                    Err(read) => {
                        tracing::warn!(error = %read, "cannot read the credentials of {} again", secret.mailbox());
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn download(&self, attachment: &Attachment, max: u64) -> Result<Vec<u8>, BackendError> {
        self.0.download(attachment, max).await
    }

    async fn open_stream(&self, task_id: &str, peer: &str) -> Option<String> {
        self.0.open_stream(task_id, peer).await
    }

    async fn pump_stream(
        &self,
        stream_id: &str,
        events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> usize {
        self.0.pump_stream(stream_id, events).await
    }

    async fn thread(&self, task_id: &str) -> Vec<Earlier> {
        self.0.thread(task_id).await
    }

    async fn close_stream(&self, stream_id: &str, payload: serde_json::Value) {
        self.0.close_stream(stream_id, payload).await
    }

    async fn claim(&self, email_id: &str) -> Result<ClaimOutcome, BackendError> {
        self.0.claim(email_id).await
    }

    async fn renew_claim(&self, email_id: &str) -> Result<bool, BackendError> {
        self.0.renew_claim(email_id).await
    }

    async fn claim_done(&self, email_id: &str) -> Result<bool, BackendError> {
        self.0.claim_done(email_id).await
    }
}
