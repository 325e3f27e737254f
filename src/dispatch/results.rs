//! What a result carries beyond text: structured fields (`X-AAMP-StructuredResult`) and
//! files, read from the agent's **final answer only** (never from the prompt the bridge
//! wrote), and files gathered from the task's own workspace and nowhere else.
//!
//! An answer hands things back in one of three ways (the reference bridges' conventions):
//! - a line `AAMP_RESULT_JSON:` followed by one JSON object (on the same line, on the next
//!   lines, or in a ```` ``` ```` fence) with `output`, `structuredResult` (an array of
//!   `{fieldKey, fieldTypeKey, value, ...}`) and `attachments` (`[{path, filename?,
//!   contentType?}]`);
//! - lines `FILE: path`;
//! - the whole answer being such a JSON object.
//!
//! What remains (or the object's `output`) is the output text.

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

const MARKER: &str = "AAMP_RESULT_JSON:";

/// A file an answer names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRef {
    pub path: String,
    pub filename: Option<String>,
    pub content_type: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extracted {
    pub output: String,
    pub structured: Option<Value>,
    pub files: Vec<FileRef>,
}

fn as_object_result(value: &Value) -> Option<&serde_json::Map<String, Value>> {
    let obj = value.as_object()?;
    ["output", "structuredResult", "attachments"]
        .iter()
        .any(|k| obj.contains_key(*k))
        .then_some(obj)
}

fn file_refs(obj: &serde_json::Map<String, Value>) -> Vec<FileRef> {
    obj.get("attachments")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|a| match a {
                    Value::String(path) => Some(FileRef {
                        path: path.clone(),
                        filename: None,
                        content_type: None,
                    }),
                    Value::Object(o) => Some(FileRef {
                        path: o.get("path")?.as_str()?.to_string(),
                        filename: o
                            .get("filename")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                        content_type: o
                            .get("contentType")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                    }),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The first JSON value in `text` (after white space and an optional fence), and how many
/// bytes of `text` it took (fence included).
fn leading_json(text: &str) -> Option<(Value, usize)> {
    let start = text.len() - text.trim_start().len();
    let rest = &text[start..];
    if let Some(fenced) = rest.strip_prefix("```") {
        let body_start = fenced.find('\n')? + 1;
        let body = &fenced[body_start..];
        let end = body.find("```")?;
        let value: Value = serde_json::from_str(body[..end].trim()).ok()?;
        return Some((value, start + 3 + body_start + end + 3));
    }
    if !rest.starts_with('{') {
        return None;
    }
    let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
    let value = stream.next()?.ok()?;
    Some((value, start + stream.byte_offset()))
}

/// Reads an agent's final answer.
pub fn extract(answer: &str) -> Extracted {
    let trimmed = answer.trim();
    if let Ok(value) = serde_json::from_str::<Value>(trimmed) {
        if let Some(obj) = as_object_result(&value) {
            return Extracted {
                output: obj
                    .get("output")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                structured: obj
                    .get("structuredResult")
                    .cloned()
                    .filter(|v| !v.is_null()),
                files: file_refs(obj),
            };
        }
    }
    let mut text = answer.to_string();
    let mut structured = None;
    let mut files = Vec::new();
    let mut json_output = None;
    if let Some(at) = find_marker(&text) {
        let after = at + MARKER.len();
        if let Some((value, used)) = leading_json(&text[after..]) {
            if let Some(obj) = as_object_result(&value) {
                structured = obj
                    .get("structuredResult")
                    .cloned()
                    .filter(|v| !v.is_null());
                files.extend(file_refs(obj));
                json_output = obj
                    .get("output")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                text.replace_range(at..after + used, "");
            }
        }
    }
    let mut kept = Vec::new();
    for line in text.lines() {
        match line.trim_start().strip_prefix("FILE:") {
            Some(path) if !path.trim().is_empty() => files.push(FileRef {
                path: path.trim().to_string(),
                filename: None,
                content_type: None,
            }),
            _ => kept.push(line),
        }
    }
    let rest = kept.join("\n").trim().to_string();
    Extracted {
        output: match json_output {
            Some(out) if rest.is_empty() => out,
            Some(out) => format!("{rest}\n\n{out}"),
            None => rest,
        },
        structured,
        files,
    }
}

/// Where the marker starts a line (after white space).
fn find_marker(text: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let lead = line.len() - line.trim_start().len();
        if line[lead..].starts_with(MARKER) {
            return Some(offset + lead);
        }
        offset += line.len();
    }
    None
}

/// A file read from the workspace, ready to attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    pub filename: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// Limits on what a result attaches.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    pub per_file: u64,
    pub total: u64,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            per_file: 10 << 20,
            total: 20 << 20,
        }
    }
}

