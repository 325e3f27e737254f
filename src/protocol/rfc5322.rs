//! AAMP messages as RFC 5322 bytes: rendering an outgoing mail, and reading a raw mail into a
//! [`MailView`]. Pure code, no I/O.

use std::time::SystemTime;

use base64::Engine as _;

use super::codec::{clean_header_text, encode_word};
use super::message::{normalize_message_id, AampMessage, MailView};

/// Longest line we write before folding, and the hard limit of RFC 5322 (without CRLF).
const SOFT_LIMIT: usize = 78;
const HARD_LIMIT: usize = 998;

/// A mail ready to submit: the envelope addresses and the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedMail {
    pub from: String,
    pub to: Vec<String>,
    /// With angle brackets.
    pub message_id: String,
    pub bytes: Vec<u8>,
}

/// Renders `msg` as a text/plain mail. A message without a Message-ID gets a fresh one on the
/// sender's domain.
pub fn render(msg: &AampMessage, date: SystemTime) -> RenderedMail {
    render_with(msg, date, &[])
}

/// A file to attach to an outgoing mail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutgoingFile {
    pub filename: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// Renders `msg` with `files` attached (multipart/mixed); without files, as text/plain.
pub fn render_with(msg: &AampMessage, date: SystemTime, files: &[OutgoingFile]) -> RenderedMail {
    let env = &msg.envelope;
    let message_id = if env.message_id.is_empty() {
        let domain = env.from.rsplit_once('@').map_or("localhost", |(_, d)| d);
        format!("<{}@{}>", uuid::Uuid::new_v4(), clean_header_text(domain))
    } else {
        normalize_message_id(&env.message_id)
    };
    let subject = if env.subject.is_empty() {
        msg.subject()
    } else {
        env.subject.clone()
    };
    let mut out = String::new();
    write_header(&mut out, "Message-ID", &message_id);
    write_header(&mut out, "Date", &rfc5322_date(date));
    write_header(&mut out, "From", &env.from);
    write_header(&mut out, "To", &env.to.join(", "));
    write_text_header(&mut out, "Subject", &subject);
    if let Some(id) = &env.in_reply_to {
        write_header(&mut out, "In-Reply-To", id);
    }
    if !env.references.is_empty() {
        write_header(&mut out, "References", &env.references.join(" "));
    }
    if msg.intent().is_reply() {
        // RFC 3834: an automatic answer, so other automatons do not answer it in turn.
        write_header(&mut out, "Auto-Submitted", "auto-replied");
    }
    write_header(&mut out, "MIME-Version", "1.0");
    for (name, value) in msg.headers() {
        write_text_header(&mut out, name, &value);
    }
    let body = normalize_newlines(&msg.body_text());
    if files.is_empty() {
        write_text_part(&mut out, &body);
    } else {
        let boundary = format!("aamp-{}", uuid::Uuid::new_v4().simple());
        write_header(
            &mut out,
            "Content-Type",
            &format!("multipart/mixed; boundary=\"{boundary}\""),
        );
        out.push_str("\r\n");
        out.push_str(&format!("--{boundary}\r\n"));
        write_text_part(&mut out, &body);
        for file in files {
            out.push_str(&format!("--{boundary}\r\n"));
            let name = clean_header_text(&file.filename).replace(['"', '\\'], "_");
            let name = if name.is_ascii() {
                format!("\"{name}\"")
            } else {
                format!("\"{}\"", encode_word(&name))
            };
            let content_type = clean_header_text(&file.content_type);
            write_header(
                &mut out,
                "Content-Type",
                &format!("{content_type}; name={name}"),
            );
            write_header(
                &mut out,
                "Content-Disposition",
                &format!("attachment; filename={name}"),
            );
            write_header(&mut out, "Content-Transfer-Encoding", "base64");
            out.push_str("\r\n");
            write_base64(&mut out, &file.bytes);
        }
        out.push_str(&format!("--{boundary}--\r\n"));
    }
    RenderedMail {
        from: env.from.clone(),
        to: env.to.clone(),
        message_id,
        bytes: out.into_bytes(),
    }
}

/// The text/plain part: 7bit when it is short-lined ASCII, base64 otherwise.
fn write_text_part(out: &mut String, body: &str) {
    let seven_bit = body.is_ascii() && body.split("\r\n").all(|l| l.len() <= HARD_LIMIT);
    write_header(out, "Content-Type", "text/plain; charset=utf-8");
    if seven_bit {
        write_header(out, "Content-Transfer-Encoding", "7bit");
        out.push_str("\r\n");
        out.push_str(body);
        if !out.ends_with("\r\n") {
            out.push_str("\r\n");
        }
    } else {
        write_header(out, "Content-Transfer-Encoding", "base64");
        out.push_str("\r\n");
        write_base64(out, body.as_bytes());
    }
}

