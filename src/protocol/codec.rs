//! Value codecs used inside AAMP headers: base64url payloads, the dispatch context, suggested
//! options, and RFC 2047 encoded-words. Pure functions, no I/O.

use std::collections::BTreeMap;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;

const URL_SAFE_NO_PAD: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_encode_padding(false),
);
const LENIENT_URL: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);
const STANDARD: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// base64url without padding, as AAMP writes StructuredResult and pair rules.
pub fn b64url_encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes base64url or standard base64, with or without padding. Whitespace (left by header
/// folding) is ignored; the two alphabets are normalised to the URL-safe one first.
pub fn b64url_decode(text: &str) -> Option<Vec<u8>> {
    let cleaned: String = text
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            other => other,
        })
        .collect();
    LENIENT_URL.decode(cleaned.trim_end_matches('=')).ok()
}

/// base64url JSON, the form of `X-AAMP-StructuredResult` and `X-AAMP-Dispatch-Context-Rules`.
pub fn encode_json(value: &serde_json::Value) -> String {
    b64url_encode(value.to_string().as_bytes())
}

/// The inverse of [`encode_json`]; `None` for anything that is not base64 of UTF-8 JSON.
pub fn decode_json(text: &str) -> Option<serde_json::Value> {
    let bytes = b64url_decode(text)?;
    serde_json::from_slice(&bytes).ok()
}

