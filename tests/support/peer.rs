//! A dispatcher on a mailbox of the test host: sends tasks and reads what comes back.

use super::*;

/// A dispatcher: sends tasks from its own mailbox and reads what comes back.
pub struct Peer {
    pub account: Account,
    sender: Sender,
    mailbox: Reader,
    state: aamp_bridge::mailbox::aamp::Position,
    pub inbox: Vec<Inbound>,
}

impl Peer {
    pub async fn new(account: Account) -> Peer {
        let sender = Sender::new(&account).unwrap();
        let mut mailbox = Reader::new(account.clone()).unwrap();
        mailbox.connect().await.expect("peer connects over JMAP");
        let state =
            aamp_bridge::mailbox::aamp::Position::at(mailbox.current_state().await.unwrap());
        Peer {
            account,
            sender,
            mailbox,
            state,
            inbox: Vec::new(),
        }
    }

    pub fn dispatch_to(&self, to: &str, title: &str, body: &str) -> AampMessage {
        AampMessage::dispatch(
            uuid::Uuid::new_v4().to_string(),
            &self.account.email,
            to,
            Dispatch {
                title: title.into(),
                body_text: body.into(),
                ..Dispatch::default()
            },
        )
    }

    /// Sends `msg`; returns it with its Message-ID filled in.
    pub async fn send(&self, mut msg: AampMessage) -> AampMessage {
        msg.envelope.message_id = self.sender.send(&msg).await.expect("peer sends over SMTP");
        msg
    }

    /// Sends `msg` with files attached.
    pub async fn send_files(
        &self,
        mut msg: AampMessage,
        files: &[aamp_bridge::protocol::OutgoingFile],
    ) -> AampMessage {
        msg.envelope.message_id = self
            .sender
            .send_with(&msg, files)
            .await
            .expect("peer sends over SMTP");
        msg
    }

    /// Waits until a message of `intent` for `task_id` has arrived and returns it.
    pub async fn wait_for(&mut self, task_id: &str, intent: Intent) -> Inbound {
        self.wait_for_within(task_id, intent, WAIT).await
    }

    /// [`Peer::wait_for`] with a deadline of its own.
    pub async fn wait_for_within(
        &mut self,
        task_id: &str,
        intent: Intent,
        wait: Duration,
    ) -> Inbound {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(found) = self
                .inbox
                .iter()
                .find(|i| i.message.task_id() == task_id && i.message.intent() == intent)
            {
                return found.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no {intent} for {task_id} within {wait:?}; got: {:#?}",
                self.inbox
                    .iter()
                    .map(|i| (i.message.intent(), i.message.task_id().to_string()))
                    .collect::<Vec<_>>()
            );
            let (new, state) = self
                .mailbox
                .fetch_since(&self.state, 50)
                .await
                .expect("peer polls");
            self.state = state;
            if new.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.inbox.extend(new);
        }
    }

    /// Waits until everything sent to this peer before now has arrived: `via` (another
    /// account) mails a marker, and when it is in, the mails submitted before it are too
    /// (the one Postfix queue delivers in order). For checking that nothing more comes.
    pub async fn settle(&mut self, via: &Account) {
        let sender = Sender::new(via).unwrap();
        let marker = format!("marker-{}", uuid::Uuid::new_v4());
        let mut msg = AampMessage {
            envelope: Envelope {
                version: protocol::VERSION.into(),
                task_id: marker.clone(),
                from: via.email.clone(),
                to: vec![self.account.email.clone()],
                message_id: String::new(),
                subject: String::new(),
                in_reply_to: None,
                references: vec![],
                received_body: None,
            },
            body: Body::CardQuery {
                text: "marker".into(),
            },
        };
        msg.envelope.subject = msg.subject();
        sender.send(&msg).await.expect("the marker is sent");
        self.wait_for(&marker, Intent::CardQuery).await;
    }

