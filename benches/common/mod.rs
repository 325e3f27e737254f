//! What both benchmarks need: the mail host's addresses, new mailboxes on it, and an
//! account for the bridge's own mail clients.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use aamp_bridge::config::{Account, PushTransport, SenderAuth, SmtpSecurity};

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
        password: PASSWORD.into(),
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
