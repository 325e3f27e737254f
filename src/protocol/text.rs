//! Reading the text of a mail: the `<id>`s of its threading headers, and the labelled
//! sections the SDKs write into bodies (`Question:`, `Output:`, `Suggested options:`).

/// The longest message id kept from a mail; longer ones are not ids anyone sends.
const MAX_MESSAGE_ID: usize = 250;

/// Every `<...>` id in an In-Reply-To or References value. A msg-id holds no white space:
/// any inside the brackets is removed, and empty or over-long ids are dropped, so a hostile
/// value cannot make the replies' threading headers huge.
pub(super) fn message_ids(text: &str) -> Vec<String> {
    let ids: Vec<String> = text
        .split('<')
        .skip(1)
        .filter_map(|part| part.split_once('>').map(|(id, _)| id))
        .map(|id| id.split_whitespace().collect::<String>())
        .filter(|id| !id.is_empty() && id.len() <= MAX_MESSAGE_ID)
        .map(|id| format!("<{id}>"))
        .collect();
    if ids.is_empty() && !text.trim().is_empty() {
        text.split_whitespace()
            .filter(|id| id.len() <= MAX_MESSAGE_ID)
            .map(normalize_message_id)
            .collect()
    } else {
        ids
    }
}

/// The line index and the rest of the first line whose trimmed start is `marker`.
pub(super) fn marker_line<'a>(body: &'a str, marker: &str) -> Option<(usize, &'a str)> {
    body.lines().enumerate().find_map(|(i, line)| {
        let rest = strip_prefix_ci(line.trim_start(), marker);
        (rest.len() != line.trim_start().len()).then_some((i, rest))
    })
}

/// The text after `marker` (rest of its line and the lines below), up to the first line that
/// starts with one of `stops`; trimmed. `None` when the marker is absent.
pub(super) fn section(body: &str, marker: &str, stops: &[&str]) -> Option<String> {
    let (index, first) = marker_line(body, marker)?;
    let mut lines = vec![first];
    for line in body.lines().skip(index + 1) {
        let start = line.trim_start();
        let starts_with = |s: &&str| {
            start
                .get(..s.len())
                .is_some_and(|h| h.eq_ignore_ascii_case(s))
        };
        if stops.iter().any(starts_with) {
            break;
        }
        lines.push(line);
    }
    Some(lines.join("\n").trim().to_string())
}

pub(super) fn first_line_after(body: &str, marker: &str) -> Option<String> {
    marker_line(body, marker)
        .map(|(_, rest)| rest.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// `  1. X`, `- X`, `* X` or `X` → `X`; blank lines → `None`.
pub(super) fn strip_list_marker(line: &str) -> Option<String> {
    let line = line.trim();
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    let rest = if digits > 0 && matches!(line.as_bytes().get(digits), Some(b'.') | Some(b')')) {
        &line[digits + 1..]
    } else if let Some(rest) = line.strip_prefix("- ").or_else(|| line.strip_prefix("* ")) {
        rest
    } else {
        line
    };
    let rest = rest.trim();
    (!rest.is_empty()).then(|| rest.to_string())
}

/// A Message-ID with exactly one pair of angle brackets (empty stays empty).
pub fn normalize_message_id(id: &str) -> String {
    let id = id
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .trim();
    if id.is_empty() {
        String::new()
    } else {
        format!("<{id}>")
    }
}

pub(super) fn strip_prefix_ci<'a>(text: &'a str, prefix: &str) -> &'a str {
    match text.get(..prefix.len()) {
        Some(head) if head.eq_ignore_ascii_case(prefix) => &text[prefix.len()..],
        _ => text,
    }
}
