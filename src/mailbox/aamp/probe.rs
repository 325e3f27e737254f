//! Checking an AAMP mailbox as `doctor` and `init` do. The other kinds read their mailbox once
//! (their system's probe); an AAMP mailbox is a mail server's, where the bridge relies on more
//! than one login: JMAP and SMTP, push, the claims' keywords, the evidence of who sent a mail
//! and the AAMP service. Each part is a [`Finding`], so the shells print them without knowing
//! how AAMP reads a mailbox.

use super::{auth, helper, Reader, Sender};
use crate::config::{Account, SenderAuth};
use crate::mailbox::finding::{Finding, Verdict};
use crate::mailbox::MailboxError;

/// `doctor`'s check of an AAMP mailbox, part by part. Sender evidence only where tasks arrive
/// (`tasks_arrive`): in the person's own mailbox only answers do. An error when the mailbox's
/// clients cannot be made at all.
pub(crate) async fn check(
    account: &Account,
    tasks_arrive: bool,
) -> Result<Vec<Finding>, MailboxError> {
    let mut found = Vec::new();
    let mut reader = Reader::new(account.clone())?;
    match reader.connect().await {
        Ok(()) => {
            let jmap = format!("logged in as {} at {}", account.login, account.jmap_url);
            found.push(Finding::new("JMAP", Verdict::Ok, jmap, ""));
            found.extend(transport(account));
            found.push(push(account, &reader));
            found.extend(claims(&reader).await);
            if tasks_arrive {
                found.push(sender_evidence(account, &reader).await);
            }
        }
        Err(e) => {
            let fix = e.fix("jmap_url");
            found.push(Finding::new("JMAP", Verdict::Fail, e.to_string(), fix));
        }
    }
    found.push(smtp(account).await);
    found.extend(service(account).await);
    Ok(found)
}

/// A login of an AAMP mailbox that failed: which, the server's own answer, what to do.
#[derive(Debug, thiserror::Error)]
#[error("{what} failed: {error}")]
pub struct LoginFailed {
    pub what: String,
    pub error: MailboxError,
    pub fix: String,
}

/// Logs in over JMAP, then over SMTP, as the bridge will: what `init` tests a mailbox with
/// before it writes the config.
pub async fn login(account: &Account) -> Result<(), LoginFailed> {
    jmap_login(account).await.map_err(|error| LoginFailed {
        what: format!("JMAP login as {}", account.login),
        fix: error.fix("jmap_url"),
        error,
    })?;
    smtp_login(account).await.map_err(|error| LoginFailed {
        what: format!(
            "SMTP login as {} at {}:{} ({})",
            account.login,
            account.smtp_host,
            account.smtp_port,
            account.smtp_security.name()
        ),
        fix: error.fix("smtp_host, smtp_port and smtp_security"),
        error,
    })
}

/// A reader of `account`, logged in over JMAP.
pub(crate) async fn jmap_login(account: &Account) -> Result<Reader, MailboxError> {
    let mut reader = Reader::new(account.clone())?;
    reader.connect().await?;
    Ok(reader)
}

async fn smtp_login(account: &Account) -> Result<(), MailboxError> {
    Sender::new(account)?.check_smtp().await
}

/// The claims each replica holds on the mailbox's Inbox, read from the server: per replica
/// name, (live claims, claims whose lease ran out). What the live view shows of a mailbox
/// served by several bridges.
pub async fn replica_claims(
    account: &Account,
) -> Result<std::collections::BTreeMap<String, (usize, usize)>, MailboxError> {
    jmap_login(account).await?.replicas().await
}

/// A WARN when the password would cross the network in clear text.
fn transport(account: &Account) -> Option<Finding> {
    let url = std::iter::once(&account.jmap_url)
        .chain(account.aamp_url.as_ref())
        .find(|u| u.scheme() == "http" && !u.host_str().is_some_and(crate::config::is_loopback))?;
    Some(Finding::new(
        "transport",
        Verdict::Warn,
        format!("{url} is plain http: the password crosses the network unencrypted (insecure_http = true)"),
        "use https for jmap_url and aamp_url, and drop insecure_http",
    ))
}

/// Whether new mail is pushed, or polled for.
fn push(account: &Account, reader: &Reader) -> Finding {
    let every = account.poll_interval.as_secs();
    match (account.push, reader.push_target()) {
        (false, _) => Finding::new(
            "push",
            Verdict::Warn,
            format!("push is off in the config: polling every {every} s"),
            "set push = true unless the server's push is broken",
        ),
        (true, Some(target)) => {
            let offered: Vec<String> = target.transports.iter().map(|t| t.to_string()).collect();
            Finding::new("push", Verdict::Ok, format!("offered: {}", offered.join(", ")), "")
        }
        (true, None) => Finding::new(
            "push",
            Verdict::Warn,
            format!("the server offers no JMAP push: polling every {every} s"),
            "lower poll_interval_secs for quicker answers, or enable WebSocket/EventSource push on the server",
        ),
    }
}

