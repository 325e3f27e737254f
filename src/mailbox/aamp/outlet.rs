//! The AAMP side of the outbound seam ([`Backend`] for [`Sender`]: SMTP submission, the AAMP
//! service's streams, threads and claims), and opening an AAMP mailbox for an agent: registered
//! first when it has to be, its Sent-copy worker started and its directory card published.

use serde_json::json;

use super::claims::Claim;
use super::helper;
use super::{Cursor, Reader, Sender};
use crate::backend::{Backend, BackendError, ClaimOutcome, Earlier};
use crate::config::{AgentConfig, LoadedConfig, Secret, SenderAuth};
use crate::events::{Event, Events};
use crate::inbound::Attachment;
use crate::mailbox::error::OpenError;
use crate::mailbox::outlet::{Answering, Intake, Opening, Outlet, System};
use crate::protocol::RenderedMail;

#[async_trait::async_trait]
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

    async fn thread(&self, task_id: &str) -> Vec<Earlier> {
        let events = match self.helper().await {
            Ok(Some(api)) => api.thread(task_id).await,
            Ok(None) => return Vec::new(),
            Err(e) => Err(e),
        };
        match events {
            Ok(events) => events
                .iter()
                .map(|e| Earlier {
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

    async fn claim(&self, email_id: &str) -> Result<ClaimOutcome, BackendError> {
        Ok(match Sender::claim(self, email_id).await? {
            Claim::Won => ClaimOutcome::Won,
            Claim::TakenOver { from } => ClaimOutcome::TakenOver { from },
            Claim::Lost { by } => ClaimOutcome::Lost { by },
        })
    }

    async fn renew_claim(&self, email_id: &str) -> Result<bool, BackendError> {
        Ok(self.renew(email_id).await?)
    }

    async fn claim_done(&self, email_id: &str) -> Result<bool, BackendError> {
        Ok(self.finish_claim(email_id).await?)
    }
}

/// AAMP as the outlet sees it: answers submitted over SMTP, the card published again after
/// a reload.
#[async_trait::async_trait]
impl Answering for Sender {
    fn secret(&self) -> &Secret {
        self.password()
    }

    async fn republish(&self, config: &LoadedConfig, agent: &AgentConfig, events: Events) {
        publish_card(config, agent, self, events).await
    }
}

/// The mailbox system AAMP: opened here, checked by `doctor` itself (JMAP and SMTP).
pub(crate) const SYSTEM: System = System {
    open: |o| Box::pin(open(o)),
    probe: None,
};

/// Opens an agent's AAMP mailbox: registers it first when the config asks to, starts its
/// Sent-copy worker on `services` (stopped by `outbox_stop`), publishes its directory card,
/// and gives its sender and its reader from the saved position.
async fn open(o: Opening<'_>) -> Result<(Outlet, Intake), OpenError> {
    let Opening {
        config,
        agent,
        events,
        services,
        outbox_stop,
    } = o;
    let mailbox_name = agent.mailbox_name().to_string();
    if let Some(registration) = config.registration(&mailbox_name) {
        let credentials = helper::register(&registration).await.map_err(|source| {
            OpenError::mailbox(
                format!(
                    "registering mailbox {mailbox_name:?} with {}",
                    registration.aamp_url
                ),
                source,
            )
        })?;
        crate::config::write_credentials(&registration.credentials_file, &credentials).map_err(
            |source| OpenError::SaveCredentials {
                path: registration.credentials_file.clone(),
                source,
            },
        )?;
        tracing::info!(mailbox = %mailbox_name, email = %credentials.email, file = %registration.credentials_file.display(), "registered a new mailbox");
        events.emit(
            Event::MailboxRegistered,
            json!({"mailbox": mailbox_name, "email": credentials.email}),
        );
    }
    let account = config.account(&mailbox_name)?;
    if account.sender_auth == SenderAuth::None {
        tracing::warn!(agent = %agent.name, mailbox = %mailbox_name, "sender_auth = \"none\": the From header is believed as it is, so anyone who can put mail in this Inbox can act as an allowed sender");
    }
    let setup = |what: &str| format!("agent {:?}: {what} setup", agent.name);
    let mut sender =
        Sender::new(&account).map_err(|source| OpenError::mailbox(setup("SMTP"), source))?;
    // Sent copies are kept beside the outbox, never on a reply's path.
    if let Some(copies) = sender
        .sent_copies()
        .map_err(|source| OpenError::mailbox(setup("JMAP"), source))?
    {
        services.spawn(copies.run(outbox_stop.clone()));
    }
    publish_card(config, agent, &sender, events).await;
    let reader =
        Reader::new(account).map_err(|source| OpenError::mailbox(setup("JMAP"), source))?;
    let cursor = Cursor::new(
        config
            .state()
            .mailbox_file(&agent.name, "jmap", "email-state"),
    );
    let intake = Intake::new(move |r| {
        Box::pin(super::intake::run(
            r.name, reader, cursor, r.link, r.deliver, r.events, r.stop,
        ))
    });
    Ok((Outlet::new(sender), intake))
}

/// Publishes the agent's summary and card in the AAMP service's directory, when it has them.
/// A failure is reported; it does not stop the agent.
pub(crate) async fn publish_card(
    config: &LoadedConfig,
    agent: &AgentConfig,
    sender: &Sender,
    events: Events,
) {
    if agent.summary.is_none() && agent.card.is_none() && agent.card_file.is_none() {
        return;
    }
    let card = match (&agent.card, &agent.card_file) {
        (Some(card), _) => Some(card.clone()),
        (None, Some(file)) => {
            let path = config
                .path
                .parent()
                .unwrap_or(std::path::Path::new("."))
                .join(file);
            match std::fs::read_to_string(&path) {
                Ok(text) => Some(text),
                Err(e) => {
                    tracing::warn!(agent = %agent.name, file = %path.display(), error = %e, "cannot read the agent's card_file");
                    None
                }
            }
        }
        (None, None) => None,
    };
    match sender.helper().await {
        Ok(Some(api)) => match api
            .directory_upsert(agent.summary.as_deref(), card.as_deref())
            .await
        {
            Ok(()) => events.emit(Event::AgentCard, json!({"agent": agent.name})),
            Err(e) => {
                tracing::warn!(agent = %agent.name, error = %e, "could not publish the agent's card")
            }
        },
        Ok(None) => {
            tracing::warn!(agent = %agent.name, "summary and card are published through the AAMP service: set aamp_url on the agent's mailbox")
        }
        Err(e) => {
            tracing::warn!(agent = %agent.name, error = %e, "could not reach the AAMP service to publish the agent's card")
        }
    }
}
