//! A running task handing work to other agents (`delegate`, `docs/delegation.md`): the tools
//! the bridge's MCP server relays to ([`Delegator`]), the grants that bind them to the one
//! task that runs ([`Registry`]), and the children's answers taken in (once).
//!
//! A delegation is a `task.dispatch` from the agent's own mailbox, carrying the parent's chain
//! one hop further (`protocol::chain`): the chain's members plus this agent, its deadline, and
//! its token budget less what the parent's run spent so far. It is journaled with its mail in
//! one transaction before the mail leaves; the child's `task.result`, arriving in the agent's
//! mailbox, is kept with it; a waiting tool call is woken.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::journal::{Delegation, JournalError, NewDelegation, Outgoing};
use super::{compose, Engine};
use crate::backend::Backend;
use crate::inbound::Inbound;
use crate::protocol::chain::ChildLimits;
use crate::protocol::{AampMessage, Body, Dispatch, Envelope, Priority, Status};

/// A boxed future of a tool's answer: its text, or why it failed (the tool's error text).
pub type ToolFuture<'a> = Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>>;

/// What a tool call reaches: the engine of the agent whose task holds the grant.
pub trait Delegator: Send + Sync {
    /// Runs `tool` with `args` for the task `grant` names.
    fn call<'a>(&'a self, grant: &'a Grant, tool: &'a str, args: Value) -> ToolFuture<'a>;
}

/// A running task's right to the tools, bound to that task and to the processes of its run.
#[derive(Clone)]
pub struct Grant {
    pub agent: String,
    /// The task's journal row.
    pub row: i64,
    /// The run's tag (`RUN_VAR`): only a process carrying it may use the grant.
    pub run_tag: String,
    pub env: Envelope,
    pub dispatch: Dispatch,
    pub engine: Arc<dyn Delegator>,
}

/// The grants of the tasks running now, by their credential, and the socket the bridge's MCP
/// servers reach them through. A grant is removed when its run ends: its credential is refused
/// from then on.
pub struct Registry {
    pub socket: std::path::PathBuf,
    grants: Mutex<HashMap<String, Grant>>,
    /// Woken whenever a child's answer is taken in.
    answered: tokio::sync::Notify,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("socket", &self.socket)
            .finish()
    }
}

impl Registry {
    pub fn new(socket: std::path::PathBuf) -> Arc<Registry> {
        Arc::new(Registry {
            socket,
            grants: Mutex::new(HashMap::new()),
            answered: tokio::sync::Notify::new(),
        })
    }

    /// The grant `token` names, while its run lasts.
    pub fn grant(&self, token: &str) -> Option<Grant> {
        self.lock().get(token).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Grant>> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives `grant` a new credential (kept until the returned guard is dropped).
    pub(super) fn issue(self: &Arc<Self>, grant: Grant) -> GrantGuard {
        let token = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        self.lock().insert(token.clone(), grant);
        let command = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "aamp-bridge".into());
        let server = crate::runner::McpServer {
            name: "aamp".into(),
            command,
            args: vec!["mcp".into()],
            env: vec![
                (SOCKET_VAR.into(), self.socket.display().to_string()),
                (TOKEN_VAR.into(), token.clone()),
            ],
        };
        GrantGuard {
            registry: self.clone(),
            token,
            server,
        }
    }
}

/// A credential in force; dropping it withdraws it.
pub(super) struct GrantGuard {
    registry: Arc<Registry>,
    pub(super) token: String,
    /// The MCP server the agent is given: `aamp-bridge mcp`, with the socket and credential.
    pub(super) server: crate::runner::McpServer,
}

impl Drop for GrantGuard {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.token);
    }
}

/// The environment variables an agent's MCP server finds the bridge by.
pub const SOCKET_VAR: &str = "AAMP_BRIDGE_MCP_SOCKET";
pub const TOKEN_VAR: &str = "AAMP_BRIDGE_MCP_TOKEN";