fn write_base64(out: &mut String, bytes: &[u8]) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    for chunk in encoded.as_bytes().chunks(76) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push_str("\r\n");
    }
}

/// A structured or ASCII field: control characters removed, folded at spaces.
fn write_header(out: &mut String, name: &str, value: &str) {
    fold_into(out, name, &clean_header_text(value));
}

/// A free-text field: plain when ASCII, RFC 2047 encoded-words otherwise. ASCII values
/// (TaskIds, base64url payloads) are not written as encoded-words, since a reader that does
/// not decode them would lose the value; except one holding `=?`, which a reader that does
/// decode would take for an encoded-word and change (a fuzzer found it).
fn write_text_header(out: &mut String, name: &str, value: &str) {
    let value = clean_header_text(value);
    if value.is_ascii() && !value.contains("=?") {
        // AAMP fields stay on one line up to the hard limit: some readers (the Node SDK) keep
        // the fold's CRLF inside the value.
        let aamp = name.len() > 7 && name[..7].eq_ignore_ascii_case("X-AAMP-");
        fold_at(
            out,
            name,
            &value,
            if aamp { HARD_LIMIT - 8 } else { SOFT_LIMIT },
        );
    } else {
        fold_into(out, name, &encode_word(&value));
    }
}

/// Writes `Name: value` folded at spaces so lines stay near 78 characters. The value is cut
/// into segments of spaces followed by a word, and a fold (CRLF) only goes before a segment,
/// so unfolding gives back the value exactly, runs of spaces included. A segment longer than
/// the hard limit of 998 (a long token, or a long run of spaces from hostile input) is broken
/// inside; base64 readers skip that folding white space, and TaskIds are kept far shorter.
/// Every step of the loop consumes input, so any value ends, and no line passes the limit.
fn fold_into(out: &mut String, name: &str, value: &str) {
    fold_at(out, name, value, SOFT_LIMIT);
}

/// [`fold_into`], folding where a line would pass `soft`.
fn fold_at(out: &mut String, name: &str, value: &str, soft: usize) {
    const MAX: usize = HARD_LIMIT - 8;
    let mut line = format!("{name}:");
    let head = line.len();
    let mut segment = String::new();
    for (i, word) in value.trim().split(' ').enumerate() {
        segment.push(' ');
        if word.is_empty() && i > 0 {
            continue; // one more space of a run; it stays with the word that follows
        }
        segment.push_str(word);
        if line.len() > head && line.len() + segment.len() > soft {
            out.push_str(&line);
            out.push_str("\r\n");
            line.clear();
        }
        line.push_str(&segment);
        segment.clear();
        while line.len() > MAX {
            let mut cut = MAX;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            out.push_str(&line[..cut]);
            out.push_str("\r\n");
            line = format!(" {}", &line[cut..]);
        }
    }
    out.push_str(&line);
    out.push_str("\r\n");
}

fn normalize_newlines(text: &str) -> String {
    text.replace("\r\n", "\n")
        .replace('\r', "\n")
        .replace('\n', "\r\n")
}

/// `Sun, 29 Nov 2026 10:02:18 +0000`.
pub fn rfc5322_date(time: SystemTime) -> String {
    super::time::timestamp(time)
        .strftime("%a, %d %b %Y %H:%M:%S +0000")
        .to_string()
}

