//! What both benchmarks need: the mail host's addresses, new mailboxes on it, and an
//! account for the bridge's own mail clients.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use std::time::Instant;

use aamp_bridge::config::{Account, PushTransport, SenderAuth, SmtpSecurity};
use aamp_bridge::protocol::{AampMessage, Dispatch, Intent, Priority};

pub const JMAP: &str = "http://127.0.0.1:18080/.well-known/jmap";
pub const SMTP_PORT: u16 = 15587;
pub const DOMAIN: &str = "example.test";
pub const PASSWORD: &str = "secret";

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn adduser(prefix: &str) -> String {
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    );
    let out = Command::new("bash")
        .arg(repo().join("scripts/mailhost.sh"))
        .args(["adduser", &name, PASSWORD])
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "adduser: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("{name}@{DOMAIN}")
}

pub fn account(email: &str) -> Account {
    Account {
        name: "bench".into(),
        email: email.into(),
        jmap_url: url::Url::parse(JMAP).unwrap(),
        login: email.into(),
        password: aamp_bridge::config::Secret::fixed("bench", PASSWORD),
        smtp_host: "127.0.0.1".into(),
        smtp_port: SMTP_PORT,
        smtp_security: SmtpSecurity::Plain,
        insecure_tls: false,
        poll_interval: Duration::from_secs(1),
        push: false,
        push_transport: PushTransport::Auto,
        reconcile_interval: Duration::from_secs(60),
        save_sent: false,
        aamp_url: None,
        sender_auth: SenderAuth::Auto,
        authserv_id: None,
        replica: None,
    }
}

/// A dispatch of bench task `n`.
pub fn dispatch(from: &str, to: &str, n: usize) -> AampMessage {
    AampMessage::dispatch(
        format!("bench-{n}-{}", uuid::Uuid::new_v4()),
        from,
        to,
        Dispatch {
            title: format!("bench {n}"),
            priority: Priority::Normal,
            body_text: "instant".into(),
            ..Dispatch::default()
        },
    )
}

/// `n` dispatches sent one after another; seconds from the first sent to the last result
/// seen by the dispatcher.
pub fn burst_run(
    rt: &tokio::runtime::Runtime,
    sender: &aamp_bridge::mailbox::aamp::Sender,
    mailbox: &aamp_bridge::mailbox::aamp::Reader,
    boss: &str,
    to: &str,
    n: usize,
) -> f64 {
    let mut state =
        aamp_bridge::mailbox::aamp::Position::at(rt.block_on(mailbox.current_state()).unwrap());
    let started = Instant::now();
    let mut ids: std::collections::HashSet<String> = (0..n)
        .map(|i| {
            let msg = dispatch(boss, to, 200_000 + i);
            rt.block_on(sender.send(&msg)).unwrap();
            msg.task_id().to_string()
        })
        .collect();
    while !ids.is_empty() {
        let (inbound, next) = rt.block_on(mailbox.fetch_since(&state, 50)).unwrap();
        state = next;
        for m in inbound {
            if m.message.intent() == Intent::TaskResult {
                ids.remove(m.message.task_id());
            }
        }
        if started.elapsed() > Duration::from_secs(120) {
            eprintln!(
                "{} of {n} results missing after 120 s; stopping this measure",
                ids.len()
            );
            return f64::INFINITY;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed().as_secs_f64()
}
