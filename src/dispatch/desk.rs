//! The person-facing side of one agent: the questions its agent asks the task's dispatcher
//! (mailed as `task.help_needed`, kept until answered, matched with their answers: a reply to
//! the question's mail, a follow-up dispatch, or the operator's answer from the live view),
//! and what the operator does from the live view, on the paths mail takes (answering a
//! question, cancelling a task). Mail answers and the live view both reach it here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::json;

use super::journal::{NewTask, TaskState};
use super::operator::{Acts, OperatorError, BY_DISPATCHER, BY_OPERATOR};
use super::questions::{self, OpenQuestion, PendingQuestion};
use super::runs::Running;
use super::{task_key, AgentSpec, Common, Outbox, Task};
use crate::backend::Backend;
use crate::protocol::{Body, Dispatch, Envelope};
use crate::runner::{Answer, Question};

/// Questions waiting for their answers and the operator's acts, for one agent. Cheap to
/// clone.
pub struct Desk<B> {
    common: Arc<Common<B>>,
    /// Where the questions' mails go.
    outbox: Outbox<B>,
    /// The tasks admitted and not finished: what the operator may cancel.
    running: Running,
    /// Questions mailed to dispatchers, by task key, awaiting an answer.
    questions: Arc<Mutex<HashMap<String, PendingQuestion>>>,
    /// What the operator did from the live view, for the tasks' answers.
    acts: Arc<Acts>,
}

impl<B> Clone for Desk<B> {
    fn clone(&self) -> Self {
        Desk {
            common: self.common.clone(),
            outbox: self.outbox.clone(),
            running: self.running.clone(),
            questions: self.questions.clone(),
            acts: self.acts.clone(),
        }
    }
}

impl<B: Backend> Desk<B> {
    pub(super) fn new(common: Arc<Common<B>>, outbox: Outbox<B>, running: Running) -> Self {
        Desk {
            common,
            outbox,
            running,
            questions: Arc::default(),
            acts: Arc::default(),
        }
    }

    fn spec(&self) -> Arc<AgentSpec> {
        self.common.spec()
    }

