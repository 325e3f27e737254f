#!/usr/bin/env python3
"""A small AMP (Agent Mailer Protocol) broker for tests, written from the published API of
study8677/agent-mailer (see the README's AMP section): the agent-facing routes only, with the
same request and response shapes, the same identity checks and the same faults (no
idempotency: the same send twice is two messages).

    amp_broker.py --port N --db FILE --record FILE --user NAME:KEY [--user NAME:KEY ...]
                  [--stall-first-reply]

Every agent call needs `X-API-Key`; a key belongs to a user, and a user's agents are its
tenant (mail across tenants is refused with 403). State is kept in the SQLite file, so the
broker can be stopped and started again. Every request is appended to the record file as a
JSON line {method, path, status, body}; a request whose body does not match the API's shapes
is refused with 422 and recorded with "invalid": the tests assert there are none.

  POST  /agents/register                 {name, address?, role, description?, system_prompt}
  POST  /messages/send                   SendRequest -> MessageResponse (or a list)
  GET   /messages/inbox/{address}?agent_id=..[&all=true]   unread, oldest first
  GET   /messages/thread/{thread_id}     oldest first
  PATCH /messages/{id}/read | /unread
"""
import argparse
import datetime
import json
import sqlite3
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = argparse.ArgumentParser()
args.add_argument("--port", type=int, required=True)
args.add_argument("--db", required=True)
args.add_argument("--record", required=True)
args.add_argument("--user", action="append", default=[], help="NAME:API_KEY")
args.add_argument("--domain", default="amp.test")
args.add_argument(
    "--stall-first-reply",
    action="store_true",
    help="store the first reply, record it, then never answer that request (a client killed mid-send)",
)
opts = args.parse_args()

lock = threading.Lock()
stalled = threading.Event()
db = sqlite3.connect(opts.db, check_same_thread=False)
db.row_factory = sqlite3.Row
db.executescript(
    """
CREATE TABLE IF NOT EXISTS agents (id TEXT PRIMARY KEY, user TEXT NOT NULL, name TEXT NOT NULL,
  address TEXT NOT NULL UNIQUE, role TEXT NOT NULL, description TEXT NOT NULL,
  system_prompt TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (id TEXT PRIMARY KEY, thread_id TEXT NOT NULL,
  from_agent TEXT NOT NULL, to_agent TEXT NOT NULL, action TEXT NOT NULL, subject TEXT NOT NULL,
  body TEXT NOT NULL, attachments TEXT NOT NULL, is_read INTEGER NOT NULL,
  parent_id TEXT, created_at TEXT NOT NULL, seq INTEGER NOT NULL);
"""
)
keys = {}
for entry in opts.user:
    name, key = entry.split(":", 1)
    keys[key] = name


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def record(entry):
    with open(opts.record, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Invalid(Exception):
    pass


def check(body, fields):
    """Pydantic's checks for a model: required fields present, types as declared."""
    if not isinstance(body, dict):
        raise Invalid("body is not an object")
    out = {}
    for name, kinds, default in fields:
        if name not in body:
            if default is REQUIRED:
                raise Invalid(f"{name}: field required")
            out[name] = default
            continue
        value = body[name]
        if not any(k(value) for k in kinds):
            raise Invalid(f"{name}: wrong type {type(value).__name__}")
        out[name] = value
    return out


REQUIRED = object()
is_str = lambda v: isinstance(v, str)  # noqa: E731
is_none = lambda v: v is None  # noqa: E731
is_str_list = lambda v: isinstance(v, list) and all(isinstance(i, (str, dict)) for i in v)  # noqa: E731

SEND_REQUEST = [
    ("agent_id", [is_str], REQUIRED),
    ("from_agent", [is_str], REQUIRED),
    ("to_agent", [is_str, lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v)], REQUIRED),
    ("action", [is_str], "send"),
    ("subject", [is_str], ""),
    ("body", [is_str], ""),
    ("attachments", [is_str_list], []),
    ("parent_id", [is_str, is_none], None),
    ("forward_scope", [lambda v: v in ("message", "thread"), is_none], None),
]
REGISTER_REQUEST = [
    ("name", [is_str], REQUIRED),
    ("address", [is_str, is_none], None),
    ("role", [is_str], REQUIRED),
    ("description", [is_str], ""),
    ("system_prompt", [is_str], REQUIRED),
]


def message(row):
    return {
        "id": row["id"],
        "thread_id": row["thread_id"],
        "from_agent": row["from_agent"],
        "to_agent": row["to_agent"],
        "action": row["action"],
        "subject": row["subject"],
        "body": row["body"],
        "body_html": "<p>%s</p>" % row["body"],
        "attachments": json.loads(row["attachments"]),
        "is_read": bool(row["is_read"]),
        "parent_id": row["parent_id"],
        "created_at": row["created_at"],
    }


