//! The loader's tests: a good config, and every refusal naming its key and fix.

use super::*;
use std::os::unix::fs::PermissionsExt;

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

const GOOD: &str = r#"
[mailboxes.coder]
email = "coder@example.test"
jmap_url = "http://127.0.0.1:18080/.well-known/jmap"
password_file = "coder.pass"
smtp_host = "127.0.0.1"
smtp_port = 15587
smtp_security = "plain"

[[agents]]
name = "coder"
profile = "echo"
allow_from = ["*@example.test"]
"#;

#[test]
fn a_good_config_loads() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "coder.pass", "secret\n", 0o600);
    let path = write(dir.path(), "config.toml", GOOD, 0o644);
    let loaded = LoadedConfig::load(&path).unwrap();
    let account = loaded.account("coder").unwrap();
    assert_eq!(account.password.value(), "secret");
    assert_eq!(account.login, "coder@example.test");
    assert_eq!(account.smtp_port, 15587);
    assert_eq!(loaded.agents(&[]).unwrap().len(), 1);
    assert!(
        !format!("{account:?}").contains("secret"),
        "Debug must not show the password"
    );
}

/// [`GOOD`] with `keys` added to its mailbox's table.
fn good_with(keys: &str) -> String {
    GOOD.replace(
        "smtp_security = \"plain\"",
        &format!("smtp_security = \"plain\"\n{keys}"),
    )
}

fn load_err(config: &str, pass_mode: u32, config_mode: u32) -> String {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "coder.pass", "secret\n", pass_mode);
    let path = write(dir.path(), "config.toml", config, config_mode);
    LoadedConfig::load(&path).unwrap_err().to_string()
}

/// Asserts that `config` (beside a private password file) is refused with an error that
/// says each of `says`.
#[track_caller]
fn assert_refused(config: &str, says: &[&str]) {
    let e = load_err(config, 0o600, 0o644);
    assert!(says.iter().all(|s| e.contains(s)), "{says:?}: {e}");
}

/// Issue 18: `jmap_url = "http://mail.example.com/…"` loaded without a word and sent the
/// password with Basic auth in clear.
#[test]
fn plain_http_to_another_host_is_refused_unless_the_mailbox_says_so() {
    let remote = GOOD.replace("http://127.0.0.1:18080", "http://mail.example.com");
    assert_refused(
        &remote,
        &["mailboxes.coder.jmap_url", "unencrypted", "insecure_http"],
    );
    assert_refused(
        &good_with("aamp_url = \"http://aamp.example.com\""),
        &["mailboxes.coder.aamp_url"],
    );
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "coder.pass", "secret\n", 0o600);
    let allowed = remote.replace(
        "smtp_security = \"plain\"",
        "smtp_security = \"plain\"\ninsecure_http = true",
    );
    let path = write(dir.path(), "config.toml", &allowed, 0o644);
    let loaded = LoadedConfig::load(&path).unwrap();
    assert_eq!(loaded.account("coder").unwrap().jmap_url.scheme(), "http");
}

#[test]
fn errors_name_the_key_and_the_fix() {
    let edit = |from: &str, to: &str| GOOD.replace(from, to);
    // (the config, the password file's mode, what the error says)
    let cases: [(String, u32, &[&str]); 7] = [
        (
            edit("127.0.0.1\"\nsmtp_port", "mail.example.com\"\nsmtp_port"),
            0o600,
            &["mailboxes.coder.smtp_security", "loopback"],
        ),
        (GOOD.to_string(), 0o644, &["password_file", "chmod 600"]),
        (
            edit("password_file = \"coder.pass\"", "password = \"x\""),
            0o600,
            &["chmod 600", "config.toml"],
        ),
        (
            edit("name = \"coder\"", "name = \"Coder!\""),
            0o600,
            &["agents[0].name"],
        ),
        (
            edit(
                "profile = \"echo\"",
                "profile = \"echo\"\nmailbox = \"nope\"",
            ),
            0o600,
            &["agents[0].mailbox", "coder"],
        ),
        (
            edit("smtp_port = 15587", "smtp_prot = 15587"),
            0o600,
            &["line 7", "smtp_prot"],
        ),
        (
            edit(
                "allow_from = [\"*@example.test\"]",
                "allow_from = [\"everyone\"]",
            ),
            0o600,
            &["allow_from[0]"],
        ),
    ];
    for (config, pass_mode, says) in cases {
        let e = load_err(&config, pass_mode, 0o644);
        assert!(says.iter().all(|s| e.contains(s)), "{says:?}: {e}");
    }
}