    /// Queues the agent's question to the dispatcher as `task.help_needed` and keeps its
    /// answer channel until a reply comes.
    pub(super) async fn ask(&self, task: &Task, question: Question) {
        let inner = &self.common;
        // The mail, the live view and the answer's matching all see the shown form.
        let help = questions::help_needed(&question);
        let text = help.question.clone();
        let options = help.suggested_options.clone();
        let n = inner
            .journal
            .count_outgoing(task.row, "task.help_needed")
            .unwrap_or(0);
        let mail = self
            .outbox
            .compose(&task.env, &task.key, Body::HelpNeeded(help), n);
        let queued = self
            .outbox
            .enqueue(task, &mail)
            .and_then(|()| inner.journal.set_state(task.row, TaskState::HelpNeeded));
        match queued {
            Ok(()) => {
                self.common.note(
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
                self.questions
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
    pub(super) fn answered_by(&self, env: &Envelope, dispatch: &Dispatch) -> Option<String> {
        let pending = self.questions.lock().expect("questions lock");
        match &dispatch.parent_task_id {
            Some(parent) if pending.contains_key(&task_key(&env.from, parent)) => {
                Some(task_key(&env.from, parent))
            }
            _ => questions::replied_to(
                &pending,
                &env.from,
                env.in_reply_to.as_deref(),
                &env.references,
            )
            .map(|(k, _)| k),
        }
    }

    /// Hands the answer in `text` (or else `title`) to the question waiting under `waiting`.
    pub(super) fn answer(&self, waiting: &str, answer_task_id: &str, text: &str, title: &str) {
        let inner = &self.common;
        let Some(question) = self
            .questions
            .lock()
            .expect("questions lock")
            .remove(waiting)
        else {
            return;
        };
        let choice = questions::choose(&question.options, text)
            .or_else(|| questions::choose(&question.options, title));
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
            None => match questions::own_words(text) {
                Some(words) => Answer::Text(words),
                None => Answer::None,
            },
        };
        let _ = question.answer.send(answer);
    }

    /// The question a plain reply from `from` answers (its task key and the asking task's
    /// row), if it replies to a question's mail.
    pub(super) fn replied_to(
        &self,
        from: &str,
        in_reply_to: Option<&str>,
        references: &[String],
    ) -> Option<(String, i64)> {
        let pending = self.questions.lock().expect("questions lock");
        questions::replied_to(&pending, from, in_reply_to, references)
    }

    /// The question waiting under `waiting`: the asking task's row and the question's text.
    fn asked(&self, waiting: &str) -> Option<(i64, String)> {
        self.questions
            .lock()
            .expect("questions lock")
            .get(waiting)
            .map(|q| (q.task_row, q.text.clone()))
    }

    /// The task `key` ended: its question, if any, is no longer waiting.
    pub(super) fn forget(&self, key: &str) {
        self.questions.lock().expect("questions lock").remove(key);
    }

    /// The questions waiting for an answer.
    pub fn open_questions(&self) -> Vec<OpenQuestion> {
        let agent = self.spec().name.clone();
        let pending = self.questions.lock().expect("questions lock");
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

    /// Answers the question task `task_id` of `from` waits on with `answer` (an option's name
    /// or number, or free text), as a reply by mail would: recorded in the journal, noted on the
    /// task's timeline, and handed to the agent once. A second answer finds no question.
    pub fn operator_answer(
        &self,
        from: &str,
        task_id: &str,
        answer: &str,
    ) -> Result<(), OperatorError> {
        let spec = self.spec();
        let waiting = task_key(from, task_id);
        let asked = self.asked(&waiting);
        let Some((row, question)) = asked else {
            return Err(OperatorError::NoQuestion {
                from: from.to_string(),
                task_id: task_id.to_string(),
            });
        };
        let key = format!("operator|{}", uuid::Uuid::new_v4());
        self.common.journal.record(
            &NewTask {
                agent: &spec.name,
                message_key: &key,
                sender: "operator",
                task_id,
                session_key: None,
                state: TaskState::Answered,
                admitted: false,
                mail: &json!({"operator": {"answer": answer, "question": row}}).to_string(),
                reason: Some("an answer to a question, from the live view"),
                chain: None,
            },
            None,
        )?;
        self.common
            .note(row, "answered by the operator", Some(answer));
        tracing::info!(row, "the operator answers the agent's question");
        // The dispatcher asked nothing and answered nothing: its answer says who did.
        let question: String = question.chars().take(200).collect();
        self.acts
            .answered
            .lock()
            .expect("answered lock")
            .entry(waiting.clone())
            .or_default()
            .push(format!(
                "the question {question:?} was answered on this machine by its operator: {answer:?}"
            ));
        self.answer(&waiting, task_id, answer, "");
        Ok(())
    }

    /// What the operator answered for `task` from the live view, for its answer (and forgets
    /// it): `None` when nobody did.
    pub(super) fn operator_answers(&self, task: &Task) -> Option<String> {
        let key = task_key(&task.env.from, &task.env.task_id);
        let said = self
            .acts
            .answered
            .lock()
            .expect("answered lock")
            .remove(&key)?;
        Some(format!("(aamp-bridge: {})", said.join("; ")))
    }

    /// Stops the queued or running task `task_id` of `from`, as its dispatcher's `task.cancel`
    /// would; its answer says the operator cancelled it.
    pub fn operator_cancel(&self, from: &str, task_id: &str) -> Result<(), OperatorError> {
        let key = task_key(from, task_id);
        let cancelled = self.running.with(&key, |cancel| {
            self.acts
                .cancelled
                .lock()
                .expect("cancelled lock")
                .insert(key.clone());
            tracing::info!(%from, %task_id, "the operator cancels the task");
            cancel.cancel();
        });
        cancelled.ok_or_else(|| OperatorError::NotActive {
            from: from.to_string(),
            task_id: task_id.to_string(),
        })
    }

    /// Who cancelled `task`, for its answer (and forgets it).
    pub(super) fn cancelled_by(&self, task: &Task) -> &'static str {
        let key = task_key(&task.env.from, &task.env.task_id);
        let mut by_operator = self.acts.cancelled.lock().expect("cancelled lock");
        if by_operator.remove(&key) {
            self.common
                .note(task.row, BY_OPERATOR, Some("from the live view"));
            BY_OPERATOR
        } else {
            BY_DISPATCHER
        }
    }
}
