//! One `Received:` field read by its grammar (RFC 5321 §4.4, RFC 5322 §3.6.7), never by
//! searching for words in it. Pure code.
//!
//! ```text
//! Received: from HELO (RDNS [IP]) (Authenticated sender: LOGIN) by HOST (Postfix)
//!           with ESMTPA id 42F9D99E6B2 for <agent@example.test>; Mon, 30 Nov 2026 …
//! ```
//!
//! A client chooses some of this text: its HELO name (the `from` value, and Postfix copies it
//! as sent, `with`, `(Authenticated` and all), often the reverse-DNS name, and the `for`
//! address (a quoted local part may hold spaces, parentheses and keywords). So the value is
//! first cut into RFC 5322 tokens (comments, quoted strings, angle addresses and domain
//! literals are each one token, whatever they hold), then read as clauses in their order:
//! `from` takes exactly one token, whatever it spells; `by` one token; then `via`, `with`,
//! `id`, `for` and registered extra clauses (Exim's `tls CIPHER`), each once; `;` ends the
//! clauses and the date follows. What does not fit is an error, never a guess: a caller that
//! needs the field (the receiving server's own) then believes nothing.
//!
//! Invariants: the verdict (`with` protocol, the authenticated login) comes only from text
//! after the `from` clause's single token; a word that is inside a comment, a quoted string or
//! an angle address is never a keyword; unbalanced brackets of any kind are errors.

/// The clauses of one Received field. Values keep their spelling; keywords are matched
/// without regard to case.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Received {
    /// The client's name for itself (its HELO/EHLO argument, as the server recorded it).
    pub from: Option<String>,
    /// The server that wrote the field.
    pub by: Option<String>,
    pub via: Option<String>,
    /// The protocol (`ESMTPA`, `LMTP`, ...), lower-cased: the `with` clause's first word.
    pub with: Option<String>,
    pub id: Option<String>,
    pub for_: Option<String>,
    /// Top-level comments, trimmed, each with the clause it follows (`"from"` for the ones
    /// between the `from` value and `by`, as Postfix writes the client's address and login).
    pub comments: Vec<(&'static str, String)>,
}

/// Why a field was not understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReceivedError {
    #[error("an unclosed {0}")]
    Unclosed(&'static str),
    #[error("a stray '{0}'")]
    Stray(char),
    #[error("no ';' before the date")]
    NoDate,
    #[error("no clauses before the date")]
    Empty,
    #[error("'{0}' where a clause keyword should be")]
    NotAKeyword(String),
    #[error("'{0}' has no value")]
    NoValue(String),
    #[error("'{0}' appears twice")]
    Repeated(String),
    #[error("'{0}' is out of order")]
    OutOfOrder(String),
    #[error("more than one token after 'from'")]
    LongFrom,
}

impl Received {
    /// The `Authenticated sender:` login the server recorded in a comment (Postfix's
    /// `smtpd_sasl_authenticated_header`), lower-cased. `Err` when more than one comment
    /// claims a login, or the claim is not one address: a field like that is not believed.
    pub fn authenticated_sender(&self) -> Result<Option<String>, &'static str> {
        let claims: Vec<&str> = self
            .comments
            .iter()
            .filter_map(|(_, c)| {
                let lower = c.to_ascii_lowercase();
                lower
                    .starts_with("authenticated sender:")
                    .then(|| c["authenticated sender:".len()..].trim())
            })
            .collect();
        match claims.as_slice() {
            [] => Ok(None),
            [login] => {
                let login = login.trim_matches(['<', '>']);
                if login.is_empty() || login.contains(char::is_whitespace) {
                    Err("its Authenticated sender comment is not one address")
                } else {
                    Ok(Some(login.to_ascii_lowercase()))
                }
            }
            _ => Err("it has more than one Authenticated sender comment"),
        }
    }

    /// The protocol is SMTP of some kind (`SMTP`, `ESMTP`, `ESMTPSA`, `UTF8SMTPA`, ...,
    /// RFC 3848 and RFC 6531), as a server records mail that entered over SMTP.
    pub fn is_smtp(&self) -> bool {
        self.with.as_deref().is_some_and(|p| {
            let p = p.strip_prefix("utf8").unwrap_or(p);
            p.starts_with("smtp") || p.starts_with("esmtp")
        })
    }

    /// The protocol is an authenticated one (RFC 3848: `ESMTPA`, `ESMTPSA`, `UTF8SMTPA`, ...).
    pub fn is_authenticated(&self) -> bool {
        self.is_smtp() && self.with.as_deref().is_some_and(|p| p.ends_with('a'))
    }

    /// A delivery hop inside the receiving server (Cyrus, Dovecot: `LMTP`, `LMTPA`, ...).
    pub fn is_lmtp(&self) -> bool {
        self.with.as_deref().is_some_and(|p| p.starts_with("lmtp"))
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    /// A quoted string, an angle address or a domain literal: one value, never a keyword.
    Opaque(String),
    Comment(String),
    Semicolon,
}

