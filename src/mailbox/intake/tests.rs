//! The reading loop's health rule over a fake mailbox.

use super::*;
use crate::config::Secret;
use crate::mailbox::link::{Link, Reach};

/// A mailbox whose server takes only the key `good`; each read's time is kept.
struct Keyed {
    secret: Secret,
    good: String,
    reads: std::sync::Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
}

impl Watched for Keyed {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        self.reads.lock().unwrap().push(tokio::time::Instant::now());
        if self.secret.value() == self.good {
            Ok(0)
        } else {
            Err(IntakeError::Mailbox(MailboxError::Http {
                url: "http://broker.test/inbox".into(),
                status: 401,
                body: String::new(),
            }))
        }
    }
    fn next_read(&mut self, _taken: usize) -> Duration {
        Duration::from_secs(600)
    }
    fn address(&self) -> String {
        "coder@broker.test".into()
    }
}

fn private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let fresh = path.with_extension("new");
    std::fs::write(&fresh, text).unwrap();
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(fresh, path).unwrap();
}

/// A key file in a fresh directory, its secret, and the link state beside it.
struct KeyFile {
    dir: tempfile::TempDir,
    file: std::path::PathBuf,
    secret: Secret,
    link: Link,
}

impl KeyFile {
    fn new(key: &str) -> KeyFile {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        private(&file, key);
        let secret = Secret::from_file("coder", &file, crate::config::SecretForm::Trimmed).unwrap();
        let link = Link::new(dir.path().join("link.json"));
        KeyFile {
            dir,
            file,
            secret,
            link,
        }
    }

    /// Writes `key` to the file, as a person replacing it does.
    fn write(&self, key: &str) {
        private(&self.file, key);
    }

    /// Writes `key` and reloads: the secret is replaced by one read from the file.
    fn reload(&self, key: &str) {
        self.write(key);
        let fresh =
            Secret::from_file("coder", &self.file, crate::config::SecretForm::Trimmed).unwrap();
        assert!(self.secret.replace(&fresh));
    }

    /// A mailbox over this key that takes only `good`.
    fn keyed(&self, good: &str) -> Keyed {
        Keyed {
            secret: self.secret.clone(),
            good: good.into(),
            reads: Default::default(),
        }
    }

    /// The reading loop's health over this key, for `server` (`fix`: the key's config key).
    fn health(&self, server: &'static str, fix: &'static str) -> Health<'_> {
        Health::new(&self.link, server, "coder".into(), fix).with_secret(self.secret.clone())
    }

    /// The link state as `status` reads it.
    fn state(&self) -> crate::mailbox::link::LinkState {
        super::super::link::read(&self.dir.path().join("link.json")).unwrap()
    }
}

/// Issue 37: refused credentials waited 5 minutes, read once at start. A key written to
/// the file is tried within [`CREDENTIALS_RECHECK`]; one that works is not read again
/// before its interval; a key replaced by a reload (another clone of the secret) is tried
/// at once.
#[tokio::test(start_paused = true)]
async fn refused_credentials_are_read_again_and_a_new_key_is_tried_at_once() {
    let key = KeyFile::new("amk_old");
    let mut keyed = key.keyed("amk_new");
    let reads = keyed.reads.clone();
    let stop = CancellationToken::new();
    let health = key.health("the AMP broker", "api_key_file");
    let count = || reads.lock().unwrap().len();
    let start = tokio::time::Instant::now();
    let watching = watch("coder", Events::new(false), health, &mut keyed, None, &stop);
    let driving = async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(count(), 1, "refused once, then waiting");
        let state = key.state();
        assert_eq!(state.mailbox, Reach::AuthFailed);
        assert_eq!(state.credentials.unwrap().worked, Some(false));
        key.write("amk_new\n");
        tokio::time::sleep(CREDENTIALS_RECHECK * 2).await;
        assert_eq!(count(), 2, "the new key tried at the next look at the file");
        let at = reads.lock().unwrap()[1] - start;
        assert!(
            at <= Duration::from_secs(60) + CREDENTIALS_RECHECK,
            "{at:?}"
        );
        let state = key.state();
        assert_eq!(state.mailbox, Reach::Connected);
        assert_eq!(state.credentials.unwrap().worked, Some(true));
        // Working: the file is not looked at, nor the server asked, before the interval.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(count(), 2);
        // A reload with another key: tried at once.
        key.reload("amk_other");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(count(), 3, "read at once with the reloaded key");
        stop.cancel();
    };
    tokio::join!(watching, driving);
}

