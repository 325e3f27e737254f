//! `aamp-bridge dispatch`: sends a task from one of the config's mailboxes and waits for its answer
//! (with `--follow`, its live stream).

use crate::output::{errln, outln};

use super::stream_printer::StreamPrinter;
use super::*;

use crate::inbound::{Bounce, Mail};
use crate::mailbox::Dispatcher;
use crate::protocol::message::normalize_message_id;

pub(super) async fn dispatch(config: &LoadedConfig, args: DispatchArgs) -> anyhow::Result<i32> {
    let account = config.account(&args.from)?;
    // A live stream goes through an AAMP service (the agent's bridge opens it there): with no
    // service, --follow would wait for a stream that never opens and show nothing.
    if args.follow && !args.no_wait && account.aamp_url.is_none() {
        errln!(
            "--follow shows the agent's live stream, which goes through an AAMP service, and the mailbox {} has none (no aamp_url): nothing would be streamed. Set aamp_url under [mailboxes.{}] to the service the agent's bridge uses, or dispatch without --follow (the answer still comes back by mail)",
            args.from, args.from
        );
        return Ok(2);
    }
    let text = task_text(&args)?;
    let mut mailbox = Dispatcher::new(&account)?;
    // The mailbox's place is taken before sending, so the answer cannot slip past it.
    mailbox
        .connect()
        .await
        .with_context(|| format!("connecting to the mailbox {}", account.email))?;
    let task_id = uuid::Uuid::new_v4().to_string();
    let msg = task(&task_id, &account.email, &args, text);
    let message_id = mailbox.send(&msg).await.context("sending the dispatch")?;
    errln!("sent task {task_id} to {} ({message_id})", args.to);
    if args.no_wait {
        if args.json {
            outln!(
                "{}",
                serde_json::json!({"taskId": task_id, "messageId": message_id})
            );
        }
        return Ok(0);
    }
    let waiting = Waiting {
        args: &args,
        task_id,
        message_id,
        mailbox,
        following: tokio::task::JoinSet::new(),
        followed: false,
        answered: Vec::new(),
    };
    waiting.until_answered().await
}

/// The task's text: the argument, or stdin for `-`.
fn task_text(args: &DispatchArgs) -> anyhow::Result<String> {
    if args.text != "-" {
        return Ok(args.text.clone());
    }
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .context("reading the task text from stdin")?;
    Ok(s)
}

/// The dispatch as mailed.
fn task(task_id: &str, from: &str, args: &DispatchArgs, text: String) -> AampMessage {
    AampMessage::dispatch(
        task_id.to_string(),
        from,
        &args.to,
        Dispatch {
            title: args.title.clone(),
            priority: Priority::Normal,
            session_key: args.session_key.clone(),
            // Run by an agent while it works on a task: one more hop than that task had.
            hop_count: std::env::var(crate::dispatch::HOPS_VAR)
                .ok()
                .and_then(|h| h.trim().parse::<u32>().ok())
                .map(|h| h.saturating_add(1)),
            body_text: text,
            ..Dispatch::default()
        },
    )
}

/// A dispatch sent, waited for: its acks, questions, live stream, and result or bounce.
struct Waiting<'a> {
    args: &'a DispatchArgs,
    task_id: String,
    message_id: String,
    mailbox: Dispatcher,
    /// The stream follower, when there is one; aborted when the result is in.
    following: tokio::task::JoinSet<()>,
    followed: bool,
    /// Who answered this task: a report that one of them could not be reached is not true.
    answered: Vec<String>,
}