/// Why a file was not opened, in the words of the result's "Files not attached" list.
fn unsafe_why(e: crate::fsio::Unsafe) -> String {
    use crate::fsio::Unsafe;
    match e {
        Unsafe::Link => "a symbolic link".into(),
        Unsafe::NotRegular => "not a regular file (a folder, FIFO, socket or device)".into(),
        Unsafe::HardLinked(n) => {
            format!("has {n} names (hard links), and another may be outside the task's workspace")
        }
        Unsafe::Outside => {
            "outside the task's workspace (only files the agent made there are sent)".into()
        }
        Unsafe::Io(e) => e.to_string(),
    }
}

/// Reads the named files from `workspace` (relative paths are taken from it; a path that
/// resolves, symbolic links followed, outside it is refused). Returns the files and, for
/// each one not attached, `path: why`.
pub fn gather(workspace: &Path, refs: &[FileRef], caps: Caps) -> (Vec<Attached>, Vec<String>) {
    let root = match workspace.canonicalize() {
        Ok(root) => root,
        Err(e) => {
            return (
                Vec::new(),
                refs.iter()
                    .map(|r| format!("{}: the workspace is gone ({e})", r.path))
                    .collect(),
            )
        }
    };
    let mut gathering = Gathering {
        root,
        caps,
        seen: HashSet::new(),
        names: HashSet::new(),
        total: 0,
    };
    let (mut attached, mut refused) = (Vec::new(), Vec::new());
    for r in refs {
        match gathering.take(r) {
            Ok(Some(file)) => attached.push(file),
            Ok(None) => {}
            Err(why) => refused.push(format!("{}: {why}", r.path)),
        }
    }
    (attached, refused)
}

/// What [`gather`] has taken so far from the workspace at `root`.
struct Gathering {
    root: PathBuf,
    caps: Caps,
    /// The files read, by their resolved paths: a file named twice is attached once.
    seen: HashSet<PathBuf>,
    /// The attachments' names.
    names: HashSet<String>,
    /// The bytes read.
    total: u64,
}

const OUTSIDE: &str = "outside the task's workspace (only files the agent made there are sent)";

impl Gathering {
    /// The file `r` names, read and named; `None` when it is attached already; `Err` says
    /// why it is not.
    fn take(&mut self, r: &FileRef) -> Result<Option<Attached>, String> {
        let resolved = self.resolve(&r.path)?;
        if !self.seen.insert(resolved.clone()) {
            return Ok(None);
        }
        let bytes = self.read(&resolved)?;
        self.total += bytes.len() as u64;
        let base = r.filename.clone().unwrap_or_else(|| {
            resolved
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "file".into())
        });
        let filename = super::workspace::unique_name(
            &super::workspace::safe_file_name(&base),
            &mut self.names,
        );
        let content_type = stated_or_guessed(r.content_type.clone(), &filename, &bytes);
        Ok(Some(Attached {
            filename,
            content_type,
            bytes,
        }))
    }

    /// `path` as the file it names, links followed, when that is inside the workspace.
    fn resolve(&self, path: &str) -> Result<PathBuf, String> {
        let given = Path::new(path.trim());
        let joined = lexical(&if given.is_absolute() {
            given.to_path_buf()
        } else {
            self.root.join(given)
        });
        // Outside by its very words (`..`, an absolute path elsewhere): refused before
        // anything is looked up there.
        if !joined.starts_with(&self.root) {
            return Err(OUTSIDE.into());
        }
        let resolved = joined.canonicalize().map_err(|_| "not found".to_string())?;
        if !resolved.starts_with(&self.root) {
            return Err(OUTSIDE.into());
        }
        Ok(resolved)
    }

    /// The bytes of the file at `resolved`, within the caps.
    fn read(&self, resolved: &Path) -> Result<Vec<u8>, String> {
        // Opened as the agent's own file reads are: no link followed, no blocking on a FIFO
        // or a device, one name only (a hard link the agent made in its workspace to the
        // bridge's password would be mailed to the sender), and checked as opened.
        let file = crate::fsio::open_inside(&self.root, resolved, OpenOptions::new().read(true))
            .map_err(unsafe_why)?;
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        within_caps(len, self.total, self.caps)?;
        let mut bytes = Vec::with_capacity(len as usize);
        // No more than was checked, should the file grow meanwhile.
        file.take(self.caps.per_file.min(self.caps.total - self.total))
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?;
        Ok(bytes)
    }
}

