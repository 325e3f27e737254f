//! Which argument of which tool carries what the bridge sends, read from the input schemas
//! `tools/list` gives: the real server's schemas were never seen (tests/hosts/README.md), so
//! nothing is assumed beyond the tool names the SAMP README states. A field is found by a
//! short list of names (and its JSON type); a tool or field that cannot be found, or an
//! argument the tool requires that the bridge cannot fill, fails `doctor` and the start,
//! naming the tool and the field.

use serde_json::Value;

use super::error::SampError;

/// The argument names of the tools the bridge calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tools {
    pub send: SendFields,
    /// `check_inbox`'s page size, when it takes one.
    pub inbox_limit: Option<String>,
    /// `ack`'s list of message ids.
    pub ack_ids: String,
    /// `read_thread`'s thread id (`None`: no such tool; answers are then not looked for
    /// before a retry).
    pub thread_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendFields {
    pub to: String,
    pub subject: Option<String>,
    pub body: String,
    pub data: Option<String>,
    pub in_reply_to: String,
}

/// What each field may be called, and its JSON type.
const TO: (&[&str], &str) = (&["to", "recipient", "to_agent", "agent"], "string");
const SUBJECT: (&[&str], &str) = (&["subject", "title"], "string");
const BODY: (&[&str], &str) = (&["body", "text", "content", "message"], "string");
const DATA: (&[&str], &str) = (&["data", "metadata", "payload", "structured"], "object");
const REPLY_TO: (&[&str], &str) = (
    &[
        "in_reply_to",
        "reply_to",
        "parent_id",
        "in_reply_to_id",
        "parent",
    ],
    "string",
);
const LIMIT: (&[&str], &str) = (&["limit", "max", "max_messages", "count"], "integer");
const IDS: (&[&str], &str) = (&["message_ids", "ids", "messages", "message_id"], "array");
const THREAD: (&[&str], &str) = (&["thread_id", "thread", "id"], "string");

/// One tool's input schema.
struct Schema<'a> {
    tool: &'a str,
    properties: &'a serde_json::Map<String, Value>,
    required: Vec<&'a str>,
    used: Vec<String>,
}

impl<'a> Schema<'a> {
    fn of(tools: &'a [Value], tool: &'a str) -> Result<Schema<'a>, SampError> {
        let found = tools
            .iter()
            .find(|t| t["name"] == tool)
            .ok_or_else(|| mapping(tool, "the server offers no such tool"))?;
        static EMPTY: std::sync::OnceLock<serde_json::Map<String, Value>> =
            std::sync::OnceLock::new();
        let schema = &found["inputSchema"];
        Ok(Schema {
            tool,
            properties: schema["properties"]
                .as_object()
                .unwrap_or_else(|| EMPTY.get_or_init(Default::default)),
            required: schema["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default(),
            used: Vec::new(),
        })
    }

    /// The property named like `field` with its type (a schema without a type takes any).
    fn find(&mut self, (names, kind): (&[&str], &str)) -> Option<String> {
        let name = names.iter().find(|n| {
            self.properties.get(**n).is_some_and(|p| match &p["type"] {
                Value::String(t) => t == kind || (kind == "object" && t == "string"),
                Value::Array(ts) => ts.iter().any(|t| t == kind),
                _ => true,
            })
        })?;
        self.used.push(name.to_string());
        Some(name.to_string())
    }

    fn need(&mut self, field: (&[&str], &str), what: &str) -> Result<String, SampError> {
        self.find(field).ok_or_else(|| {
            mapping(
                self.tool,
                &format!(
                    "no argument for {what} (looked for {} of type {})",
                    field.0.join(", "),
                    field.1
                ),
            )
        })
    }

    /// Every argument the tool requires is one the bridge fills.
    fn all_required_filled(&self) -> Result<(), SampError> {
        match self.required.iter().find(|r| !self.used.iter().any(|u| u == *r)) {
            Some(other) => Err(mapping(
                self.tool,
                &format!("it requires the argument {other:?}, which the bridge does not know how to fill"),
            )),
            None => Ok(()),
        }
    }
}