/// How long `delegate` waits for the answer unless told.
const DEFAULT_WAIT: Duration = Duration::from_secs(600);

fn text_arg(args: &Value, name: &str) -> Result<String, String> {
    args[name]
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("the argument {name:?} (text) is missing"))
}

impl<B: Backend> Delegator for Engine<B> {
    fn call<'a>(&'a self, grant: &'a Grant, tool: &'a str, args: Value) -> ToolFuture<'a> {
        Box::pin(async move {
            match tool {
                "list_agents" => Ok(self.list_agents()),
                "delegate" => self.delegate(grant, &args).await,
                "delegate_status" => self.status(grant, &text_arg(&args, "task_id")?),
                "delegate_cancel" => self.cancel_child(grant, &text_arg(&args, "task_id")?),
                other => Err(format!("no tool {other:?}")),
            }
        })
    }
}

fn journal_error(e: JournalError) -> String {
    format!("the bridge's journal failed: {e}")
}

impl<B: Backend> Engine<B> {
    fn registry(&self) -> Option<&Arc<Registry>> {
        self.common.settings.delegation.as_ref()
    }

    /// A grant of the delegation tools to the run of `task` tagged `run_tag`, when the bridge
    /// serves them and the agent may delegate: its socket and credential added to the run's
    /// environment `env`.
    pub(super) fn grant_for(
        &self,
        task: &super::Task,
        run_tag: &str,
        env: &mut Vec<(String, String)>,
    ) -> Option<GrantGuard> {
        let registry = self.registry()?.clone();
        let spec = self.common.spec();
        if spec.delegate_to.is_empty() {
            return None;
        }
        let guard = registry.issue(Grant {
            agent: spec.name.clone(),
            row: task.row,
            run_tag: run_tag.to_string(),
            env: task.env.clone(),
            dispatch: task.dispatch.clone(),
            engine: Arc::new(self.clone()),
        });
        env.push((SOCKET_VAR.into(), registry.socket.display().to_string()));
        env.push((TOKEN_VAR.into(), guard.token.clone()));
        Some(guard)
    }

    /// The addresses this agent may delegate to, with what is known of them.
    fn list_agents(&self) -> String {
        let spec = self.common.spec();
        let agents: Vec<Value> = spec
            .delegate_to
            .iter()
            .map(|to| json!({"address": to}))
            .collect();
        json!({"agents": agents}).to_string()
    }

