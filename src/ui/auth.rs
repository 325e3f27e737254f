//! Who may use the page: the access token (kept 0600 in the state folder), the `Host` header
//! (no DNS rebinding), and for actions the page's CSRF token and a same-origin `Origin`. Pure
//! checks, tested here.
//!
//! The token is never a cookie: a browser sends a cookie of 127.0.0.1 to every port of
//! 127.0.0.1 (cookies ignore ports, and SameSite counts every loopback port as one site), so
//! any local web server the operator visited would receive it. The link carries it in its
//! fragment (`#token=`, which a browser never sends), the page keeps it in sessionStorage
//! (one origin, port included) and sends it as `Authorization: Bearer` on each request, a
//! header no other page can make a browser send here without a CORS preflight, which is
//! never granted.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;

/// Why the token file could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} does not hold a token (64 hex digits); delete it and start the bridge again")]
    Malformed { path: std::path::PathBuf },
}

/// 32 bytes from the system's random source, as 64 hex digits.
pub fn random_hex() -> std::io::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The access token in `path`, made (owner-only) when there is none yet. Kept across
/// restarts, so a bookmarked page keeps working; delete the file to change it.
pub fn load_or_create_token(path: &Path) -> Result<String, TokenError> {
    let io = |source| TokenError::Io {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let token = text.trim().to_string();
            if token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(token);
            }
            return Err(TokenError::Malformed {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let token = random_hex().map_err(io)?;
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?
    };
    writeln!(file, "{token}").map_err(io)?;
    Ok(token)
}

/// The token a running bridge's page wants, from its state folder (`aamp-bridge ui`).
pub fn read_token(path: &Path) -> Option<String> {
    let token = std::fs::read_to_string(path).ok()?.trim().to_string();
    (token.len() == 64).then_some(token)
}

/// Equal, in a time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The `Host` values the page answers to: the listen address, `localhost:PORT` when it is a
/// loopback one, and those the config adds. Anything else (a name an attacker's DNS points
/// at 127.0.0.1) is refused.
#[derive(Clone, Debug)]
pub struct Hosts(Vec<String>);

impl Hosts {
    pub fn new(listen: SocketAddr, extra: &[String]) -> Hosts {
        let port = listen.port();
        let mut hosts = vec![listen.to_string()];
        if listen.ip().is_loopback() {
            hosts.extend([
                format!("localhost:{port}"),
                format!("127.0.0.1:{port}"),
                format!("[::1]:{port}"),
            ]);
        }
        hosts.extend(extra.iter().map(|h| h.to_ascii_lowercase()));
        hosts.dedup();
        Hosts(hosts)
    }

    pub fn allows(&self, host: Option<&str>) -> bool {
        host.is_some_and(|h| self.0.iter().any(|a| a.eq_ignore_ascii_case(h.trim())))
    }
}

/// The token an `Authorization: Bearer TOKEN` header carries.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The page's link: the token in the fragment, which the browser keeps to itself.
pub fn link(addr: &str, token: &str) -> String {
    format!("http://{addr}/#token={token}")
}

/// The value of `name` in a query string (no percent-decoding: the token is hex).
pub fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then_some(v)
    })
}

/// An action (POST) comes from the page itself: its `Origin` is this very host over http,
/// and it carries the CSRF token the page read from the feed.
pub fn same_origin(origin: Option<&str>, host: &str) -> bool {
    origin.is_some_and(|o| o.eq_ignore_ascii_case(&format!("http://{host}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_the_listen_address_and_loopback_names() {
        let hosts = Hosts::new("127.0.0.1:8765".parse().unwrap(), &[]);
        assert!(hosts.allows(Some("127.0.0.1:8765")));
        assert!(hosts.allows(Some("localhost:8765")));
        assert!(hosts.allows(Some("LOCALHOST:8765")));
        assert!(!hosts.allows(Some("evil.example:8765")));
        assert!(!hosts.allows(Some("localhost:8766")));
        assert!(!hosts.allows(None));
        let remote = Hosts::new("192.0.2.7:80".parse().unwrap(), &["box.lan:80".into()]);
        assert!(remote.allows(Some("box.lan:80")));
        assert!(!remote.allows(Some("localhost:80")));
    }

    #[test]
    fn bearers_queries_and_origins() {
        assert_eq!(bearer("Bearer tok"), Some("tok"));
        assert_eq!(bearer("bearer  tok "), Some("tok"));
        assert_eq!(bearer("Basic tok"), None);
        assert_eq!(bearer("tok"), None);
        assert_eq!(
            link("127.0.0.1:80", "tok"),
            "http://127.0.0.1:80/#token=tok"
        );
        assert_eq!(query_param("x=1&token=abc", "token"), Some("abc"));
        assert!(same_origin(Some("http://127.0.0.1:80"), "127.0.0.1:80"));
        assert!(!same_origin(Some("http://evil.example"), "127.0.0.1:80"));
        assert!(!same_origin(None, "127.0.0.1:80"));
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }

    #[test]
    fn the_token_file_is_owner_only_and_kept() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ui-token");
        let token = load_or_create_token(&path).unwrap();
        assert_eq!(token.len(), 64);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create_token(&path).unwrap(), token);
        assert_eq!(read_token(&path).as_deref(), Some(token.as_str()));
        std::fs::write(&path, "short").unwrap();
        assert!(matches!(
            load_or_create_token(&path),
            Err(TokenError::Malformed { .. })
        ));
    }
}
