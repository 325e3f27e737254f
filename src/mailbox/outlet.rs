//! An agent's mailbox opened: its [`Outlet`] (where answers go, the one
//! [`Backend`](crate::backend::Backend) dispatch sees, over whichever system it is) and its
//! [`Intake`] (how its mail comes in). [`open`] is the one call the daemon makes; the kind of
//! mailbox is chosen here, and each kind's code lives in its own folder.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::aamp::{self, Cursor, Reader, Sender};
use super::amp::{self, AmpClient, AmpReplies, PositionFile};
use super::asmtp::{self, AsmtpClient, AsmtpReplies, WatermarkFile};
use super::error::OpenError;
use super::intake::{self, DeliverError};
use super::link::Link;
use super::samp::{self, SampClient, SampReplies};
use crate::backend::{Backend, BackendError, ClaimOutcome, Earlier};
use crate::config::{AgentConfig, LoadedConfig, Secret};
use crate::error::{Classify as _, ErrorClass};
use crate::events::Events;
use crate::inbound::{Attachment, Mail};
use crate::protocol::RenderedMail;

/// Where one agent's answers go: its mailbox back-end.
pub enum Outlet {
    /// AAMP: SMTP submission, Sent copies, the AAMP service's streams and threads.
    Aamp(Box<Sender>),
    /// AMP: replies on the broker.
    Amp(Box<AmpReplies>),
    /// ASMTP: reply envelopes with client ids.
    Asmtp(Box<AsmtpReplies>),
    /// SAMP: `send_message` replies in the thread.
    Samp(Box<SampReplies>),
}

/// How an agent's mail comes in, with where its reading stands.
pub enum Intake {
    Aamp(Box<Reader>, Cursor),
    Asmtp(AsmtpClient, WatermarkFile),
    Amp(AmpClient, PositionFile),
    Samp(SampClient),
}

/// Opens an agent's mailbox: its outlet and its intake. Work a back-end keeps beside the
/// outbox (AAMP's Sent copies) runs on `services` until `outbox_stop`.
pub async fn open(
    config: &LoadedConfig,
    agent: &AgentConfig,
    events: Events,
    services: &TaskTracker,
    outbox_stop: &CancellationToken,
) -> Result<(Outlet, Intake), OpenError> {
    let mailbox_name = agent.mailbox_name();
    let state = config.state();
    let setup = |what: &str| format!("agent {:?}: {what} setup", agent.name);
    if config.is_asmtp(mailbox_name) {
        let client = AsmtpClient::new(config.asmtp_account(mailbox_name)?)
            .map_err(|source| OpenError::mailbox(setup("ASMTP"), source))?
            .with_threads(state.asmtp_threads(&agent.name))
            .with_questions(state.asmtp_questions(&agent.name));
        let outlet = Outlet::Asmtp(Box::new(AsmtpReplies::new(client.clone())));
        let watermark = WatermarkFile::new(state.asmtp_watermark(&agent.name));
        return Ok((outlet, Intake::Asmtp(client, watermark)));
    }
    if config.is_samp(mailbox_name) {
        let client = SampClient::new(config.samp_account(mailbox_name)?)
            .map_err(|source| OpenError::mailbox(setup("SAMP"), source))?
            .with_questions(state.samp_questions(&agent.name));
        let outlet = Outlet::Samp(Box::new(SampReplies::new(client.clone())));
        return Ok((outlet, Intake::Samp(client)));
    }
    if config.is_amp(mailbox_name) {
        let client = AmpClient::new(config.amp_account(mailbox_name)?)
            .map_err(|source| OpenError::mailbox(setup("AMP"), source))?
            .with_questions(state.amp_questions(&agent.name));
        let outlet = Outlet::Amp(Box::new(AmpReplies::new(client.clone())));
        let position = PositionFile::new(state.amp_position(&agent.name));
        return Ok((outlet, Intake::Amp(client, position)));
    }
    let (sender, reader, cursor) =
        aamp::outlet::open(config, agent, events, services, outbox_stop).await?;
    Ok((
        Outlet::Aamp(Box::new(sender)),
        Intake::Aamp(Box::new(reader), cursor),
    ))
}

impl Intake {
    /// Reads the mailbox until `stop`, handing each mail to `deliver`.
    pub async fn run(
        self,
        name: String,
        link: Link,
        deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
        events: Events,
        stop: CancellationToken,
    ) {
        match self {
            Intake::Aamp(reader, cursor) => {
                intake::run(name, *reader, cursor, link, deliver, events, stop).await
            }
            Intake::Asmtp(client, watermark) => {
                asmtp::run_intake(name, client, link, watermark, deliver, events, stop).await
            }
            Intake::Amp(client, position) => {
                amp::run_intake(name, client, link, position, deliver, events, stop).await
            }
            Intake::Samp(client) => {
                samp::run_intake(name, client, link, deliver, events, stop).await
            }
        }
    }
}

impl Outlet {
    async fn submit_once(&self, mail: &RenderedMail) -> Result<(), BackendError> {
        match self {
            Outlet::Aamp(s) => Backend::submit(s.as_ref(), mail).await,
            Outlet::Amp(a) => Backend::submit(a.as_ref(), mail).await,
            Outlet::Asmtp(a) => Backend::submit(a.as_ref(), mail).await,
            Outlet::Samp(a) => Backend::submit(a.as_ref(), mail).await,
        }
    }

