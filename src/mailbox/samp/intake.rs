//! The SAMP inbox read in: polled (the bridge uses no push of the server's), each message
//! handed to the journal before it is acked, since `ack` clears its content.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::client::SampClient;
use super::wire::{message_id, to_inbound, SampMessage, BELIEVED};
use crate::events::Events;
use crate::mailbox::intake::{self, DeliverError, Health, IntakeError, Watched};
use crate::mailbox::link::Link;
use crate::mailbox::Mail;

/// The inbox for [`intake::watch`].
struct SampWatched<'a, D> {
    client: SampClient,
    deliver: D,
    link: &'a Link,
    agent: &'a str,
    events: Events,
}

impl<D: FnMut(Mail) -> Result<(), DeliverError> + Send> Watched for SampWatched<'_, D> {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        let mut taken = 0;
        // A few pages at most per read; the rest at the next one, at once.
        for _ in 0..5 {
            let (messages, more) = self.client.check_inbox().await?;
            let mut handled = Vec::new();
            for m in &messages {
                hand_on(&self.client, m, &mut self.deliver)?;
                handled.push(m.id.clone());
            }
            // Unreadable ones are reported and acked too: left unread they would fill the
            // inbox (10 unread refuse every sender).
            let bad = self.client.unreadable.take();
            handled.extend(bad.iter().filter_map(|b| b.id.clone()));
            crate::mailbox::report_unreadable(bad, self.agent, "SAMP", &self.events);
            // Only now, with every one in the journal: ack clears their content.
            self.client.ack(&handled).await?;
            taken += messages.len();
            if !more || handled.is_empty() {
                break;
            }
        }
        Ok(taken)
    }

    fn next_read(&mut self, taken: usize) -> Duration {
        self.link.push("polling");
        if taken > 0 {
            Duration::ZERO
        } else {
            self.client.account.poll_interval
        }
    }

    fn address(&self) -> String {
        self.client.address()
    }
}

/// Hands one message to the journal: an answer to a question the agent asked as a reply,
/// anything else as a task.
fn hand_on(
    client: &SampClient,
    m: &SampMessage,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<(), IntakeError> {
    let question = {
        let mut recent = client.recent.lock().expect("recent lock");
        recent.saw(m);
        m.in_reply_to
            .as_deref()
            .and_then(|parent| recent.questions.question(parent))
    };
    if let Some(question) = question {
        let reply = crate::inbound::Reply {
            email_id: m.id.clone(),
            from: format!("{}@{}", m.from, client.domain()),
            message_id: message_id(&m.id),
            in_reply_to: Some(question),
            references: Vec::new(),
            text: m.body.clone().unwrap_or_default(),
            sender_check: crate::inbound::SenderCheck::Verified(BELIEVED.into()),
            auto_submitted: false,
        };
        return deliver(Mail::Reply(reply)).map_err(IntakeError::Deliver);
    }
    match to_inbound(m, &client.domain()) {
        Some(inbound) => deliver(Mail::Aamp(Box::new(inbound))).map_err(IntakeError::Deliver),
        None => {
            tracing::warn!(id = %m.id, "a SAMP message that cannot be read as a task; skipped");
            Ok(())
        }
    }
}

/// Polls the inbox until `stop` (SAMP has no push the bridge uses).
pub async fn run_intake(
    name: String,
    client: SampClient,
    link: Link,
    deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
    events: Events,
    stop: CancellationToken,
) {
    let health = Health::new(
        &link,
        "the SAMP server",
        client.account.name.clone(),
        "key_file (then `aamp-bridge reload`)",
    )
    // A refused key is asked about again only every 5 minutes (the default), not every few
    // seconds as AMP's and ASMTP's: the SAMP server locks out the whole address after a few
    // failed keys (the README: a per-IP lockout), and with it every other agent of the
    // machine. A key written to the file is still tried at once.
    .with_secret(client.account.key.clone());
    let mut watched = SampWatched {
        client,
        deliver,
        link: &link,
        agent: &name,
        events,
    };
    intake::watch(&name, events, health, &mut watched, None, &stop).await;
}
