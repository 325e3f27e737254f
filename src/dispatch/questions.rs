//! Questions an agent asks its dispatcher (`task.help_needed`): mailed, kept until answered,
//! and matched with their answers (a reply to the question's mail, a follow-up dispatch, or
//! the operator's answer from the live view).

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::json;

use super::journal::TaskState;
use super::{task_key, Engine, Task};
use crate::backend::Backend;
use crate::protocol::{Body, Dispatch, Envelope, HelpNeeded};
use crate::runner::{Answer, Question};

/// The questions' state: those mailed to dispatchers, by task key, awaiting an answer.
#[derive(Default)]
pub(super) struct Questions {
    pending: Mutex<HashMap<String, PendingQuestion>>,
}

/// A question mailed to a dispatcher, waiting for the answer.
struct PendingQuestion {
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
fn help_needed(question: &Question) -> HelpNeeded {
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
fn replied_to(
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

impl<O: Backend> Engine<O> {
    /// Queues the agent's question to the dispatcher as `task.help_needed` and keeps its
    /// answer channel until a reply comes.
    pub(super) async fn ask_dispatcher(&self, task: &Task, question: Question) {
        let inner = &self.inner;
        // The mail, the live view and the answer's matching all see the shown form.
        let help = help_needed(&question);
        let text = help.question.clone();
        let options = help.suggested_options.clone();
        let n = inner
            .journal
            .count_outgoing(task.row, "task.help_needed")
            .unwrap_or(0);
        let mail = self.compose(&task.env, &task.key, Body::HelpNeeded(help), n);
        let queued = self
            .enqueue(task, &mail)
            .and_then(|()| inner.journal.set_state(task.row, TaskState::HelpNeeded));
        match queued {
            Ok(()) => {
                self.note(
                    task.row,
                    "asked the dispatcher",
                    Some(&mail.mail.message_id),
                );
                inner.events.emit(crate::events::Event::TaskHelpNeeded, json!({"agent": self.spec().name, "taskId": task.env.task_id, "from": task.env.from, "question": text, "options": options, "messageId": mail.mail.message_id}));
                let pending = PendingQuestion {
                    help_message_id: mail.mail.message_id.clone(),
                    text,
                    options,
                    answer: question.answer,
                    task_row: task.row,
                };
                inner
                    .questions
                    .pending
                    .lock()
                    .expect("questions lock")
                    .insert(task_key(&task.env.from, &task.env.task_id), pending);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not queue task.help_needed; the question goes unanswered");
                let _ = question.answer.send(Answer::None);
            }
        }
    }

    /// The question a dispatch answers, by task key: same sender, and its ParentTaskId is the
    /// waiting task, or it replies to the help mail.
    pub(super) fn question_answered_by(
        &self,
        env: &Envelope,
        dispatch: &Dispatch,
    ) -> Option<String> {
        let pending = self.inner.questions.pending.lock().expect("questions lock");
        match &dispatch.parent_task_id {
            Some(parent) if pending.contains_key(&task_key(&env.from, parent)) => {
                Some(task_key(&env.from, parent))
            }
            _ => replied_to(
                &pending,
                &env.from,
                env.in_reply_to.as_deref(),
                &env.references,
            )
            .map(|(k, _)| k),
        }
    }

    /// Hands the answer in `text` (or else `title`) to the question waiting under `waiting`.
    pub(super) fn answer_question(
        &self,
        waiting: &str,
        answer_task_id: &str,
        text: &str,
        title: &str,
    ) {
        let inner = &self.inner;
        let Some(question) = inner
            .questions
            .pending
            .lock()
            .expect("questions lock")
            .remove(waiting)
        else {
            return;
        };
        let choice = choose(&question.options, text).or_else(|| choose(&question.options, title));
        inner.events.emit(
            crate::events::Event::TaskAnswered,
            json!({"agent": self.spec().name, "taskId": waiting.split_once('\n').map(|(_, t)| t), "answerTaskId": answer_task_id, "choice": choice.map(|i| question.options[i].clone())}),
        );
        if choice.is_none() {
            tracing::info!(
                "the answer names none of the options; it goes to the agent as free text"
            );
        }
        if let Err(e) = inner
            .journal
            .set_state(question.task_row, TaskState::Running)
        {
            tracing::warn!(error = %e, "could not record that the question was answered");
        }
        let answer = match choice {
            Some(i) => Answer::Chosen(i),
            None => match own_words(text) {
                Some(words) => Answer::Text(words),
                None => Answer::None,
            },
        };
        let _ = question.answer.send(answer);
    }

    /// The question a plain reply from `from` answers (its task key and the asking task's
    /// row), if it replies to a question's mail.
    pub(super) fn question_replied_to(
        &self,
        from: &str,
        in_reply_to: Option<&str>,
        references: &[String],
    ) -> Option<(String, i64)> {
        let pending = self.inner.questions.pending.lock().expect("questions lock");
        replied_to(&pending, from, in_reply_to, references)
    }

    /// The question waiting under `waiting`: the asking task's row and the question's text.
    pub(super) fn question_asked(&self, waiting: &str) -> Option<(i64, String)> {
        self.inner
            .questions
            .pending
            .lock()
            .expect("questions lock")
            .get(waiting)
            .map(|q| (q.task_row, q.text.clone()))
    }

    /// The task `key` ended: its question, if any, is no longer waiting.
    pub(super) fn forget_question(&self, key: &str) {
        self.inner
            .questions
            .pending
            .lock()
            .expect("questions lock")
            .remove(key);
    }

    /// The questions waiting for an answer.
    pub fn open_questions(&self) -> Vec<OpenQuestion> {
        let agent = self.spec().name.clone();
        let pending = self.inner.questions.pending.lock().expect("questions lock");
        pending
            .iter()
            .map(|(key, q)| {
                let (from, task_id) = key.split_once('\n').unwrap_or(("", key));
                OpenQuestion {
                    agent: agent.clone(),
                    from: from.to_string(),
                    task_id: task_id.to_string(),
                    question: q.text.clone(),
                    options: q.options.clone(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
