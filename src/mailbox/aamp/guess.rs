//! Where a mail domain's servers probably are, for `init`'s defaults: a JMAP session URL that
//! answers (200, or 401 asking for a login) and an SMTP submission host whose name resolves.
//! Guesses only: the person sees them as defaults and the mailbox is tested before anything
//! is written.

use std::time::Duration;

/// The first answering candidate of each kind, if any.
#[derive(Debug, Default, PartialEq)]
pub struct Guess {
    pub jmap_url: Option<String>,
    pub smtp_host: Option<String>,
}

/// The candidates for `domain`, in the order they are preferred.
pub fn candidates(domain: &str) -> (Vec<String>, Vec<String>) {
    let jmap = ["", "jmap.", "mail."]
        .iter()
        .map(|p| format!("https://{p}{domain}/.well-known/jmap"))
        .collect();
    let smtp = ["smtp.", "mail.", ""]
        .iter()
        .map(|p| format!("{p}{domain}"))
        .collect();
    (jmap, smtp)
}

/// Asks each candidate at once, within `limit` in all.
pub async fn guess(domain: &str, limit: Duration) -> Guess {
    if domain.is_empty() || domain.contains(['/', ' ', ':']) {
        return Guess::default();
    }
    let (jmap, smtp) = candidates(domain);
    let Ok(http) = crate::mailbox::http_client(false, Some(limit)) else {
        return Guess::default();
    };
    let jmap_answers = futures::future::join_all(jmap.iter().map(|url| {
        let http = http.clone();
        async move {
            match http.get(url).send().await {
                Ok(r) => matches!(r.status().as_u16(), 200 | 401),
                Err(_) => false,
            }
        }
    }));
    let smtp_answers = futures::future::join_all(smtp.iter().map(|host| async move {
        tokio::net::lookup_host((host.as_str(), 587))
            .await
            .map(|mut a| a.next().is_some())
            .unwrap_or(false)
    }));
    let Ok((jmap_ok, smtp_ok)) =
        tokio::time::timeout(limit, futures::future::join(jmap_answers, smtp_answers)).await
    else {
        return Guess::default();
    };
    let first = |names: &[String], ok: &[bool]| {
        names
            .iter()
            .zip(ok)
            .find(|(_, ok)| **ok)
            .map(|(n, _)| n.clone())
    };
    Guess {
        jmap_url: first(&jmap, &jmap_ok),
        smtp_host: first(&smtp, &smtp_ok),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_domain_itself_is_tried_first_for_jmap_and_last_for_smtp() {
        let (jmap, smtp) = super::candidates("example.org");
        assert_eq!(jmap[0], "https://example.org/.well-known/jmap");
        assert_eq!(
            smtp,
            ["smtp.example.org", "mail.example.org", "example.org"]
        );
    }
}