    /// The mailbox's credentials, which its intake shares.
    pub fn secret(&self) -> &Secret {
        match self {
            Outlet::Aamp(s) => s.password(),
            Outlet::Amp(a) => a.secret(),
            Outlet::Asmtp(a) => a.secret(),
            Outlet::Samp(a) => a.secret(),
        }
    }

    /// What the back-end publishes about the agent (AAMP: its directory card), published
    /// again after a reload.
    pub async fn republish(&self, config: &LoadedConfig, agent: &AgentConfig, events: Events) {
        if let Outlet::Aamp(sender) = self {
            aamp::outlet::publish_card(config, agent, sender, events).await;
        }
    }
}

impl Backend for Outlet {
    /// Refused credentials are read again from their file: when it holds others (replaced
    /// without a reload), the mail is sent again with them at once.
    async fn submit(&self, mail: &RenderedMail) -> Result<(), BackendError> {
        let secret = self.secret();
        let tried = secret.generation();
        match self.submit_once(mail).await {
            Ok(()) => {
                secret.worked(true);
                Ok(())
            }
            Err(e) if e.class() == ErrorClass::Auth => {
                if secret.generation() != tried {
                    // Replaced while this attempt was under way (a reload): sent again with
                    // the new one, not left for the 5-minute retry.
                    return self.submit_once(mail).await;
                }
                secret.worked(false);
                match secret.reread() {
                    Ok(true) => self.submit_once(mail).await,
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
        match self {
            Outlet::Aamp(s) => Backend::download(s.as_ref(), attachment, max).await,
            Outlet::Amp(a) => Backend::download(a.as_ref(), attachment, max).await,
            Outlet::Asmtp(a) => Backend::download(a.as_ref(), attachment, max).await,
            Outlet::Samp(a) => Backend::download(a.as_ref(), attachment, max).await,
        }
    }

    async fn open_stream(&self, task_id: &str, peer: &str) -> Option<String> {
        match self {
            Outlet::Aamp(s) => Backend::open_stream(s.as_ref(), task_id, peer).await,
            Outlet::Amp(a) => Backend::open_stream(a.as_ref(), task_id, peer).await,
            Outlet::Asmtp(a) => Backend::open_stream(a.as_ref(), task_id, peer).await,
            Outlet::Samp(a) => Backend::open_stream(a.as_ref(), task_id, peer).await,
        }
    }

    async fn pump_stream(
        &self,
        stream_id: &str,
        events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> usize {
        match self {
            Outlet::Aamp(s) => Backend::pump_stream(s.as_ref(), stream_id, events).await,
            Outlet::Amp(a) => Backend::pump_stream(a.as_ref(), stream_id, events).await,
            Outlet::Asmtp(a) => Backend::pump_stream(a.as_ref(), stream_id, events).await,
            Outlet::Samp(a) => Backend::pump_stream(a.as_ref(), stream_id, events).await,
        }
    }

    async fn thread(&self, task_id: &str) -> Vec<Earlier> {
        match self {
            Outlet::Aamp(s) => Backend::thread(s.as_ref(), task_id).await,
            Outlet::Amp(a) => Backend::thread(a.as_ref(), task_id).await,
            Outlet::Asmtp(a) => Backend::thread(a.as_ref(), task_id).await,
            Outlet::Samp(a) => Backend::thread(a.as_ref(), task_id).await,
        }
    }

    async fn close_stream(&self, stream_id: &str, payload: serde_json::Value) {
        match self {
            Outlet::Aamp(s) => Backend::close_stream(s.as_ref(), stream_id, payload).await,
            Outlet::Amp(a) => Backend::close_stream(a.as_ref(), stream_id, payload).await,
            Outlet::Asmtp(a) => Backend::close_stream(a.as_ref(), stream_id, payload).await,
            Outlet::Samp(a) => Backend::close_stream(a.as_ref(), stream_id, payload).await,
        }
    }

    async fn claim(&self, email_id: &str) -> Result<ClaimOutcome, BackendError> {
        match self {
            Outlet::Aamp(s) => Backend::claim(s.as_ref(), email_id).await,
            Outlet::Amp(a) => Backend::claim(a.as_ref(), email_id).await,
            Outlet::Asmtp(a) => Backend::claim(a.as_ref(), email_id).await,
            Outlet::Samp(a) => Backend::claim(a.as_ref(), email_id).await,
        }
    }

    async fn renew_claim(&self, email_id: &str) -> Result<bool, BackendError> {
        match self {
            Outlet::Aamp(s) => Backend::renew_claim(s.as_ref(), email_id).await,
            Outlet::Amp(a) => Backend::renew_claim(a.as_ref(), email_id).await,
            Outlet::Asmtp(a) => Backend::renew_claim(a.as_ref(), email_id).await,
            Outlet::Samp(a) => Backend::renew_claim(a.as_ref(), email_id).await,
        }
    }

    async fn claim_done(&self, email_id: &str) -> Result<(), BackendError> {
        match self {
            Outlet::Aamp(s) => Backend::claim_done(s.as_ref(), email_id).await,
            Outlet::Amp(a) => Backend::claim_done(a.as_ref(), email_id).await,
            Outlet::Asmtp(a) => Backend::claim_done(a.as_ref(), email_id).await,
            Outlet::Samp(a) => Backend::claim_done(a.as_ref(), email_id).await,
        }
    }
}
