//! The inbound model: a message as a mailbox back-end hands it to dispatch, whichever system
//! it came from (AAMP mail, an ASMTP envelope, an AMP message), with what the back-end found
//! about its sender. Below both `mailbox` (which makes these) and `dispatch` (which consumes
//! them); it knows only the wire model.

use crate::protocol::{self, AampMessage};

/// What the headers say about the sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SenderCheck {
    /// There is evidence the From address is genuine; how.
    Verified(String),
    /// The mailbox believes From as it is (`sender_auth = "none"`).
    Trusted,
    /// No evidence: why.
    Unverified(String),
}

impl SenderCheck {
    pub fn is_believed(&self) -> bool {
        !matches!(self, SenderCheck::Unverified(_))
    }
}

/// A parsed AAMP message with where it came from.
#[derive(Clone, Debug)]
pub struct Inbound {
    pub email_id: String,
    pub message: AampMessage,
    /// The mail as read, from which `message` was parsed (kept to store it).
    pub view: protocol::MailView,
    /// Whether the From address is believed, under the mailbox's `sender_auth`.
    pub sender_check: SenderCheck,
    /// The text body was longer than we fetch and was cut.
    pub truncated: bool,
    pub attachments: Vec<Attachment>,
    /// Why the back-end would not read this message whole (too large): it is then answered
    /// rejected with this reason, never run. `None` for a message read as it is.
    pub refused: Option<String>,
}

/// A mail to an agent, as the intake hands it on.
#[derive(Clone, Debug)]
pub enum Mail {
    Aamp(Box<Inbound>),
    /// A plain reply from a mail client (no AAMP headers) to a mail the bridge sent.
    Reply(Reply),
    /// A mail server's notice that a mail could not be delivered (a DSN, RFC 3464).
    Bounce(Bounce),
}

/// A delivery status notification in the mailbox's Inbox, as read.
#[derive(Clone, Debug)]
pub struct Bounce {
    pub email_id: String,
    pub notification: protocol::dsn::Notification,
}

/// A plain reply: a person answering, say, a `task.help_needed` question from their mail
/// client, which writes no AAMP headers but names the mail it answers.
#[derive(Clone, Debug)]
pub struct Reply {
    pub email_id: String,
    pub from: String,
    pub message_id: String,
    pub in_reply_to: Option<String>,
    pub references: Vec<String>,
    /// The text as written, quoted lines (`>`) included.
    pub text: String,
    pub sender_check: SenderCheck,
    pub auto_submitted: bool,
}

/// An inbound mail as stored: enough to parse it again.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredInbound {
    email_id: String,
    view: protocol::MailView,
    truncated: bool,
    attachments: Vec<Attachment>,
}

impl Inbound {
    /// What identifies this mail: its Message-ID, or (for a mail without one) the server's
    /// id of it, which no Message-ID can look like.
    pub fn message_key(&self) -> String {
        let id = &self.message.envelope.message_id;
        if id.is_empty() {
            format!("email-id:{}", self.email_id)
        } else {
            id.clone()
        }
    }

    /// The mail as JSON, to store and read back with [`Inbound::from_json`].
    pub fn to_json(&self) -> String {
        serde_json::to_string(&StoredInbound {
            email_id: self.email_id.clone(),
            view: self.view.clone(),
            truncated: self.truncated,
            attachments: self.attachments.clone(),
        })
        .expect("a stored mail serializes")
    }

    /// What the journal keeps of a mail that is not admitted: enough to answer it, recognise
    /// it again and show it (ids, sender, subject, sizes), never its body or attachments, so
    /// mail the bridge refuses cannot fill the disk.
    pub fn summary_json(&self) -> String {
        let env = &self.message.envelope;
        let subject: String = env.subject.chars().take(200).collect();
        serde_json::json!({"summary": {
            "emailId": self.email_id,
            "from": env.from,
            "taskId": env.task_id,
            "messageId": env.message_id,
            "subject": subject,
            "bodyBytes": self.view.body_text.len(),
            "attachments": self.attachments.len(),
            "attachmentBytes": self.attachments.iter().map(|a| a.size).sum::<u64>(),
            "truncated": self.truncated,
        }})
        .to_string()
    }

    pub fn from_json(text: &str) -> Result<Inbound, String> {
        let stored: StoredInbound = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let message = AampMessage::parse(&stored.view).map_err(|e| e.to_string())?;
        Ok(Inbound {
            email_id: stored.email_id,
            message,
            view: stored.view,
            // Only mail that passed the check was stored to be run.
            sender_check: SenderCheck::Verified("checked when it arrived".into()),
            truncated: stored.truncated,
            attachments: stored.attachments,
            refused: None,
        })
    }
}

/// A file attached to an inbound mail, to download with `mailbox::aamp::Sender::download`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    pub name: String,
    pub content_type: String,
    pub size: u64,
    pub url: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbound(raw: &str, email_id: &str) -> Inbound {
        let view = protocol::parse_raw(raw.as_bytes()).unwrap();
        Inbound {
            email_id: email_id.into(),
            message: AampMessage::parse(&view).unwrap(),
            view,
            sender_check: SenderCheck::Trusted,
            truncated: false,
            attachments: vec![Attachment {
                name: "a.txt".into(),
                content_type: "text/plain".into(),
                size: 3,
                url: "http://x/a".into(),
            }],
            refused: None,
        }
    }

    #[test]
    fn a_mail_without_message_id_is_known_by_its_server_id_and_stores_whole() {
        let raw = "From: a@x.test\r\nTo: b@x.test\r\nX-AAMP-Intent: task.dispatch\r\nX-AAMP-TaskId: t1\r\n\r\nTask: hi\r\n";
        let (one, two) = (inbound(raw, "E1"), inbound(raw, "E2"));
        assert_eq!(one.message_key(), "email-id:E1");
        assert_ne!(
            one.message_key(),
            two.message_key(),
            "two such mails are two tasks"
        );
        let with_id = inbound(&format!("Message-ID: <m@x.test>\r\n{raw}"), "E3");
        assert_eq!(with_id.message_key(), "<m@x.test>");
        let back = Inbound::from_json(&with_id.to_json()).unwrap();
        assert_eq!(back.message, with_id.message);
        assert_eq!(back.attachments, with_id.attachments);
        assert_eq!(back.email_id, "E3");
        assert!(Inbound::from_json("{\"not\": \"a mail\"}").is_err());
    }
}