/// Issue 43: an answer refused for its token while the reads took it (ASMTP's push socket
/// opened before the token was revoked: the next read is the 60 s catch-up) waited for
/// that read: sent 40 s after the new token was written, while `status` said the
/// credentials worked. The outbox's refusal now shows in the link at once, and the file
/// is looked at every [`CREDENTIALS_RECHECK`] until it holds another token.
#[tokio::test(start_paused = true)]
async fn a_send_refused_for_its_credentials_shows_in_status_and_the_file_is_watched() {
    let key = KeyFile::new("tok_old");
    let secret = &key.secret;
    // The server still takes the old token for reads: only the send is refused.
    let mut keyed = key.keyed("tok_old");
    let reads = keyed.reads.clone();
    let stop = CancellationToken::new();
    let health = key.health("the ASMTP operator", "token_file");
    let mut changes = secret.changes();
    let watching = watch("coder", Events::new(false), health, &mut keyed, None, &stop);
    let driving = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(reads.lock().unwrap().len(), 1);
        // The outbox's send is refused (what `Outlet::submit` records).
        secret.worked(false);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let state = key.state();
        assert_eq!(state.mailbox, Reach::AuthFailed, "{state:?}");
        assert_eq!(state.credentials.unwrap().worked, Some(false));
        assert!(state
            .last_error
            .unwrap()
            .contains("refused the credentials"));
        tokio::time::sleep(Duration::from_secs(30)).await;
        key.write("tok_new");
        let written = tokio::time::Instant::now();
        changes.borrow_and_update();
        changes.changed().await.unwrap();
        assert!(
            written.elapsed() <= CREDENTIALS_RECHECK,
            "{:?}",
            written.elapsed()
        );
        stop.cancel();
    };
    tokio::join!(watching, driving);
}

/// A mailbox that answers `bad` reads with what is not JSON, then reads well; each read's
/// time is kept.
struct Garbled {
    bad: usize,
    reads: Vec<tokio::time::Instant>,
}

impl Watched for Garbled {
    async fn read(&mut self) -> Result<usize, IntakeError> {
        self.reads.push(tokio::time::Instant::now());
        if self.reads.len() <= self.bad {
            return Err(IntakeError::Mailbox(MailboxError::Protocol {
                what: "http://broker.test/inbox".into(),
                detail: "expected value at line 1 column 1".into(),
            }));
        }
        Ok(0)
    }
    fn next_read(&mut self, _taken: usize) -> Duration {
        Duration::from_secs(600)
    }
    fn address(&self) -> String {
        "coder@broker.test".into()
    }
}

/// Issue 43: two answers that were not JSON (status 200) held the next task back 120 s on
/// AMP and ASMTP: each was taken for a permanent error and waited out a minute. They are
/// retried on the short schedule.
#[tokio::test(start_paused = true)]
async fn answers_that_are_not_json_are_retried_on_the_short_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let link = Link::new(dir.path().join("link.json"));
    let mut garbled = Garbled {
        bad: 2,
        reads: Vec::new(),
    };
    let stop = CancellationToken::new();
    let health = Health::new(&link, "the AMP broker", "coder".into(), "api_key_file");
    let start = tokio::time::Instant::now();
    let watching = watch(
        "coder",
        Events::new(false),
        health,
        &mut garbled,
        None,
        &stop,
    );
    let stopping = async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        stop.cancel();
    };
    tokio::join!(watching, stopping);
    assert_eq!(garbled.reads.len(), 3, "two bad answers, then a good read");
    let third = garbled.reads[2] - start;
    assert!(third <= Duration::from_secs(10), "{third:?}");
}

/// A pushed connection that ends as scripted, noting when each attempt came; once the
/// script is done it stays connected until stopped.
struct Scripted {
    script: std::collections::VecDeque<Result<Closed, MailboxError>>,
    attempts: std::sync::Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
}

impl Pushed for Scripted {
    fn transport(&self) -> &'static str {
        "websocket"
    }

    async fn connect(
        &mut self,
        _wake: &mpsc::Sender<()>,
        stop: &CancellationToken,
        connected: impl FnOnce() + Send,
    ) -> Result<Closed, MailboxError> {
        self.attempts
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        match self.script.pop_front() {
            Some(Ok(Closed::Replaced)) => {
                // Up for a while; the test replaces the credentials meanwhile.
                connected();
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(Closed::Replaced)
            }
            Some(Ok(closed)) => {
                connected();
                Ok(closed)
            }
            Some(Err(e)) => Err(e),
            None => {
                connected();
                stop.cancelled().await;
                Ok(Closed::Stopped)
            }
        }
    }
}