#[test]
fn loopback_hosts() {
    assert!(
        is_loopback("127.0.0.1")
            && is_loopback("localhost")
            && is_loopback("[::1]")
            && is_loopback("127.8.9.1")
    );
    assert!(!is_loopback("10.0.0.1") && !is_loopback("mail.example.com"));
}

/// Issue 22: `replica` names this bridge among several on an AAMP mailbox; a name that could
/// not be a keyword is refused, and so is `replica` on an ASMTP or AMP mailbox, whose reads
/// are not conditional (two bridges there would both run a task): it is an AAMP key only.
#[test]
fn replicas_are_named_well_and_only_on_aamp_mailboxes() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "coder.pass", "secret\n", 0o600);
    let named = good_with("replica = \"Host-A\"\nlease_secs = 30");
    let path = write(dir.path(), "config.toml", &named, 0o644);
    let replica = LoadedConfig::load(&path)
        .unwrap()
        .account("coder")
        .unwrap()
        .replica
        .unwrap();
    assert_eq!(replica.name, "host-a");
    assert_eq!(replica.lease, std::time::Duration::from_secs(30));
    assert_refused(
        &good_with("replica = \"host a\""),
        &["mailboxes.coder.replica"],
    );
    let asmtp = r#"
[mailboxes.coder]
kind = "asmtp"
asmtp_url = "http://127.0.0.1:9"
handle = "@owner.coder"
token_file = "coder.pass"
replica = "host-a"

[[agents]]
name = "coder"
profile = "echo"
allow_from = ["@owner.boss"]
"#;
    assert_refused(
        asmtp,
        &["line 7: mailboxes.coder.replica", "AAMP mailboxes only"],
    );
}

/// `recheck_secs` is an AMP key: five minutes unless set, 0 turns it off, and another kind
/// of mailbox refuses it. `timeout_secs` (one HTTP call) is 120 s on AMP unless set (issue
/// 21: the fixed 30 s cut every read of a large message on the real broker), never 0.
#[test]
fn recheck_secs_and_timeout_secs_of_amp_mailboxes() {
    let amp = |extra: &str| {
        format!(
            "[mailboxes.coder]\nkind = \"amp\"\namp_url = \"http://127.0.0.1:9\"\naddress = \"coder@alice.amp.test\"\nagent_id = \"a1\"\napi_key_file = \"coder.pass\"\n{extra}\n[[agents]]\nname = \"coder\"\nprofile = \"echo\"\nallow_from = [\"boss@alice.amp.test\"]\n"
        )
    };
    let account_of = |text: &str| {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "coder.pass", "secret\n", 0o600);
        let path = write(dir.path(), "config.toml", text, 0o644);
        LoadedConfig::load(&path)
            .unwrap()
            .amp_account("coder")
            .unwrap()
    };
    let recheck_of = |text: &str| account_of(text).recheck;
    assert_eq!(
        account_of(&amp("")).timeout,
        std::time::Duration::from_secs(120)
    );
    assert_eq!(
        account_of(&amp("timeout_secs = 20")).timeout,
        std::time::Duration::from_secs(20)
    );
    assert_refused(&amp("timeout_secs = 0"), &["timeout_secs", "at least 1"]);
    assert_eq!(
        recheck_of(&amp("")),
        Some(std::time::Duration::from_secs(300))
    );
    assert_eq!(recheck_of(&amp("recheck_secs = 0")), None);
    assert_refused(&good_with("recheck_secs = 10"), &["recheck_secs"]);
}

