//! A person's own mailbox sending one task and reading what comes back: what
//! `aamp-bridge dispatch` needs of AAMP, and no more.

use std::sync::Arc;

use super::helper::HelperApi;
use super::{Position, Reader, Sender};
use crate::config::Account;
use crate::mailbox::{Mail, MailboxError};
use crate::protocol::AampMessage;

/// One mailbox that sends a task and reads the mail that comes after it.
pub struct Dispatcher {
    sender: Sender,
    reader: Reader,
    /// Where reading goes on from: taken when connecting, before anything is sent.
    position: Position,
}

impl Dispatcher {
    /// The mailbox `account`, not yet logged in.
    pub fn new(account: &Account) -> Result<Dispatcher, MailboxError> {
        Ok(Dispatcher {
            sender: Sender::new(account)?,
            reader: Reader::new(account.clone())?,
            position: Position::default(),
        })
    }

    /// Logs in and takes the Inbox's place, so an answer to a task sent after this cannot
    /// slip past the reading.
    pub async fn connect(&mut self) -> Result<(), MailboxError> {
        self.reader.connect().await?;
        self.position = Position::at(self.reader.current_state().await?);
        Ok(())
    }

    /// Sends `message`: its Message-ID.
    pub async fn send(&self, message: &AampMessage) -> Result<String, MailboxError> {
        self.sender.send(message).await
    }

    /// The mail that arrived since the last read.
    pub async fn new_mail(&mut self) -> Result<Vec<Mail>, MailboxError> {
        let (mail, next) = self.reader.fetch_mail_since(&self.position, 50).await?;
        self.position = next;
        Ok(mail)
    }

    /// The AAMP service live streams are followed on; `None` without `aamp_url`.
    pub async fn streams(&self) -> Result<Option<Arc<HelperApi>>, MailboxError> {
        self.sender.helper().await
    }
}
