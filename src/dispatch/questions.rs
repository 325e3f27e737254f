//! Questions an agent asks its dispatcher (`task.help_needed`) as the [`Desk`](super::Desk)
//! keeps them: the mail's body with what hides in the text shown, and how a reply names its
//! question and an option.

use std::collections::HashMap;

use crate::protocol::HelpNeeded;
use crate::runner::{Answer, Question};

/// A question mailed to a dispatcher, waiting for the answer.
pub(super) struct PendingQuestion {
    /// The Message-ID of the help_needed mail, which a reply may name in In-Reply-To.
    pub help_message_id: String,
    /// The question as the agent put it (the live view shows it).
    pub text: String,
    pub options: Vec<String>,
    pub answer: tokio::sync::oneshot::Sender<Answer>,
    /// The journal row of the task that asked.
    pub task_row: i64,
}

/// The answer's own words: its lines up to the first quoted one (`>`), trimmed; `None` when
/// empty.
pub fn own_words(text: &str) -> Option<String> {
    let words: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim_start().starts_with('>'))
        .collect();
    let words = words.join("\n").trim().to_string();
    (!words.is_empty()).then_some(words)
}

/// Which option an answer names: a number (`2`), an option's name, or text containing one
/// (the longest match wins). The first line that is not empty or quoted (`>`) is the answer.
pub fn choose(options: &[String], text: &str) -> Option<usize> {
    let answer = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('>'))?;
    let answer = answer.trim_end_matches(['.', '!']);
    if let Ok(n) = answer.parse::<usize>() {
        return (1..=options.len()).contains(&n).then(|| n - 1);
    }
    if let Some(i) = options
        .iter()
        .position(|o| o.trim().eq_ignore_ascii_case(answer))
    {
        return Some(i);
    }
    let lower = answer.to_lowercase();
    options
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.trim().is_empty() && lower.contains(&o.trim().to_lowercase()))
        .max_by_key(|(_, o)| o.len())
        .map(|(i, _)| i)
}

/// Whether `c` changes how text reads without being seen: direction overrides, embeddings,
/// isolates and marks, zero-width and other format characters, fillers, variation and tag
/// selectors, and controls other than newline and tab (a carriage return can hide a line's
/// start on a terminal).
fn hidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{ad}' | '\u{61c}'
        | '\u{115f}' | '\u{1160}' | '\u{180e}' | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{3164}'
        | '\u{fe00}'..='\u{fe0f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}'
        | '\u{e0000}'..='\u{e007f}')
}

/// `text` with every [`hidden`] character shown as `<U+XXXX>`: what a person approves reads
/// as it is (a right-to-left override in a command would otherwise move where the command
/// seems to end, and reverse the words after it).
pub fn visible(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if hidden(c) {
            out.push_str(&format!("<U+{:04X}>", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// The `task.help_needed` body for a question: the agent's words, with what hides in them
/// shown ([`visible`]).
pub(super) fn help_needed(question: &Question) -> HelpNeeded {
    HelpNeeded {
        question: visible(&question.text),
        blocked_reason: visible(&question.reason),
        suggested_options: question.options.iter().map(|o| visible(o)).collect(),
    }
}

/// A question an agent asked and its dispatcher has not answered yet.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenQuestion {
    pub agent: String,
    pub from: String,
    pub task_id: String,
    pub question: String,
    pub options: Vec<String>,
}

/// The question waiting in `pending` that a mail from `from` replies to (by In-Reply-To or
/// References naming its mail): its task key and the asking task's journal row.
pub(super) fn replied_to(
    pending: &HashMap<String, PendingQuestion>,
    from: &str,
    in_reply_to: Option<&str>,
    references: &[String],
) -> Option<(String, i64)> {
    let sender = format!("{}\n", from.to_ascii_lowercase());
    pending
        .iter()
        .find(|(k, q)| {
            k.starts_with(&sender)
                && (in_reply_to == Some(q.help_message_id.as_str())
                    || references.contains(&q.help_message_id))
        })
        .map(|(k, q)| (k.clone(), q.task_row))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Body;

    #[test]
    fn answers_name_an_option() {
        let options: Vec<String> = ["Allow", "Always allow", "Reject"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(choose(&options, "2"), Some(1));
        assert_eq!(choose(&options, "  reject.\n\n> quoted question"), Some(2));
        assert_eq!(choose(&options, "> Which option?\nAlways allow"), Some(1));
        assert_eq!(choose(&options, "I allow it, go ahead"), Some(0));
        assert_eq!(choose(&options, "4"), None);
        assert_eq!(choose(&options, "maybe later"), None);
        assert_eq!(choose(&options, ""), None);
    }

    /// Issue 43: a right-to-left override in a command to approve moved where the command
    /// seemed to end; the mail the dispatcher gets shows it (and its kind) as `<U+202E>`.
    #[test]
    fn the_question_mail_shows_direction_marks_and_controls() {
        let (answer, _chosen) = tokio::sync::oneshot::channel();
        let question = Question {
            text: "Run `ls \u{202e}gnp.exe` \u{2066}now\u{2069}?\nSure\r?".into(),
            reason: "blocked\u{200b}".into(),
            options: vec!["Allow \u{202d}once".into(), "Reject".into()],
            answer,
        };
        let env = crate::protocol::Envelope {
            version: "1.1".into(),
            task_id: "t".into(),
            from: "boss@x.test".into(),
            to: vec!["coder@x.test".into()],
            message_id: "<m@x.test>".into(),
            subject: String::new(),
            in_reply_to: None,
            references: vec![],
            received_body: None,
        };
        let body = Body::HelpNeeded(help_needed(&question));
        let msg = crate::protocol::AampMessage::reply(&env, "coder@x.test", body);
        let mail = crate::protocol::render(&msg, std::time::SystemTime::now());
        let read = crate::protocol::parse_raw(&mail.bytes).expect("the mail parses");
        let text = read.body_text;
        assert!(
            text.contains("Run `ls <U+202E>gnp.exe` <U+2066>now<U+2069>?\nSure<U+000D>?"),
            "{text}"
        );
        assert!(text.contains("blocked<U+200B>"), "{text}");
        assert!(text.contains("Allow <U+202D>once"), "{text}");
        assert!(!text.chars().any(hidden), "{text:?}");
        assert_eq!(
            visible("plain\ttext\nnext, ÄÖ, עברית"),
            "plain\ttext\nnext, ÄÖ, עברית"
        );
    }
}
