//! Delivery status notifications (RFC 3464): the bounce a mail server sends back when a mail
//! could not be delivered. Pure code: the `message/delivery-status` part's text and the
//! returned message's headers (a `message/rfc822` or `text/rfc822-headers` part) in, what
//! failed out.

/// One recipient a notification reports on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipient {
    /// `Final-Recipient`, without its address type (`rfc822;`).
    pub address: String,
    /// `Action`: `failed`, `delayed`, `delivered`, `relayed` or `expanded`.
    pub action: String,
    /// `Status`, the enhanced status code (`5.1.1`).
    pub status: String,
    /// `Diagnostic-Code`, without its type (`smtp;`), folded lines joined.
    pub diagnostic: Option<String>,
}

impl Recipient {
    /// Whether the mail will never reach this recipient.
    pub fn failed(&self) -> bool {
        self.action.eq_ignore_ascii_case("failed")
    }

    /// In words: "nobody@example.test: 5.1.1 (550 5.1.1 User unknown)".
    pub fn describe(&self) -> String {
        let what = match self.status.as_str() {
            s if s.starts_with("5.1.1") => "the address does not exist",
            s if s.starts_with("5.1.") => "the address is not valid",
            s if s.starts_with("5.2.2") => "the mailbox is full",
            s if s.starts_with("5.7.") => "the server refused it",
            s if s.starts_with('4') => "delivery is delayed",
            _ => "it could not be delivered",
        };
        match &self.diagnostic {
            Some(d) => format!("{}: {what} ({}; {d})", self.address, self.status),
            None => format!("{}: {what} ({})", self.address, self.status),
        }
    }
}

/// What a notification says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The Message-ID of the mail it returns (from the returned headers), with its `<>`.
    pub message_id: Option<String>,
    /// The returned mail's `X-AAMP-TaskId` and `X-AAMP-Intent`, when it was AAMP mail.
    pub task_id: Option<String>,
    pub intent: Option<String>,
    pub recipients: Vec<Recipient>,
}

impl Notification {
    /// The recipients the mail will never reach.
    pub fn failed(&self) -> impl Iterator<Item = &Recipient> {
        self.recipients.iter().filter(|r| r.failed())
    }
}

/// Header fields of a block of `name: value` lines, folded lines unfolded, names lowercase.
fn fields(block: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = out.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((name, value)) = line.split_once(':') {
            out.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    out
}

/// `rfc822; nobody@example.test` → `nobody@example.test`.
fn without_type(value: &str) -> String {
    match value.split_once(';') {
        Some((_, rest)) => rest.trim().to_string(),
        None => value.trim().to_string(),
    }
}

/// Reads a notification from its `message/delivery-status` text and the returned mail's
/// header section (empty when the server returned none). `None` when the text reports on no
/// recipient.
pub fn parse(delivery_status: &str, returned_headers: &str) -> Option<Notification> {
    let text = delivery_status.replace("\r\n", "\n");
    // The per-message block first, then one block per recipient, blank lines between.
    let recipients: Vec<Recipient> = text
        .split("\n\n")
        .skip(1)
        .filter_map(|block| {
            let f = fields(block);
            let get = |name: &str| f.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
            let address = get("final-recipient").or(get("original-recipient"))?;
            Some(Recipient {
                address: without_type(address),
                action: get("action").unwrap_or("failed").to_ascii_lowercase(),
                status: get("status").unwrap_or("5.0.0").to_string(),
                diagnostic: get("diagnostic-code")
                    .map(without_type)
                    .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
                    .filter(|d| !d.is_empty()),
            })
        })
        .collect();
    if recipients.is_empty() {
        return None;
    }
    let headers = returned_headers.replace("\r\n", "\n");
    let head = headers.split("\n\n").next().unwrap_or_default();
    let returned = fields(head);
    let get = |name: &str| {
        returned
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    Some(Notification {
        message_id: get("message-id"),
        task_id: get("x-aamp-taskid"),
        intent: get("x-aamp-intent"),
        recipients,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the project's Postfix sent back for a dispatch to a local address that does not
    /// exist (Cyrus refused it over LMTP).
    const POSTFIX_STATUS: &str = "Reporting-MTA: dns; localhost\r\nX-Postfix-Queue-ID: E95EB62A001\r\nX-Postfix-Sender: rfc822; dsnprobe@example.test\r\nArrival-Date: Tue,  1 Dec 2026 04:50:35 +0000 (UTC)\r\n\r\nFinal-Recipient: rfc822; nobody-here@example.test\r\nOriginal-Recipient: rfc822;nobody-here@example.test\r\nAction: failed\r\nStatus: 5.1.1\r\nRemote-MTA: dns; localhost\r\nDiagnostic-Code: smtp; 550-Mailbox unknown.  Either there is no mailbox\r\n    associated with this 550-name or you do not have authorization to see it.\r\n    550 5.1.1 User unknown\r\n";
    const POSTFIX_RETURNED: &str = "Return-Path: <dsnprobe@example.test>\r\nMessage-ID: <3129a0fe-a09d-4a73-a6b4-1d604901bd83@example.test>\r\nFrom: dsnprobe@example.test\r\nTo: nobody-here@example.test\r\nX-AAMP-Intent: task.dispatch\r\nX-AAMP-TaskId: 7426395a-b85c-4803-a20c-6d7f93692918\r\n\r\nhello\r\n";

    #[test]
    fn a_postfix_bounce_names_the_mail_and_the_missing_address() {
        let n = parse(POSTFIX_STATUS, POSTFIX_RETURNED).unwrap();
        assert_eq!(
            n.message_id.as_deref(),
            Some("<3129a0fe-a09d-4a73-a6b4-1d604901bd83@example.test>")
        );
        assert_eq!(
            n.task_id.as_deref(),
            Some("7426395a-b85c-4803-a20c-6d7f93692918")
        );
        assert_eq!(n.intent.as_deref(), Some("task.dispatch"));
        let failed: Vec<&Recipient> = n.failed().collect();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].address, "nobody-here@example.test");
        assert_eq!(failed[0].status, "5.1.1");
        let said = failed[0].describe();
        assert!(
            said.starts_with(
                "nobody-here@example.test: the address does not exist (5.1.1; 550-Mailbox unknown."
            ),
            "{said}"
        );
        assert!(said.ends_with("550 5.1.1 User unknown)"), "{said}");
    }

    #[test]
    fn a_delay_is_not_a_failure_and_no_recipients_is_no_notification() {
        let delayed = POSTFIX_STATUS
            .replace("Action: failed", "Action: delayed")
            .replace("Status: 5.1.1", "Status: 4.4.1");
        let n = parse(&delayed, "").unwrap();
        assert_eq!(n.failed().count(), 0);
        assert_eq!(n.message_id, None);
        assert!(parse("Reporting-MTA: dns; x\n", "").is_none());
        assert!(parse("", "").is_none());
        assert!(parse("garbage without fields\n\n\u{0}\u{1}", "\n\n").is_none());
    }
}
