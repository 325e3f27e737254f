//! Files the bridge keeps: one way to write a file atomically, a small JSON state file
//! written that way, the lock that makes a state directory belong to one running bridge, and
//! the words that are safe in a path.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A small JSON file of state (a mailbox's watermark or position), private to its owner and
/// written atomically: a crash leaves the old value or the new one.
pub struct JsonFile<T> {
    path: PathBuf,
    kind: std::marker::PhantomData<fn() -> T>,
}

impl<T: serde::Serialize + serde::de::DeserializeOwned> JsonFile<T> {
    pub fn new(path: PathBuf) -> JsonFile<T> {
        JsonFile {
            path,
            kind: std::marker::PhantomData,
        }
    }

    /// The value; `None` when there is no file, or one that does not read as `T` (as at a
    /// first start).
    pub fn load(&self) -> io::Result<Option<T>> {
        match std::fs::read(&self.path) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn save(&self, value: &T) -> io::Result<()> {
        let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
        write_atomic(&self.path, &bytes, 0o600)
    }
}

/// `text` as a word safe in a path or an argument: ASCII letters, digits, `-` and `_` kept,
/// any other character written as `other`, at most `max` characters.
pub fn safe_word(text: &str, other: char, max: usize) -> String {
    text.chars()
        .map(
            |c| match c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                true => c,
                false => other,
            },
        )
        .take(max)
        .collect()
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one, never a mix:
/// a temporary file of this writer's own beside it (so concurrent writers never share one),
/// written with `mode`, flushed to disk, renamed over `path`, and the folder flushed so the
/// rename itself survives a power loss. Missing folders are made.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} names no file", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // Flushing a folder is not supported everywhere; the rename is done either way.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Holds a state directory for this process: a second bridge on the same directory is
/// refused with the holder's pid. The OS drops the lock when the process ends, however it
/// ends, so a crash never leaves a stale lock behind.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    pub path: PathBuf,
}

/// Why a state directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another aamp-bridge (pid {pid}) is running on the state directory {dir}; stop it first, or give this one another state_dir")]
    Held { pid: String, dir: PathBuf },
    #[error("cannot lock the state directory {dir}: {source}")]
    Io { dir: PathBuf, source: io::Error },
}

impl StateLock {
    /// The pid of the bridge holding `state_dir`, if one runs (without taking the lock).
    pub fn holder(state_dir: &Path) -> Option<String> {
        let mut file = File::open(crate::paths::StateDir::new(state_dir).lock()).ok()?;
        match file.try_lock_shared() {
            Ok(()) => None,
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                Some(pid.trim().to_string())
            }
            Err(std::fs::TryLockError::Error(_)) => None,
        }
    }

    pub fn acquire(state_dir: &Path) -> Result<StateLock, LockError> {
        let io = |source| LockError::Io {
            dir: state_dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(io)?;
        let path = crate::paths::StateDir::new(state_dir).lock();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(LockError::Held {
                    pid: if pid.is_empty() {
                        "unknown".into()
                    } else {
                        pid.into()
                    },
                    dir: state_dir.to_path_buf(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(StateLock { _file: file, path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_writes_replace_whole_files_with_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/file.json");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "no temporary file is left behind");
    }

    #[test]
    fn concurrent_writers_never_corrupt_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.json");
        std::thread::scope(|s| {
            for i in 0..8 {
                let path = &path;
                s.spawn(move || {
                    for j in 0..50 {
                        let body = format!("{{\"writer\":{i},\"n\":{j}}}");
                        write_atomic(path, body.as_bytes(), 0o600).unwrap();
                    }
                });
            }
        });
        let text = std::fs::read_to_string(&path).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).expect("one whole write");
    }

    #[test]
    fn a_second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).unwrap();
        let second = StateLock::acquire(dir.path()).unwrap_err();
        let text = second.to_string();
        assert!(text.contains(&std::process::id().to_string()), "{text}");
        drop(first);
        StateLock::acquire(dir.path()).expect("free again once the holder is gone");
    }
}

/// Why [`open_inside`] did not open a file.
#[derive(Debug)]
pub enum Unsafe {
    /// The last step of the path is a symbolic link.
    Link,
    /// A folder, FIFO, socket or device.
    NotRegular,
    /// The file has this many names: another may be outside the folder it was asked in.
    HardLinked(u64),
    /// What was opened is outside the folder.
    Outside,
    Io(io::Error),
}

/// Opens `path` (already resolved to a place inside `root`) for reading in a way a file's
/// maker cannot turn against the reader: without following a link at its last step and
/// without blocking (a FIFO or a device never stalls the thread in `open`), then checks what
/// was opened: a regular file, with one name only (a hard link made inside `root` to a file
/// outside it, the bridge's password for one, has two), and still inside `root` as the kernel
/// has it (what `/proc/self/fd` says, so a folder swapped for a link meanwhile is caught).
pub fn open_inside(root: &Path, path: &Path, options: &mut OpenOptions) -> Result<File, Unsafe> {
    use std::os::unix::fs::MetadataExt;
    let file = options
        .custom_flags(
            nix::libc::O_NOFOLLOW
                | nix::libc::O_NONBLOCK
                | nix::libc::O_CLOEXEC
                | nix::libc::O_NOCTTY,
        )
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => Unsafe::Link,
            Some(nix::libc::ENXIO) => Unsafe::NotRegular,
            _ => Unsafe::Io(e),
        })?;
    let meta = file.metadata().map_err(Unsafe::Io)?;
    if !meta.file_type().is_file() {
        return Err(Unsafe::NotRegular);
    }
    if meta.nlink() > 1 {
        return Err(Unsafe::HardLinked(meta.nlink()));
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(Unsafe::Io)?;
        if !real.starts_with(root) {
            return Err(Unsafe::Outside);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = root;
    Ok(file)
}