/// The characters of a field value, as the lexer reads them.
type Chars<'a> = std::iter::Peekable<std::str::Chars<'a>>;

/// Cuts an unfolded field value into tokens, up to the first top-level `;` (the date after it
/// is not read). `Ok((tokens, saw_semicolon))`.
fn lex(value: &str) -> Result<(Vec<Token>, bool), ReceivedError> {
    let mut tokens = Vec::new();
    let mut chars = value.chars().peekable();
    while let Some(&c) = chars.peek() {
        let token = match c {
            c if c.is_whitespace() => {
                chars.next();
                continue;
            }
            // The `from` value is the client's HELO name, copied as sent (Postfix): one run
            // without white space, whatever it holds (`(Authenticated`, `x)`, `;`). For every
            // valid name (a domain or an address literal) that is the token.
            _ if matches!(tokens.as_slice(), [Token::Word(w)] if w.eq_ignore_ascii_case("from")) => {
                Token::Opaque(run(&mut chars, char::is_whitespace))
            }
            ';' => {
                tokens.push(Token::Semicolon);
                return Ok((tokens, true));
            }
            ')' | '>' | ']' | '\\' => return Err(ReceivedError::Stray(c)),
            '(' | '"' | '<' | '[' => {
                chars.next();
                match c {
                    '(' => Token::Comment(comment(&mut chars)?),
                    '"' => Token::Opaque(format!("\"{}\"", quoted(&mut chars)?)),
                    '<' => Token::Opaque(angle_address(&mut chars)?),
                    _ => Token::Opaque(domain_literal(&mut chars)?),
                }
            }
            _ => Token::Word(run(&mut chars, |c| {
                c.is_whitespace() || "();\"<>[]\\".contains(c)
            })),
        };
        tokens.push(token);
    }
    Ok((tokens, false))
}

/// The characters up to the first that `ends` (not taken).
fn run(chars: &mut Chars<'_>, ends: impl Fn(char) -> bool) -> String {
    let mut text = String::new();
    while let Some(&c) = chars.peek() {
        if ends(c) {
            break;
        }
        text.push(c);
        chars.next();
    }
    text
}

/// The rest of a comment whose opening `(` was read (nested ones kept whole), trimmed.
fn comment(chars: &mut Chars<'_>) -> Result<String, ReceivedError> {
    let mut depth = 1usize;
    let mut text = String::new();
    loop {
        match chars.next() {
            None => return Err(ReceivedError::Unclosed("comment")),
            Some('\\') => match chars.next() {
                Some(e) => text.push(e),
                None => return Err(ReceivedError::Unclosed("comment")),
            },
            Some('(') => {
                depth += 1;
                text.push('(');
            }
            Some(')') => {
                depth -= 1;
                if depth == 0 {
                    return Ok(text.trim().to_string());
                }
                text.push(')');
            }
            Some(other) => text.push(other),
        }
    }
}

