//! Task workspaces: one private folder per admitted task, made empty before every run (so a
//! task run again after a crash never sees the first run's leftovers), and safe names for
//! the files a mail brings.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The task's folder below `root`: readable, safe, and its own (the journal row is in it).
pub fn path(root: &Path, task_id: &str, row: i64) -> PathBuf {
    let safe: String = task_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
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
