//! A mailbox's secret (an AMP API key, an ASMTP token, an AAMP password) as every client of
//! that mailbox shares it: read from its 0600 file at start, and read again at a reload or
//! when the server refused it, so a replaced key is used without a restart. Each client asks
//! for the value at each request (or connection); the value is never logged or shown.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// How the file holds the secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretForm {
    /// The whole file, trimmed (`api_key_file`, `token_file`).
    Trimmed,
    /// The file without its line ending (`password_file`: spaces are the password's own).
    Line,
    /// The `smtpPassword` of a credentials file (`credentials_file`).
    Credentials,
}

/// Why a secret file could not be read again; the value in use is kept.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} can be read by other users (run `chmod 600 {}`)", .0.display(), .0.display())]
    NotPrivate(PathBuf),
    #[error("{} is not a credentials file: {detail}", path.display())]
    Malformed { path: PathBuf, detail: String },
    /// An empty file (one being written, or emptied by mistake) is never a secret.
    #[error("{} is empty", .0.display())]
    Empty(PathBuf),
}

/// What `status` shows of a secret: when it was last read, and whether the server took it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretStatus {
    /// The file it is read from (`None`: written in the config itself).
    pub file: Option<PathBuf>,
    pub read_at: SystemTime,
    /// When the value in use was first read (start, or when a changed file was read).
    pub changed_at: SystemTime,
    /// Whether the server took the value in use: `None` until it was tried.
    pub worked: Option<bool>,
}

/// One mailbox's secret, shared by its clones.
#[derive(Clone)]
pub struct Secret {
    shared: Arc<Shared>,
}

struct Shared {
    /// The mailbox's name in the config (what the log names).
    mailbox: String,
    state: Mutex<State>,
    /// The number of the value in use, counted from 0 at start: one more at each change.
    changes: tokio::sync::watch::Sender<u64>,
    /// One more each time the value in use works again after it was refused (a key made
    /// active again on the server).
    recoveries: tokio::sync::watch::Sender<u64>,
    /// One more each time the value in use is refused after it worked or before it was
    /// tried: whoever was refused (the outbox's send), the intake hears it and watches the
    /// file for a replaced value.
    refusals: tokio::sync::watch::Sender<u64>,
}

struct State {
    file: Option<(PathBuf, SecretForm)>,
    value: String,
    read_at: SystemTime,
    changed_at: SystemTime,
    worked: Option<bool>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("mailbox", &self.shared.mailbox)
            .field("file", &self.status().file)
            .finish_non_exhaustive()
    }
}

/// Reads a secret file in its form; the file must be private.
pub fn read_secret(path: &Path, form: SecretForm) -> Result<String, SecretError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if !super::is_private(path) {
        return Err(SecretError::NotPrivate(path.to_path_buf()));
    }
    let value = match form {
        SecretForm::Trimmed => text.trim().to_string(),
        SecretForm::Line => text.trim_end_matches(['\r', '\n']).to_string(),
        SecretForm::Credentials => {
            serde_json::from_str::<super::Credentials>(&text)
                .map_err(|e| SecretError::Malformed {
                    path: path.to_path_buf(),
                    detail: e.to_string(),
                })?
                .smtp_password
        }
    };
    if value.is_empty() {
        return Err(SecretError::Empty(path.to_path_buf()));
    }
    Ok(value)
}

