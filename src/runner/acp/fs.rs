//! The agent's file requests, confined to the task's workspace, in a way an agent cannot turn
//! against the bridge: a file is opened without following a link at its last step and without
//! blocking (a FIFO or a device never stalls a thread in `open`), then checked as opened: a
//! regular file, with no other name (a hard link made inside the workspace to a file outside
//! it has two), still inside the workspace after the open (what `/proc/self/fd` says it is,
//! so a folder swapped for a link between the check and the open is caught), and of a bounded
//! size. The caller runs these off the runtime ([`tokio::task::spawn_blocking`]) under a
//! deadline.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;

use super::*;

/// How long one file request may take before the agent is told it failed.
pub(super) const FILE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

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
        Err(outside(path))
    }
}

/// Refuses, before anything else (before a person is asked about it), a path that is not
/// absolute or, read as written (`..` taken away), is not inside `root`. Links are checked
/// when the file is opened.
pub(super) fn precheck(root: &Path, path: &Path) -> Result<(), String> {
    use std::path::Component;
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    let mut plain = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                plain.pop();
            }
            Component::CurDir => {}
            other => plain.push(other),
        }
    }
    if plain.starts_with(root) {
        Ok(())
    } else {
        Err(outside(path))
    }
}

fn outside(path: &Path) -> String {
    format!("{} is outside the task's workspace", path.display())
}

/// Opens `resolved` (already confined) without following a last link and without blocking,
/// and checks what was opened.
fn open_checked(
    root: &Path,
    asked: &Path,
    resolved: &Path,
    options: &mut OpenOptions,
) -> Result<File, String> {
    use crate::fsio::Unsafe;
    crate::fsio::open_inside(root, resolved, options).map_err(|e| match e {
        Unsafe::Link => format!("{} is a symbolic link", asked.display()),
        Unsafe::NotRegular => format!(
            "{} is not a regular file (a folder, FIFO, socket or device)",
            asked.display()
        ),
        Unsafe::HardLinked(n) => format!(
            "{} has {n} names (hard links), and another may be outside the task's workspace",
            asked.display()
        ),
        Unsafe::Outside => outside(asked),
        Unsafe::Io(e) => format!("{}: {e}", asked.display()),
    })
}

/// `fs/read_text_file`: at most [`MAX_READ`] bytes of a regular file inside `root`.
pub(super) fn read_confined(root: &Path, req: &ReadTextFileRequest) -> Result<String, String> {
    let path = confine(root, &req.path, true)?;
    let file = open_checked(root, &req.path, &path, OpenOptions::new().read(true))?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if size > MAX_READ {
        return Err(format!(
            "{} is {size} bytes; at most {MAX_READ} can be read",
            req.path.display()
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // A file that grows while it is read is still cut at the cap.
    file.take(MAX_READ + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", req.path.display()))?;
    if bytes.len() as u64 > MAX_READ {
        return Err(format!(
            "{} grew past {MAX_READ} bytes while it was read",
            req.path.display()
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{} is not UTF-8 text", req.path.display()))?;
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

/// `fs/write_text_file`: a regular file inside `root`, made or replaced; never a link, a
/// FIFO, a device, or a file with another name.
pub(super) fn write_confined(root: &Path, req: &WriteTextFileRequest) -> Result<(), String> {
    let path = confine(root, &req.path, false)?;
    let mut file = open_checked(
        root,
        &req.path,
        &path,
        OpenOptions::new().write(true).create(true).mode(0o644),
    )?;
    file.set_len(0)
        .and_then(|()| file.write_all(req.content.as_bytes()))
        .map_err(|e| format!("{}: {e}", req.path.display()))
}

/// Runs a file request off the runtime, answered within [`FILE_DEADLINE`] whatever the file
/// system does.
pub(super) async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    match tokio::time::timeout(FILE_DEADLINE, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(format!("the file request failed: {e}")),
        Err(_) => Err(format!(
            "the file request took longer than {}s",
            FILE_DEADLINE.as_secs()
        )),
    }
}