class Fail(Exception):
    def __init__(self, status, detail):
        self.status, self.detail = status, detail


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def handle_any(self, method):
        url = urllib.parse.urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = None
        entry = {"method": method, "path": url.path, "query": url.query}
        try:
            user = keys.get(self.headers.get("X-API-Key", ""))
            if user is None:
                raise Fail(401, "Invalid or missing API key")
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError:
                    raise Invalid("body is not JSON")
            entry["body"] = body
            with lock:
                status, out = self.route(method, url, body, user)
        except Invalid as e:
            entry["invalid"] = str(e)
            status, out = 422, {"detail": str(e)}
        except Fail as e:
            status, out = e.status, {"detail": e.detail}
        entry["status"] = status
        if (
            opts.stall_first_reply
            and not stalled.is_set()
            and method == "POST"
            and status == 200
            and isinstance(body, dict)
            and body.get("action") == "reply"
        ):
            stalled.set()
            entry["stalled"] = True
            record(entry)
            threading.Event().wait()
        record(entry)
        data = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PATCH(self):
        self.handle_any("PATCH")

    def owned(self, user, agent_id, address=None):
        row = db.execute("SELECT * FROM agents WHERE id = ?", (agent_id,)).fetchone()
        if row is None:
            raise Fail(404, f"Agent '{agent_id}' not found")
        if row["user"] != user:
            raise Fail(403, "Agent does not belong to this API key's user")
        if address is not None and row["address"] != address:
            raise Fail(403, f"Agent '{agent_id}' does not own address '{address}'")
        return row

    def route(self, method, url, body, user):
        parts = [p for p in url.path.split("/") if p]
        query = dict(urllib.parse.parse_qsl(url.query))
        if method == "POST" and parts == ["agents", "register"]:
            req = check(body, REGISTER_REQUEST)
            address = req["address"] or f"{req['name']}@{user}.{opts.domain}"
            if not address.endswith(f"@{user}.{opts.domain}"):
                raise Fail(400, f"address must end with @{user}.{opts.domain}")
            if db.execute("SELECT 1 FROM agents WHERE address = ?", (address,)).fetchone():
                raise Fail(409, "address taken")
            agent = (str(uuid.uuid4()), user, req["name"], address, req["role"], req["description"], req["system_prompt"], now())
            db.execute("INSERT INTO agents VALUES (?, ?, ?, ?, ?, ?, ?, ?)", agent)
            db.commit()
            keys_ = ["id", "user", "name", "address", "role", "description", "system_prompt", "created_at"]
            out = dict(zip(keys_, agent))
            out.pop("user")
            out.update(tags=[], last_seen=None, status="active", team_id=None)
            return 200, out
        if method == "POST" and parts == ["messages", "send"]:
            req = check(body, SEND_REQUEST)
            self.owned(user, req["agent_id"], req["from_agent"])
            recipients = req["to_agent"] if isinstance(req["to_agent"], list) else [req["to_agent"]]
            for addr in recipients:
                row = db.execute("SELECT user FROM agents WHERE address = ?", (addr,)).fetchone()
                if row is None:
                    raise Fail(404, f"Recipient address '{addr}' not found")
                if row["user"] != user:
                    raise Fail(403, "Cross-tenant mail is not allowed")
            if req["action"] != "send" and not req["parent_id"]:
                raise Fail(400, "parent_id is required for reply/forward")
            if req["action"] == "send":
                thread_id = str(uuid.uuid4())
            else:
                parent = db.execute("SELECT thread_id FROM messages WHERE id = ?", (req["parent_id"],)).fetchone()
                if parent is None:
                    raise Fail(404, "Parent message not found")
                thread_id = parent["thread_id"]
            out = []
            for addr in recipients:
                seq = db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
                row = (str(uuid.uuid4()), thread_id, req["from_agent"], addr, req["action"], req["subject"],
                       req["body"], json.dumps(req["attachments"]), 0, req["parent_id"], now(), seq)
                db.execute("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
                out.append(message(db.execute("SELECT * FROM messages WHERE id = ?", (row[0],)).fetchone()))
            db.commit()
            return 200, out[0] if len(out) == 1 else out
        if method == "GET" and len(parts) == 3 and parts[:2] == ["messages", "inbox"]:
            address = urllib.parse.unquote(parts[2])
            if "agent_id" not in query:
                raise Invalid("agent_id: field required")
            self.owned(user, query["agent_id"], address)
            unread = "" if query.get("all") == "true" else "AND is_read = 0"
            rows = db.execute(f"SELECT * FROM messages WHERE to_agent = ? {unread} ORDER BY seq", (address,)).fetchall()
            return 200, [message(r) for r in rows]
        if method == "GET" and len(parts) == 3 and parts[:2] == ["messages", "thread"]:
            rows = db.execute("SELECT * FROM messages WHERE thread_id = ? ORDER BY seq", (parts[2],)).fetchall()
            mine = {r["address"] for r in db.execute("SELECT address FROM agents WHERE user = ?", (user,))}
            if not rows or not any(r["from_agent"] in mine or r["to_agent"] in mine for r in rows):
                raise Fail(404, "Thread not found")
            return 200, [message(r) for r in rows]
        if method == "PATCH" and len(parts) == 3 and parts[0] == "messages" and parts[2] in ("read", "unread"):
            row = db.execute("SELECT * FROM messages WHERE id = ?", (parts[1],)).fetchone()
            if row is None:
                raise Fail(404, "Message not found")
            owner = db.execute("SELECT user FROM agents WHERE address = ?", (row["to_agent"],)).fetchone()
            if owner is None or owner["user"] != user:
                raise Fail(403, "Only the recipient's owner may do this")
            db.execute("UPDATE messages SET is_read = ? WHERE id = ?", (1 if parts[2] == "read" else 0, parts[1]))
            db.commit()
            return 200, message(db.execute("SELECT * FROM messages WHERE id = ?", (parts[1],)).fetchone())
        raise Fail(404, "Not Found")


server = ThreadingHTTPServer(("127.0.0.1", opts.port), Handler)
server.daemon_threads = True
print("listening", opts.port, flush=True)
server.serve_forever()
