//! Is a mail's `From:` genuine? Pure code over the mail's header fields, in message order
//! (newest first, as servers prepend them).
//!
//! Only what the receiving server itself wrote counts, and a sender can write anything below
//! it. So the evidence is read from the server's region at the top of the header, decided
//! from the top and failing closed: first the delivery fields the mailbox's own server writes
//! (`LMTP` hops, Cyrus and the like), then exactly one field, which must be the server's SMTP
//! hop (the mail entering over `SMTP`/`ESMTP*`). Every Received field is read by its grammar
//! ([`super::received`]): a HELO name, a reverse-DNS name, a comment or a recipient can hold
//! any word (`with`, `by`, `(Authenticated`, `esmtpa`) and none of them moves a clause. If a
//! field of the region does not parse, or the field where the SMTP hop belongs records another
//! protocol, the mail is not believed and the reason names that field; the search never goes
//! further down for a field that does parse (everything further down the sender wrote).
//!
//! The evidence, in the region:
//! - **submission**: the SMTP hop says the server took the mail from an authenticated
//!   submission (`with ESMTPA`/`ESMTPSA`, RFC 3848) and names the login in its one
//!   `(Authenticated sender: ADDRESS)` comment (Postfix's `smtpd_sasl_authenticated_header`),
//!   and the login is the From address;
//! - **authentication-results**: an `Authentication-Results:` field (RFC 8601) above the hop
//!   from the configured authserv-id says `dmarc=pass` for the From domain, or `dkim=pass` or
//!   `spf=pass` for a domain aligned with it.

use super::received::{self, Received};
use crate::config::SenderAuth;

pub use crate::inbound::SenderCheck;

/// Checks `from` against the header fields `headers` (name, raw value), under `mode`.
pub fn check_sender(
    headers: &[(String, String)],
    from: &str,
    mode: SenderAuth,
    authserv_id: Option<&str>,
) -> SenderCheck {
    if mode == SenderAuth::None {
        return SenderCheck::Trusted;
    }
    let from = from.trim().to_ascii_lowercase();
    let Some((_, from_domain)) = from.rsplit_once('@') else {
        return SenderCheck::Unverified("the From address has no domain".into());
    };
    let region = match server_region(headers) {
        Ok(region) => region,
        Err(why) => return SenderCheck::Unverified(why),
    };
    let submission = matches!(mode, SenderAuth::Auto | SenderAuth::Submission);
    let results = matches!(mode, SenderAuth::Auto | SenderAuth::AuthenticationResults);
    let mut why = Vec::new();
    if submission {
        let hop = &region.hop;
        match hop.authenticated_sender() {
            Err(problem) => why.push(format!("the server's Received field is not believed: {problem}")),
            Ok(Some(login)) if hop.is_authenticated() && login == from => {
                return SenderCheck::Verified(format!("authenticated submission by {login}"))
            }
            Ok(Some(login)) if hop.is_authenticated() => why.push(format!(
                "it was submitted by {login}, not by the From address"
            )),
            Ok(None) if hop.is_authenticated() => why.push(
                "it came from an authenticated submission, but the server does not record the login (Postfix: smtpd_sasl_authenticated_header = yes)".to_string(),
            ),
            Ok(_) => why.push("it did not come from an authenticated submission".to_string()),
        }
    }
    if results {
        match authserv_id {
            Some(id) => {
                let id = id.trim().to_ascii_lowercase();
                for (_, value) in region.fields[..region.top]
                    .iter()
                    .filter(|(n, _)| n == "authentication-results")
                {
                    if let Some(how) = results_pass(value, &id, from_domain) {
                        return SenderCheck::Verified(how);
                    }
                }
                why.push(format!(
                    "no Authentication-Results from {id} pass for {from_domain}"
                ));
            }
            None if mode == SenderAuth::AuthenticationResults => {
                why.push("no authserv_id is configured".to_string())
            }
            None => {}
        }
    }
    SenderCheck::Unverified(why.join("; "))
}

