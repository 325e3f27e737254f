//! An AAMP message as lower-camel-case JSON, in the shape of the upstream conformance corpus:
//! what `--json` output prints and the corpus tests compare. Moved out of `message.rs` (which
//! reads and writes the mail itself) to keep each file whole and under the size limit.

use serde_json::{json, Map, Value};

use super::message::{AampMessage, Body, Status};

impl AampMessage {
    /// The message as lower-camel-case JSON, in the shape of the upstream conformance corpus
    /// (fields that do not apply are left out). Used by `--json` output and the corpus tests.
    pub fn to_json(&self) -> Value {
        let env = &self.envelope;
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("protocolVersion", json!(env.version));
        put("intent", json!(self.intent().as_str()));
        put("taskId", json!(env.task_id));
        put("from", json!(env.from));
        put("to", json!(env.to.join(", ")));
        put("messageId", json!(env.message_id));
        put("subject", json!(env.subject));
        if let Some(v) = &env.in_reply_to {
            put("inReplyTo", json!(v));
        }
        let body_text = env
            .received_body
            .clone()
            .unwrap_or_else(|| self.body_text());
        put("bodyText", json!(body_text));
        match &self.body {
            Body::Dispatch(d) => {
                put("title", json!(d.title));
                put("priority", json!(d.priority.as_str()));
                if let Some(v) = &d.expires_at {
                    put("expiresAt", json!(v));
                }
                if let Some(v) = &d.session_key {
                    put("sessionKey", json!(v));
                }
                if !d.dispatch_context.is_empty() {
                    put("dispatchContext", json!(d.dispatch_context));
                }
                if let Some(v) = &d.parent_task_id {
                    put("parentTaskId", json!(v));
                }
            }
            Body::Cancel { .. } => {}
            Body::Ack => {}
            Body::HelpNeeded(h) => {
                put("question", json!(h.question));
                put("blockedReason", json!(h.blocked_reason));
                put("suggestedOptions", json!(h.suggested_options));
            }
            Body::Result(r) => {
                put("status", json!(r.status.as_str()));
                put("output", json!(r.output));
                if let Some(e) = &r.error {
                    put("errorMsg", json!(e));
                }
                if let Some(s) = &r.structured_result {
                    put("structuredResult", s.clone());
                }
                if let Some(u) = &r.usage {
                    put("usage", super::usage_wire::to_json(u));
                }
            }
            Body::StreamOpened { stream_id } => put("streamId", json!(stream_id)),
            Body::PairRequest { pair_code, rules } => {
                put("pairCode", json!(pair_code));
                if let Some(r) = rules {
                    put("dispatchContextRules", r.clone());
                }
            }
            Body::PairRespond { status, reason } => {
                put("status", json!(status.as_str()));
                put("success", json!(*status == Status::Completed));
                if let Some(r) = reason {
                    put("reason", json!(r));
                }
            }
            Body::CardQuery { .. } => {}
            Body::CardResponse { summary, .. } => put("summary", json!(summary)),
        }
        Value::Object(m)
    }
}