fn valid_context_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `key=value; key=value` with lower-cased keys matching `^[a-z0-9_-]+$` and percent-encoded
/// values. Invalid keys and empty values are dropped. `None` when nothing is left.
pub fn encode_dispatch_context(context: &BTreeMap<String, String>) -> Option<String> {
    let parts: Vec<String> = context
        .iter()
        .filter_map(|(key, value)| {
            let key = key.trim().to_ascii_lowercase();
            (valid_context_key(&key) && !value.is_empty())
                .then(|| format!("{key}={}", encode_uri_component(value)))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Parses `X-AAMP-Dispatch-Context`, skipping entries without `=` or with invalid keys. A value
/// that is not valid percent-encoding is kept as it came.
pub fn parse_dispatch_context(text: &str) -> BTreeMap<String, String> {
    text.split(';')
        .filter_map(|entry| {
            let (key, value) = entry.trim().split_once('=')?;
            let key = key.trim();
            if !valid_context_key(key) {
                return None;
            }
            let value = value.trim();
            let decoded = percent_decode(value).unwrap_or_else(|| value.to_string());
            Some((key.to_string(), decoded))
        })
        .collect()
}

/// JavaScript's `encodeURIComponent`: everything but `A-Z a-z 0-9 - _ . ! ~ * ' ( )` is
/// percent-encoded as UTF-8.
pub fn encode_uri_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Strict percent-decoding to UTF-8; `None` on a bad escape or invalid UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Suggested options joined with `|`. A `|` inside an option would split it, so it becomes `/`;
/// options that are empty after trimming are dropped. Non-ASCII options become encoded-words one
/// by one, so the separators stay visible to every reader.
pub fn encode_options(options: &[String]) -> String {
    options
        .iter()
        .map(|o| clean_header_text(&o.replace('|', "/")).trim().to_string())
        .filter(|o| !o.is_empty())
        .map(|o| if o.is_ascii() { o } else { encode_word(&o) })
        .collect::<Vec<_>>()
        .join("|")
}

/// Splits `X-AAMP-SuggestedOptions` on `|`, decoding encoded-words in each option.
pub fn parse_options(text: &str) -> Vec<String> {
    text.split('|')
        .map(|o| decode_words(o.trim()).trim().to_string())
        .filter(|o| !o.is_empty())
        .collect()
}

/// Header text made safe to write: CR, LF and other control characters become spaces, so no
/// value can ever start a header of its own.
pub fn clean_header_text(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// One or more RFC 2047 `B` encoded-words for a non-ASCII value, each at most 75 characters,
/// split on character boundaries and separated by a space (folded by the renderer).
pub fn encode_word(text: &str) -> String {
    // "=?utf-8?B?" + "?=" is 12 characters; 75 - 12 = 63 base64 characters = 45 bytes at most.
    const MAX_BYTES: usize = 45;
    let mut words = Vec::new();
    let mut chunk = String::new();
    for c in text.chars() {
        if chunk.len() + c.len_utf8() > MAX_BYTES {
            words.push(std::mem::take(&mut chunk));
        }
        chunk.push(c);
    }
    if !chunk.is_empty() || words.is_empty() {
        words.push(chunk);
    }
    words
        .iter()
        .map(|w| {
            format!(
                "=?utf-8?B?{}?=",
                base64::engine::general_purpose::STANDARD.encode(w)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Decodes RFC 2047 encoded-words (`=?charset?B|Q?text?=`) anywhere in a header value. White
/// space between two adjacent encoded-words is dropped, as the RFC says. Words that do not
/// decode are left as they are. UTF-8, US-ASCII and ISO-8859-1 are decoded exactly; other
/// charsets are read as UTF-8 with replacement characters.
pub fn decode_words(text: &str) -> String {
    if !text.contains("=?") {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut pending_space = String::new();
    let mut last_was_word = false;
    while !rest.is_empty() {
        if let Some((decoded, used)) = decode_one_word(rest) {
            if !last_was_word {
                out.push_str(&pending_space);
            }
            pending_space.clear();
            out.push_str(&decoded);
            rest = &rest[used..];
            last_was_word = true;
            continue;
        }
        let c = rest.chars().next().expect("rest is not empty");
        if c.is_whitespace() {
            pending_space.push(c);
        } else {
            out.push_str(&pending_space);
            pending_space.clear();
            out.push(c);
            last_was_word = false;
        }
        rest = &rest[c.len_utf8()..];
    }
    out.push_str(&pending_space);
    out
}

fn decode_one_word(text: &str) -> Option<(String, usize)> {
    let body = text.strip_prefix("=?")?;
    let (charset, body) = body.split_once('?')?;
    let (encoding, body) = body.split_once('?')?;
    let end = body.find("?=")?;
    let payload = &body[..end];
    if charset.is_empty() || payload.contains(char::is_whitespace) {
        return None;
    }
    let used = 2 + charset.len() + 1 + encoding.len() + 1 + end + 2;
    let bytes = match encoding {
        "B" | "b" => STANDARD.decode(payload).ok()?,
        "Q" | "q" => decode_q(payload)?,
        _ => return None,
    };
    // RFC 2231 allows a language after '*': "utf-8*en".
    let charset = charset.split('*').next().unwrap_or("").to_ascii_lowercase();
    let decoded = match charset.as_str() {
        "iso-8859-1" | "latin1" | "iso8859-1" => bytes.iter().map(|&b| b as char).collect(),
        _ => String::from_utf8_lossy(&bytes).into_owned(),
    };
    Some((decoded, used))
}

fn decode_q(payload: &str) -> Option<Vec<u8>> {
    let bytes = payload.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'_' => out.push(b' '),
            b'=' => {
                let hex = payload.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            other => out.push(other),
        }
        i += 1;
    }
    Some(out)
}

/// Joins folded header lines (CRLF or LF followed by white space) and trims the result.
pub fn unfold(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {}
            other => out.push(other),
        }
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_has_no_padding_and_decoder_accepts_both_alphabets() {
        let data = b"\xfb\xff\xfe subjects?";
        let encoded = b64url_encode(data);
        assert!(!encoded.contains('='));
        assert!(!encoded.contains('+') && !encoded.contains('/'));
        assert_eq!(b64url_decode(&encoded).unwrap(), data);
        let standard = base64::engine::general_purpose::STANDARD.encode(data);
        assert_eq!(b64url_decode(&standard).unwrap(), data);
        assert_eq!(b64url_decode("e30=").unwrap(), b"{}");
        assert_eq!(b64url_decode("e3\r\n 0").unwrap(), b"{}");
        assert!(b64url_decode("not base64!").is_none());
    }

    #[test]
    fn dispatch_context_follows_the_sdk_rules() {
        let mut ctx = BTreeMap::new();
        ctx.insert("Project_Key".to_string(), "proj 123".to_string());
        ctx.insert("source".to_string(), "feishu".to_string());
        ctx.insert("bad key".to_string(), "x".to_string());
        ctx.insert("empty".to_string(), String::new());
        let header = encode_dispatch_context(&ctx).unwrap();
        assert_eq!(header, "project_key=proj%20123; source=feishu");
        let parsed = parse_dispatch_context(&header);
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed["project_key"], "proj 123");
        let lenient = parse_dispatch_context("a=1;;noequals; BAD=2 ; b=%zz; c=%E2%9C%93");
        assert_eq!(lenient["a"], "1");
        assert_eq!(lenient["b"], "%zz");
        assert_eq!(lenient["c"], "✓");
        assert!(!lenient.contains_key("BAD"));
        assert!(encode_dispatch_context(&BTreeMap::new()).is_none());
    }

    #[test]
    fn uri_component_matches_javascript() {
        assert_eq!(encode_uri_component("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(encode_uri_component("-_.!~*'()"), "-_.!~*'()");
    }

    #[test]
    fn options_round_trip_including_non_ascii_and_pipes() {
        let options = vec![
            " PostgreSQL ".to_string(),
            "yes|no".to_string(),
            "数据库".to_string(),
            "  ".to_string(),
        ];
        let header = encode_options(&options);
        assert!(header.is_ascii());
        assert_eq!(
            parse_options(&header),
            vec!["PostgreSQL", "yes/no", "数据库"]
        );
        assert!(parse_options("").is_empty());
    }

    #[test]
    fn encoded_words_decode_in_both_encodings_and_charsets() {
        assert_eq!(decode_words("=?utf-8?B?w6lsw6k=?="), "élé");
        assert_eq!(
            decode_words("=?ISO-8859-1?Q?caf=E9_au_lait?="),
            "café au lait"
        );
        assert_eq!(decode_words("=?utf-8?q?a?= =?utf-8?q?b?= c"), "ab c");
        assert_eq!(decode_words("plain =?broken"), "plain =?broken");
        assert_eq!(decode_words("x =?utf-8?x?abc?= y"), "x =?utf-8?x?abc?= y");
        let long = "ü".repeat(100);
        let words = encode_word(&long);
        assert!(words.split(' ').all(|w| w.len() <= 75));
        assert_eq!(decode_words(&words), long);
    }

    #[test]
    fn header_text_cannot_inject_lines() {
        assert_eq!(clean_header_text("oops\r\nBcc: x@y\0"), "oops  Bcc: x@y ");
        assert_eq!(unfold("abc\r\n def\n\tghi "), "abc def\tghi");
    }
}
