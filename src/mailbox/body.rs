//! Reading an HTTP answer's body with its cap counted while it is read, on every back-end
//! (issue 43 item 2): a server's `Content-Length`, a row's `size_hint` or nothing at all says
//! how long a body is, and none of them is believed. Before, a 30 MB ASMTP envelope whose hint
//! understated it cost 313 MB of memory, and a 150 MB AMP message 461 MB before it was refused.
//!
//! Two readers: [`read_capped`] keeps the bytes up to a cap and stops at the first byte over
//! it; [`read_json_skimmed`] reads a JSON list of messages keeping each string up to the
//! message cap: a longer one is emptied and only counted as it goes by, so the message it
//! belongs to is still read whole otherwise (its id, sender, date) and can be answered
//! `rejected` with its size, while the messages beside it are read as usual.

use serde_json::Value;

use super::MailboxError;

/// The most bytes of one answer read whole where no message cap applies (a JMAP `Email/get`
/// of 16 mails is bounded near 16 MiB by the server's own body limit).
pub const MAX_ANSWER: usize = 32 << 20;

/// How much of an error answer's body is read: its start is all a person is shown.
const ERROR_BODY: usize = 64 << 10;

/// The field a skimmed list's item gets when one of its strings was cut: the bytes seen of
/// it. Any such field the server sent is removed first, so it is never the server's word.
pub const OVERSIZED: &str = "aamp_bridge_oversized";

/// Reads `response`'s body up to `cap` bytes: more is an `Oversized` error as soon as the
/// first byte over it arrives (the rest is never read). `done` is asked after each chunk
/// whether what was read is enough (an event stream whose answer is in).
pub async fn read_capped(
    response: &mut reqwest::Response,
    url: &str,
    cap: usize,
    mut done: impl FnMut(&[u8]) -> bool,
) -> Result<Vec<u8>, MailboxError> {
    // Never sized by the server's Content-Length: a lie would be an allocation.
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(MailboxError::network(url.to_string()))?
    {
        let seen = body.len().saturating_add(chunk.len());
        if seen > cap {
            return Err(oversized(format!("the answer of {url}"), seen as u64, cap));
        }
        body.extend_from_slice(&chunk);
        if done(&body) {
            break;
        }
    }
    Ok(body)
}

/// An `Oversized` error: `what` was seen to be at least `at_least` bytes, over `cap`.
pub fn oversized(what: String, at_least: u64, cap: usize) -> MailboxError {
    MailboxError::Oversized {
        what,
        at_least,
        limit: cap as u64,
    }
}

/// A status other than 2xx as an `Http` error carrying the start of the body (at most
/// [`ERROR_BODY`] of it is read); the response itself otherwise.
pub async fn success(
    mut response: reqwest::Response,
    url: &str,
) -> Result<reqwest::Response, MailboxError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let mut start = Vec::new();
    // A broken or endless error body costs nothing more than its start.
    while let Ok(Some(chunk)) = response.chunk().await {
        start.extend_from_slice(&chunk);
        if start.len() >= ERROR_BODY {
            break;
        }
    }
    Err(MailboxError::Http {
        url: url.to_string(),
        status: status.as_u16(),
        body: String::from_utf8_lossy(&start)
            .chars()
            .take(200)
            .collect::<String>()
            .trim()
            .to_string(),
    })
}

/// How much a skimmed answer may keep, and read.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The longest string kept (a message's cap): a longer one is emptied and counted.
    pub string: usize,
    /// The most bytes of the whole answer kept; more is an `Oversized` error.
    pub kept: usize,
    /// The most bytes read, kept or not: a server that never ends its answer is cut there.
    pub read: u64,
}

impl Limits {
    /// For a list of messages of at most `cap` bytes each: room for one message at its cap
    /// twice (AMP sends a body and its HTML) and a page of small ones; reading goes on past
    /// a message over the cap up to 1 GiB (so a 150 MB one is named and sized), which costs
    /// time, not memory.
    pub fn messages(cap: u64) -> Limits {
        let string = usize::try_from(cap).unwrap_or(usize::MAX);
        Limits {
            string,
            kept: string.saturating_mul(2).saturating_add(8 << 20),
            read: cap.saturating_mul(64).max(1 << 30),
        }
    }
}

