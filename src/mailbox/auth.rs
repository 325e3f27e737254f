//! Is a mail's `From:` genuine? Pure code over the mail's header fields, in message order
//! (newest first, as servers prepend them).
//!
//! Only what the receiving server itself wrote counts, and a sender can write anything below
//! it. So the evidence is read from above the topmost `Received:` field that records the mail
//! entering over SMTP (the receiving server's own; `LMTP` hops inside the server are passed
//! over):
//!
//! - **submission**: that field says the server took the mail from an authenticated
//!   submission (`with ESMTPA`/`ESMTPSA`, RFC 3848) and names the login
//!   (`Authenticated sender: ADDRESS`, Postfix's `smtpd_sasl_authenticated_header`), and the
//!   login is the From address;
//! - **authentication-results**: an `Authentication-Results:` field (RFC 8601) above it from
//!   the configured authserv-id says `dmarc=pass` for the From domain, or `dkim=pass` or
//!   `spf=pass` for a domain aligned with it.

use crate::config::SenderAuth;

/// What the headers say about the sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SenderCheck {
    /// There is evidence the From address is genuine; how.
    Verified(String),
    /// The mailbox believes From as it is (`sender_auth = "none"`).
    Trusted,
    /// No evidence: why.
    Unverified(String),
}

impl SenderCheck {
    pub fn is_believed(&self) -> bool {
        !matches!(self, SenderCheck::Unverified(_))
    }
}

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
    let Some((fields, top)) = written_by_server(headers) else {
        return SenderCheck::Unverified(
            "the mail has no Received field from an SMTP server (it was not sent through the mail server)".into(),
        );
    };
    let submission = matches!(mode, SenderAuth::Auto | SenderAuth::Submission);
    let results = matches!(mode, SenderAuth::Auto | SenderAuth::AuthenticationResults);
    let mut why = Vec::new();
    if submission {
        match authenticated_sender(&fields[top].1) {
            Some(login) if login == from => {
                return SenderCheck::Verified(format!("authenticated submission by {login}"))
            }
            Some(login) => why.push(format!(
                "it was submitted by {login}, not by the From address"
            )),
            None => why.push("it did not come from an authenticated submission".to_string()),
        }
    }
    if results {
        match authserv_id {
            Some(id) => {
                let id = id.trim().to_ascii_lowercase();
                for (_, value) in fields[..top]
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

/// Which evidence a server wrote on one of its delivered mails: whether its own Received
/// field records the authenticated login, and the authserv-ids of Authentication-Results it
/// added. For `doctor` and `init`: what `sender_auth` can rely on with this server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    pub authenticated_submission: bool,
    pub authserv_ids: Vec<String>,
}

pub fn evidence(headers: &[(String, String)]) -> Evidence {
    let Some((fields, top)) = written_by_server(headers) else {
        return Evidence::default();
    };
    let mut authserv_ids: Vec<String> = fields[..top]
        .iter()
        .filter(|(n, _)| n == "authentication-results")
        .filter_map(|(_, v)| {
            strip_comments(v)
                .split(';')
                .next()
                .and_then(|id| id.split_whitespace().next().map(str::to_string))
        })
        .collect();
    authserv_ids.dedup();
    Evidence {
        authenticated_submission: authenticated_sender(&fields[top].1).is_some(),
        authserv_ids,
    }
}

/// The fields (lower-case names, unfolded values) and the index of the topmost Received field
/// that records the mail entering over SMTP: that field and those above it are the receiving
/// server's. `None` when there is no such field.
fn written_by_server(headers: &[(String, String)]) -> Option<(Vec<(String, String)>, usize)> {
    let fields: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), unfold(v)))
        .collect();
    let top = fields
        .iter()
        .position(|(n, v)| n == "received" && received_over_smtp(v))?;
    Some((fields, top))
}

fn unfold(value: &str) -> String {
    value
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_lowercase()
}

/// The `with` protocol of a Received field, lower-cased.
fn protocol(received: &str) -> Option<&str> {
    let mut words = received.split_whitespace();
    words.find(|w| *w == "with")?;
    words.next().map(|w| w.trim_end_matches(';'))
}

fn received_over_smtp(received: &str) -> bool {
    protocol(received).is_some_and(|p| {
        let p = p.strip_prefix("utf8").unwrap_or(p);
        p.starts_with("smtp") || p.starts_with("esmtp")
    })
}

/// The login of an authenticated submission recorded in a Received field.
fn authenticated_sender(received: &str) -> Option<String> {
    let authenticated = protocol(received).is_some_and(|p| p.ends_with('a'));
    if !authenticated {
        return None;
    }
    let rest = received.split("authenticated sender:").nth(1)?;
    let login = rest
        .split([')', ' ', ';'])
        .find(|w| !w.is_empty())?
        .trim_matches(['<', '>']);
    Some(login.to_string())
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
    let value = strip_comments(value);
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
        assert!(
            matches!(&other, SenderCheck::Unverified(w) if w.contains("submitted by boss@example.test")),
            "{other:?}"
        );
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
                authserv_ids: vec!["mx.example.test".into()]
            }
        );
        assert_eq!(evidence(&h(&[LMTP])), Evidence::default());
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
        assert!(
            matches!(&check, SenderCheck::Unverified(w) if w.contains("not come from an authenticated submission")),
            "{check:?}"
        );
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
}