/// Reads a raw RFC 5322 mail. `None` only when the bytes hold no header at all.
pub fn parse_raw(bytes: &[u8]) -> Option<MailView> {
    let message = mail_parser::MessageParser::default().parse(bytes)?;
    let addresses = |list: Option<&mail_parser::Address>| -> Vec<String> {
        list.map(|a| {
            a.iter()
                .filter_map(|addr| addr.address().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
    };
    let headers: Vec<(String, String)> = message
        .headers_raw()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    if headers.is_empty() {
        return None;
    }
    Some(MailView {
        from: addresses(message.from())
            .into_iter()
            .next()
            .unwrap_or_default(),
        to: addresses(message.to()),
        message_id: message
            .message_id()
            .map(normalize_message_id)
            .unwrap_or_default(),
        subject: message.subject().unwrap_or_default().to_string(),
        // The line break that ends the last line belongs to the message format, not the text.
        body_text: message
            .body_text(0)
            .map(|b| {
                let b = b.replace("\r\n", "\n");
                b.strip_suffix('\n').map(str::to_string).unwrap_or(b)
            })
            .unwrap_or_default(),
        headers,
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn aamp_fields_in_ascii_stay_on_one_line() {
        let reason = "the agent failed: ".to_string() + &"word ".repeat(120);
        let mut out = String::new();
        write_text_header(&mut out, "X-AAMP-ErrorMsg", &reason);
        assert_eq!(out.matches("\r\n").count(), 1, "{out}");
        let mut out = String::new();
        write_text_header(&mut out, "Subject", &reason);
        assert!(
            out.matches("\r\n").count() > 1,
            "other fields still fold: {out}"
        );
    }

    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn dates_are_rfc5322() {
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_795_946_538);
        assert_eq!(rfc5322_date(t), "Sun, 29 Nov 2026 10:02:18 +0000");
        assert_eq!(rfc5322_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 +0000");
        let leap_day = UNIX_EPOCH + std::time::Duration::from_secs(951_825_599);
        assert_eq!(rfc5322_date(leap_day), "Tue, 29 Feb 2000 11:59:59 +0000");
    }

    #[test]
    fn long_tokens_fold_only_past_the_hard_limit() {
        let mut out = String::new();
        let token = "A".repeat(500);
        fold_into(&mut out, "X-AAMP-StructuredResult", &token);
        assert_eq!(
            out.matches("\r\n").count(),
            1,
            "a 500-char token stays on one line"
        );
        let mut out = String::new();
        let token = "B".repeat(3000);
        fold_into(&mut out, "X-AAMP-StructuredResult", &token);
        assert!(out.split("\r\n").all(|l| l.len() <= HARD_LIMIT));
        let joined: String = out.split("\r\n").map(str::trim).collect();
        assert_eq!(joined, format!("X-AAMP-StructuredResult: {token}"));
    }

    #[test]
    fn folding_keeps_runs_of_spaces() {
        let value = format!("{}  two  spaces {}", "a".repeat(70), "b".repeat(70));
        let mut out = String::new();
        fold_into(&mut out, "X-AAMP-TaskId", &value);
        assert!(out.lines().count() > 1, "{out}");
        let unfolded = out.trim_end().replace("\r\n", "");
        assert_eq!(unfolded, format!("X-AAMP-TaskId: {value}"));
    }

    /// The review's reproduction: a dispatch whose References holds a run of ~980 blanks.
    /// Rendering any reply to it (an ack, or the rejection an unknown sender gets) used to
    /// underflow in `fold_into`: a panic in debug builds, a spinning worker in release builds.
    #[test]
    fn a_reply_to_hostile_references_renders_and_stays_within_the_limit() {
        let raw = format!(
            "From: a@x.test\r\nTo: b@x.test\r\nMessage-ID: <m1@x.test>\r\nReferences: <a{}b@x.test> <c@x.test>\r\nX-AAMP-Intent: task.dispatch\r\nX-AAMP-TaskId: t1\r\n\r\nbody\r\n",
            " ".repeat(980)
        );
        assert!(raw.lines().any(|l| l.len() >= 994));
        let view = parse_raw(raw.as_bytes()).expect("a mail");
        let msg = AampMessage::parse(&view).expect("a dispatch");
        let reply = AampMessage::reply(&msg.envelope, "b@x.test", super::super::Body::Ack);
        let mail = render(&reply, UNIX_EPOCH);
        let text = String::from_utf8(mail.bytes).unwrap();
        assert!(text.split("\r\n").all(|l| l.len() <= HARD_LIMIT), "{text}");
        // Folding stays exact for whatever survives as a header value.
        for value in [
            "x".to_string(),
            format!("a{}b", " ".repeat(2000)),
            format!("{} tail", "w".repeat(1500)),
        ] {
            let mut out = String::new();
            fold_into(&mut out, "X-AAMP-TaskId", &value);
            assert!(out.split("\r\n").all(|l| l.len() <= HARD_LIMIT), "{out}");
        }
    }

    #[test]
    fn text_headers_fold_at_spaces() {
        let mut out = String::new();
        let text = "word ".repeat(40);
        fold_into(&mut out, "Subject", text.trim());
        assert!(out.split("\r\n").all(|l| l.len() <= SOFT_LIMIT));
        assert!(out.lines().count() > 1);
    }
}
