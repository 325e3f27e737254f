//! The test mail host (scripts/mailhost.sh): the shared instance started on first use (two mail
//! domains, each the other's MX, signing with DKIM and verifying what comes in), private
//! instances for tests that stop it, fresh mailboxes per test, and a stranger's way in (the
//! inbound port).

use super::*;

pub struct MailHost {
    pub domain: String,
    pub password: String,
    pub jmap_url: String,
    pub smtp_port: u16,
    /// Submission that requires STARTTLS (a self-signed certificate), as strict clients use it.
    pub smtp_tls_port: u16,
    /// Submission as stock Postfix does it: its Received field does not name the login.
    pub smtp_stock_port: u16,
    /// The inbound (MX) port: plain SMTP from other servers, no authentication.
    pub mx_port: u16,
    /// The name OpenDKIM writes first in the `Authentication-Results` it adds to mail coming
    /// in (a mailbox's `authserv_id`).
    pub authserv_id: String,
    /// Environment for scripts/mailhost.sh that selects this instance (empty: the shared one).
    env: Vec<(String, String)>,
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script(args: &[&str]) -> std::process::Output {
    script_with(&[], args)
}

fn script_with(env: &[(String, String)], args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(repo().join("scripts/mailhost.sh"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("bash runs scripts/mailhost.sh")
}

/// The mail host for a test, started on first use when it is not running already.
///
/// On a machine that has none (the host is not running, and Cyrus is not installed or this
/// is not root) the test fails with the one line that says how to start it: a bare
/// `cargo test` never reports a mail-host test as passed that did not run. With
/// `AAMP_SKIP_MAILHOST=1` it is `None` instead, so the test returns at once
/// (`let Some(host) = mailhost() else { return };`) after listing itself as NOT RUN on stderr,
/// past the test harness's capture. `AAMP_REQUIRE_MAILHOST` (set by `scripts/test.sh`, and so
/// CI) goes straight to the host: one that cannot start fails the test.
pub fn mailhost() -> Option<&'static MailHost> {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    let available = *AVAILABLE.get_or_init(|| {
        std::env::var_os("AAMP_REQUIRE_MAILHOST").is_some()
            || script(&["check"]).status.success()
            || (Path::new("/usr/lib/cyrus/bin/master").exists()
                && nix::unistd::Uid::effective().is_root())
    });
    if available {
        return Some(shared_host());
    }
    if std::env::var_os("AAMP_SKIP_MAILHOST").is_none() {
        panic!("{NO_MAILHOST}");
    }
    use std::io::Write as _;
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let _ = writeln!(
        std::io::stderr().lock(),
        "NOT RUN (AAMP_SKIP_MAILHOST, no test mail host): {test}"
    );
    None
}

/// What a mail-host test says on a machine without the host.
pub const NO_MAILHOST: &str = "this test needs the test mail host, which is not running: \
    start it with `sudo scripts/mailhost.sh install && sudo scripts/mailhost.sh start` \
    (or run everything with `sudo scripts/test.sh`); AAMP_SKIP_MAILHOST=1 lists these tests \
    as NOT RUN instead";

/// The shared mail host, started when it is not running; a failure to start it fails the test.
pub fn shared_host() -> &'static MailHost {
    static HOST: OnceLock<MailHost> = OnceLock::new();
    HOST.get_or_init(|| {
        if !script(&["check"]).status.success() {
            let out = script(&["start"]);
            assert!(
                out.status.success(),
                "the mail host did not start (run `bash scripts/mailhost.sh install` as root first):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        host_from_env("MAILHOST", "example.test", 0)
    })
}

/// The shared host's second mail domain (`example2.test`, started with the first), skipped
/// the way [`mailhost`] is: mail between the two is DKIM-signed by the sender's domain and
/// carries the receiving domain's `Authentication-Results`.
pub fn mailhost2() -> Option<&'static MailHost> {
    mailhost()?;
    static HOST: OnceLock<MailHost> = OnceLock::new();
    Some(HOST.get_or_init(|| {
        assert!(
            std::env::var_os("MAILHOST2_DOMAIN").is_none_or(|d| !d.is_empty()),
            "this test needs the mail host's second domain, which MAILHOST2_DOMAIN= switches off"
        );
        host_from_env("MAILHOST2", "example2.test", 10000)
    }))
}

