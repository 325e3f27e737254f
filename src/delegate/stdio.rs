//! `aamp-bridge mcp`: the MCP server an agent starts (over stdio, on the official SDK `rmcp`)
//! to reach the delegation tools of the task it runs. It holds no state: each tool call goes
//! to the bridge over its socket with the task's credential, both from the environment.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::MAX_LINE;
use crate::dispatch::delegations::{SOCKET_VAR, TOKEN_VAR};

/// Why `aamp-bridge mcp` cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("{0} is not set: `aamp-bridge mcp` is started by an agent the bridge runs, for a task that may delegate (delegate_to in the agent's config)")]
    NotInTask(&'static str),
    #[error("the MCP session failed: {0}")]
    Session(String),
}

/// The relay to the bridge: its socket and the task's credential.
#[derive(Clone)]
struct Relay {
    socket: Arc<std::path::PathBuf>,
    token: Arc<String>,
}

impl Relay {
    async fn call(&self, tool: &str, args: Value) -> Result<String, String> {
        let stream = tokio::net::UnixStream::connect(&*self.socket)
            .await
            .map_err(|e| {
                format!(
                    "the bridge is not reachable at {}: {e}; is it running?",
                    self.socket.display()
                )
            })?;
        let (read, mut write) = stream.into_split();
        let mut line = json!({"token": *self.token, "tool": tool, "args": args}).to_string();
        line.push('\n');
        write
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("the bridge closed the connection: {e}"))?;
        let mut answer = String::new();
        BufReader::new(read.take(MAX_LINE as u64))
            .read_line(&mut answer)
            .await
            .map_err(|e| format!("the bridge's answer could not be read: {e}"))?;
        let answer: Value = serde_json::from_str(&answer)
            .map_err(|e| format!("the bridge's answer is not JSON ({e}); it may have stopped"))?;
        match answer["ok"].as_bool() {
            Some(true) => Ok(answer["text"].as_str().unwrap_or_default().to_string()),
            _ => Err(answer["error"].as_str().unwrap_or("refused").to_string()),
        }
    }
}

fn schema(value: Value) -> Arc<serde_json::Map<String, Value>> {
    Arc::new(value.as_object().cloned().unwrap_or_default())
}

/// The tools, as the agent sees them.
fn tools() -> Vec<Tool> {
    let id = json!({"type": "object", "properties": {"task_id": {"type": "string", "description": "the TaskId delegate returned"}}, "required": ["task_id"]});
    vec![
        Tool::new(
            "list_agents",
            "The agents (mail addresses) this task may hand work to with delegate.",
            schema(json!({"type": "object", "properties": {}})),
        ),
        Tool::new(
            "delegate",
            "Hand a sub-task to another agent by mail and (unless wait is false) wait for its answer, returned as JSON: state (completed, rejected or cancelled) and answer (its output, or why it was rejected).",
            schema(json!({"type": "object", "properties": {
                "to": {"type": "string", "description": "the agent's mail address (see list_agents)"},
                "title": {"type": "string", "description": "a one-line title"},
                "body": {"type": "string", "description": "the task, in full"},
                "wait": {"type": "boolean", "description": "wait for the answer (default true)"},
                "timeout": {"type": "integer", "description": "seconds to wait, and the sub-task's deadline (default 600)"},
                "budget": {"type": "integer", "description": "model tokens the sub-task may spend at most"}
            }, "required": ["to", "title", "body"]})),
        ),
        Tool::new(
            "delegate_status",
            "Where a delegation stands, with the answer once there is one.",
            schema(id.clone()),
        ),
        Tool::new(
            "delegate_cancel",
            "Cancel a delegation (the other agent is sent task.cancel).",
            schema(id),
        ),
    ]
}

impl ServerHandler for Relay {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "Tools to hand parts of this task to other agents by mail (aamp-bridge).",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.unwrap_or_default());
        let result = match self.call(&request.name, args).await {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(error) => CallToolResult::error(vec![ContentBlock::text(error)]),
        };
        Ok(result.into())
    }
}

/// Serves MCP on stdin/stdout until the agent closes it.
pub async fn run() -> Result<(), McpError> {
    let var = |name: &'static str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or(McpError::NotInTask(name))
    };
    let relay = Relay {
        socket: Arc::new(var(SOCKET_VAR)?.into()),
        token: Arc::new(var(TOKEN_VAR)?),
    };
    let service = relay
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Session(e.to_string()))?;
    service
        .waiting()
        .await
        .map_err(|e| McpError::Session(e.to_string()))?;
    Ok(())
}