impl Waiting<'_> {
    /// The exit code: 0 completed, 1 rejected, 3 undeliverable; an error past the timeout.
    async fn until_answered(mut self) -> anyhow::Result<i32> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(self.args.timeout);
        loop {
            let mail = self.mailbox.new_mail().await?;
            let (inbound, bounces) = self.sort(mail);
            for b in bounces {
                if let Some(code) = self.bounced(&b) {
                    return Ok(code);
                }
            }
            let task_id = self.task_id.clone();
            for m in inbound.iter().filter(|m| m.task_id() == task_id) {
                if let Some(code) = self.message(m).await? {
                    return Ok(code);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("no result for task {} within {}s (it may still come; the agent's mailbox is {})", self.task_id, self.args.timeout, self.args.to);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The AAMP messages and the delivery reports among new mail, noting who answered.
    fn sort(&mut self, mail: Vec<Mail>) -> (Vec<AampMessage>, Vec<Bounce>) {
        let mut inbound = Vec::new();
        let mut bounces = Vec::new();
        for m in mail {
            match m {
                Mail::Aamp(i) => {
                    if i.message.task_id() == self.task_id {
                        let from = crate::protocol::address(&i.message.envelope.from);
                        self.answered.push(from);
                    }
                    inbound.push(i.message)
                }
                Mail::Bounce(b) => bounces.push(b),
                Mail::Reply(_) => {}
            }
        }
        (inbound, bounces)
    }

    /// Exit 3 when the server could not deliver the dispatch: no answer will come.
    fn bounced(&self, b: &Bounce) -> Option<i32> {
        let of_this = b
            .notification
            .message_id
            .as_deref()
            .map(normalize_message_id)
            == Some(normalize_message_id(&self.message_id));
        let unreached = unreached(&b.notification, &self.args.to, &self.answered);
        if !of_this || unreached.is_empty() {
            if of_this {
                errln!("ignored a delivery report naming no address that has not answered");
            }
            return None;
        }
        let failed: Vec<String> = unreached.iter().map(|r| r.describe()).collect();
        if self.args.json {
            outln!(
                "{}",
                serde_json::json!({"taskId": self.task_id, "messageId": self.message_id,
                                   "undeliverable": failed})
            );
        }
        errln!("the dispatch could not be delivered: {}", failed.join("; "));
        Some(3)
    }

    /// One message about the task; its exit code when it is the result.
    async fn message(&mut self, m: &AampMessage) -> anyhow::Result<Option<i32>> {
        match &m.body {
            Body::StreamOpened { stream_id } if self.args.follow && !self.followed => {
                self.followed = true;
                self.follow(stream_id).await;
            }
            Body::Ack => errln!("acknowledged by {}", m.envelope.from),
            Body::HelpNeeded(h) => errln!("the agent needs help: {}", h.question),
            Body::Result(r) => {
                // What the stream still has to say comes before the result.
                if self.followed {
                    let next = self.following.join_next();
                    let _ = tokio::time::timeout(Duration::from_secs(5), next).await;
                    self.following.abort_all();
                }
                let args = self.args;
                if args.json && args.follow {
                    outln!("{}", crate::events::json_text(&m.to_json())?);
                } else if args.json {
                    outln!("{}", serde_json::to_string_pretty(&m.to_json())?);
                } else if r.status == Status::Completed {
                    outln!("{}", r.output);
                } else {
                    let why = r.error.as_deref().unwrap_or("no reason given");
                    errln!("rejected: {why}");
                }
                if let (Some(usage), false) = (&r.usage, args.json) {
                    errln!("usage: {}", crate::protocol::usage_wire::line(usage));
                }
                return Ok(Some(if r.status == Status::Completed { 0 } else { 1 }));
            }
            _ => {}
        }
        Ok(None)
    }

    /// Prints the task's live stream as it comes, beside the waiting.
    async fn follow(&mut self, stream_id: &str) {
        match self.mailbox.streams().await {
            Ok(Some(streams)) => {
                let (stream_id, json) = (stream_id.to_string(), self.args.json);
                self.following.spawn(async move {
                    let mut printer = StreamPrinter::default();
                    let done = streams
                        .follow(&stream_id, |e| printer.print(&e, json))
                        .await;
                    printer.end();
                    if let Err(e) = done {
                        errln!("the live stream ended: {e}");
                    }
                });
            }
            Ok(None) => {
                errln!(
                    "no live stream: the mailbox {} has no aamp_url",
                    self.args.from
                )
            }
            Err(e) => errln!("no live stream: {e}"),
        }
    }
}

/// The recipients a delivery report of the dispatch says it never reached that count: the
/// address it was sent to, only while that address has not answered (an ack or result from
/// it shows the report is not true).
fn unreached<'a>(
    report: &'a crate::protocol::dsn::Notification,
    to: &str,
    answered: &[String],
) -> Vec<&'a crate::protocol::dsn::Recipient> {
    let to = crate::protocol::address(to);
    report
        .failed()
        .filter(|r| {
            let address = crate::protocol::address(&r.address);
            address.eq_ignore_ascii_case(&to)
                && !answered.iter().any(|a| a.eq_ignore_ascii_case(&address))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::protocol::dsn::{Notification, Recipient};

    fn failed(address: &str) -> Recipient {
        Recipient {
            address: address.into(),
            action: "failed".into(),
            status: "5.1.1".into(),
            diagnostic: None,
        }
    }

    #[test]
    fn a_report_counts_only_for_the_address_dispatched_to_while_it_has_not_answered() {
        let report = Notification {
            message_id: Some("<d@x.test>".into()),
            task_id: None,
            intent: None,
            recipients: vec![failed("Agent@X.test"), failed("other@x.test")],
        };
        let to = "Helper <agent@x.test>";
        let unreached = super::unreached(&report, to, &[]);
        assert_eq!(unreached.len(), 1);
        assert_eq!(unreached[0].address, "Agent@X.test");
        assert!(super::unreached(&report, to, &["agent@x.test".into()]).is_empty());
        assert!(super::unreached(&report, "third@x.test", &[]).is_empty());
    }
}