/// Was a delivery report made by the mailbox's own server? Only then is it believed: anyone
/// can send a mail with a `message/delivery-status` part over the server's inbound port (or
/// submit one), naming any Message-ID, and a believed report marks an answer undelivered and
/// ends a waiting `dispatch`. The same region rule as for senders, from the top and failing
/// closed: below the delivery hops (`LMTP`), the first Received field must record a mail the
/// server made itself: no SMTP (or any other protocol it took the mail in over), no client
/// (`from`), as Postfix's bounce daemon writes it (`by HOST (Postfix) id ID; DATE`); or Exim's
/// own `from mailnull ... with local`. A local user's `sendmail` (Postfix's
/// `(Postfix, from userid N)`) is not the server. `Err` says why not.
pub fn report_by_server(headers: &[(String, String)]) -> Result<(), String> {
    let mut number = 0;
    for (name, value) in headers {
        if !name.trim().eq_ignore_ascii_case("received") {
            continue;
        }
        number += 1;
        let value = unfold(value);
        let hop = received::parse(&value).map_err(|e| {
            format!(
                "Received field {number} from the top, where the receiving server's own belongs, was not understood ({e}): {}",
                clip(&value)
            )
        })?;
        if hop.is_lmtp() {
            continue;
        }
        let local_user = hop
            .comments
            .iter()
            .any(|(_, c)| c.to_ascii_lowercase().contains("userid"));
        let made_here = match (hop.from.as_deref(), hop.with.as_deref()) {
            (None, None) => !local_user,
            (Some(from), Some("local")) => from.eq_ignore_ascii_case("mailnull"),
            _ => false,
        };
        return if made_here {
            Ok(())
        } else {
            Err(format!(
                "Received field {number} from the top says the report came in from {} ({}), not from the mail server itself: {}",
                hop.from.as_deref().unwrap_or("a local user"),
                hop.with.as_deref().unwrap_or("no protocol"),
                clip(&value)
            ))
        };
    }
    Err("the report has no Received field of the mail server's own".into())
}

/// Which evidence a server wrote on one of its delivered mails: whether its own Received
/// field records the authenticated login, and the authserv-ids of Authentication-Results it
/// added. For `doctor` and `init`: what `sender_auth` can rely on with this server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    pub authenticated_submission: bool,
    /// The server records authenticated submissions (`ESMTPA`) but not the login.
    pub login_not_recorded: bool,
    pub authserv_ids: Vec<String>,
    /// Why the server's own fields could not be read, when they could not: mail like this one
    /// is never believed.
    pub problem: Option<String>,
}

pub fn evidence(headers: &[(String, String)]) -> Evidence {
    let region = match server_region(headers) {
        Ok(region) => region,
        Err(problem) => {
            return Evidence {
                problem: Some(problem),
                ..Evidence::default()
            }
        }
    };
    let mut authserv_ids: Vec<String> = region.fields[..region.top]
        .iter()
        .filter(|(n, _)| n == "authentication-results")
        .filter_map(|(_, v)| {
            strip_comments(&v.to_ascii_lowercase())
                .split(';')
                .next()
                .and_then(|id| id.split_whitespace().next().map(str::to_string))
        })
        .collect();
    authserv_ids.dedup();
    let login = region.hop.authenticated_sender();
    Evidence {
        authenticated_submission: region.hop.is_authenticated() && matches!(login, Ok(Some(_))),
        login_not_recorded: region.hop.is_authenticated() && matches!(login, Ok(None)),
        authserv_ids,
        problem: login.err().map(str::to_string),
    }
}

/// The receiving server's part of a mail's header: the fields (lower-case names, unfolded
/// values) in message order, the index of its SMTP hop, and that field read. Fields above
/// `top` and the hop itself are the server's; everything below it the sender could write.
struct Region {
    fields: Vec<(String, String)>,
    top: usize,
    hop: Received,
}

/// Finds the [`Region`] from the top, failing closed: `Err` says which field was not
/// understood, or that there is no SMTP hop.
fn server_region(headers: &[(String, String)]) -> Result<Region, String> {
    let fields: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), unfold(v)))
        .collect();
    let mut number = 0;
    for (i, (name, value)) in fields.iter().enumerate() {
        if name != "received" {
            continue;
        }
        number += 1;
        let hop = received::parse(value).map_err(|e| {
            format!(
                "Received field {number} from the top, where the receiving server's own belongs, was not understood ({e}): {}",
                clip(value)
            )
        })?;
        if hop.is_lmtp() {
            continue; // a delivery hop inside the server
        }
        if !hop.is_smtp() {
            return Err(format!(
                "Received field {number} from the top, where the receiving server's SMTP hop belongs, records {}, not SMTP: {}",
                hop.with.as_deref().unwrap_or("no protocol"),
                clip(value)
            ));
        }
        return Ok(Region {
            fields,
            top: i,
            hop,
        });
    }
    Err("the mail has no Received field from an SMTP server (it was not sent through the mail server)".into())
}