/// A file of `size` bytes may be added to `total` bytes already attached.
fn within_caps(size: u64, total: u64, caps: Caps) -> Result<(), String> {
    if size > caps.per_file {
        return Err(format!(
            "{size} bytes, more than the {} a file may have",
            caps.per_file
        ));
    }
    if total + size > caps.total {
        return Err(format!(
            "the result's files would pass {} bytes in all",
            caps.total
        ));
    }
    Ok(())
}

/// The content type the agent gave when it looks like one, else one from the name or bytes.
fn stated_or_guessed(stated: Option<String>, filename: &str, bytes: &[u8]) -> String {
    stated
        .filter(|t| t.contains('/') && !t.chars().any(|c| c.is_control()))
        .unwrap_or_else(|| content_type(filename, bytes))
}

/// `path` with `.` and `..` taken out by their words alone (no link is followed).
fn lexical(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Adds a file the agent sent itself (not from the disk), under the same caps and with a
/// name of its own.
pub fn attach_inline(
    files: &mut Vec<Attached>,
    refused: &mut Vec<String>,
    name: &str,
    content_type: Option<String>,
    bytes: Vec<u8>,
    caps: Caps,
) {
    let total: u64 = files.iter().map(|f| f.bytes.len() as u64).sum();
    if let Err(why) = within_caps(bytes.len() as u64, total, caps) {
        refused.push(format!("{name}: {why}"));
        return;
    }
    let mut taken: HashSet<String> = files.iter().map(|f| f.filename.clone()).collect();
    let filename =
        super::workspace::unique_name(&super::workspace::safe_file_name(name), &mut taken);
    let content_type = stated_or_guessed(content_type, &filename, &bytes);
    files.push(Attached {
        filename,
        content_type,
        bytes,
    });
}

/// A content type from the file name, else from the content (text or not).
pub fn content_type(name: &str, bytes: &[u8]) -> String {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let known = match ext.as_str() {
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "diff" | "patch" => "text/x-diff",
        "rs" | "py" | "js" | "ts" | "go" | "c" | "h" | "java" | "sh" => "text/plain",
        _ => "",
    };
    if !known.is_empty() {
        return known.to_string();
    }
    if std::str::from_utf8(bytes).is_ok() && !bytes.contains(&0) {
        "text/plain".into()
    } else {
        "application/octet-stream".into()
    }
}

/// Fills `attachmentFilenames` of file-typed fields (`fieldTypeKey` naming an attachment or
/// a file) with what was really attached, where the agent left it out.
pub fn fill_attachment_names(structured: &mut Value, attached: &[Attached]) {
    let Some(fields) = structured.as_array_mut() else {
        return;
    };
    let names: Vec<Value> = attached
        .iter()
        .map(|a| Value::String(a.filename.clone()))
        .collect();
    for field in fields.iter_mut().filter_map(Value::as_object_mut) {
        let kind = field
            .get("fieldTypeKey")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_ascii_lowercase();
        let has_names = field
            .get("attachmentFilenames")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if (kind.contains("attachment") || kind.contains("file")) && !has_names {
            field.insert("attachmentFilenames".into(), Value::Array(names.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_marked_block_gives_fields_files_and_the_text() {
        let answer = "Done, see the report.\n\nAAMP_RESULT_JSON:\n```json\n{\"output\": \"Report ready\", \"structuredResult\": [{\"fieldKey\": \"summary\", \"fieldTypeKey\": \"text\", \"value\": \"ok\"}], \"attachments\": [{\"path\": \"out/report.md\", \"filename\": \"report.md\"}]}\n```\nFILE: data.csv\n";
        let e = extract(answer);
        assert_eq!(e.output, "Done, see the report.\n\nReport ready");
        assert_eq!(e.structured.unwrap()[0]["value"], "ok");
        assert_eq!(
            e.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            vec!["out/report.md", "data.csv"]
        );
        let bare = extract("AAMP_RESULT_JSON: {\"output\": \"x\", \"structuredResult\": []}\ntail");
        assert_eq!(bare.output, "tail\n\nx");
        assert_eq!(bare.structured, Some(json!([])));
    }

    #[test]
    fn a_whole_json_answer_and_plain_text() {
        let e = extract("{\"output\": \"hi\", \"attachments\": [\"a.txt\"]}");
        assert_eq!(e.output, "hi");
        assert_eq!(e.files[0].path, "a.txt");
        let plain = extract("{\"some\": \"json the agent was asked for\"}");
        assert_eq!(plain.output, "{\"some\": \"json the agent was asked for\"}");
        assert!(plain.structured.is_none() && plain.files.is_empty());
    }

    #[test]
    fn echoed_instructions_give_no_structured_result() {
        let echoed = "To return fields, end your answer with a line AAMP_RESULT_JSON: followed by one JSON object.\nAAMP_RESULT_JSON: followed by one JSON object with \"output\"";
        let e = extract(echoed);
        assert!(e.structured.is_none());
        assert!(e.files.is_empty());
        assert_eq!(e.output, echoed);
    }

    #[test]
    fn files_come_only_from_the_workspace_and_never_through_a_hard_link_or_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("out")).unwrap();
        std::fs::write(ws.join("out/report.md"), "# r").unwrap();
        std::fs::write(ws.join("big.bin"), vec![0u8; 2000]).unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), ws.join("link")).unwrap();
        // What an agent with a shell of its own can make: a second name inside the workspace
        // for a file outside it (the bridge's password), and a FIFO that would block a read.
        std::fs::hard_link(dir.path().join("secret"), ws.join("hard")).unwrap();
        let fifo = std::process::Command::new("mkfifo")
            .arg(ws.join("fifo"))
            .status()
            .unwrap();
        assert!(fifo.success());
        let refs: Vec<FileRef> = [
            "hard",
            "fifo",
            "out/report.md",
            "../secret",
            "/etc/passwd",
            "link",
            "missing",
            "out",
            "big.bin",
            "out/../out/report.md",
        ]
        .iter()
        .map(|p| FileRef {
            path: p.to_string(),
            filename: None,
            content_type: None,
        })
        .collect();
        let (files, refused) = gather(
            &ws,
            &refs,
            Caps {
                per_file: 1000,
                total: 5000,
            },
        );
        assert_eq!(files.len(), 1, "{refused:?}");
        assert_eq!(files[0].filename, "report.md");
        assert_eq!(files[0].content_type, "text/markdown");
        let said = refused.join("\n");
        for needle in [
            "../secret: outside",
            "/etc/passwd: outside",
            "link: outside",
            "missing: not found",
            "out: not a regular file",
            "fifo: not a regular file",
            "hard: has 2 names",
            "big.bin: 2000 bytes",
        ] {
            assert!(said.contains(needle), "{needle}: {said}");
        }
    }

    #[test]
    fn file_fields_get_the_attached_names() {
        let mut s = json!([
            {"fieldKey": "report", "fieldTypeKey": "attachment", "value": ""},
            {"fieldKey": "summary", "fieldTypeKey": "text", "value": "ok"},
            {"fieldKey": "files", "fieldTypeKey": "multi_file", "attachmentFilenames": ["kept.txt"]}
        ]);
        let attached = vec![Attached {
            filename: "report.md".into(),
            content_type: "text/markdown".into(),
            bytes: vec![],
        }];
        fill_attachment_names(&mut s, &attached);
        assert_eq!(s[0]["attachmentFilenames"], json!(["report.md"]));
        assert!(s[1].get("attachmentFilenames").is_none());
        assert_eq!(s[2]["attachmentFilenames"], json!(["kept.txt"]));
    }
}