/// The instance that scripts/mailhost.sh runs from the `PREFIX_*` variables (the defaults of
/// the first domain's ports plus `port_offset`).
fn host_from_env(prefix: &str, domain: &str, port_offset: u16) -> MailHost {
    let port = |var: &str, default: u16| {
        std::env::var(format!("{prefix}_{var}"))
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default + port_offset)
    };
    let domain = std::env::var(format!("{prefix}_DOMAIN")).unwrap_or_else(|_| domain.into());
    MailHost {
        authserv_id: format!("mx.{domain}"),
        domain,
        password: std::env::var("MAILHOST_PASSWORD").unwrap_or_else(|_| "secret".into()),
        jmap_url: format!(
            "http://127.0.0.1:{}/.well-known/jmap",
            port("JMAP_PORT", 18080)
        ),
        smtp_port: port("SUBMIT_PORT", 15587),
        smtp_tls_port: port("SUBMIT_TLS_PORT", 15588),
        smtp_stock_port: port("SUBMIT_STOCK_PORT", 15589),
        mx_port: port("MX_PORT", 12525),
        env: Vec::new(),
    }
}

/// A mail host instance of its own (own folder and ports), for tests that stop and start it.
/// It is stopped and deleted on drop.
pub struct PrivateHost(pub MailHost);

