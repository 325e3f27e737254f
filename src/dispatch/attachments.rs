//! A task's workspace made ready before it asks for a slot: the folder made, and the mail's
//! attachments downloaded into it under safe and distinct names (downloads never hold a slot).

use std::collections::HashSet;

use super::prompt;
use super::workspace::{make_private_dir, safe_file_name, unique_name, Workspace};
use super::{Engine, Task};
use crate::backend::Backend;
use crate::inbound::Attachment;
use crate::runner::RunError;
use tokio_util::sync::CancellationToken;

/// The largest attachment a task takes.
const MAX_ATTACHMENT: u64 = 25 << 20;
/// The most attachments a task takes; the prompt names the rest as left out.
const MAX_ATTACHMENTS: usize = 32;
/// Attachments downloaded at once.
const DOWNLOADS_AT_ONCE: usize = 4;

/// A task's workspace made ready: the attachments saved in it, and those left out.
#[derive(Clone, Default)]
pub(super) struct Prepared {
    pub files: Vec<prompt::File>,
    pub left_out: Vec<prompt::File>,
}

impl<B: Backend> Engine<B> {
    /// Step 1: makes the task's workspace ready and downloads the mail's attachments into its
    /// attachment folder, under safe and distinct names: at most [`MAX_ATTACHMENTS`] of them
    /// (the rest are named in the prompt as left out), [`DOWNLOADS_AT_ONCE`] at a time. On an
    /// error a task's own workspace is gone again; `None` when the task is cancelled first.
    /// The workspace is made ready before the task asks for a slot: downloads never hold one.
    pub(super) async fn make_ready(
        &self,
        task: &Task,
        workspace: &Workspace,
        cancel: &CancellationToken,
    ) -> Option<Result<Prepared, RunError>> {
        let ready = async {
            workspace.prepare()?;
            let saved = save_attachments(self.backend(), workspace, &task.extras.attachments).await;
            if saved.is_err() {
                self.finish_workspace(workspace);
            }
            saved
        };
        tokio::select! {
            p = ready => Some(p),
            _ = cancel.cancelled() => None,
        }
    }
}

async fn save_attachments<B: Backend>(
    backend: &B,
    workspace: &Workspace,
    attachments: &[Attachment],
) -> Result<Prepared, RunError> {
    if attachments.is_empty() {
        return Ok(Prepared::default());
    }
    let dir = workspace.dir.join(&workspace.attachments);
    make_private_dir(&dir)?;
    let (taken, left) = attachments.split_at(attachments.len().min(MAX_ATTACHMENTS));
    let mut files = Vec::new();
    let mut names = HashSet::new();
    // DOWNLOADS_AT_ONCE at a time, saved in the mail's order.
    for chunk in taken.chunks(DOWNLOADS_AT_ONCE) {
        let downloaded =
            futures::future::join_all(chunk.iter().map(|a| download_one(backend, a))).await;
        for (attachment, bytes) in chunk.iter().zip(downloaded) {
            let bytes = bytes?;
            let name = unique_name(&safe_file_name(&attachment.name), &mut names);
            std::fs::write(dir.join(&name), &bytes)?;
            files.push(prompt::File {
                path: format!("{}/{name}", workspace.attachments),
                content_type: attachment.content_type.clone(),
                size: bytes.len() as u64,
            });
        }
    }
    let left_out = left
        .iter()
        .map(|a| prompt::File {
            path: a.name.clone(),
            content_type: a.content_type.clone(),
            size: a.size,
        })
        .collect();
    Ok(Prepared { files, left_out })
}

async fn download_one<B: Backend>(
    backend: &B,
    attachment: &Attachment,
) -> Result<Vec<u8>, RunError> {
    backend
        .download(attachment, MAX_ATTACHMENT)
        .await
        .map_err(|e| {
            RunError::Prepare(format!(
                "could not download the attachment {:?}: {e}",
                attachment.name
            ))
        })
}