fn mapping(tool: &str, problem: &str) -> SampError {
    SampError::Mapping {
        tool: tool.to_string(),
        problem: problem.to_string(),
    }
}

/// Maps the tools the bridge needs from a `tools/list` answer.
pub fn map(tools: &[Value]) -> Result<Tools, SampError> {
    let mut send = Schema::of(tools, "send_message")?;
    let fields = SendFields {
        to: send.need(TO, "the recipient")?,
        subject: send.find(SUBJECT),
        body: send.need(BODY, "the text")?,
        data: send.find(DATA),
        in_reply_to: send.need(REPLY_TO, "the message a reply answers")?,
    };
    send.all_required_filled()?;
    let mut inbox = Schema::of(tools, "check_inbox")?;
    let inbox_limit = inbox.find(LIMIT);
    inbox.all_required_filled()?;
    let mut ack = Schema::of(tools, "ack")?;
    let ack_ids = ack.need(IDS, "the message ids")?;
    ack.all_required_filled()?;
    let thread_id = match Schema::of(tools, "read_thread") {
        Ok(mut thread) => {
            let id = thread.need(THREAD, "the thread id")?;
            thread.all_required_filled()?;
            Some(id)
        }
        Err(_) => None,
    };
    Ok(Tools {
        send: fields,
        inbox_limit,
        ack_ids,
        thread_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, properties: Value, required: &[&str]) -> Value {
        json!({"name": name, "inputSchema": {"type": "object", "properties": properties, "required": required}})
    }

    fn imitation() -> Vec<Value> {
        vec![
            tool(
                "send_message",
                json!({"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"},
                       "data": {"type": "object"}, "in_reply_to": {"type": "string"}}),
                &["to", "subject", "body"],
            ),
            tool("check_inbox", json!({"limit": {"type": "integer"}}), &[]),
            tool(
                "ack",
                json!({"message_ids": {"type": "array"}}),
                &["message_ids"],
            ),
            tool(
                "read_thread",
                json!({"thread_id": {"type": "string"}}),
                &["thread_id"],
            ),
        ]
    }

    #[test]
    fn the_imitations_schemas_map() {
        let tools = map(&imitation()).unwrap();
        assert_eq!(tools.send.to, "to");
        assert_eq!(tools.send.data.as_deref(), Some("data"));
        assert_eq!(tools.send.in_reply_to, "in_reply_to");
        assert_eq!(tools.inbox_limit.as_deref(), Some("limit"));
        assert_eq!(tools.ack_ids, "message_ids");
        assert_eq!(tools.thread_id.as_deref(), Some("thread_id"));
    }

    #[test]
    fn other_names_map_and_what_cannot_be_mapped_is_named() {
        let mut other = imitation();
        other[0] = tool(
            "send_message",
            json!({"recipient": {"type": "string"}, "text": {"type": "string"}, "parent_id": {"type": "string"}}),
            &["recipient", "text"],
        );
        let tools = map(&other).unwrap();
        assert_eq!(
            (
                tools.send.to.as_str(),
                tools.send.body.as_str(),
                tools.send.subject
            ),
            ("recipient", "text", None)
        );
        other[0] = tool(
            "send_message",
            json!({"to": {"type": "string"}, "body": {"type": "string"}, "in_reply_to": {"type": "string"}, "priority": {"type": "string"}}),
            &["to", "body", "priority"],
        );
        let e = map(&other).unwrap_err().to_string();
        assert!(e.contains("send_message") && e.contains("priority"), "{e}");
        other.remove(2);
        other[0] = imitation()[0].clone();
        let e = map(&other).unwrap_err().to_string();
        assert!(e.contains("ack") && e.contains("no such tool"), "{e}");
        let mut no_reply = imitation();
        no_reply[0] = tool(
            "send_message",
            json!({"to": {"type": "string"}, "body": {"type": "string"}}),
            &[],
        );
        let e = map(&no_reply).unwrap_err().to_string();
        assert!(
            e.contains("send_message") && e.contains("in_reply_to"),
            "{e}"
        );
    }
}
