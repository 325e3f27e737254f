use crate::error::{Classify, ErrorClass};

#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// The causes are in the text (plain words first, then reqwest's chain), not behind
    /// `source()`: an `anyhow` chain printed them twice.
    #[error("cannot reach {url}: {}", explain(error))]
    Network { url: String, error: reqwest::Error },
    #[error("{url} answered HTTP {status}{}", answer_words(*.status, .body))]
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
        /// The server's TLS certificate was not trusted.
        certificate: bool,
    },
    #[error("{0}")]
    Address(String),
    #[error("push: {detail}")]
    Push { detail: String, class: ErrorClass },
    /// A back-end's own error (SAMP: a tool's refusal, a schema the bridge cannot map), with
    /// the class the back-end gave it.
    #[error("{detail}")]
    Service { detail: String, class: ErrorClass },
    #[error("{what} is {bytes} bytes, more than {server} takes ({limit})")]
    TooLarge {
        what: String,
        server: String,
        bytes: usize,
        limit: usize,
    },
    /// An answer, or one message in it, longer than the bridge reads: the reading stopped at
    /// the first byte over the cap, so only a lower bound of its size is known.
    #[error("{what} is over the {} cap: at least {at_least} bytes", cap_words(*.limit))]
    Oversized {
        what: String,
        at_least: u64,
        limit: u64,
    },
}

/// A cap in a person's words: `16 MiB`, or its bytes when it is not a whole number of MiB.
pub fn cap_words(limit: u64) -> String {
    if limit >= 1 << 20 && limit.is_multiple_of(1 << 20) {
        format!("{} MiB", limit >> 20)
    } else {
        format!("{limit} bytes")
    }
}

impl MailboxError {
    /// The server's TLS certificate was not trusted (so `insecure_tls` is the knob), read
    /// from the error's causes, not its words.
    pub fn certificate_refused(&self) -> bool {
        match self {
            MailboxError::Network { error, .. } => certificate_refused(error),
            MailboxError::Smtp { certificate, .. } => *certificate,
            _ => false,
        }
    }

    /// What to do about it, in a person's words: `what` names the setting that points at the
    /// server ("jmap_url", "smtp_host, smtp_port and smtp_security").
    pub fn fix(&self, what: &str) -> String {
        if self.certificate_refused() {
            return "the server's TLS certificate is not trusted: give it one from a trusted CA, \
                    or, for a host you control, set insecure_tls = true on this mailbox"
                .to_string();
        }
        match self {
            MailboxError::Network { error, .. } => match cause(error) {
                Cause::NoSuchHost => format!("check the host name in {what}"),
                Cause::Refused => format!(
                    "check the port in {what}, and that the server runs and is reachable from here"
                ),
                Cause::NotTls => format!(
                    "that port does not speak TLS: use http:// or the server's TLS port in {what}"
                ),
                Cause::TimedOut => format!("check {what} and the network (no answer in time)"),
                _ => format!("check {what}, and that the server runs and is reachable from here"),
            },
            MailboxError::Http { status: 404, .. } => format!(
                "check the path in {what} (a JMAP session URL usually ends in /.well-known/jmap)"
            ),
            _ if self.class() == ErrorClass::Auth => {
                "the server refused the login: check the address (or login) and the password"
                    .to_string()
            }
            _ => format!("check {what}, and that the server runs"),
        }
    }

    /// Maps a failure to reach `url` (for `map_err`).
    pub fn network(url: impl Into<String>) -> impl FnOnce(reqwest::Error) -> MailboxError {
        let url = url.into();
        move |error| MailboxError::Network { url, error }
    }
}

/// Whether a TLS certificate was refused somewhere in `e`'s causes.
pub fn certificate_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    certificate_problem(e).is_some()
}

fn certificate_problem<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::CertificateError> {
    if let Some(rustls::Error::InvalidCertificate(c)) = e.downcast_ref::<rustls::Error>() {
        return Some(c);
    }
    // An io::Error hands on its inner error's source, not the inner error itself.
    if let Some(inner) = e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        if let Some(c) = certificate_problem(inner) {
            return Some(c);
        }
    }
    e.source().and_then(certificate_problem)
}

/// Why a connection failed, read from the error's causes.
#[derive(Debug, PartialEq)]
enum Cause {
    NoSuchHost,
    Refused,
    Certificate,
    NotTls,
    TimedOut,
    Other,
}

fn cause(e: &(dyn std::error::Error + 'static)) -> Cause {
    if certificate_refused(e) {
        return Cause::Certificate;
    }
    let mut found = Cause::Other;
    each_cause(e, &mut |c| {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => found = Cause::Refused,
                std::io::ErrorKind::TimedOut => found = Cause::TimedOut,
                _ => {}
            }
        }
        if c.downcast_ref::<reqwest::Error>()
            .is_some_and(|r| r.is_timeout())
        {
            found = Cause::TimedOut;
        }
        if matches!(
            c.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidMessage(_))
        ) {
            found = Cause::NotTls;
        }
        // Neither hyper-util's resolver error nor the system resolver's has a type or kind of
        // its own to look for (this picks words for a person, it decides nothing).
        let text = c.to_string();
        if text.starts_with("dns error") || text.contains("failed to lookup address") {
            found = Cause::NoSuchHost;
        }
        found != Cause::Other
    });
    found
}

