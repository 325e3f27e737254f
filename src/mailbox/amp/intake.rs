//! Reading an AMP inbox: the counts polled, the newest messages read when one changed, the
//! position kept on disk and moved only after every message before it was handed on.

use std::collections::HashSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::events::Events;
use crate::mailbox::intake::{self, DeliverError, Health, IntakeError, Watched};
use crate::mailbox::Mail;

use super::client::AmpClient;
use super::wire::{answer_to, question_marked, to_inbound_within, AmpMessage, PAGE};

/// How far the inbox has been read: the newest `created_at` handed on, the ids at exactly that
/// time (the broker's timestamps can tie), and the visible and unread counts then.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub created_at: String,
    pub ids: Vec<String>,
    pub total: u64,
    #[serde(default)]
    pub unread: u64,
}

/// The position file.
pub type PositionFile = crate::fsio::JsonFile<Position>;

/// The broker's inbox for [`intake::watch`], followed by position.
pub(super) struct AmpWatched<'a, D> {
    pub(super) client: AmpClient,
    pub(super) position: &'a PositionFile,
    pub(super) deliver: D,
    pub(super) link: &'a crate::mailbox::link::Link,
    pub(super) poll_interval: Duration,
    /// When this process last read the newest messages (`None`: not yet).
    pub(super) walked: Option<tokio::time::Instant>,
    pub(super) agent: &'a str,
    pub(super) events: Events,
}

impl<D: FnMut(Mail) -> Result<(), DeliverError> + Send> Watched for AmpWatched<'_, D> {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        let recheck = match (self.walked, self.client.account.recheck) {
            (None, _) => true,
            (Some(at), Some(every)) => at.elapsed() >= every,
            (Some(_), None) => false,
        };
        let read = poll_once(&self.client, self.position, &mut self.deliver, recheck).await;
        // A message the broker returns that cannot be read is reported once and marked read,
        // so that the unread count does not keep a poll reading it again.
        let bad = self.client.unreadable.take();
        for id in bad.iter().filter_map(|b| b.id.as_deref()) {
            if let Err(e) = self.client.mark_read(id).await {
                tracing::debug!(%id, error = %e, "could not mark an unreadable AMP message read");
            }
        }
        crate::mailbox::report_unreadable(bad, self.agent, "AMP", &self.events);
        let read = read?;
        if read.walked {
            self.walked = Some(tokio::time::Instant::now());
        }
        Ok(read.taken)
    }

    fn next_read(&mut self, taken: usize) -> Duration {
        self.link.push("polling");
        if taken > 0 {
            // More may have come while these were taken.
            Duration::ZERO
        } else {
            self.poll_interval
        }
    }

    fn address(&self) -> String {
        self.client.address().to_string()
    }
}

/// Polls the inbox until `stop` (AMP has no push).
pub async fn run_intake(
    name: String,
    client: AmpClient,
    link: crate::mailbox::link::Link,
    position: PositionFile,
    deliver: impl FnMut(Mail) -> Result<(), DeliverError> + Send,
    events: Events,
    stop: CancellationToken,
) {
    let poll_interval = client.account.poll_interval;
    let health = Health::new(
        &link,
        "the AMP broker",
        client.address().to_string(),
        "api_key_file (and agent_id)",
    )
    .with_secret(client.account.api_key.clone())
    .retry_refused_every(intake::KEY_REFUSED_RETRY);
    let mut watched = AmpWatched {
        client,
        position: &position,
        deliver,
        link: &link,
        poll_interval,
        walked: None,
        agent: &name,
        events,
    };
    intake::watch(&name, events, health, &mut watched, None, &stop).await;
}

/// What one poll did.
pub(super) struct Polled {
    /// Messages handed on.
    pub(super) taken: usize,
    /// Whether the newest messages were read (not only counted).
    pub(super) walked: bool,
}

/// One poll: the counts, and the newest messages down to the position when a count changed
/// or `recheck` asks for it.
pub(super) async fn poll_once(
    client: &AmpClient,
    position: &PositionFile,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
    recheck: bool,
) -> Result<Polled, IntakeError> {
    let Some(mut at) = position.load()? else {
        let taken = first_start(client, position, deliver).await?;
        return Ok(Polled {
            taken,
            walked: true,
        });
    };
    let total = client.visible_total().await?;
    let unread = client.unread_total().await?;
    if total == at.total && unread == at.unread && !recheck {
        return Ok(Polled {
            taken: 0,
            walked: false,
        });
    }
    // Something arrived (or was archived, trashed or read), or it is time to look anyway: the
    // newest messages down to the position (an older message, or every message at it), a
    // page the size of the change and one more at a time.
    let page_size = (total.abs_diff(at.total) + 1).clamp(2, PAGE);
    let mut fresh = Vec::new();
    let mut at_position = HashSet::new();
    let mut page = 1;
    loop {
        let got = client.inbox_page(page, page_size).await?;
        let last_page = (got.messages.len() as u64) < page_size;
        let mut reached = false;
        for m in got.messages {
            if m.created_at < at.created_at {
                reached = true;
            } else if m.created_at == at.created_at && at.ids.contains(&m.id) {
                at_position.insert(m.id);
            } else {
                fresh.push(m);
            }
        }
        reached |= !at.ids.is_empty() && at_position.len() == at.ids.len();
        if reached || last_page {
            break;
        }
        page += 1;
    }
    // Oldest first (the broker's order is `created_at`, a string); the same message listed on
    // two pages (one arrived in between) once.
    fresh.sort_by(|a, b| a.created_at.cmp(&b.created_at));
    let mut seen = HashSet::new();
    fresh.retain(|m| seen.insert(m.id.clone()));
    if recheck && !fresh.is_empty() && total == at.total && unread == at.unread {
        tracing::info!(
            new = fresh.len(),
            "messages the inbox counts did not show (another was archived or trashed meanwhile)"
        );
    }
    let handed = hand_on(client, &fresh, deliver).await?;
    for m in &fresh {
        if m.created_at > at.created_at {
            at.created_at = m.created_at.clone();
            at.ids.clear();
        }
        if m.created_at == at.created_at && !at.ids.contains(&m.id) {
            at.ids.push(m.id.clone());
        }
    }
    at.total = total;
    // Those this poll marked read are no longer unread.
    at.unread = unread.saturating_sub(handed.marked);
    position.save(&at)?;
    Ok(Polled {
        taken: handed.taken,
        walked: true,
    })
}