/// The rest of an angle address whose `<` was read, with its brackets.
fn angle_address(chars: &mut Chars<'_>) -> Result<String, ReceivedError> {
    let mut text = String::from("<");
    loop {
        match chars.next() {
            None => return Err(ReceivedError::Unclosed("angle address")),
            Some('"') => {
                let q = quoted(chars)?;
                text.push('"');
                text.push_str(&q);
                text.push('"');
            }
            Some('>') => break,
            Some('<') => return Err(ReceivedError::Stray('<')),
            Some(other) => text.push(other),
        }
    }
    text.push('>');
    Ok(text)
}

/// The rest of a domain literal whose `[` was read, with its brackets.
fn domain_literal(chars: &mut Chars<'_>) -> Result<String, ReceivedError> {
    let mut text = String::from("[");
    loop {
        match chars.next() {
            None => return Err(ReceivedError::Unclosed("domain literal")),
            Some(']') => break,
            Some(c @ ('[' | '\\')) => return Err(ReceivedError::Stray(c)),
            Some(other) => text.push(other),
        }
    }
    text.push(']');
    Ok(text)
}

/// The rest of a quoted string whose opening `"` was read.
fn quoted(chars: &mut Chars<'_>) -> Result<String, ReceivedError> {
    let mut text = String::new();
    loop {
        match chars.next() {
            None => return Err(ReceivedError::Unclosed("quoted string")),
            Some('\\') => match chars.next() {
                Some(e) => {
                    text.push('\\');
                    text.push(e);
                }
                None => return Err(ReceivedError::Unclosed("quoted string")),
            },
            Some('"') => return Ok(text),
            Some(other) => text.push(other),
        }
    }
}

const KEYWORDS: [&str; 6] = ["from", "by", "via", "with", "id", "for"];

