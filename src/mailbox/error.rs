use crate::error::{Classify, ErrorClass};

#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    #[error("cannot reach {url}: {}", chain(source))]
    Network { url: String, source: reqwest::Error },
    #[error("{url} answered HTTP {status}{}", if .body.is_empty() { String::new() } else { format!(": {}", .body) })]
    Http {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the server's answer to {what} was not understood: {detail}")]
    Protocol { what: String, detail: String },
    #[error("JMAP {method} failed: {kind}{}", .description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Method {
        method: String,
        kind: String,
        description: Option<String>,
    },
    /// The server refused a change of one mail (a JMAP SetError), for a reason asking again
    /// does not change: its keyword table is full, the login may not change keywords, ...
    #[error("the server refused {what}: {kind}{}", .description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        what: String,
        kind: String,
        description: Option<String>,
    },
    #[error("the server can no longer list changes since our last state")]
    CannotCalculateChanges,
    #[error("SMTP to {server}: {detail}")]
    Smtp {
        server: String,
        detail: String,
        class: ErrorClass,
    },
    #[error("{0}")]
    Address(String),
    #[error("push: {detail}")]
    Push { detail: String, class: ErrorClass },
    #[error("{what} is {bytes} bytes, more than {server} takes ({limit})")]
    TooLarge {
        what: String,
        server: String,
        bytes: usize,
        limit: usize,
    },
}

impl MailboxError {
    /// The server's TLS certificate was not trusted (so `insecure_tls` is the knob), read
    /// from the error's causes, not its words.
    pub fn certificate_refused(&self) -> bool {
        fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
            if matches!(
                e.downcast_ref::<rustls::Error>(),
                Some(rustls::Error::InvalidCertificate(_))
            ) {
                return true;
            }
            // An io::Error hands on its inner error's source, not the inner error itself.
            if let Some(inner) = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                if refused(inner) {
                    return true;
                }
            }
            e.source().is_some_and(refused)
        }
        match self {
            MailboxError::Network { source, .. } => refused(source),
            _ => false,
        }
    }

    /// Maps a failure to reach `url` (for `map_err`).
    pub fn network(url: impl Into<String>) -> impl FnOnce(reqwest::Error) -> MailboxError {
        let url = url.into();
        move |source| MailboxError::Network { url, source }
    }
}

impl Classify for MailboxError {
    fn class(&self) -> ErrorClass {
        match self {
            MailboxError::Network { .. } => ErrorClass::Transient,
            MailboxError::Http { status, .. } => match status {
                401 | 403 => ErrorClass::Auth,
                408 | 425 | 429 | 500..=599 => ErrorClass::Transient,
                _ => ErrorClass::Permanent,
            },
            MailboxError::Method { kind, .. } => match kind.as_str() {
                "serverUnavailable" | "serverFail" | "rateLimit" | "stateMismatch" => {
                    ErrorClass::Transient
                }
                "forbidden" | "accountNotFound" => ErrorClass::Auth,
                _ => ErrorClass::Permanent,
            },
            MailboxError::CannotCalculateChanges => ErrorClass::Transient,
            MailboxError::Protocol { .. }
            | MailboxError::Refused { .. }
            | MailboxError::Address(_)
            | MailboxError::TooLarge { .. } => ErrorClass::Permanent,
            MailboxError::Smtp { class, .. } | MailboxError::Push { class, .. } => *class,
        }
    }
}

/// An error with its causes, `outer: inner: ...`: reqwest's own text ("error sending request")
/// hides whether the connection was refused or the certificate was not trusted.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("error sending request")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("invalid peer certificate: UnknownIssuer")]
    struct Inner;

    #[test]
    fn the_cause_is_told() {
        assert_eq!(
            super::chain(&Outer(Inner)),
            "error sending request: invalid peer certificate: UnknownIssuer"
        );
    }
}