impl Secret {
    fn new(mailbox: &str, file: Option<(PathBuf, SecretForm)>, value: String) -> Secret {
        let now = SystemTime::now();
        Secret {
            shared: Arc::new(Shared {
                mailbox: mailbox.to_string(),
                state: Mutex::new(State {
                    file,
                    value,
                    read_at: now,
                    changed_at: now,
                    worked: None,
                }),
                changes: tokio::sync::watch::Sender::new(0),
                recoveries: tokio::sync::watch::Sender::new(0),
                refusals: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// A secret written in the config itself (or made by a test): never read again.
    pub fn fixed(mailbox: &str, value: impl Into<String>) -> Secret {
        Secret::new(mailbox, None, value.into())
    }

    /// A secret read from `file` now, and again by [`Secret::reread`].
    pub fn from_file(mailbox: &str, file: &Path, form: SecretForm) -> Result<Secret, SecretError> {
        let value = read_secret(file, form)?;
        Ok(Secret::new(
            mailbox,
            Some((file.to_path_buf(), form)),
            value,
        ))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().expect("secret lock")
    }

    /// The value in use.
    pub fn value(&self) -> String {
        self.state().value.clone()
    }

    pub fn mailbox(&self) -> &str {
        &self.shared.mailbox
    }

    pub fn status(&self) -> SecretStatus {
        let state = self.state();
        SecretStatus {
            file: state.file.as_ref().map(|(p, _)| p.clone()),
            read_at: state.read_at,
            changed_at: state.changed_at,
            worked: state.worked,
        }
    }

    /// Reads the file again; true when it holds another value, which is used from now on
    /// (and every [`Secret::changes`] receiver hears it). A file that cannot be read keeps the
    /// value in use.
    pub fn reread(&self) -> Result<bool, SecretError> {
        let file = self.state().file.clone();
        let Some((path, form)) = file else {
            return Ok(false);
        };
        let value = read_secret(&path, form)?;
        Ok(self.take(Some((path, form)), value))
    }

    /// Takes the value (and the file) of `fresh`, the same mailbox's secret read from a
    /// reloaded config, which may name another file; true when the value changed.
    pub fn replace(&self, fresh: &Secret) -> bool {
        let (file, value) = {
            let state = fresh.state();
            (state.file.clone(), state.value.clone())
        };
        self.take(file, value)
    }

    fn take(&self, file: Option<(PathBuf, SecretForm)>, value: String) -> bool {
        let now = SystemTime::now();
        let changed = {
            let mut state = self.state();
            state.read_at = now;
            state.file = file;
            let changed = state.value != value;
            if changed {
                state.value = value;
                state.changed_at = now;
                state.worked = None;
            }
            changed
        };
        if changed {
            tracing::info!("credentials reloaded for {}", self.shared.mailbox);
            self.shared.changes.send_modify(|n| *n += 1);
        }
        changed
    }

    /// The server took (`true`) or refused (`false`) the value in use. Taken after it was
    /// refused, every [`Secret::recoveries`] receiver hears it.
    pub fn worked(&self, worked: bool) {
        let (recovered, refused) = {
            let mut state = self.state();
            let recovered = worked && state.worked == Some(false);
            let refused = !worked && state.worked != Some(false);
            state.worked = Some(worked);
            (recovered, refused)
        };
        if recovered {
            tracing::info!("the credentials of {} work again", self.shared.mailbox);
            self.shared.recoveries.send_modify(|n| *n += 1);
        }
        if refused {
            self.shared.refusals.send_modify(|n| *n += 1);
        }
    }

    /// Hears the value in use refused (by any of its users) when it was not known refused.
    pub fn refusals(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.refusals.subscribe()
    }

    /// Hears the value in use working again after a refusal.
    pub fn recoveries(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.recoveries.subscribe()
    }

    /// Which value is in use: one more at each change.
    pub fn generation(&self) -> u64 {
        *self.shared.changes.borrow()
    }

    /// Hears every change of the value.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private(path: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    /// A secret read from a private file `name` holding `text`, in a folder of its own.
    fn secret_in(name: &str, text: &str, form: SecretForm) -> (tempfile::TempDir, PathBuf, Secret) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        private(&file, text);
        let secret = Secret::from_file("coder", &file, form).unwrap();
        (dir, file, secret)
    }

    #[test]
    fn a_changed_file_is_taken_once_and_heard_by_every_clone() {
        let (_dir, file, secret) = secret_in("key", "amk_one\n", SecretForm::Trimmed);
        let clone = secret.clone();
        let mut changes = clone.changes();
        assert_eq!(secret.value(), "amk_one");
        secret.worked(false);
        assert!(!secret.reread().unwrap(), "the same key is no change");
        assert_eq!(secret.status().worked, Some(false));
        private(&file, "amk_two");
        assert!(secret.reread().unwrap());
        assert!(!clone.reread().unwrap(), "taken once");
        assert_eq!(clone.value(), "amk_two");
        assert_eq!(clone.status().worked, None, "the new key is not tried yet");
        assert!(changes.has_changed().unwrap());
        assert_eq!(*changes.borrow_and_update(), 1);
    }

    #[test]
    fn a_file_that_cannot_be_read_keeps_the_value_in_use() {
        let (_dir, file, secret) = secret_in("password", " pass word \r\n", SecretForm::Line);
        assert_eq!(secret.value(), " pass word ");
        std::fs::write(&file, "leaked").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(secret.reread(), Err(SecretError::NotPrivate(_))));
        private(&file, "\n");
        assert!(matches!(secret.reread(), Err(SecretError::Empty(_))));
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(secret.reread(), Err(SecretError::Read { .. })));
        assert_eq!(secret.value(), " pass word ");
        assert!(!format!("{secret:?}").contains("pass word"));
    }
}