impl PrivateHost {
    /// Starts an instance on six ports the OS says are free (the machine may run other
    /// servers). A port can be taken between asking and binding (Cyrus and Postfix cannot be
    /// told to pick their own), so a failed start is tried again on new ports, twice.
    pub fn start(name: &str) -> PrivateHost {
        shared_host(); // the packages are installed and the shared instance's syslog sink runs
        let dir = format!("/tmp/aamp-mailhost-{name}-{}", std::process::id());
        let mut attempt = 0;
        loop {
            attempt += 1;
            let listeners: Vec<std::net::TcpListener> = (0..6)
                .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
                .collect();
            let ports: Vec<u16> = listeners
                .iter()
                .map(|l| l.local_addr().unwrap().port())
                .collect();
            drop(listeners);
            let (jmap, imap, submit, mx, submit_tls) =
                (ports[0], ports[1], ports[2], ports[3], ports[4]);
            let env: Vec<(String, String)> = vec![
                ("MAILHOST_DIR".into(), dir.clone()),
                ("MAILHOST_JMAP_PORT".into(), jmap.to_string()),
                ("MAILHOST_IMAP_PORT".into(), imap.to_string()),
                ("MAILHOST_SUBMIT_PORT".into(), submit.to_string()),
                ("MAILHOST_MX_PORT".into(), mx.to_string()),
                ("MAILHOST_SUBMIT_TLS_PORT".into(), submit_tls.to_string()),
                ("MAILHOST_SUBMIT_STOCK_PORT".into(), ports[5].to_string()),
                // One domain: the shared host runs the second.
                ("MAILHOST2_DOMAIN".into(), String::new()),
            ];
            let out = script_with(&env, &["start"]);
            if !out.status.success() {
                let _ = script_with(&env, &["clean"]);
                assert!(
                    attempt < 3,
                    "private mail host did not start:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            }
            return PrivateHost(MailHost {
                domain: "example.test".into(),
                password: "secret".into(),
                jmap_url: format!("http://127.0.0.1:{jmap}/.well-known/jmap"),
                smtp_port: submit,
                smtp_tls_port: submit_tls,
                smtp_stock_port: ports[5],
                mx_port: mx,
                authserv_id: "mx.example.test".into(),
                env,
            });
        }
    }

    pub fn stop(&self) {
        let out = script_with(&self.0.env, &["stop"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn restart(&self) {
        let out = script_with(&self.0.env, &["start"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateHost {
    fn drop(&mut self) {
        let _ = script_with(&self.0.env, &["clean"]);
    }
}

impl MailHost {
    /// A new mailbox whose name starts with `prefix`, unique to this test run.
    pub fn user(&self, prefix: &str) -> Account {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "{prefix}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let email = format!("{name}@{}", self.domain);
        let out = script_with(&self.env, &["adduser", &email]);
        assert!(
            out.status.success(),
            "adduser {email}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Account {
            name: name.clone(),
            email: email.clone(),
            jmap_url: url::Url::parse(&self.jmap_url).unwrap(),
            login: email,
            password: aamp_bridge::config::Secret::fixed(&name, self.password.clone()),
            smtp_host: "127.0.0.1".into(),
            smtp_port: self.smtp_port,
            smtp_security: SmtpSecurity::Plain,
            insecure_tls: false,
            poll_interval: Duration::from_secs(1),
            push: false,
            push_transport: aamp_bridge::config::PushTransport::Auto,
            reconcile_interval: Duration::from_secs(60),
            save_sent: false,
            aamp_url: None,
            sender_auth: aamp_bridge::config::SenderAuth::Auto,
            authserv_id: None,
            replica: None,
        }
    }

    /// Changes the password of `account` on the host: logins from now on need `password`
    /// (a session already logged in, such as an open SMTP connection, keeps working).
    pub fn set_password(&self, account: &Account, password: &str) {
        let out = script_with(&self.env, &["passwd", &account.email, password]);
        assert!(
            out.status.success(),
            "passwd {}: {}",
            account.email,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A `[mailboxes.<key>]` table for `account`, reading the password from `password_file`.
    pub fn mailbox_toml(&self, key: &str, account: &Account) -> String {
        self.mailbox_toml_with(key, account, "poll_interval_secs = 1\n")
    }

    /// Like [`MailHost::mailbox_toml`], with other settings (poll interval, push) given.
    pub fn mailbox_toml_with(&self, key: &str, account: &Account, settings: &str) -> String {
        format!(
            "[mailboxes.{key}]\nemail = \"{}\"\njmap_url = \"{}\"\npassword_file = \"password\"\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {}\nsmtp_security = \"plain\"\n{settings}\n",
            account.email, self.jmap_url, self.smtp_port
        )
    }
}

/// Hands `data` to the mail host's inbound (MX) port as another server would: plain SMTP, no
/// login, any envelope and headers. What a forger can do.
pub fn inject_mx(host: &MailHost, from: &str, to: &str, data: &str) {
    inject_mx_as(host, "forger.test", from, to, data)
}

/// A delivery report as Postfix writes one, saying `message_id` (sent to `failed`) could not
/// be delivered, handed to the inbound port by a stranger.
pub fn forge_report(host: &MailHost, to: &str, message_id: &str, failed: &str) {
    let boundary = format!("forged-{}", uuid::Uuid::new_v4().simple());
    inject_mx(
        host,
        "",
        to,
        &format!(
            "Received: by localhost (Postfix)\n\tid 476F198EDB2; Wed,  2 Dec 2026 00:48:51 +0000 (UTC)\n\
             From: Mail Delivery System <MAILER-DAEMON@{domain}>\nTo: {to}\n\
             Subject: Undelivered Mail Returned to Sender\nAuto-Submitted: auto-replied\n\
             Message-ID: <{boundary}@{domain}>\nMIME-Version: 1.0\n\
             Content-Type: multipart/report; report-type=delivery-status; boundary=\"{boundary}\"\n\n\
             --{boundary}\nContent-Type: text/plain\n\nYour mail could not be delivered.\n\n\
             --{boundary}\nContent-Type: message/delivery-status\n\n\
             Reporting-MTA: dns; localhost\n\n\
             Final-Recipient: rfc822; {failed}\nOriginal-Recipient: rfc822;{failed}\n\
             Action: failed\nStatus: 5.1.1\nDiagnostic-Code: x-unix; user unknown\n\n\
             --{boundary}\nContent-Type: text/rfc822-headers\n\n\
             From: {to}\nTo: {failed}\nMessage-ID: {message_id}\nSubject: whatever\n\n\
             --{boundary}--\n",
            domain = host.domain,
        ),
    );
}

/// [`inject_mx`] with the EHLO name `ehlo`, which Postfix copies into its own Received field.
pub fn inject_mx_as(host: &MailHost, ehlo: &str, from: &str, to: &str, data: &str) {
    use std::io::{BufRead, Write};
    let stream = std::net::TcpStream::connect(("127.0.0.1", host.mx_port)).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let expect = |code: &str, reader: &mut BufReader<std::net::TcpStream>| loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with(code), "expected {code}, got {line:?}");
        if line.as_bytes().get(3) != Some(&b'-') {
            break;
        }
    };
    expect("220", &mut reader);
    for (command, code) in [
        (format!("EHLO {ehlo}"), "250"),
        (format!("MAIL FROM:<{from}>"), "250"),
        (format!("RCPT TO:<{to}>"), "250"),
        ("DATA".to_string(), "354"),
    ] {
        write!(writer, "{command}\r\n").unwrap();
        expect(code, &mut reader);
    }
    let body = data.replace("\r\n", "\n").replace('\n', "\r\n");
    write!(writer, "{body}\r\n.\r\n").unwrap();
    expect("250", &mut reader);
    write!(writer, "QUIT\r\n").unwrap();
}