/// Calls `f` on `e` and each of its causes until it returns true, looking inside an
/// `io::Error` too (its `source()` skips the error it wraps).
fn each_cause(
    e: &(dyn std::error::Error + 'static),
    f: &mut dyn FnMut(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    if f(e) {
        return true;
    }
    if let Some(inner) = e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        if each_cause(inner, f) {
            return true;
        }
    }
    e.source().is_some_and(|s| each_cause(s, f))
}

/// A failure to connect in plain words first ("the host name is not known"), then the
/// causes as the libraries said them, each once.
pub fn explain(e: &(dyn std::error::Error + 'static)) -> String {
    let words = match cause(e) {
        Cause::NoSuchHost => "the host name is not known (DNS)",
        Cause::Refused => "nothing listens there (connection refused)",
        Cause::Certificate => match certificate_problem(e) {
            Some(rustls::CertificateError::Other(o))
                if o.to_string().contains("CaUsedAsEndEntity") =>
            {
                "its TLS certificate is self-signed"
            }
            Some(rustls::CertificateError::UnknownIssuer) => {
                "its TLS certificate is signed by an authority this machine does not trust"
            }
            Some(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            ) => "its TLS certificate is made out for another host name",
            Some(
                rustls::CertificateError::Expired | rustls::CertificateError::ExpiredContext { .. },
            ) => "its TLS certificate has expired",
            _ => "its TLS certificate is not trusted",
        },
        Cause::NotTls => "it does not speak TLS on that port",
        Cause::TimedOut => "no answer in time",
        Cause::Other => return chain(e),
    };
    format!("{words} ({})", innermost(e))
}

/// The last cause in the chain: the one that says what went wrong, without "error sending
/// request for url (...)" around it.
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// A server's refusal without its HTML: the page's title or text, cut short, and what the
/// status means when it is a login refusal.
fn answer_words(status: u16, body: &str) -> String {
    let mut text = body.trim().to_string();
    if text.starts_with('<') {
        let lower = text.to_ascii_lowercase();
        text = match (lower.find("<title>"), lower.find("</title>")) {
            (Some(a), Some(b)) if b > a => text[a + 7..b].trim().to_string(),
            _ => strip_tags(&text),
        };
    }
    let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let text: String = text.chars().take(200).collect();
    let meaning = match status {
        401 => " (the login was refused)",
        403 => " (this login may not do that)",
        404 => " (nothing at that path)",
        _ => "",
    };
    // "401 Unauthorized" after "HTTP 401" says the number once.
    let code = status.to_string();
    match text.strip_prefix(&code).map(str::trim) {
        _ if text.is_empty() => meaning.to_string(),
        Some(rest) => format!(" {rest}{meaning}"),
        None => format!(": {text}{meaning}"),
    }
}

fn strip_tags(html: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for c in html.chars() {
        match c {
            '<' => inside = true,
            '>' => {
                inside = false;
                out.push(' ');
            }
            _ if !inside => out.push(c),
            _ => {}
        }
    }
    out
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
            | MailboxError::TooLarge { .. }
            | MailboxError::Oversized { .. } => ErrorClass::Permanent,
            MailboxError::Smtp { class, .. }
            | MailboxError::Push { class, .. }
            | MailboxError::Service { class, .. } => *class,
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

/// Why an agent's mailbox could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A client could not be set up, or the mailbox registered: what was being done.
    #[error("{what}")]
    Mailbox {
        what: String,
        #[source]
        source: MailboxError,
    },
    /// A registered mailbox's credentials could not be saved.
    #[error("saving the credentials to {}", path.display())]
    SaveCredentials {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl OpenError {
    pub(crate) fn mailbox(what: String, source: MailboxError) -> OpenError {
        OpenError::Mailbox { what, source }
    }
}

/// A mailbox back-end's error as dispatch sees it: its class and what it says.
impl From<MailboxError> for crate::backend::BackendError {
    fn from(e: MailboxError) -> crate::backend::BackendError {
        use crate::error::Classify as _;
        crate::backend::BackendError::new(e.class(), e.to_string())
    }
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
    fn a_refusal_is_told_without_its_html() {
        let page = "<!DOCTYPE HTML PUBLIC \"-//W3C//DTD HTML 4.01//EN\"><html><head>\n<title>401 Unauthorized</title></head><body><h1>Unauthorized</h1></body></html>";
        assert_eq!(
            super::answer_words(401, page),
            " Unauthorized (the login was refused)"
        );
        assert_eq!(
            super::answer_words(500, "<p>broken <b>here</b></p>"),
            ": broken here"
        );
        assert_eq!(super::answer_words(404, ""), " (nothing at that path)");
        assert_eq!(
            super::answer_words(400, "{\"type\":\"urn:x\"}"),
            ": {\"type\":\"urn:x\"}"
        );
    }

    #[test]
    fn a_refused_connection_is_said_once_in_plain_words() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let text = super::explain(&io);
        assert_eq!(
            text,
            "nothing listens there (connection refused) (Connection refused)"
        );
    }

    #[test]
    fn the_cause_is_told() {
        assert_eq!(
            super::chain(&Outer(Inner)),
            "error sending request: invalid peer certificate: UnknownIssuer"
        );
    }
}
