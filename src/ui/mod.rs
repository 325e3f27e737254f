//! The live view: a page in the browser, served by `aamp-bridge start` when the config has a
//! `[ui]` table, showing each agent, its queue and its tasks as they stream, where the
//! operator answers an agent's question and cancels a task.
//!
//! - [`server`]: the HTTP server (hyper, HTTP/1.1), its routes and its refusals;
//! - [`auth`]: the access token (never a cookie), the `Host`, `Origin` and CSRF checks;
//! - `conns`: the open connections, bounded, idle ones closed first to make room;
//! - [`feed`]: one Server-Sent Events stream per open page: a snapshot, then every event
//!   line `start --json` prints (from [`crate::events::tap`]), a fresh snapshot when the page
//!   fell behind;
//! - [`snapshot`]: the read model, shared with `status`, `tasks` and `task show`;
//! - `page/`: the static page, script and style, built into the binary.
//!
//! Actions go through [`Operator`], which the daemon gives as its engines: the same paths
//! a mail answer and a `task.cancel` take.

pub mod auth;
mod conns;
mod feed;
mod server;
pub mod snapshot;
pub mod usage;

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::Value;

use crate::backend::Backend;
use crate::config::{LoadedConfig, UiConfig};
use crate::dispatch::operator::OperatorError;
use crate::dispatch::questions::OpenQuestion;
use crate::dispatch::{Engine, Journal};

pub use server::Server;

/// Why the page could not be served.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("the live view cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the live view's access token: {0}")]
    Token(#[from] auth::TokenError),
    #[error("{path}: {source}")]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why an action from the page was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("no agent {0:?} runs in this bridge")]
    NoAgent(String),
    #[error(transparent)]
    Refused(#[from] OperatorError),
}

/// What the page may do, on the paths mail takes (the daemon's engines).
pub trait Operator: Send + Sync + 'static {
    fn questions(&self) -> Vec<OpenQuestion>;
    fn answer(&self, action: &Action, answer: &str) -> Result<(), ActionError>;
    fn cancel(&self, action: &Action) -> Result<(), ActionError>;
}

/// An action the page asks: which task, and for an answer, the answer.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Action {
    pub agent: String,
    pub from: String,
    pub task_id: String,
    #[serde(default)]
    pub answer: Option<String>,
}

impl<O: Backend> Operator for Vec<Engine<O>> {
    fn questions(&self) -> Vec<OpenQuestion> {
        self.iter()
            .flat_map(|d| d.desk().open_questions())
            .collect()
    }

    fn answer(&self, action: &Action, answer: &str) -> Result<(), ActionError> {
        let engine = engine(self, &action.agent)?;
        Ok(engine
            .desk()
            .operator_answer(&action.from, &action.task_id, answer)?)
    }

    fn cancel(&self, action: &Action) -> Result<(), ActionError> {
        let engine = engine(self, &action.agent)?;
        Ok(engine
            .desk()
            .operator_cancel(&action.from, &action.task_id)?)
    }
}

/// The engine of the agent named `agent`.
fn engine<'a, O: Backend>(
    engines: &'a [Engine<O>],
    agent: &str,
) -> Result<&'a Engine<O>, ActionError> {
    engines
        .iter()
        .find(|d| d.name() == agent)
        .ok_or_else(|| ActionError::NoAgent(agent.to_string()))
}

/// The running bridge as the page sees it.
pub struct Context {
    pub config: LoadedConfig,
    pub journal: Arc<Journal>,
    /// The daemon's live figures (pid, uptime, slots), as its control socket answers.
    pub live: Arc<dyn Fn() -> Value + Send + Sync>,
    pub operator: Arc<dyn Operator>,
}

impl Context {
    /// Everything the page shows, at once. Each agent gets its mailbox's back-end, its
    /// profile, and its tasks today by state besides what `status --json` prints.
    async fn snapshot(&self) -> Value {
        let live = (self.live)();
        let mut agents =
            match snapshot::agents(&self.config, Some(&self.journal), Some(&live), false).await {
                Ok(agents) => agents.into_iter().map(|a| a.json).collect::<Vec<_>>(),
                Err(e) => {
                    tracing::warn!(error = %e, "the live view could not read the journal");
                    Vec::new()
                }
            };
        let names: Vec<&str> = self
            .config
            .config
            .agents
            .iter()
            .map(|a| a.name.as_str())
            .collect();
        let tasks = snapshot::recent_tasks(&self.journal, &names).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the live view could not read the tasks");
            Vec::new()
        });
        let mut active = Vec::new();
        for (json, agent) in agents.iter_mut().zip(&self.config.config.agents) {
            let backend = self
                .config
                .config
                .mailboxes
                .get(agent.mailbox_name())
                .map(|m| serde_json::to_value(m.kind()).unwrap_or_default());
            json["backend"] = backend.unwrap_or_default();
            json["profile"] = Value::from(agent.profile.clone());
            match snapshot::active_tasks(&self.journal, &agent.name) {
                Ok(rows) => active.extend(rows),
                Err(e) => tracing::warn!(error = %e, "the live view could not read the queue"),
            }
        }
        serde_json::json!({
            "bridge": live,
            "nowMs": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            "agents": agents,
            "tasks": tasks,
            "active": active,
            "questions": self.operator.questions(),
            "usage": usage::live(&self.journal, std::time::SystemTime::now()).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the live view could not read the usage");
                Value::Null
            }),
        })
    }
}

/// Where the page of the bridge on this state folder is, for `aamp-bridge ui`: its link
/// with the token (in the fragment, which the browser keeps to itself), when the bridge
/// serves one.
pub fn address(config: &LoadedConfig) -> Option<String> {
    let state = config.state();
    let addr = std::fs::read_to_string(state.ui_address()).ok()?;
    let token = auth::read_token(&state.ui_token())?;
    Some(auth::link(addr.trim(), &token))
}

/// A page in the state folder (owner-only) that sends the browser on to `link`: what
/// `aamp-bridge ui --open` gives the opener, so that the token never stands in a command
/// line (any local user reads those in /proc while the browser runs). Made anew each time.
pub fn opener_page(config: &LoadedConfig, link: &str) -> Result<std::path::PathBuf, UiError> {
    let path = config.state().ui_opener();
    // The link is ours (an address and hex digits); quoted for an attribute all the same.
    let quoted = link
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;");
    let html = format!(
        "<!doctype html>\n<meta charset=\"utf-8\">\n<meta name=\"referrer\" content=\"no-referrer\">\n<meta http-equiv=\"refresh\" content=\"0; url={quoted}\">\n<title>aamp-bridge</title>\n<p><a href=\"{quoted}\">Open the live view</a></p>\n"
    );
    crate::fsio::write_atomic(&path, html.as_bytes(), 0o600).map_err(|source| UiError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Binds the page's address and makes its token: `None` when the config has no `[ui]`.
pub fn bind(config: &LoadedConfig) -> Option<Result<Server, UiError>> {
    let ui: &UiConfig = config.config.ui.as_ref()?;
    Some(Server::bind(ui, &config.state()))
}