/// Reads one Received field value (folded or not).
pub fn parse(value: &str) -> Result<Received, ReceivedError> {
    let (tokens, dated) = lex(value)?;
    if !dated {
        return Err(ReceivedError::NoDate);
    }
    let mut out = Received::default();
    // The clause in progress (None before the first), and whether `by` has been read: the
    // words a server may add after a clause's value (M365's `with Microsoft SMTP Server`,
    // Exim's `tls CIPHER`) are taken only past `by`, where the client writes nothing but the
    // `for` address, which is one token.
    let mut clause: Option<&'static str> = None;
    let mut past_by = false;
    let mut seen: Vec<&'static str> = Vec::new();
    let mut iter = tokens.into_iter().peekable();
    while let Some(token) = iter.next() {
        let word = match token {
            Token::Semicolon => break,
            Token::Comment(text) => {
                out.comments.push((clause.unwrap_or(""), text));
                continue;
            }
            Token::Opaque(_) if past_by => continue,
            Token::Opaque(text) => return Err(ReceivedError::NotAKeyword(text)),
            Token::Word(word) => word,
        };
        let lower = word.to_ascii_lowercase();
        let Some(keyword) = KEYWORDS.iter().copied().find(|k| *k == lower) else {
            if past_by {
                continue; // an extra word of the clause in progress
            }
            return Err(match clause {
                Some("from") => ReceivedError::LongFrom,
                _ => ReceivedError::NotAKeyword(word),
            });
        };
        if seen.contains(&keyword) {
            return Err(ReceivedError::Repeated(keyword.into()));
        }
        let in_order = match keyword {
            "from" => seen.is_empty(),
            "by" => seen.iter().all(|k| *k == "from"),
            // RFC 5321 orders via, with, id, for; servers (M365: `id … via Frontend
            // Transport`) do not always, and past `by` all of it is the server's own text.
            _ => past_by,
        };
        if !in_order {
            return Err(ReceivedError::OutOfOrder(keyword.into()));
        }
        // The value: the next token that is not a comment, whatever it spells (`from with`
        // names a client that said EHLO with).
        let value = loop {
            match iter.next() {
                Some(Token::Comment(text)) => out.comments.push((keyword, text)),
                Some(Token::Word(v)) | Some(Token::Opaque(v)) => break v,
                Some(Token::Semicolon) | None => {
                    return Err(ReceivedError::NoValue(keyword.into()))
                }
            }
        };
        seen.push(keyword);
        clause = Some(keyword);
        let slot = match keyword {
            "from" => &mut out.from,
            "by" => {
                past_by = true;
                &mut out.by
            }
            "via" => &mut out.via,
            "with" => {
                out.with = Some(value.to_ascii_lowercase());
                continue;
            }
            "id" => &mut out.id,
            _ => &mut out.for_,
        };
        *slot = Some(value);
    }
    if seen.is_empty() {
        return Err(ReceivedError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postfix_with_a_helo_of_with_is_read_by_position() {
        let r = parse("from with (localhost [127.0.0.1]) by localhost (Postfix) with ESMTP id 42F9D99E6B2 for <agent@example.test>; Mon, 30 Nov 2026 12:00:00 +0000 (UTC)").unwrap();
        assert_eq!(r.from.as_deref(), Some("with"));
        assert_eq!(r.by.as_deref(), Some("localhost"));
        assert_eq!(r.with.as_deref(), Some("esmtp"));
        assert_eq!(r.id.as_deref(), Some("42F9D99E6B2"));
        assert_eq!(r.for_.as_deref(), Some("<agent@example.test>"));
        assert_eq!(
            r.comments,
            vec![
                ("from", "localhost [127.0.0.1]".to_string()),
                ("by", "Postfix".to_string())
            ]
        );
        assert!(r.is_smtp() && !r.is_authenticated());
    }

    #[test]
    fn the_from_value_is_one_run_without_white_space_whatever_it_holds() {
        for helo in [
            "(Authenticated",
            "x)",
            ";",
            "\"",
            "<",
            "[",
            "with",
            "a(b)c",
            "\\",
        ] {
            let r = parse(&format!(
                "from {helo} (localhost [127.0.0.1]) by localhost (Postfix) with ESMTPA id 1; d"
            ))
            .unwrap();
            assert_eq!(r.from.as_deref(), Some(helo));
            assert_eq!(r.with.as_deref(), Some("esmtpa"), "{helo}");
        }
    }

    #[test]
    fn words_inside_comments_quotes_and_addresses_are_never_keywords() {
        let r = parse("from client (using TLSv1.3 with cipher X) by mx (Stalwart SMTP) with ESMTPS id 1 for <\"a with ESMTPA (Authenticated sender: boss@x)\"@example.test>; Mon, 30 Nov 2026").unwrap();
        assert_eq!(r.with.as_deref(), Some("esmtps"));
        assert_eq!(r.authenticated_sender(), Ok(None));
    }

    #[test]
    fn what_does_not_fit_the_grammar_is_an_error() {
        for (value, err) in [
            ("from a (Authenticated (localhost [127.0.0.1]) by localhost (Postfix) with ESMTP id 1; d", ReceivedError::Unclosed("comment")),
            ("from x (localhost [127.0.0.1])) by localhost with ESMTP id 1; d", ReceivedError::Stray(')')),
            ("from a b by localhost with ESMTP; d", ReceivedError::LongFrom),
            ("from a by localhost with ESMTP", ReceivedError::NoDate),
            ("by localhost from a with ESMTP; d", ReceivedError::OutOfOrder("from".into())),
            ("from a with ESMTP by b; d", ReceivedError::OutOfOrder("with".into())),
            ("from a by b with ESMTP with ESMTPA; d", ReceivedError::Repeated("with".into())),
            ("from a by b with; d", ReceivedError::NoValue("with".into())),
            ("; d", ReceivedError::Empty),
            ("x from a; d", ReceivedError::NotAKeyword("x".into())),
            ("from a by b for <x; d", ReceivedError::Unclosed("angle address")),
        ] {
            assert_eq!(parse(value), Err(err), "{value}");
        }
    }
}
