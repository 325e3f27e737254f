//! What the back-ends without mail (AMP, ASMTP, SAMP) share in turning a rendered answer into
//! a message of their own: the AAMP answer read back from the mail, and its words as text.

use crate::protocol::{self, AampMessage, Body, RenderedMail};

/// The AAMP answer `mail` carries; `None` (logged) for a mail that is none, which `server`
/// is then not sent.
pub(crate) fn read(mail: &RenderedMail, server: &str) -> Option<AampMessage> {
    let parsed =
        protocol::rfc5322::parse_raw(&mail.bytes).and_then(|view| AampMessage::parse(&view).ok());
    if parsed.is_none() {
        tracing::warn!(message_id = %mail.message_id, "not an AAMP answer; nothing to send to {server}");
    }
    parsed
}

/// How a back-end shows emphasis: AMP's broker renders markdown, the others show plain text.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Markup {
    Plain,
    Markdown,
}

impl Markup {
    fn strong(self, text: &str) -> String {
        match self {
            Markup::Plain => text.to_string(),
            Markup::Markdown => format!("**{text}**"),
        }
    }
}

/// The text of a result, a question or a card response: the output with the error after it,
/// the question with its options, the summary over the card. `None` for what has no words
/// for a person (acks, stream announcements), which these systems drop.
pub(crate) fn text(body: &Body, markup: Markup) -> Option<String> {
    Some(match body {
        Body::Result(r) => {
            let mut text = r.output.clone();
            if let Some(error) = r.error.as_deref().filter(|e| !e.is_empty()) {
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                let status = markup.strong(r.status.as_str());
                text.push_str(&format!("{status}: {error}"));
            }
            if let Some(usage) = &r.usage {
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                let line = crate::protocol::usage_wire::line(usage);
                text.push_str(&format!("{} {line}", markup.strong("Usage:")));
            }
            text
        }
        Body::HelpNeeded(h) => {
            let mut text = format!("{} {}", markup.strong("Question:"), h.question);
            for option in &h.suggested_options {
                text.push_str(&format!("\n- {option}"));
            }
            text
        }
        Body::CardResponse { summary, text } => format!("{}\n\n{text}", markup.strong(summary)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Status, TaskResult, Usage};

    fn result(usage: Option<Usage>) -> Body {
        Body::Result(TaskResult {
            status: Status::Rejected,
            output: "partial".into(),
            error: Some("failed".into()),
            structured_result: None,
            usage,
        })
    }

    #[test]
    fn a_results_text_ends_with_its_usage_and_has_none_when_none_was_reported() {
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 2,
            model: Some("m".into()),
            ..Usage::default()
        };
        let said = text(&result(Some(usage)), Markup::Markdown).unwrap();
        assert_eq!(
            said,
            "partial\n\n**rejected**: failed\n\n**Usage:** 10 input, 2 output, 0 cache read, 0 cache write tokens (12 in all); cost unknown (m)"
        );
        let said = text(&result(None), Markup::Plain).unwrap();
        assert_eq!(said, "partial\n\nrejected: failed");
    }
}