/// A string emptied because it was over the message cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Elided {
    /// Where it is, as a JSON pointer (`/envelopes/0/content_parts/0/text`).
    pub pointer: String,
    /// How many bytes of it (JSON-escaped) were seen.
    pub bytes: u64,
    /// Whether that is all of it: false when the answer was cut at `Limits::read` inside it.
    pub whole: bool,
}

/// A JSON answer read with [`Limits`]: the value and the strings emptied in it.
#[derive(Debug)]
pub struct Skimmed {
    pub value: Value,
    pub elided: Vec<Elided>,
}

impl Skimmed {
    /// The list at `pointer` (`""`: the answer itself), each item with a string emptied
    /// marked with [`OVERSIZED`] (the bytes seen of the first); a list that is not there is
    /// `Null`.
    pub fn list(&mut self, pointer: &str) -> Value {
        let Some(mut list) = self.value.pointer_mut(pointer).map(Value::take) else {
            return Value::Null;
        };
        if let Value::Array(items) = &mut list {
            for item in items.iter_mut() {
                if let Some(object) = item.as_object_mut() {
                    object.remove(OVERSIZED);
                }
            }
            for (index, bytes) in self.items_elided(pointer) {
                if let Some(object) = items.get_mut(index).and_then(Value::as_object_mut) {
                    // The first string emptied in an item is its body: what comes after
                    // it (AMP's `body_html`) repeats it.
                    if !object.contains_key(OVERSIZED) {
                        object.insert(OVERSIZED.into(), bytes.into());
                    }
                }
            }
        }
        list
    }

    /// The items of the list at `pointer` with a string emptied, and the bytes seen of it.
    pub fn items_elided(&self, pointer: &str) -> Vec<(usize, u64)> {
        self.elided
            .iter()
            .filter_map(|e| {
                let rest = e.pointer.strip_prefix(pointer)?.strip_prefix('/')?;
                let index = rest.split('/').next()?.parse().ok()?;
                Some((index, e.bytes))
            })
            .collect()
    }
}

/// Sends `request` (to `url`) and reads its JSON answer skimmed at the message cap `max`
/// (bytes): what a call whose answer carries messages' content reads.
pub async fn send_skimmed(
    request: reqwest::RequestBuilder,
    url: &str,
    max: u64,
) -> Result<Skimmed, MailboxError> {
    let response = request
        .send()
        .await
        .map_err(MailboxError::network(url.to_string()))?;
    read_json_skimmed(response, url, Limits::messages(max)).await
}

/// Reads a JSON answer under `limits` (see [`Skimmer`]); a status other than 2xx is an
/// `Http` error, a body that is not JSON a `Protocol` one.
pub async fn read_json_skimmed(
    response: reqwest::Response,
    url: &str,
    limits: Limits,
) -> Result<Skimmed, MailboxError> {
    let mut response = success(response, url).await?;
    let mut skimmer = Skimmer::new(limits);
    // One large string kept at a time in the whole process: two agents (or an agent's reads
    // and its answer's) reading large messages at once would hold the cap twice.
    static LARGE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    let mut turn = None;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(MailboxError::network(url.to_string()))?
    {
        if turn.is_none() && skimmer.big() {
            turn = LARGE.acquire().await.ok();
        }
        match skimmer.feed(&chunk) {
            Ok(Fed::More) => {}
            // The rest is not read: dropping the response closes its connection.
            Ok(Fed::Cut) => break,
            Err(Over::Kept(kept)) => {
                return Err(oversized(format!("the answer of {url}"), kept, limits.kept));
            }
            Err(Over::Read(read)) => {
                return Err(MailboxError::Oversized {
                    what: format!("the answer of {url}"),
                    at_least: read,
                    limit: limits.read,
                });
            }
        }
    }
    skimmer.finish().map_err(|e| MailboxError::Protocol {
        what: url.to_string(),
        detail: e.to_string(),
    })
}