    /// `delegate`: the child dispatched (journaled first), then, unless `wait` is false, its
    /// answer waited for.
    async fn delegate(&self, grant: &Grant, args: &Value) -> Result<String, String> {
        let spec = self.common.spec();
        let to = text_arg(args, "to")?.to_ascii_lowercase();
        if !spec.delegate_to.iter().any(|a| a.eq_ignore_ascii_case(&to)) {
            return Err(format!(
                "agent {} may not delegate to {to}: it may delegate to {} (delegate_to in the config)",
                spec.name,
                if spec.delegate_to.is_empty() { "nobody".to_string() } else { spec.delegate_to.join(", ") }
            ));
        }
        let title = text_arg(args, "title")?;
        let body = args["body"].as_str().unwrap_or_default().to_string();
        let timeout = args["timeout"]
            .as_u64()
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_WAIT);
        let spent = self
            .common
            .journal
            .task_usage(grant.row)
            .map_err(journal_error)?
            .map(|u| u.total_tokens())
            .unwrap_or(0);
        let child_id = child_task_id(grant, &to, &title, &body);
        let mail = self.child_dispatch(
            grant,
            &child_id,
            &to,
            (title.clone(), body),
            spent,
            args,
            timeout,
        );
        let new = NewDelegation {
            agent: &spec.name,
            parent: grant.row,
            task_id: &child_id,
            recipient: &to,
            title: &title,
        };
        if self
            .common
            .journal
            .delegate(&new, &mail)
            .map_err(journal_error)?
        {
            tracing::info!(parent = %grant.env.task_id, child = %child_id, %to, "delegated");
        } else {
            tracing::info!(parent = %grant.env.task_id, child = %child_id, %to,
                "the same delegation was made before (the task ran again): its child is reused");
        }
        self.outbox.wake();
        if args["wait"].as_bool() == Some(false) {
            return Ok(json!({"task_id": child_id, "state": "sent"}).to_string());
        }
        self.wait_for(&spec.name, &child_id, timeout).await
    }

    /// The child's `task.dispatch`, rendered: from the agent's mailbox, one hop further on the
    /// parent's chain, in the parent's thread.
    #[allow(clippy::too_many_arguments)]
    fn child_dispatch(
        &self,
        grant: &Grant,
        child_id: &str,
        to: &str,
        (title, body): (String, String),
        spent: u64,
        args: &Value,
        timeout: Duration,
    ) -> Outgoing {
        let spec = self.common.spec();
        let deadline = crate::protocol::time::format_utc(SystemTime::now() + timeout);
        let limits = ChildLimits {
            new_id: uuid::Uuid::new_v4().to_string(),
            deadline: Some(deadline),
            budget_tokens: args["budget"].as_u64(),
            new_trace: *uuid::Uuid::new_v4().as_bytes(),
            span_id: uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .unwrap_or([1; 8]),
        };
        let parent = &grant.dispatch;
        let dispatch = Dispatch {
            title,
            priority: Priority::Normal,
            parent_task_id: Some(grant.env.task_id.clone()),
            hop_count: Some(parent.hop_count.unwrap_or(0).saturating_add(1)),
            chain: parent.chain.child(&spec.email, spent, limits),
            body_text: body,
            ..Dispatch::default()
        };
        let mut msg = AampMessage::dispatch(child_id.to_string(), &spec.email, to, dispatch);
        msg.envelope.message_id =
            compose::derived_message_id(&spec.email, child_id, "task.dispatch", 0);
        if !grant.env.message_id.is_empty() {
            msg.envelope.references = vec![grant.env.message_id.clone()];
        }
        Outgoing {
            intent: "task.dispatch".into(),
            mail: crate::protocol::render(&msg, SystemTime::now()),
            claim: None,
        }
    }

    /// Waits up to `timeout` for the delegation's answer.
    async fn wait_for(
        &self,
        agent: &str,
        child: &str,
        timeout: Duration,
    ) -> Result<String, String> {
        let until = tokio::time::Instant::now() + timeout;
        let registry = self.registry().cloned();
        loop {
            let notified = registry.as_ref().map(|r| r.answered.notified());
            let mut notified = std::pin::pin!(async move {
                match notified {
                    Some(n) => n.await,
                    None => std::future::pending().await,
                }
            });
            // Polled once, so a notification between the read below and the wait is kept.
            let _ = futures::poll!(notified.as_mut());
            let found = self
                .common
                .journal
                .delegation(agent, child)
                .map_err(journal_error)?;
            if let Some(d) = found.filter(|d| d.state != "sent") {
                return Ok(answer_text(&d));
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => {
                    return Ok(json!({"task_id": child, "state": "sent",
                        "note": "no answer yet; ask delegate_status later"}).to_string());
                }
            }
        }
    }

    fn status(&self, grant: &Grant, child: &str) -> Result<String, String> {
        match self
            .common
            .journal
            .delegation(&grant.agent, child)
            .map_err(journal_error)?
        {
            Some(d) if d.parent == grant.row => Ok(answer_text(&d)),
            _ => Err(format!("this task made no delegation {child}")),
        }
    }

    fn cancel_child(&self, grant: &Grant, child: &str) -> Result<String, String> {
        let journal = &self.common.journal;
        match journal
            .delegation(&grant.agent, child)
            .map_err(journal_error)?
        {
            Some(d) if d.parent == grant.row => {
                self.send_cancel(&d).map_err(journal_error)?;
                Ok(json!({"task_id": child, "state": "cancelled"}).to_string())
            }
            _ => Err(format!("this task made no delegation {child}")),
        }
    }

    /// Sends `task.cancel` for a waiting delegation and marks it cancelled.
    fn send_cancel(&self, d: &Delegation) -> Result<(), JournalError> {
        let spec = self.common.spec();
        if !self
            .common
            .journal
            .delegation_cancelled(&d.agent, &d.task_id)?
        {
            return Ok(());
        }
        let mut msg = AampMessage::dispatch(
            d.task_id.clone(),
            &spec.email,
            &d.recipient,
            Dispatch::default(),
        );
        msg.body = Body::Cancel {
            reason: "The delegating task was cancelled.".into(),
        };
        msg.envelope.subject = msg.subject();
        msg.envelope.message_id =
            compose::derived_message_id(&spec.email, &d.task_id, "task.cancel", 0);
        let mail = Outgoing {
            intent: "task.cancel".into(),
            mail: crate::protocol::render(&msg, SystemTime::now()),
            claim: None,
        };
        self.common
            .journal
            .enqueue(&spec.name, Some(d.parent), &mail)?;
        self.outbox.wake();
        if let Some(r) = self.registry() {
            r.answered.notify_waiters();
        }
        Ok(())
    }

    /// After a run of `task`: when it was cancelled (not stopped with the bridge), its waiting
    /// delegations are cancelled too.
    pub(super) fn after_run(
        &self,
        task: &super::Task,
        cancel: &tokio_util::sync::CancellationToken,
    ) {
        if cancel.is_cancelled() && !self.common.abort.is_cancelled() {
            self.cancel_children(task.row);
        }
    }

    /// The parent at `row` ended cancelled: its waiting children are cancelled too.
    pub(super) fn cancel_children(&self, row: i64) {
        let children = match self.common.journal.delegations_of(row) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the task's delegations to cancel them");
                return;
            }
        };
        for d in children.iter().filter(|d| d.state == "sent") {
            if let Err(e) = self.send_cancel(d) {
                tracing::warn!(error = %e, child = %d.task_id, "could not cancel a delegation");
            }
        }
    }

    /// A `task.result` in the agent's mailbox: the answer of one of its delegations, taken
    /// once; anything else is not for this agent. `true` when it was taken.
    pub(super) fn on_child_result(&self, inbound: &Inbound) -> Result<bool, JournalError> {
        let Body::Result(result) = &inbound.message.body else {
            return Ok(false);
        };
        let env = &inbound.message.envelope;
        let (state, answer) = match result.status {
            Status::Completed => ("completed", result.output.clone()),
            Status::Rejected => (
                "rejected",
                result.error.clone().unwrap_or_else(|| "rejected".into()),
            ),
        };
        let spec = self.common.spec();
        let taken = self.common.journal.delegation_answered(
            &spec.name,
            &env.task_id,
            &env.from,
            state,
            &answer,
        )?;
        if taken {
            tracing::info!(child = %env.task_id, from = %env.from, state, "a delegation was answered");
            if let Some(r) = self.registry() {
                r.answered.notify_waiters();
            }
        }
        Ok(taken)
    }
}

/// The child's TaskId: derived from the parent task and what is asked, so a parent run again
/// after a crash that asks the same finds its child instead of sending a second one.
fn child_task_id(grant: &Grant, to: &str, title: &str, body: &str) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x7b1e_44c2_0d9a_4f3e_8c21_5a6b_7c8d_9e0f);
    let key = format!(
        "{}\n{}\n{}\n{}\n{to}\n{title}\n{body}",
        grant.agent, grant.row, grant.env.from, grant.env.task_id
    );
    uuid::Uuid::new_v5(&NAMESPACE, key.as_bytes()).to_string()
}

/// What a tool says of a delegation.
fn answer_text(d: &Delegation) -> String {
    json!({"task_id": d.task_id, "to": d.recipient, "state": d.state,
           "answer": d.answer.clone().unwrap_or_default()})
    .to_string()
}