/// The supervisor over `pushed`, with the key file's secret and link.
fn supervise<'a>(
    key: &'a KeyFile,
    pushed: Scripted,
    wake: &'a mpsc::Sender<()>,
    push_up: &'a AtomicBool,
    stop: &'a CancellationToken,
) -> impl std::future::Future<Output = ()> + 'a {
    supervise_push(
        "coder",
        &key.link,
        Events::new(false),
        &key.secret,
        pushed,
        wake,
        push_up,
        stop,
    )
}

fn refused() -> MailboxError {
    MailboxError::Push {
        detail: "HTTP error: 401 Unauthorized".into(),
        class: ErrorClass::Auth,
    }
}

/// Issue 34: the one push supervisor. ASMTP's own loop retried a refused token every
/// 1–60 s and never said so in the events; now every pushed back-end waits refused
/// credentials out ([`PUSH_REFUSED_RETRY`]), tries replaced ones at once, backs off after
/// a drop, and keeps the link's push state.
#[tokio::test(start_paused = true)]
async fn push_waits_out_refused_credentials_and_tries_replaced_ones_at_once() {
    let key = KeyFile::new("tok_old");
    let attempts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let pushed = Scripted {
        script: [
            Err(refused()),
            Err(refused()),
            Ok(Closed::ByServer(Some("1001 operator shutting down".into()))),
        ]
        .into(),
        attempts: attempts.clone(),
    };
    let (wake, mut woken) = mpsc::channel(1);
    let push_up = AtomicBool::new(false);
    let stop = CancellationToken::new();
    let start = tokio::time::Instant::now();
    let at = |n: usize| attempts.lock().unwrap().get(n).map(|t| *t - start);
    let count = || attempts.lock().unwrap().len();
    let supervising = supervise(&key, pushed, &wake, &push_up, &stop);
    let driving = async {
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(
            count(),
            1,
            "refused once, then waiting, not retrying every few seconds"
        );
        // Replaced (a reload): tried at once, refused again, waited out again.
        key.reload("tok_new");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(count(), 2);
        assert!(at(1).unwrap() < Duration::from_secs(121), "{:?}", at(1));
        tokio::time::sleep(PUSH_REFUSED_RETRY - Duration::from_secs(1)).await;
        assert_eq!(count(), 2);
        tokio::time::sleep(Duration::from_secs(2)).await;
        // The third try connects, and the operator closes it: the link says polling and
        // push reconnects after the first backoff step, staying up this time.
        assert!(count() >= 3);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(count(), 4);
        assert!(push_up.load(Ordering::SeqCst));
        let state = key.state();
        assert_eq!(state.push, "websocket");
        assert!(
            woken.try_recv().is_ok(),
            "a connection wakes the reading loop"
        );
        stop.cancel();
    };
    tokio::join!(supervising, driving);
    assert!(!push_up.load(Ordering::SeqCst));
    let state = key.state();
    assert_eq!(state.push, "polling");
}

/// A connection the back-end closed because its credentials were replaced has seen that
/// replacement: a refusal of the new ones right after is waited out, not retried at once
/// (the supervisor's own view of the secret went stale, so its wait ended immediately).
#[tokio::test(start_paused = true)]
async fn a_replacement_push_already_reconnected_for_does_not_cut_the_next_wait_short() {
    let key = KeyFile::new("tok_old");
    let attempts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let pushed = Scripted {
        script: [Ok(Closed::Replaced), Err(refused())].into(),
        attempts: attempts.clone(),
    };
    let (wake, _woken) = mpsc::channel(1);
    let push_up = AtomicBool::new(false);
    let stop = CancellationToken::new();
    let count = || attempts.lock().unwrap().len();
    let supervising = supervise(&key, pushed, &wake, &push_up, &stop);
    let driving = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        key.reload("tok_new");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            count(),
            2,
            "closed for the new key, refused with it, then waiting"
        );
        tokio::time::sleep(PUSH_REFUSED_RETRY).await;
        assert_eq!(count(), 3, "tried again after the wait");
        stop.cancel();
    };
    tokio::join!(supervising, driving);
}