    /// A `task.cancel` of `dispatch`, from this peer to `agent`.
    pub fn cancel_of(&self, dispatch: &AampMessage, agent: &str) -> AampMessage {
        let mut cancel = AampMessage::reply(
            &dispatch.envelope,
            &self.account.email,
            Body::Cancel {
                reason: "stop".into(),
            },
        );
        cancel.envelope.to = vec![agent.to_string()];
        cancel
    }

    /// Sends raw RFC 5322 bytes from this peer's account to `to`.
    pub async fn send_raw(&self, to: &str, message_id: &str, bytes: Vec<u8>) {
        let mail = protocol::RenderedMail {
            from: self.account.email.clone(),
            to: vec![to.to_string()],
            message_id: message_id.to_string(),
            bytes,
        };
        self.sender
            .submit(&mail)
            .await
            .expect("peer sends raw mail");
    }

    /// Everything received so far for `task_id`, as intents in arrival order.
    pub fn intents_for(&self, task_id: &str) -> Vec<Intent> {
        self.inbox
            .iter()
            .filter(|i| i.message.task_id() == task_id)
            .map(|i| i.message.intent())
            .collect()
    }

    /// The raw header fields of a received mail, read over JMAP.
    pub async fn raw_headers(&self, email_id: &str) -> Vec<(String, String)> {
        let mut client = aamp_bridge::mailbox::aamp::jmap::JmapClient::new(&self.account).unwrap();
        client.connect().await.unwrap();
        let reply = client
            .call(
                "Email/get",
                serde_json::json!({"ids": [email_id], "properties": ["headers"]}),
            )
            .await
            .unwrap();
        reply["list"][0]["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["name"].as_str().unwrap().to_string(),
                    h["value"].as_str().unwrap().trim().to_string(),
                )
            })
            .collect()
    }

    /// A received mail whole, as its server keeps it (RFC 5322 bytes), read over JMAP.
    pub async fn raw_mail(&self, email_id: &str) -> Vec<u8> {
        use aamp_bridge::mailbox::aamp::jmap::{download_url, BlobRef, JmapClient};
        let mut client = JmapClient::new(&self.account).unwrap();
        client.connect().await.unwrap();
        let reply = client
            .call(
                "Email/get",
                serde_json::json!({"ids": [email_id], "properties": ["blobId"]}),
            )
            .await
            .unwrap();
        let blob = BlobRef {
            blob_id: reply["list"][0]["blobId"].as_str().unwrap().to_string(),
            name: Some("mail.eml".into()),
            content_type: "message/rfc822".into(),
            size: 0,
        };
        let session = client.session().unwrap();
        let url = download_url(&session.download_url, &session.account_id, &blob);
        client.download(&url, 10 << 20).await.unwrap()
    }
}

/// For long runs with outages (tests/soak.rs): a send and a poll that report a failure
/// instead of failing the test.
impl Peer {
    /// Sends `msg` once; the error when the host refused it (down, restarting).
    pub async fn try_send(&self, mut msg: AampMessage) -> Result<AampMessage, String> {
        msg.envelope.message_id = self.sender.send(&msg).await.map_err(|e| e.to_string())?;
        Ok(msg)
    }

    /// Fetches what has arrived since the last look, adds it to `inbox` and says how many
    /// came; an error (the host down) leaves the position where it was, to be asked again.
    pub async fn poll(&mut self) -> Result<usize, String> {
        if !self.mailbox.is_connected() {
            // Without its session the reader would take every mail for one outside the Inbox.
            self.mailbox.connect().await.map_err(|e| e.to_string())?;
        }
        let mut added = 0;
        // A few pages at most per call, so a caller that also does other things is not held.
        for _ in 0..20 {
            match self.mailbox.fetch_since(&self.state, 50).await {
                Ok((new, state)) => {
                    self.state = state;
                    if new.is_empty() {
                        break;
                    }
                    added += new.len();
                    self.inbox.extend(new);
                }
                Err(e) => {
                    // A new session at the next call (the host may have restarted).
                    self.mailbox.disconnect();
                    return Err(e.to_string());
                }
            }
        }
        Ok(added)
    }
}
