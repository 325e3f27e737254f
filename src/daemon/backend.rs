//! Choosing an agent's mailbox back-end: its intake (how mail comes in) and its `Outlet` (the one
//! `dispatch::Backend` over whichever system it is).

use super::*;
use crate::dispatch::ClaimOutcome;

/// A mailbox back-end's error as dispatch sees it: its class and what it says.
impl From<crate::mailbox::MailboxError> for BackendError {
    fn from(e: crate::mailbox::MailboxError) -> BackendError {
        use crate::error::Classify as _;
        BackendError::new(e.class(), e.to_string())
    }
}

/// Where one agent's answers go: its mailbox back-end. `dispatch` sees only [`Backend`].
pub enum Outlet {
    /// AAMP: SMTP submission, Sent copies, the AAMP service's streams and threads.
    Aamp(Box<Sender>),
    /// AMP: replies on the broker.
    Amp(Box<crate::mailbox::amp::AmpReplies>),
    /// ASMTP: reply envelopes with client ids.
    Asmtp(Box<crate::mailbox::asmtp::AsmtpReplies>),
}

impl Backend for Outlet {
    /// Refused credentials are read again from their file: when it holds others (replaced
    /// without a reload), the mail is sent again with them at once.
    async fn submit(&self, mail: &RenderedMail) -> Result<(), BackendError> {
        use crate::error::{Classify as _, ErrorClass};
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
            Outlet::Amp(_) | Outlet::Asmtp(_) => Err(BackendError::new(
                crate::error::ErrorClass::Permanent,
                "AMP and ASMTP messages carry no attachments the bridge fetches",
            )),
        }
    }

    async fn open_stream(&self, task_id: &str, peer: &str) -> Option<String> {
        match self {
            Outlet::Aamp(s) => Backend::open_stream(s.as_ref(), task_id, peer).await,
            Outlet::Amp(_) | Outlet::Asmtp(_) => None,
        }
    }

    async fn pump_stream(
        &self,
        stream_id: &str,
        events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> usize {
        match self {
            Outlet::Aamp(s) => Backend::pump_stream(s.as_ref(), stream_id, events).await,
            Outlet::Amp(_) | Outlet::Asmtp(_) => 0,
        }
    }

    async fn thread(&self, task_id: &str) -> Vec<crate::dispatch::prompt::Earlier> {
        match self {
            Outlet::Aamp(s) => Backend::thread(s.as_ref(), task_id).await,
            Outlet::Amp(_) | Outlet::Asmtp(_) => Vec::new(),
        }
    }

    async fn close_stream(&self, stream_id: &str, payload: serde_json::Value) {
        if let Outlet::Aamp(s) = self {
            Backend::close_stream(s.as_ref(), stream_id, payload).await
        }
    }

    async fn claim(&self, email_id: &str) -> Result<ClaimOutcome, BackendError> {
        match self.sender() {
            Some(s) => Ok(match s.claim(email_id).await? {
                crate::mailbox::aamp::claims::Claim::Won => ClaimOutcome::Won,
                crate::mailbox::aamp::claims::Claim::TakenOver { from } => {
                    ClaimOutcome::TakenOver { from }
                }
                crate::mailbox::aamp::claims::Claim::Lost { by } => ClaimOutcome::Lost { by },
            }),
            None => Ok(ClaimOutcome::Won),
        }
    }

    async fn renew_claim(&self, email_id: &str) -> Result<bool, BackendError> {
        match self.sender() {
            Some(s) => Ok(s.renew(email_id).await?),
            None => Ok(true),
        }
    }

    async fn claim_done(&self, email_id: &str) -> Result<(), BackendError> {
        match self.sender() {
            Some(s) => Ok(s.finish_claim(email_id).await?),
            None => Ok(()),
        }
    }
}

impl Outlet {
    async fn submit_once(&self, mail: &RenderedMail) -> Result<(), BackendError> {
        match self {
            Outlet::Aamp(s) => Backend::submit(s.as_ref(), mail).await,
            Outlet::Amp(a) => Ok(a.submit(mail).await?),
            Outlet::Asmtp(a) => Ok(a.submit(mail).await?),
        }
    }

    /// The mailbox's credentials, which its intake shares.
    pub fn secret(&self) -> &crate::config::Secret {
        match self {
            Outlet::Aamp(s) => s.password(),
            Outlet::Amp(a) => a.secret(),
            Outlet::Asmtp(a) => a.secret(),
        }
    }

    fn sender(&self) -> Option<&Sender> {
        match self {
            Outlet::Aamp(s) => Some(s.as_ref()),
            Outlet::Amp(_) | Outlet::Asmtp(_) => None,
        }
    }
}

impl Backend for Sender {
    async fn submit(&self, mail: &RenderedMail) -> Result<(), BackendError> {
        Ok(Sender::submit(self, mail).await?)
    }

    async fn download(&self, attachment: &Attachment, max: u64) -> Result<Vec<u8>, BackendError> {
        Ok(Sender::download(self, attachment, max).await?)
    }

    async fn open_stream(&self, task_id: &str, peer: &str) -> Option<String> {
        let created = match self.helper().await {
            Ok(Some(api)) => api.create_stream(task_id, peer).await,
            Ok(None) => return None,
            Err(e) => Err(e),
        };
        created.map_err(|e| tracing::warn!(error = %e, "could not open the task's stream; running without one")).ok()
    }

