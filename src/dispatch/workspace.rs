//! Task workspaces: one private folder per admitted task, made empty before every run (so a
//! task run again after a crash never sees the first run's leftovers) and removed after it;
//! or, for a task in a conversation (a Session-Key), the conversation's folder, kept from turn
//! to turn so that agents which key their sessions by folder (Claude Code) can continue them,
//! and pruned by age and count. And safe names for the files a mail brings.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// A conversation's folder unused this long is removed.
pub const CONVERSATION_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The most conversation folders an agent keeps per sender; the least recently used go first.
pub const CONVERSATIONS_KEPT: usize = 100;

/// Where a task runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workspace {
    pub dir: PathBuf,
    /// Where the task's attachments go, relative to `dir`.
    pub attachments: String,
    /// A conversation's folder: kept after the run.
    pub kept: bool,
    /// Where builds before the per-sender count kept this conversation's folder (moved to
    /// `dir` at its next turn, so the agent's files and sessions there carry over).
    pub legacy: Option<PathBuf>,
}

impl Workspace {
    /// The workspace of task `row` (`task_id`), in the conversation `scope` when it has one.
    pub fn of(root: &Path, task_id: &str, row: i64, scope: Option<&str>) -> Workspace {
        match scope {
            Some(scope) => {
                let name = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, scope.as_bytes());
                // The sender's tag first, so the prune counts each sender's conversations.
                let sender = scope.split('\n').next().unwrap_or_default();
                let tag = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, sender.as_bytes());
                let all = root.join("conversations");
                Workspace {
                    dir: all.join(format!(
                        "{}-{}",
                        &tag.simple().to_string()[..8],
                        name.simple()
                    )),
                    attachments: format!("attachments/{row}"),
                    kept: true,
                    legacy: Some(all.join(name.simple().to_string())),
                }
            }
            None => Workspace {
                dir: path(root, task_id, row),
                attachments: "attachments".into(),
                kept: false,
                legacy: None,
            },
        }
    }

    /// Ready for a run: a task's folder made empty; a conversation's made if missing, marked
    /// used, and this task's attachment folder emptied (a run again after a crash).
    pub fn prepare(&self) -> std::io::Result<()> {
        if !self.kept {
            return fresh(&self.dir);
        }
        if let Some(old) = self.legacy.as_ref().filter(|old| old.is_dir()) {
            if !self.dir.exists() {
                std::fs::rename(old, &self.dir)?;
            }
        }
        make_private_dir(&self.dir)?;
        touch(&self.dir);
        match std::fs::remove_dir_all(self.dir.join(&self.attachments)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// After the run: a task's folder removed; a conversation's marked used, and the
    /// agent's conversations pruned, but for those `in_use`.
    pub fn finish(&self, in_use: &InUse) {
        if !self.kept {
            if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(workspace = %self.dir.display(), error = %e, "could not remove the task workspace");
                }
            }
            return;
        }
        touch(&self.dir);
        if let Some(all) = self.dir.parent() {
            prune(all, CONVERSATION_MAX_AGE, CONVERSATIONS_KEPT, &in_use.now());
        }
    }
}

/// The conversation folders in use: a task of the conversation is queued or running there
/// (its attachments already saved in it, maybe). A prune never removes one, however many
/// other conversations (another sender's, say) were used since.
#[derive(Clone, Debug, Default)]
pub struct InUse(Arc<Mutex<HashMap<PathBuf, usize>>>);

impl InUse {
    /// Holds `workspace`'s folder while the returned guard lives (nothing for a task's own
    /// folder, which no prune touches).
    pub fn hold(&self, workspace: &Workspace) -> Option<Holding> {
        if !workspace.kept {
            return None;
        }
        *self
            .0
            .lock()
            .expect("in-use lock")
            .entry(workspace.dir.clone())
            .or_default() += 1;
        Some(Holding {
            set: self.clone(),
            dir: workspace.dir.clone(),
        })
    }

    fn now(&self) -> HashSet<PathBuf> {
        self.0
            .lock()
            .expect("in-use lock")
            .keys()
            .cloned()
            .collect()
    }
}

/// A conversation folder held in use (see [`InUse::hold`]).
#[derive(Debug)]
pub struct Holding {
    set: InUse,
    dir: PathBuf,
}

impl Drop for Holding {
    fn drop(&mut self) {
        let mut held = self.set.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.dir) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.dir);
            }
        }
    }
}