/// The first start: the position is the newest message, then the unread messages already
/// waiting are answered; the position is written only after them, so a crash in between
/// starts over (the journal knows what it holds).
/// How many of the newest messages a first start looks at for read ones still unanswered.
pub(super) const FIRST_START_READ: u64 = 100;

pub(super) async fn first_start(
    client: &AmpClient,
    position: &PositionFile,
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<usize, IntakeError> {
    let newest = client.inbox_page(1, 1).await?;
    let mut backlog = client.unread().await?;
    let unread = backlog.len() as u64;
    // A task a person opened in the console before the bridge ever started is read, but
    // still waits for its answer: the newest page's read messages whose thread holds no
    // reply from the agent to them are answered too (the journal knows any it answered).
    let recent = client.inbox_page(1, FIRST_START_READ).await?;
    let mut threads_read = std::collections::HashMap::new();
    for m in recent.messages.iter().filter(|m| m.is_read).rev() {
        if backlog.iter().any(|b| b.id == m.id)
            || !m.to_agent.eq_ignore_ascii_case(client.address())
        {
            continue;
        }
        if !threads_read.contains_key(&m.thread_id) {
            let thread = client.thread(&m.thread_id).await?;
            threads_read.insert(m.thread_id.clone(), thread);
        }
        let answered = threads_read[&m.thread_id].iter().any(|r| {
            r.parent_id.as_deref() == Some(m.id.as_str())
                && r.from_agent.eq_ignore_ascii_case(client.address())
        });
        if !answered {
            backlog.push(m.clone());
        }
    }
    let mut at = Position {
        created_at: newest
            .messages
            .first()
            .map(|m| m.created_at.clone())
            .unwrap_or_default(),
        ids: newest
            .messages
            .first()
            .map(|m| m.id.clone())
            .into_iter()
            .collect(),
        total: newest.total,
        unread,
    };
    if !backlog.is_empty() {
        tracing::info!(
            unread = backlog.len(),
            "first start: answering the unread messages already waiting"
        );
    }
    let handed = hand_on(client, &backlog, deliver).await?;
    at.unread = at.unread.saturating_sub(handed.marked);
    position.save(&at)?;
    Ok(handed.taken)
}

/// What [`hand_on`] did.
pub(super) struct Handed {
    pub(super) taken: usize,
    /// How many unread messages it marked read.
    pub(super) marked: u64,
}

/// Hands each message to the journal, then marks it read (a hint for people).
pub(super) async fn hand_on(
    client: &AmpClient,
    messages: &[AmpMessage],
    deliver: &mut (impl FnMut(Mail) -> Result<(), DeliverError> + Send),
) -> Result<Handed, IntakeError> {
    let mut handed = Handed {
        taken: 0,
        marked: 0,
    };
    for m in messages {
        if !m.to_agent.eq_ignore_ascii_case(client.address()) {
            continue;
        }
        let question = match m.parent_id.as_deref() {
            Some(parent) => question_answered(client, m, parent).await?,
            None => None,
        };
        // Noted before it is handed on: the answer then finds its subject here rather than
        // reading the thread again (a large message in it would be read once more).
        client
            .recent
            .lock()
            .expect("recent lock")
            .saw(&m.id, &m.subject);
        if let Some(question) = question {
            // An answer to a question the agent asked: matched by the broker's own link.
            deliver(Mail::Reply(answer_to(m, question))).map_err(IntakeError::Deliver)?
        } else {
            match to_inbound_within(m, client.account.max_message_bytes) {
                Some(inbound) => {
                    deliver(Mail::Aamp(Box::new(inbound))).map_err(IntakeError::Deliver)?
                }
                None => {
                    tracing::warn!(id = %m.id, "an AMP message that cannot be read as a task; skipped")
                }
            }
        }
        if !m.is_read {
            client.mark_read(&m.id).await?;
            handed.marked += 1;
        }
        handed.taken += 1;
    }
    Ok(handed)
}

/// The Message-ID of the agent's question that `m` replies to (its `parent_id` is `parent`),
/// if it is one. The questions file knows those the bridge saw posted; one posted by a bridge
/// killed before it could note it is found in the thread by its marker (the question is the
/// agent's own message, marked as a `task.help_needed`), and noted now. The thread is read
/// only for a reply to a message this process did not read itself.
pub(super) async fn question_answered(
    client: &AmpClient,
    m: &AmpMessage,
    parent: &str,
) -> Result<Option<String>, IntakeError> {
    {
        let recent = client.recent.lock().expect("recent lock");
        if let Some(question) = recent.questions.question(parent) {
            return Ok(Some(question));
        }
        if recent.subject(parent).is_some() {
            // A reply to a message the agent was sent, not to one it posted.
            return Ok(None);
        }
    }
    let thread = client.thread(&m.thread_id).await?;
    let asked = thread
        .iter()
        .find(|t| t.id == parent && t.from_agent.eq_ignore_ascii_case(client.address()))
        .and_then(|t| question_marked(&t.body));
    if let Some(question) = &asked {
        client.note_question(parent, question);
    }
    Ok(asked)
}