/// Issue 34: each kind of mailbox reads only its own keys. A key of another kind is refused
/// at its line, naming the mailbox, the key, the kinds it belongs to, and what this kind
/// takes; so is a key of no kind, a value of the wrong type, and an unknown kind.
#[test]
fn a_key_of_another_kind_is_refused_naming_the_mailbox_the_key_and_its_kind() {
    assert_refused(
        &good_with("recheck_secs = 10"),
        &[
            "line 9: mailboxes.coder.recheck_secs: a key of AMP mailboxes only",
            "kind is not set",
            "set kind = \"amp\"",
            "kind = \"aamp\" takes email, credentials_file",
        ],
    );
    assert_refused(
        &good_with("timeout_secs = 10"),
        &[
            "a key of AMP, ASMTP and SAMP mailboxes only",
            "set kind = \"amp\", \"asmtp\" or \"samp\"",
        ],
    );
    let samp = "\n[mailboxes.coder]\nkind = \"samp\"\nsamp_url = \"http://127.0.0.1:9/mcp\"\nkey_file = \"coder.pass\"\npoll_interval_secs = 2\nsmtp_host = \"x\"\n";
    assert_refused(
        samp,
        &[
            "line 7: mailboxes.coder.smtp_host: a key of AAMP mailboxes only, and this mailbox is kind = \"samp\"",
            "fix: drop smtp_host",
            "kind = \"samp\" takes samp_url, key_file, timeout_secs (and, like every mailbox, insecure_tls, poll_interval_secs)",
        ],
    );
    assert_refused(
        &samp.replace("smtp_host = \"x\"", "samp_ulr = \"x\""),
        &[
            "line 7: mailboxes.coder.samp_ulr: no mailbox takes this key",
            "check its spelling",
        ],
    );
    assert_refused(
        &GOOD.replace("15587", "\"x\""),
        &["line 7: mailboxes.coder.smtp_port: invalid type"],
    );
    assert_refused(
        &good_with("kind = \"imap\""),
        &["line 9: mailboxes.coder.kind:", "\"asmtp\""],
    );
    // The same in an inline table, and with a mailbox of another kind before it.
    let inline = format!(
        "[mailboxes]\nme = {{ kind = \"samp\", samp_url = \"http://127.0.0.1:9/mcp\", key_file = \"coder.pass\" }}\n{}",
        GOOD.replace("[mailboxes.coder]\n", "coder = { ")
            .replace("\"\npassword_file", "\", password_file")
            .replace("\"\njmap_url", "\", jmap_url")
            .replace("\"\nsmtp_host", "\", smtp_host")
            .replace("\"\nsmtp_port = 15587\nsmtp_security = \"plain\"", "\", smtp_port = 15587, smtp_security = \"plain\", key_file = \"k\" }")
    );
    let e = load_err(&inline, 0o600, 0o644);
    assert!(
        e.contains("line 4: mailboxes.coder.key_file: a key of SAMP mailboxes only"),
        "{e}\n{inline}"
    );
}

/// Every kind keeps the keys every mailbox has, and takes its own.
#[test]
fn each_kind_reads_its_own_keys_and_the_common_ones() {
    let config: Config = toml::from_str(
        "[mailboxes.a]\nkind = \"asmtp\"\nhandle = \"@o.a\"\npoll_interval_secs = 2\ninsecure_tls = true\nskip_backlog = true\n[mailboxes.b]\nemail = \"b@x\"\n",
    )
    .unwrap();
    let MailboxConfig::Asmtp(a) = &config.mailboxes["a"] else {
        panic!("{:?}", config.mailboxes["a"])
    };
    assert_eq!(a.handle.as_deref(), Some("@o.a"));
    assert!(a.skip_backlog);
    assert_eq!(
        a.common,
        MailboxCommon {
            insecure_tls: true,
            poll_interval_secs: 2
        }
    );
    let b = config.mailboxes["b"].aamp().unwrap();
    assert_eq!(b.email.as_deref(), Some("b@x"));
    assert_eq!(b.common, MailboxCommon::default());
    assert!(b.push && b.save_sent);
    assert_eq!(b.lease_secs, 60);
}

/// The number keys left out take their defaults (the figures the docs give).
#[test]
fn number_keys_left_out_take_their_defaults() {
    let config: Config = toml::from_str(GOOD).unwrap();
    let top = (
        config.shutdown_grace_secs,
        config.outbox_retry_hours,
        config.journal_retention_days,
        config.journal_max_size_mb,
    );
    assert_eq!(top, (30, 24, 30, 1024));
    let agent = &config.agents[0];
    let per_agent = (
        agent.max_concurrent_tasks,
        agent.max_queued_tasks,
        agent.max_refusals_per_hour,
        agent.max_tasks_per_sender_per_hour,
        agent.max_turns_per_session,
        agent.max_hops,
    );
    assert_eq!(per_agent, (1, 100, 20, 1000, 100, 8));
}