    async fn pump_stream(
        &self,
        stream_id: &str,
        events: tokio::sync::mpsc::Receiver<(&'static str, serde_json::Value)>,
    ) -> usize {
        match self.helper().await {
            Ok(Some(api)) => api.pump(stream_id, events).await,
            _ => 0,
        }
    }

    async fn thread(&self, task_id: &str) -> Vec<crate::dispatch::prompt::Earlier> {
        let events = match self.helper().await {
            Ok(Some(api)) => api.thread(task_id).await,
            Ok(None) => return Vec::new(),
            Err(e) => Err(e),
        };
        match events {
            Ok(events) => events
                .iter()
                .map(|e| crate::dispatch::prompt::Earlier {
                    intent: e["intent"].as_str().unwrap_or("message").to_string(),
                    from: e["from"].as_str().unwrap_or_default().to_string(),
                    text: ["output", "question", "bodyText", "errorMsg"]
                        .iter()
                        .find_map(|k| e[*k].as_str().filter(|t| !t.is_empty()))
                        .unwrap_or_default()
                        .to_string(),
                })
                .collect(),
            Err(e) => {
                tracing::warn!(task_id, error = %e, "could not read the parent task's thread; going on without it");
                Vec::new()
            }
        }
    }

    async fn close_stream(&self, stream_id: &str, payload: serde_json::Value) {
        if let Ok(Some(api)) = self.helper().await {
            if let Err(e) = api.close(stream_id, &payload).await {
                tracing::warn!(stream_id, error = %e, "could not close the task's stream");
            }
        }
    }
}

/// How an agent's mail comes in, once its dispatcher exists.
pub(super) enum Intake {
    Aamp(Box<Reader>),
    Asmtp(crate::mailbox::asmtp::AsmtpClient),
    Amp(crate::mailbox::amp::AmpClient),
}

/// An agent's mailbox back-end: where its answers go and how its mail comes in. For AAMP,
/// the mailbox is registered first when it has to be, and its Sent-copy worker and directory
/// card are set up.
pub(super) async fn open_backend(
    config: &LoadedConfig,
    agent: &crate::config::AgentConfig,
    agent_dir: &std::path::Path,
    journal: &Journal,
    events: Events,
    services: &TaskTracker,
    outbox_stop: &CancellationToken,
) -> anyhow::Result<(Outlet, Intake)> {
    let mailbox_name = agent.mailbox_name().to_string();
    if config.is_asmtp(&mailbox_name) {
        let client = crate::mailbox::asmtp::AsmtpClient::new(config.asmtp_account(&mailbox_name)?)
            .with_context(|| format!("agent {:?}: ASMTP setup", agent.name))?
            .with_threads(agent_dir.join("asmtp-threads"))
            .with_questions(agent_dir.join("asmtp-questions"));
        let outlet = Outlet::Asmtp(Box::new(crate::mailbox::asmtp::AsmtpReplies::new(
            client.clone(),
        )));
        return Ok((outlet, Intake::Asmtp(client)));
    }
    if config.is_amp(&mailbox_name) {
        let account = config.amp_account(&mailbox_name)?;
        let client = crate::mailbox::amp::AmpClient::new(account)
            .with_context(|| format!("agent {:?}: AMP setup", agent.name))?
            .with_questions(agent_dir.join("amp-questions"));
        let outlet = Outlet::Amp(Box::new(crate::mailbox::amp::AmpReplies::new(
            client.clone(),
        )));
        return Ok((outlet, Intake::Amp(client)));
    }
    if let Some(registration) = config.registration(&mailbox_name) {
        let credentials = crate::mailbox::helper::register(&registration)
            .await
            .with_context(|| {
                format!(
                    "registering mailbox {mailbox_name:?} with {}",
                    registration.aamp_url
                )
            })?;
        crate::config::write_credentials(&registration.credentials_file, &credentials)
            .with_context(|| {
                format!(
                    "saving the credentials to {}",
                    registration.credentials_file.display()
                )
            })?;
        tracing::info!(mailbox = %mailbox_name, email = %credentials.email, file = %registration.credentials_file.display(), "registered a new mailbox");
        events.emit(
            crate::events::Event::MailboxRegistered,
            json!({"mailbox": mailbox_name, "email": credentials.email}),
        );
    }
    let account = config.account(&mailbox_name)?;
    if account.sender_auth == crate::config::SenderAuth::None {
        tracing::warn!(agent = %agent.name, mailbox = %mailbox_name, "sender_auth = \"none\": the From header is believed as it is, so anyone who can put mail in this Inbox can act as an allowed sender");
    }
    import_sessions(journal, &agent.name, &agent_dir.join("sessions.json"));
    let mut sender =
        Sender::new(&account).with_context(|| format!("agent {:?}: SMTP setup", agent.name))?;
    // Sent copies are kept beside the outbox, never on a reply's path.
    if let Some(copies) = sender
        .sent_copies()
        .with_context(|| format!("agent {:?}: JMAP setup", agent.name))?
    {
        services.spawn(copies.run(outbox_stop.clone()));
    }
    publish_card(config, agent, &sender, events).await;
    let mailbox =
        Reader::new(account).with_context(|| format!("agent {:?}: JMAP setup", agent.name))?;
    Ok((
        Outlet::Aamp(Box::new(sender)),
        Intake::Aamp(Box::new(mailbox)),
    ))
}