/// Where the skimmer is in the document.
enum Frame {
    /// In a list, at its item `0`.
    Array(usize),
    /// In an object, at the value of `key` (or before a key, when `want_key`).
    Object { key: String, want_key: bool },
}

/// The string being read: where its text starts in the output, how long it is so far, and
/// whether it is over the cap (emptied, counted only).
struct Open {
    start: usize,
    len: usize,
    escape: bool,
    key: bool,
    eliding: bool,
    /// The string's bytes once it is past [`SPILL`].
    spill: Option<Vec<u8>>,
}

/// A string longer than this is kept in a buffer of its own (see [`Skimmer::keep`]).
const SPILL: usize = 1 << 20;

/// What [`Skimmer::feed`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Fed {
    More,
    /// `Limits::read` was reached inside an emptied string: the document is closed, read
    /// no more.
    Cut,
}

/// Why [`Skimmer::feed`] gave up on an answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Over {
    /// The bytes kept passed `Limits::kept`.
    Kept(u64),
    /// The bytes read passed `Limits::read` outside an emptied string.
    Read(u64),
}

/// Copies a JSON document as it arrives, keeping track of where it is (the containers and
/// keys it is in), so that a string over the cap can be cut and named. It checks only what
/// it needs to; the copy is parsed by serde_json, which finds any other fault.
pub struct Skimmer {
    limits: Limits,
    out: Vec<u8>,
    stack: Vec<Frame>,
    open: Option<Open>,
    elided: Vec<Elided>,
    read: u64,
    cut: bool,
}

impl Skimmer {
    pub fn new(limits: Limits) -> Skimmer {
        Skimmer {
            limits,
            out: Vec::new(),
            stack: Vec::new(),
            open: None,
            elided: Vec::new(),
            read: 0,
            cut: false,
        }
    }