/// Marks a folder used now (its modification time).
fn touch(dir: &Path) {
    let _ = std::fs::File::open(dir).and_then(|f| f.set_modified(SystemTime::now()));
}

/// Removes the folders in `dir` unused for longer than `max_age`, then, per sender (the tag
/// the folder's name starts with; folders of older builds count as one sender), the least
/// recently used beyond `keep`; never one `in_use`. So no sender's conversations push out
/// another's.
pub fn prune(dir: &Path, max_age: Duration, keep: usize, in_use: &HashSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    let mut folders: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| {
            let used = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            (used, e.path())
        })
        .collect();
    folders.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut per_sender: HashMap<String, usize> = HashMap::new();
    for (used, path) in &folders {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let sender = match name.split_once('-') {
            Some((tag, _)) if tag.len() == 8 => tag.to_string(),
            _ => String::new(),
        };
        let n = per_sender.entry(sender).or_default();
        let (rank, old) = (*n, now.duration_since(*used).unwrap_or_default() > max_age);
        *n += 1;
        if (old || rank >= keep) && !in_use.contains(path) {
            tracing::info!(workspace = %path.display(), "removing a conversation's workspace no longer used");
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// The task's folder below `root`: readable, safe, and its own (the journal row is in it).
pub fn path(root: &Path, task_id: &str, row: i64) -> PathBuf {
    let safe = crate::fsio::safe_word(task_id, '_', 48);
    root.join(format!("{safe}-{row}"))
}

/// Makes `dir` an empty private folder, removing whatever an earlier run left there.
pub fn fresh(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    make_private_dir(dir)
}

pub fn make_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

/// A file name from a mail made safe to create: no folders, no control characters, not
/// hidden, at most 100 characters.
pub fn safe_file_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = base
        .chars()
        .filter(|c| !c.is_control())
        .map(|c| if c == ':' { '_' } else { c })
        .take(100)
        .collect();
    let cleaned = cleaned.trim().trim_start_matches('.').to_string();
    if cleaned.is_empty() {
        "attachment".to_string()
    } else {
        cleaned
    }
}

/// `name`, or `name-2`, `name-3`, ... (before the extension) when taken.
pub fn unique_name(name: &str, taken: &mut HashSet<String>) -> String {
    let (stem, ext) = match name.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() => (s.to_string(), format!(".{e}")),
        _ => (name.to_string(), String::new()),
    };
    let mut candidate = name.to_string();
    let mut n = 2;
    while !taken.insert(candidate.clone()) {
        candidate = format!("{stem}-{n}{ext}");
        n += 1;
    }
    candidate
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One turn in `ws`: its folder prepared, then the turn finished.
    fn turn(ws: &Workspace, in_use: &InUse) {
        ws.prepare().unwrap();
        ws.finish(in_use);
    }

    /// Another sender's (eve's) conversations, more than are kept, one turn each.
    fn many_of_eves(root: &Path, in_use: &InUse) {
        for n in 0..CONVERSATIONS_KEPT + 5 {
            let conversation = format!("eve\nkey-{n}");
            turn(&Workspace::of(root, "t", 2, Some(&conversation)), in_use);
        }
    }

    #[test]
    fn attachment_names_are_safe_and_distinct() {
        assert_eq!(safe_file_name("../../etc/passwd"), "passwd");
        assert_eq!(safe_file_name("C:\\temp\\x.txt"), "x.txt");
        assert_eq!(safe_file_name(".bashrc"), "bashrc");
        assert_eq!(safe_file_name("\u{0}\n"), "attachment");
        let mut taken = HashSet::new();
        assert_eq!(unique_name("a.txt", &mut taken), "a.txt");
        assert_eq!(unique_name("a.txt", &mut taken), "a-2.txt");
        assert_eq!(unique_name("a.txt", &mut taken), "a-3.txt");
        assert_eq!(unique_name("README", &mut taken), "README");
        assert_eq!(unique_name("README", &mut taken), "README-2");
    }

    #[test]
    fn a_conversation_keeps_its_folder_and_old_ones_are_pruned() {
        let root = tempfile::tempdir().unwrap();
        let first = Workspace::of(root.path(), "t1", 1, Some("boss\nkey-1"));
        let second = Workspace::of(root.path(), "t2", 2, Some("boss\nkey-1"));
        let other = Workspace::of(root.path(), "t3", 3, Some("eve\nkey-1"));
        assert_eq!(first.dir, second.dir, "one folder per conversation");
        assert_ne!(first.dir, other.dir, "another sender's is another");
        assert_ne!(first.attachments, second.attachments);
        first.prepare().unwrap();
        std::fs::write(first.dir.join("notes.md"), "turn 1").unwrap();
        let none = InUse::default();
        first.finish(&none);
        second.prepare().unwrap();
        assert!(
            first.dir.join("notes.md").exists(),
            "kept for the next turn"
        );
        second.finish(&none);
        // Pruned: a sender's least recently used beyond the count, and the old.
        turn(&other, &none);
        let newer = Workspace::of(root.path(), "t5", 5, Some("boss\nkey-2"));
        turn(&newer, &none);
        let all = root.path().join("conversations");
        prune(&all, CONVERSATION_MAX_AGE, 1, &HashSet::new());
        assert!(newer.dir.exists() && other.dir.exists() && !first.dir.exists());
        prune(&all, Duration::ZERO, 10, &HashSet::new());
        assert!(!other.dir.exists() && !newer.dir.exists());
        // A task outside a conversation: its own folder, removed after.
        let lone = Workspace::of(root.path(), "t4", 4, None);
        turn(&lone, &none);
        assert!(!lone.dir.exists());
    }

    /// Issue 31: another sender's many conversations made the prune remove the folder of a
    /// conversation whose task was running in it.
    #[test]
    fn a_conversation_in_use_is_never_pruned() {
        let root = tempfile::tempdir().unwrap();
        let in_use = InUse::default();
        let running = Workspace::of(root.path(), "t1", 1, Some("boss\nbusy"));
        running.prepare().unwrap();
        let holding = in_use.hold(&running).expect("a conversation is held");
        let twice = in_use.hold(&running);
        many_of_eves(root.path(), &in_use);
        assert!(running.dir.exists(), "in use");
        let prune_all = || {
            let conversations = root.path().join("conversations");
            prune(&conversations, Duration::ZERO, 1, &in_use.now())
        };
        drop(holding);
        prune_all();
        assert!(running.dir.exists(), "still held by its second task");
        drop(twice);
        prune_all();
        assert!(!running.dir.exists());
        assert!(in_use
            .hold(&Workspace::of(root.path(), "t9", 9, None))
            .is_none());
    }

    /// Issue 31: the hundred conversations kept were counted per agent, so one sender's many
    /// Session-Keys pushed out everyone else's. They are counted per sender, and a folder an
    /// older build made (no sender tag) moves to its new name at the conversation's next turn.
    #[test]
    fn conversations_are_counted_per_sender_and_old_folders_carry_over() {
        let root = tempfile::tempdir().unwrap();
        let none = InUse::default();
        let boss = Workspace::of(root.path(), "t1", 1, Some("boss\nmine"));
        boss.prepare().unwrap();
        std::fs::write(boss.dir.join("notes.md"), "mine").unwrap();
        boss.finish(&none);
        many_of_eves(root.path(), &none);
        assert!(
            boss.dir.join("notes.md").exists(),
            "another sender's do not count"
        );
        let eve = std::fs::read_dir(root.path().join("conversations"))
            .unwrap()
            .count()
            - 1;
        assert_eq!(eve, CONVERSATIONS_KEPT);
        // A folder of an older build, named without the tag: its next turn finds it.
        let later = Workspace::of(root.path(), "t3", 3, Some("carol\nold"));
        let legacy = later.legacy.clone().unwrap();
        make_private_dir(&legacy).unwrap();
        std::fs::write(legacy.join("session.json"), "{}").unwrap();
        later.prepare().unwrap();
        assert!(later.dir.join("session.json").exists() && !legacy.exists());
    }

    #[test]
    fn workspaces_are_safe_distinct_and_fresh() {
        let root = tempfile::tempdir().unwrap();
        let a = path(root.path(), "../../etc/passwd", 1);
        assert!(a.starts_with(root.path()));
        assert!(!a.file_name().unwrap().to_string_lossy().contains(".."));
        assert_ne!(path(root.path(), "t", 1), path(root.path(), "t", 2));
        fresh(&a).unwrap();
        std::fs::write(a.join("left-over"), "x").unwrap();
        fresh(&a).unwrap();
        assert_eq!(std::fs::read_dir(&a).unwrap().count(), 0, "emptied");
    }
}
