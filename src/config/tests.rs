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

fn load_err(config: &str, pass_mode: u32, config_mode: u32) -> String {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "coder.pass", "secret\n", pass_mode);
    let path = write(dir.path(), "config.toml", config, config_mode);
    LoadedConfig::load(&path).unwrap_err().to_string()
}

/// Issue 18: `jmap_url = "http://mail.example.com/…"` loaded without a word and sent the
/// password with Basic auth in clear.
#[test]
fn plain_http_to_another_host_is_refused_unless_the_mailbox_says_so() {
    let remote = GOOD.replace("http://127.0.0.1:18080", "http://mail.example.com");
    let e = load_err(&remote, 0o600, 0o644);
    assert!(
        e.contains("mailboxes.coder.jmap_url")
            && e.contains("unencrypted")
            && e.contains("insecure_http"),
        "{e}"
    );
    let e = load_err(
        &GOOD.replace(
            "smtp_security = \"plain\"",
            "smtp_security = \"plain\"\naamp_url = \"http://aamp.example.com\"",
        ),
        0o600,
        0o644,
    );
    assert!(e.contains("mailboxes.coder.aamp_url"), "{e}");
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
    let e = load_err(
        &GOOD.replace("127.0.0.1\"\nsmtp_port", "mail.example.com\"\nsmtp_port"),
        0o600,
        0o644,
    );
    assert!(
        e.contains("mailboxes.coder.smtp_security") && e.contains("loopback"),
        "{e}"
    );
    let e = load_err(GOOD, 0o644, 0o644);
    assert!(
        e.contains("password_file") && e.contains("chmod 600"),
        "{e}"
    );
    let e = load_err(
        &GOOD.replace("password_file = \"coder.pass\"", "password = \"x\""),
        0o600,
        0o644,
    );
    assert!(e.contains("chmod 600") && e.contains("config.toml"), "{e}");
    let e = load_err(
        &GOOD.replace("name = \"coder\"", "name = \"Coder!\""),
        0o600,
        0o644,
    );
    assert!(e.contains("agents[0].name"), "{e}");
    let e = load_err(
        &GOOD.replace(
            "profile = \"echo\"",
            "profile = \"echo\"\nmailbox = \"nope\"",
        ),
        0o600,
        0o644,
    );
    assert!(
        e.contains("agents[0].mailbox") && e.contains("coder"),
        "{e}"
    );
    let e = load_err(
        &GOOD.replace("smtp_port = 15587", "smtp_prot = 15587"),
        0o600,
        0o644,
    );
    assert!(e.contains("line 7") && e.contains("smtp_prot"), "{e}");
    let e = load_err(
        &GOOD.replace(
            "allow_from = [\"*@example.test\"]",
            "allow_from = [\"everyone\"]",
        ),
        0o600,
        0o644,
    );
    assert!(e.contains("allow_from[0]"), "{e}");
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
/// are not conditional (two bridges there would both run a task).
#[test]
fn replicas_are_named_well_and_only_on_aamp_mailboxes() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "coder.pass", "secret\n", 0o600);
    let named = GOOD.replace(
        "smtp_security = \"plain\"",
        "smtp_security = \"plain\"\nreplica = \"Host-A\"\nlease_secs = 30",
    );
    let path = write(dir.path(), "config.toml", &named, 0o644);
    let replica = LoadedConfig::load(&path)
        .unwrap()
        .account("coder")
        .unwrap()
        .replica
        .unwrap();
    assert_eq!(replica.name, "host-a");
    assert_eq!(replica.lease, std::time::Duration::from_secs(30));
    let e = load_err(
        &GOOD.replace(
            "smtp_security = \"plain\"",
            "smtp_security = \"plain\"\nreplica = \"host a\"",
        ),
        0o600,
        0o644,
    );
    assert!(e.contains("mailboxes.coder.replica"), "{e}");
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
    let e = load_err(asmtp, 0o600, 0o644);
    assert!(
        e.contains("mailboxes.coder.replica") && e.contains("one bridge"),
        "{e}"
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
    let e = load_err(&amp("timeout_secs = 0"), 0o600, 0o644);
    assert!(
        e.contains("timeout_secs") && e.contains("at least 1"),
        "{e}"
    );
    assert_eq!(
        recheck_of(&amp("")),
        Some(std::time::Duration::from_secs(300))
    );
    assert_eq!(recheck_of(&amp("recheck_secs = 0")), None);
    let e = load_err(
        &GOOD.replace(
            "smtp_security = \"plain\"",
            "smtp_security = \"plain\"\nrecheck_secs = 10",
        ),
        0o600,
        0o644,
    );
    assert!(e.contains("recheck_secs"), "{e}");
}