/// A field value for a reason: one line, control characters shown as `?`, at most 160
/// characters (it is a stranger's text).
fn clip(value: &str) -> String {
    let flat: String = value
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(160)
        .collect();
    if value.chars().count() > 160 {
        format!("{flat}…")
    } else {
        flat
    }
}

fn unfold(value: &str) -> String {
    value
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Removes RFC 5322 comments (parenthesised, possibly nested).
fn strip_comments(text: &str) -> String {
    let mut depth = 0usize;
    text.chars()
        .filter(|c| {
            match c {
                '(' => depth += 1,
                ')' if depth > 0 => {
                    depth -= 1;
                    return false;
                }
                _ => {}
            }
            depth == 0
        })
        .collect()
}

/// `d` is `domain` or a parent of it (relaxed alignment).
fn aligned(d: &str, domain: &str) -> bool {
    let d = d.trim_matches(['.', '@']);
    !d.is_empty() && (domain == d || domain.ends_with(&format!(".{d}")))
}

/// How an Authentication-Results field from `authserv_id` vouches for `domain`, if it does.
fn results_pass(value: &str, authserv_id: &str, domain: &str) -> Option<String> {
    let value = strip_comments(&value.to_ascii_lowercase());
    let mut parts = value.split(';');
    let id = parts.next()?.split_whitespace().next()?;
    if id != authserv_id {
        return None;
    }
    for result in parts {
        let mut words = result.split_whitespace();
        let Some((method, outcome)) = words.next().and_then(|w| w.split_once('=')) else {
            continue;
        };
        if outcome != "pass" {
            continue;
        }
        let props: Vec<(&str, &str)> = words.filter_map(|w| w.split_once('=')).collect();
        let prop = |key: &str| props.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let domain_of = |v: &str| v.rsplit('@').next().unwrap_or(v).to_string();
        let ok = match method {
            "dmarc" => prop("header.from").is_none_or(|d| d == domain),
            "dkim" => prop("header.d")
                .map(str::to_string)
                .or_else(|| prop("header.i").map(domain_of))
                .is_some_and(|d| aligned(&d, domain)),
            "spf" => prop("smtp.mailfrom")
                .map(domain_of)
                .is_some_and(|d| aligned(&d, domain)),
            _ => false,
        };
        if ok {
            return Some(format!("{method}=pass from {authserv_id}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(fields: &[(&str, &str)]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// Asserts that `check` did not believe the sender, saying each of `says`.
    #[track_caller]
    fn assert_unverified(check: &SenderCheck, says: &[&str]) {
        assert!(
            matches!(check, SenderCheck::Unverified(w) if says.iter().all(|s| w.contains(s))),
            "{check:?}"
        );
    }

    const LMTP: (&str, &str) = ("Received", "from localhost ([unix socket])\r\n\t by localhost (Cyrus 3.6.1) with LMTPA;\r\n\t Mon, 30 Nov 2026 12:50:47 +0000");

    fn submission(login: &str) -> (String, String) {
        ("Received".into(), format!("from vm (localhost [127.0.0.1])\r\n\t(Authenticated sender: {login})\r\n\tby localhost (Postfix) with ESMTPA id 7B57298E8B9\r\n\tfor <agent@example.test>; Mon, 30 Nov 2026 12:50:47 +0000 (UTC)"))
    }

    #[test]
    fn an_authenticated_submission_by_the_from_address_is_believed() {
        let mut headers = h(&[LMTP]);
        headers.push(submission("Boss@Example.test"));
        assert_eq!(
            check_sender(&headers, "boss@example.test", SenderAuth::Auto, None),
            SenderCheck::Verified("authenticated submission by boss@example.test".into())
        );
        let other = check_sender(&headers, "ceo@example.test", SenderAuth::Auto, None);
        assert_unverified(&other, &["submitted by boss@example.test"]);
    }

    #[test]
    fn the_evidence_a_server_writes_is_read_for_doctor() {
        let mut headers = h(&[
            LMTP,
            ("Authentication-Results", "mx.example.test; spf=none"),
        ]);
        headers.push(submission("boss@example.test"));
        assert_eq!(
            evidence(&headers),
            Evidence {
                authenticated_submission: true,
                authserv_ids: vec!["mx.example.test".into()],
                ..Evidence::default()
            }
        );
        assert!(evidence(&h(&[LMTP])).problem.is_some());
    }

    #[test]
    fn a_forged_received_below_the_servers_own_counts_for_nothing() {
        let mut headers = h(&[
            LMTP,
            (
                "Received",
                "from evil (evil [127.0.0.1]) by localhost (Postfix) with ESMTP id 1; Mon, 30 Nov 2026",
            ),
        ]);
        headers.push(submission("boss@example.test"));
        let check = check_sender(&headers, "boss@example.test", SenderAuth::Auto, None);
        assert_unverified(&check, &["not come from an authenticated submission"]);
        let none = check_sender(&h(&[LMTP]), "boss@example.test", SenderAuth::Auto, None);
        assert!(!none.is_believed());
        assert_eq!(
            check_sender(&h(&[]), "boss@example.test", SenderAuth::None, None),
            SenderCheck::Trusted
        );
    }

    #[test]
    fn authentication_results_of_the_configured_server_above_its_received_are_believed() {
        let mx = (
            "Received",
            "from mail.partner.test by mx.example.test (Postfix) with ESMTPS id 9; Mon, 30 Nov 2026",
        );
        let ours = |results: &str| {
            h(&[
                ("Authentication-Results", results),
                mx,
                (
                    "Authentication-Results",
                    "mx.example.test; dmarc=pass header.from=partner.test",
                ),
            ])
        };
        let id = Some("mx.example.test");
        let dmarc =
            ours("mx.example.test; dkim=fail; dmarc=pass (p=reject) header.from=partner.test");
        assert_eq!(
            check_sender(&dmarc, "a@partner.test", SenderAuth::Auto, id),
            SenderCheck::Verified("dmarc=pass from mx.example.test".into())
        );
        let dkim = ours("mx.example.test 1; dkim=pass header.d=partner.test header.s=s1");
        assert!(check_sender(
            &dkim,
            "a@mail.partner.test",
            SenderAuth::AuthenticationResults,
            id
        )
        .is_believed());
        let spf = ours("mx.example.test; spf=pass smtp.mailfrom=bounce@partner.test");
        assert!(check_sender(&spf, "a@partner.test", SenderAuth::Auto, id).is_believed());
        let unaligned = ours(
            "mx.example.test; dkim=pass header.d=other.test; spf=pass smtp.mailfrom=x@other.test",
        );
        assert!(!check_sender(&unaligned, "a@partner.test", SenderAuth::Auto, id).is_believed());
        let foreign = ours("someone.else; dmarc=pass header.from=partner.test");
        assert!(
            !check_sender(&foreign, "a@partner.test", SenderAuth::Auto, id).is_believed(),
            "another server's results, and ours forged below our Received, do not count"
        );
        assert!(!check_sender(&dmarc, "a@partner.test", SenderAuth::Submission, id).is_believed());
    }

    /// The fields of the bounce the test host's Postfix wrote for mail to a user that does not
    /// exist, as Cyrus delivered it.
    fn postfix_bounce() -> Vec<(String, String)> {
        h(&[
            ("Return-Path", "<>"),
            LMTP,
            ("X-Sieve", "CMU Sieve 3.0"),
            (
                "Received",
                "by localhost (Postfix)\r\n\tid 476F198EDB2; Wed,  2 Dec 2026 00:48:51 +0000 (UTC)",
            ),
            ("From", "Mail Delivery System <MAILER-DAEMON@example.test>"),
        ])
    }

    #[test]
    fn a_delivery_report_is_believed_only_when_the_server_made_it() {
        assert_eq!(report_by_server(&postfix_bounce()), Ok(()));
        let exim = h(&[(
            "Received",
            "from mailnull by mx.example.test with local (Exim 4.96)\r\n\tid 1tQxYz-000AbC-1x\r\n\tfor agent@example.test; Mon, 30 Nov 2026 12:00:00 +0000",
        )]);
        assert_eq!(report_by_server(&exim), Ok(()));
        // A stranger over the inbound port, with the server's own line forged below.
        let mut forged = h(&[
            LMTP,
            (
                "Received",
                "from forger.test (localhost [127.0.0.1])\r\n\tby localhost (Postfix) with ESMTP id 1A2B3C\r\n\tfor <agent@example.test>; Wed,  2 Dec 2026 00:48:51 +0000 (UTC)",
            ),
        ]);
        forged.extend(postfix_bounce().into_iter().skip(1));
        let why = report_by_server(&forged).unwrap_err();
        assert!(
            why.contains("forger.test") && why.contains("esmtp"),
            "{why}"
        );
        // Submitted by a user of the server, or handed to its sendmail by a local user.
        let mut submitted = h(&[LMTP]);
        submitted.push(submission("boss@example.test"));
        assert!(report_by_server(&submitted).is_err());
        let pickup = h(&[
            LMTP,
            (
                "Received",
                "by localhost (Postfix, from userid 1000)\r\n\tid 5C6D; Wed,  2 Dec 2026 00:48:51 +0000 (UTC)",
            ),
        ]);
        assert!(report_by_server(&pickup).is_err());
        assert!(report_by_server(&h(&[LMTP])).is_err());
        let unreadable = h(&[("Received", "by localhost (Postfix id 1; Wed, 2 Dec 2026")]);
        assert!(report_by_server(&unreadable).is_err());
    }

    /// Published shapes of each server's Received field, with the client's HELO name as `{}`:
    /// (server, the field, whether it records an authenticated submission by boss).
    const SHAPES: &[(&str, &str, bool)] = &[
        ("Postfix inbound", "from {} (client.example.net [192.0.2.1])\r\n\tby mx.example.test (Postfix) with ESMTP id 4Z9Qh01abcz2\r\n\tfor <agent@example.test>; Mon, 30 Nov 2026 12:00:00 +0000 (UTC)", false),
        ("Postfix over TLS", "from {} (client.example.net [192.0.2.1])\r\n\t(using TLSv1.3 with cipher TLS_AES_256_GCM_SHA384 (256/256 bits)\r\n\t key-exchange X25519 server-signature RSA-PSS (2048 bits) server-digest SHA256)\r\n\t(No client certificate requested)\r\n\tby mx.example.test (Postfix) with ESMTPS id 4Z9Qh01abcz2\r\n\tfor <agent@example.test>; Mon, 30 Nov 2026 12:00:00 +0000 (UTC)", false),
        ("Postfix submission, login recorded", "from {} (localhost [127.0.0.1])\r\n\t(Authenticated sender: boss@example.test)\r\n\tby localhost (Postfix) with ESMTPSA id 42F9D99E6B2\r\n\tfor <agent@example.test>; Mon, 30 Nov 2026 12:00:00 +0000 (UTC)", true),
        ("Postfix submission, stock", "from {} (localhost [127.0.0.1])\r\n\tby localhost (Postfix) with ESMTPSA id 42F9D99E6B2\r\n\tfor <agent@example.test>; Mon, 30 Nov 2026 12:00:00 +0000 (UTC)", false),
        ("Exim", "from client.example.net ([192.0.2.1] helo={})\r\n\tby mx.example.test with esmtps  (TLS1.3) tls TLS_AES_256_GCM_SHA384\r\n\t(Exim 4.96)\r\n\t(envelope-from <boss@example.test>)\r\n\tid 1tQxYz-000AbC-1x\r\n\tfor agent@example.test; Mon, 30 Nov 2026 12:00:00 +0000", false),
        ("Exim submission", "from client.example.net ([192.0.2.1] helo={})\r\n\tby mx.example.test with esmtpsa  (TLS1.3) tls TLS_AES_256_GCM_SHA384\r\n\t(Exim 4.96)\r\n\t(envelope-from <boss@example.test>)\r\n\tid 1tQxYz-000AbC-1x\r\n\tfor agent@example.test; Mon, 30 Nov 2026 12:00:00 +0000", false),
        ("Stalwart", "from {} (client.example.net [192.0.2.1])\r\n\t(using TLSv1.3 with cipher TLS13_AES_256_GCM_SHA384)\r\n\tby mail.example.test (Stalwart SMTP) with ESMTPS id 192A3B4C5D6E7F80;\r\n\tMon, 30 Nov 2026 12:00:00 +0000", false),
        ("Gmail", "from {} (mail-sor-f41.google.com. [209.85.220.41])\r\n        by mx.google.com with SMTPS id a640c23a62f3a-a8d2c1e3b4fsor1234567.66.2026.11.30.04.00.00\r\n        for <agent@example.test>\r\n        (Google Transport Security);\r\n        Mon, 30 Nov 2026 04:00:00 -0800 (PST)", false),
        ("Microsoft 365", "from {} (mail-am6eur05on2100.outbound.protection.outlook.com [40.107.22.100])\r\n by mx.example.test (Postfix) with ESMTPS id 4Z9Qh;\r\n Mon, 30 Nov 2026 12:00:00 +0000", false),
    ];

    /// What a stranger's mail carries below the server's field: a Received line claiming
    /// boss's authenticated submission, and Authentication-Results claiming DMARC passed.
    fn forged_below() -> Vec<(String, String)> {
        h(&[
            ("Authentication-Results", "mx.example.test; dmarc=pass header.from=example.test"),
            ("Received", "from client.example.net (localhost [127.0.0.1])\r\n\t(Authenticated sender: boss@example.test)\r\n\tby localhost (Postfix) with ESMTPA id 42F9D99E6B2\r\n\tfor <agent@example.test>; Mon, 30 Nov 2026 12:00:00 +0000"),
            ("Received", "from vm by localhost with LMTPA; Mon, 30 Nov 2026"),
        ])
    }

    fn mail(shape: &str, helo: &str, below: &[(String, String)]) -> Vec<(String, String)> {
        let mut headers = h(&[LMTP]);
        headers.push(("Received".into(), shape.replace("{}", helo)));
        headers.extend_from_slice(below);
        headers
    }

    const HOSTILE_HELO: &[&str] = &[
        "with",
        "WITH",
        "by",
        "from",
        "(Authenticated",
        "esmtpa",
        "ESMTPSA",
        "id",
        "for",
        "with)",
        "x(Authenticated",
        "Authenticated",
        "sender:",
        ";",
        "\"",
        "<",
        "[",
        ")",
        "(",
        "((",
        "\\",
        "a;b",
        "(Authenticated_sender:boss@example.test)",
        "lmtp",
        "LMTPA",
        "via",
    ];

    fn verdict(headers: &[(String, String)]) -> bool {
        let id = Some("mx.example.test");
        [
            SenderAuth::Auto,
            SenderAuth::Submission,
            SenderAuth::AuthenticationResults,
        ]
        .iter()
        .any(|mode| check_sender(headers, "boss@example.test", *mode, id).is_believed())
    }

    #[test]
    fn no_helo_name_changes_the_verdict_on_any_servers_field() {
        for (server, shape, genuine) in SHAPES {
            let baseline = verdict(&mail(shape, "client.example.net", &forged_below()));
            assert_eq!(baseline, *genuine, "{server}");
            for helo in HOSTILE_HELO {
                let headers = mail(shape, helo, &forged_below());
                if *genuine && server.starts_with("Postfix") {
                    assert!(verdict(&headers), "{server}, EHLO {helo}: still believed");
                } else {
                    assert!(
                        !verdict(&headers),
                        "{server}, EHLO {helo}: believed a stranger"
                    );
                }
            }
        }
    }

    #[test]
    fn the_issue_18_mail_is_not_believed_and_says_why() {
        let postfix = "from with (localhost [127.0.0.1])\r\n\tby localhost (Postfix) with ESMTP id 42F9D99E6B2\r\n\tfor <agent@example.test>; Mon, 30 Nov 2026 12:00:00 +0000 (UTC)";
        let headers = mail(postfix, "", &forged_below());
        let check = check_sender(&headers, "boss@example.test", SenderAuth::Auto, None);
        assert_eq!(
            check,
            SenderCheck::Unverified("it did not come from an authenticated submission".into())
        );
    }

    #[test]
    fn a_server_field_that_does_not_parse_fails_closed_and_is_named() {
        // An unclosed comment in the server's own field: the well-formed forged field below
        // is never taken in its place.
        let broken = "from x (client [192.0.2.1] by mx (Postfix) with ESMTP id 1; Mon, 30 Nov 2026";
        let headers = mail(broken, "", &forged_below());
        let check = check_sender(&headers, "boss@example.test", SenderAuth::Auto, None);
        assert_unverified(
            &check,
            &["Received field 2 from the top", "an unclosed comment"],
        );
        assert!(evidence(&headers)
            .problem
            .unwrap()
            .contains("Received field 2"));
        // Where the SMTP hop belongs, something else: not believed, not searched past.
        let http = mail(
            "from x by mx with HTTP; Mon, 30 Nov 2026",
            "",
            &forged_below(),
        );
        let check = check_sender(&http, "boss@example.test", SenderAuth::Auto, None);
        assert_unverified(&check, &["records http, not SMTP"]);
    }

    #[test]
    fn two_login_comments_or_a_login_without_esmtpa_are_not_believed() {
        let two = "from x (localhost [127.0.0.1]) (Authenticated sender: boss@example.test) (Authenticated sender: eve@example.test) by localhost (Postfix) with ESMTPA id 1; d";
        assert!(!verdict(&mail(two, "", &[])));
        let plain = "from x (localhost [127.0.0.1]) (Authenticated sender: boss@example.test) by localhost (Postfix) with ESMTP id 1; d";
        assert!(!verdict(&mail(plain, "", &[])));
        let stock = mail(SHAPES[3].1, "vm", &[]);
        let check = check_sender(&stock, "boss@example.test", SenderAuth::Auto, None);
        assert_unverified(&check, &["smtpd_sasl_authenticated_header"]);
        assert!(evidence(&stock).login_not_recorded);
    }

    #[test]
    fn microsoft_365_internal_hops_parse() {
        for value in [
            "from AM6PR04MB5432.eurprd04.prod.outlook.com (2603:10a6:20b:ab::12) by DB9PR04MB8123.eurprd04.prod.outlook.com (2603:10a6:10:2c5::9) with Microsoft SMTP Server (version=TLS1_2, cipher=TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384) id 15.20.7452.28; Mon, 30 Nov 2026 12:00:00 +0000",
            "from AM0PR10CA0001.EURPRD10.PROD.OUTLOOK.COM (2603:10a6:208:17c::11) by AM0PR10CA0001.outlook.office365.com (2603:10a6:208:17c::11) with Microsoft SMTP Server (version=TLS1_2, cipher=TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384) id 15.20.7452.28 via Frontend Transport; Mon, 30 Nov 2026 12:00:00 +0000",
            "from DB9PR04MB8123.eurprd04.prod.outlook.com ([fe80::1]) by DB9PR04MB8123.eurprd04.prod.outlook.com ([fe80::1%6]) with mapi id 15.20.7452.028; Mon, 30 Nov 2026 12:00:00 +0000",
            "by 2002:a17:906:1234:b0:a8d:1234:5678 with SMTP id abc123csp1234567ejc; Mon, 30 Nov 2026 04:00:00 -0800 (PST)",
        ] {
            let r = received::parse(value).unwrap_or_else(|e| panic!("{value}: {e}"));
            assert!(r.with.is_some(), "{value}");
        }
    }

    proptest::proptest! {
        /// No text a client controls (its HELO name, its reverse-DNS name, any field below
        /// the server's own) changes whether a mail is believed.
        #[test]
        fn client_text_never_changes_the_verdict(
            helo in "[!-~]{1,40}|\\PC{1,12}",
            rdns in "[a-zA-Z0-9.-]{1,30}",
            below in proptest::collection::vec(
                ("(?i)received|authentication-results|from|x-aamp-intent",
                 "(( |with|by|from|for|id|esmtpa|ESMTPSA|\\(Authenticated sender: boss@example.test\\)|\\(|\\)|;|<|>|\"|lmtp|mx.example.test; dmarc=pass header.from=example.test|[a-z@.]{1,8})){0,20}"),
                0..6,
            ),
        ) {
            let below: Vec<(String, String)> = below;
            let helo: String = helo.chars().filter(|c| !c.is_whitespace()).collect();
            proptest::prop_assume!(!helo.is_empty());
            for (server, shape, genuine) in SHAPES {
                let shape = shape.replace("client.example.net", &rdns);
                let believed = verdict(&mail(&shape, &helo, &below));
                if *genuine && server.starts_with("Postfix") {
                    proptest::prop_assert!(believed, "{} EHLO {:?}", server, helo);
                } else {
                    proptest::prop_assert!(!believed, "{} EHLO {:?} below {:?}", server, helo, below);
                }
            }
        }
    }
}
