//! `aamp-bridge dispatch`: sends a task from one of the config's mailboxes and waits for its answer
//! (with `--follow`, its live stream).

use crate::output::{errln, outln};

use super::stream_printer::StreamPrinter;
use super::*;

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
    let text = if args.text == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the task text from stdin")?;
        s
    } else {
        args.text.clone()
    };
    let mut mailbox = crate::mailbox::Dispatcher::new(&account)?;
    mailbox
        .connect()
        .await
        .with_context(|| format!("connecting to the mailbox {}", account.email))?;
    let task_id = uuid::Uuid::new_v4().to_string();
    let msg = AampMessage::dispatch(
        task_id.clone(),
        &account.email,
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
    );
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    // The stream follower, when there is one; aborted when the result is in.
    let mut following = tokio::task::JoinSet::new();
    let mut followed = false;
    // Who answered this task: a report that one of them could not be reached is not true.
    let mut answered: Vec<String> = Vec::new();
    loop {
        let mail = mailbox.new_mail().await?;
        let mut inbound = Vec::new();
        let mut bounces = Vec::new();
        for m in mail {
            match m {
                crate::inbound::Mail::Aamp(i) => {
                    if i.message.task_id() == task_id {
                        answered.push(crate::protocol::address(&i.message.envelope.from));
                    }
                    inbound.push(i.message)
                }
                crate::inbound::Mail::Bounce(b) => bounces.push(b),
                _ => {}
            }
        }
        for b in bounces {
            // The server could not deliver the dispatch: no answer will come.
            let of_this = b
                .notification
                .message_id
                .as_deref()
                .map(crate::protocol::message::normalize_message_id)
                == Some(crate::protocol::message::normalize_message_id(&message_id));
            let unreached = unreached(&b.notification, &args.to, &answered);
            if !of_this || unreached.is_empty() {
                if of_this {
                    errln!("ignored a delivery report naming no address that has not answered");
                }
                continue;
            }
            let failed: Vec<String> = unreached.iter().map(|r| r.describe()).collect();
            if args.json {
                outln!(
                    "{}",
                    serde_json::json!({"taskId": task_id, "messageId": message_id,
                                       "undeliverable": failed})
                );
            }
            errln!("the dispatch could not be delivered: {}", failed.join("; "));
            return Ok(3);
        }
        for m in inbound.into_iter().filter(|m| m.task_id() == task_id) {
            match &m.body {
                Body::StreamOpened { stream_id } if args.follow && !followed => {
                    followed = true;
                    match mailbox.streams().await {
                        Ok(Some(helper)) => {
                            let (stream_id, json) = (stream_id.clone(), args.json);
                            following.spawn(async move {
                                let mut printer = StreamPrinter::default();
                                let done =
                                    helper.follow(&stream_id, |e| printer.print(&e, json)).await;
                                printer.end();
                                if let Err(e) = done {
                                    errln!("the live stream ended: {e}");
                                }
                            });
                        }
                        Ok(None) => {
                            errln!("no live stream: the mailbox {} has no aamp_url", args.from)
                        }
                        Err(e) => errln!("no live stream: {e}"),
                    }
                }
                Body::Ack => errln!("acknowledged by {}", m.envelope.from),
                Body::HelpNeeded(h) => errln!("the agent needs help: {}", h.question),
                Body::Result(r) => {
                    // What the stream still has to say comes before the result.
                    if followed {
                        let _ = tokio::time::timeout(Duration::from_secs(5), following.join_next())
                            .await;
                        following.abort_all();
                    }
                    if args.json && args.follow {
                        outln!("{}", crate::events::json_text(&m.to_json())?);
                    } else if args.json {
                        outln!("{}", serde_json::to_string_pretty(&m.to_json())?);
                    } else if r.status == Status::Completed {
                        outln!("{}", r.output);
                    } else {
                        errln!(
                            "rejected: {}",
                            r.error.as_deref().unwrap_or("no reason given")
                        );
                    }
                    return Ok(if r.status == Status::Completed { 0 } else { 1 });
                }
                _ => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("no result for task {task_id} within {}s (it may still come; the agent's mailbox is {})", args.timeout, args.to);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
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