    /// Takes the next bytes.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<Fed, Over> {
        if self.cut {
            return Ok(Fed::Cut);
        }
        let room = self.limits.read.saturating_sub(self.read);
        let over_read = chunk.len() as u64 > room;
        if over_read {
            chunk = &chunk[..room as usize];
        }
        self.read += chunk.len() as u64;
        while let Some((&byte, rest)) = chunk.split_first() {
            if self.open.is_some() {
                chunk = self.in_string(chunk);
            } else {
                self.structural(byte);
                chunk = rest;
            }
            if self.out.len() > self.limits.kept {
                return Err(Over::Kept(self.out.len() as u64));
            }
        }
        if !over_read {
            return Ok(Fed::More);
        }
        if self.open.as_ref().is_some_and(|o| o.eliding && !o.key) {
            self.cut_here();
            return Ok(Fed::Cut);
        }
        Err(Over::Read(self.read + 1))
    }

    /// Copies string bytes up to the next quote or backslash at once (a long string is read
    /// in runs, not byte by byte), or only counts them once the string is over the cap;
    /// what is left of `chunk`.
    fn in_string<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        let Some(open) = self.open.as_mut() else {
            return chunk;
        };
        if open.escape {
            open.escape = false;
            let byte = [chunk[0]];
            self.keep(&byte);
            return &chunk[1..];
        }
        let run = chunk
            .iter()
            .position(|&b| b == b'"' || b == b'\\')
            .unwrap_or(chunk.len());
        self.keep(&chunk[..run]);
        match chunk.get(run) {
            Some(b'\\') => {
                self.keep(b"\\");
                if let Some(open) = self.open.as_mut() {
                    open.escape = true;
                }
            }
            Some(_) => self.end_string(),
            None => return &[],
        }
        &chunk[run + 1..]
    }

    /// Keeps bytes of the open string, up to the cap: a string past [`SPILL`] moves to a
    /// buffer of its own, allocated once at the cap (no doubling copies) and given back
    /// whole when the string goes over the cap; past the cap it is only counted.
    fn keep(&mut self, bytes: &[u8]) {
        let Some(open) = self.open.as_mut() else {
            return;
        };
        open.len += bytes.len();
        if open.eliding {
            return;
        }
        if open.len > self.limits.string {
            open.eliding = true;
            open.spill = None;
            self.out.truncate(open.start);
            return;
        }
        if open.spill.is_none() && self.out.len() - open.start + bytes.len() > SPILL {
            let mut spill = Vec::with_capacity(self.limits.string.min(256 << 20));
            spill.extend_from_slice(&self.out[open.start..]);
            self.out.truncate(open.start);
            open.spill = Some(spill);
        }
        match open.spill.as_mut() {
            Some(spill) => spill.extend_from_slice(bytes),
            None => self.out.extend_from_slice(bytes),
        }
    }

    /// Whether a string past [`SPILL`] is being kept (the reader then waits its turn).
    pub fn big(&self) -> bool {
        self.open.as_ref().is_some_and(|o| o.spill.is_some())
    }

    fn end_string(&mut self) {
        let Some(open) = self.open.take() else { return };
        if let Some(spill) = &open.spill {
            self.out.extend_from_slice(spill);
        }
        if open.eliding {
            self.elided.push(Elided {
                pointer: self.pointer(),
                bytes: open.len as u64,
                whole: true,
            });
        }
        if open.key {
            let key = String::from_utf8_lossy(&self.out[open.start..]).into_owned();
            if let Some(Frame::Object { key: k, .. }) = self.stack.last_mut() {
                *k = key;
            }
        }
        self.out.push(b'"');
    }

    fn structural(&mut self, byte: u8) {
        match byte {
            b'"' => {
                let key = matches!(
                    self.stack.last(),
                    Some(Frame::Object { want_key: true, .. })
                );
                self.out.push(b'"');
                self.open = Some(Open {
                    start: self.out.len(),
                    len: 0,
                    escape: false,
                    key,
                    eliding: false,
                    spill: None,
                });
                return;
            }
            b'{' => self.stack.push(Frame::Object {
                key: String::new(),
                want_key: true,
            }),
            b'[' => self.stack.push(Frame::Array(0)),
            b'}' | b']' => {
                self.stack.pop();
            }
            b',' => match self.stack.last_mut() {
                Some(Frame::Array(index)) => *index += 1,
                Some(Frame::Object { want_key, .. }) => *want_key = true,
                None => {}
            },
            b':' => {
                if let Some(Frame::Object { want_key, .. }) = self.stack.last_mut() {
                    *want_key = false;
                }
            }
            // Whitespace between tokens is not kept.
            b' ' | b'\t' | b'\r' | b'\n' => return,
            _ => {}
        }
        self.out.push(byte);
    }

    /// Where the skimmer is, as a JSON pointer.
    fn pointer(&self) -> String {
        self.stack
            .iter()
            .map(|frame| match frame {
                Frame::Array(index) => format!("/{index}"),
                Frame::Object { key, .. } => {
                    format!("/{}", key.replace('~', "~0").replace('/', "~1"))
                }
            })
            .collect()
    }

    /// Ends the emptied string the reading stopped in, noting how much of it was seen, and
    /// closes every container it is in, so that what was read stays a JSON document.
    fn cut_here(&mut self) {
        let Some(open) = self.open.take() else { return };
        self.out.push(b'"');
        self.elided.push(Elided {
            pointer: self.pointer(),
            bytes: open.len as u64,
            whole: false,
        });
        for frame in self.stack.drain(..).rev() {
            self.out.push(match frame {
                Frame::Array(_) => b']',
                Frame::Object { .. } => b'}',
            });
        }
        self.cut = true;
    }

    /// The document read, and the strings emptied in it.
    pub fn finish(self) -> Result<Skimmed, serde_json::Error> {
        Ok(Skimmed {
            value: serde_json::from_slice(&self.out)?,
            elided: self.elided,
        })
    }
}

#[cfg(test)]
#[path = "body_tests.rs"]
pub(crate) mod tests;