/// Whether the server takes the keywords this replica's claims write (nothing without
/// `replica`).
async fn claims(reader: &Reader) -> Option<Finding> {
    let (verdict, detail, fix) = match reader.check_claims().await {
        Ok(None) => return None,
        Ok(Some(true)) => (
            Verdict::Ok,
            "the server takes the keywords this replica's claims write".to_string(),
            "",
        ),
        Ok(Some(false)) => (
            Verdict::Warn,
            "no answered task in the Inbox yet to try the claims' keywords on".to_string(),
            "run doctor again after the first task",
        ),
        Err(e) => (
            Verdict::Fail,
            e.to_string(),
            "this replica cannot claim tasks, so it runs none (they are parked): the login must be allowed to set keywords, and the mailbox must have room for 30 more keyword names (Cyrus keeps 100 per mailbox, never freed: builds before this one used one per lease; a new mailbox, or the administrator, clears them)",
        ),
    };
    Some(Finding::new("claims", verdict, detail, fix))
}

/// Whether the newest mail in the Inbox carries evidence of its sender that the bridge can
/// check (`sender_auth`).
async fn sender_evidence(account: &Account, reader: &Reader) -> Finding {
    const PART: &str = "sender evidence";
    let headers = match reader.newest_headers().await {
        Ok(Some(headers)) => headers,
        Ok(None) => {
            return Finding::new(
                PART,
                Verdict::Warn,
                "no mail in the Inbox yet to look at",
                "run doctor again after the first dispatch",
            )
        }
        Err(e) => return Finding::new(PART, Verdict::Warn, e.to_string(), ""),
    };
    let ev = auth::evidence(&headers);
    let mut found = Vec::new();
    if ev.authenticated_submission {
        found.push("authenticated submission".to_string());
    }
    for id in &ev.authserv_ids {
        found.push(format!("Authentication-Results from {id}"));
    }
    const POSTFIX_FIX: &str = "Postfix: smtpd_sasl_authenticated_header = yes on the submission service; or OpenDKIM/OpenDMARC and authserv_id";
    if account.sender_auth == SenderAuth::None {
        Finding::new(
            PART,
            Verdict::Warn,
            "sender_auth = \"none\": any From is believed",
            "set sender_auth = \"auto\" if the server writes evidence",
        )
    } else if let Some(problem) = &ev.problem {
        Finding::new(
            PART,
            Verdict::Warn,
            format!("the newest Inbox mail is not believed whoever sent it: {problem}"),
            "mail whose top Received fields the bridge cannot read is ignored; if the server writes them that way, report the field",
        )
    } else if ev.login_not_recorded && ev.authserv_ids.is_empty() {
        Finding::new(PART, Verdict::Warn, "the server records authenticated submissions (ESMTPA) but not the login, so no From can be checked and mail like it is ignored", POSTFIX_FIX)
    } else if found.is_empty() {
        Finding::new(PART, Verdict::Warn, "the newest Inbox mail carries no evidence this bridge can check, so mail like it is ignored", format!("{POSTFIX_FIX}; or sender_auth = \"none\" (not advised)"))
    } else {
        let writes = format!("the server writes: {}", found.join(", "));
        Finding::new(PART, Verdict::Ok, writes, "")
    }
}

/// The SMTP login answers are sent with.
async fn smtp(account: &Account) -> Finding {
    let sender = match Sender::new(account) {
        Ok(sender) => sender,
        Err(e) => {
            let fix = "check smtp_security and the host name";
            return Finding::new("SMTP", Verdict::Fail, e.to_string(), fix);
        }
    };
    match sender.check_smtp().await {
        Ok(()) => Finding::new(
            "SMTP",
            Verdict::Ok,
            format!(
                "EHLO and login at {}:{} ({:?})",
                account.smtp_host, account.smtp_port, account.smtp_security
            ),
            "",
        ),
        Err(e) => {
            let fix = e.fix("smtp_host, smtp_port and smtp_security");
            Finding::new("SMTP", Verdict::Fail, e.to_string(), fix)
        }
    }
}

/// Whether the AAMP service answers (nothing without `aamp_url`).
async fn service(account: &Account) -> Option<Finding> {
    let base = account.aamp_url.as_ref()?;
    Some(match helper::HelperApi::discover(base, account).await {
        Ok(_) => Finding::new(
            "AAMP service",
            Verdict::Ok,
            format!("{base} answers /.well-known/aamp"),
            "",
        ),
        Err(e) => Finding::new(
            "AAMP service",
            Verdict::Warn,
            e.to_string(),
            "check aamp_url; without the service tasks run without live streams",
        ),
    })
}
