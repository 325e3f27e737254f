//! The agent's file requests, confined to the task's workspace.

use super::*;

/// `path` resolved, and inside `root`; symlinks are followed before the check.
pub(super) fn confine(root: &Path, path: &Path, must_exist: bool) -> Result<PathBuf, String> {
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    let resolved = if must_exist {
        path.canonicalize()
            .map_err(|e| format!("{}: {e}", path.display()))?
    } else {
        let parent = path
            .parent()
            .ok_or_else(|| format!("{} has no parent folder", path.display()))?;
        let name = path
            .file_name()
            .ok_or_else(|| format!("{} names no file", path.display()))?;
        parent
            .canonicalize()
            .map_err(|e| format!("{}: {e}", parent.display()))?
            .join(name)
    };
    if resolved.starts_with(root) {
        Ok(resolved)
    } else {
        Err(format!(
            "{} is outside the task's workspace",
            path.display()
        ))
    }
}

pub(super) fn read_confined(root: &Path, req: &ReadTextFileRequest) -> Result<String, String> {
    let path = confine(root, &req.path, true)?;
    let size = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
    if size > MAX_READ {
        return Err(format!(
            "{} is {size} bytes; at most {MAX_READ} can be read",
            req.path.display()
        ));
    }
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", req.path.display()))?;
    let skip = req.line.map_or(0, |l| l.saturating_sub(1) as usize);
    Ok(match req.limit {
        None if skip == 0 => text,
        limit => text
            .lines()
            .skip(skip)
            .take(limit.map_or(usize::MAX, |l| l as usize))
            .collect::<Vec<_>>()
            .join("\n"),
    })
}

pub(super) fn write_confined(root: &Path, req: &WriteTextFileRequest) -> Result<(), String> {
    let path = confine(root, &req.path, false)?;
    if path.is_symlink() {
        return Err(format!("{} is a symbolic link", req.path.display()));
    }
    std::fs::write(&path, &req.content).map_err(|e| format!("{}: {e}", req.path.display()))
}
