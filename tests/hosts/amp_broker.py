#!/usr/bin/env python3
"""A small AMP (Agent Mailer Protocol) broker for tests, written from the published API of
study8677/agent-mailer (see docs/mailboxes/amp.md): the agent-facing routes only, with the
same request and response shapes, the same identity checks and the same faults (no
idempotency: the same send twice is two messages).

    amp_broker.py --port N --db FILE --record FILE --user NAME:KEY [--user NAME:KEY ...]
                  [--stall-first-reply] [--render-ms-per-kb MS] [--huge-bodies]

Every agent call needs `X-API-Key`; a key belongs to a user, and a user's agents are its
tenant (mail across tenants is refused with 403). With `--huge-bodies`, a message whose body
is `@@HUGE:N@@` is returned by GET and PATCH with a body (and body_html) of N bytes, made as
they are sent (a message too large to keep in a test's memory, issue 43). A user logs in to the console with the
password `pw-NAME` and gets a session token (Bearer) for the /users and /admin routes; keys
made there work like the ones on the command line, until deactivated. State is kept in the
SQLite file, so the broker can be stopped and started again. Every request is appended to the
record file as a JSON line {method, path, status, body}; a request whose body does not match
the API's shapes is refused with 422 and recorded with "invalid": the tests assert there are
none.

Like the real broker (46ca115), every request is served by one event loop (one at a time),
and every message returned is rendered to HTML first: `--render-ms-per-kb` is what that costs
(the real one: about 4.5 ms per KB of markdown, 26 s for 1 MB). Inbox and thread are ordered
by `created_at` (an ISO string, compared as text); archived and trashed threads and trashed
messages are hidden from the inbox; a person reading a message in the console marks it read.

  POST  /agents/register                 {name, address?, role, description?, system_prompt}
  POST  /messages/send                   SendRequest -> MessageResponse (or a list)
  GET   /messages/inbox/{address}?agent_id=..[&all=true]   unread (or all), oldest first
        ...&page=P&page_size=S (1..100)  {messages, total, page, page_size, total_pages},
                                         newest first
  GET   /messages/thread/{thread_id}     oldest first (trashed messages hidden)
  PATCH /messages/{id}/read | /unread
  POST  /users/login                     {username, password} -> {token, user}
  POST  /users/api-keys                  {name} -> {id, raw_key, ...}     (session token)
  POST  /users/api-keys/{id}/deactivate                                   (session token)
  POST  /users/api-keys/{id}/reactivate                                   (session token)
  PATCH /admin/messages/{id}/read        the console opening a message    (session token)
  POST  /admin/threads/{id}/archive | /trash, /admin/messages/{id}/trash  (session token)
"""
import argparse
import datetime
import json
import re
import sqlite3
import threading
import time
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
args.add_argument("--render-ms-per-kb", type=float, default=0.0)
# Every message whose subject is this is returned without its from_agent (issue 36).
args.add_argument("--malformed-subject", default=None)
# A body `@@HUGE:N@@` is returned by GET and PATCH as N bytes of "x", made while sent (issue 43).
args.add_argument("--huge-bodies", action="store_true")
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
CREATE TABLE IF NOT EXISTS api_keys (id TEXT PRIMARY KEY, user TEXT NOT NULL, key TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL, is_active INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS archived_threads (thread_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS trashed_threads (thread_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS trashed_messages (message_id TEXT PRIMARY KEY);
"""
)
users = set()
for entry in opts.user:
    name, key = entry.split(":", 1)
    users.add(name)
    db.execute("INSERT OR IGNORE INTO api_keys VALUES (?, ?, ?, 'command line', 1)", (str(uuid.uuid4()), name, key))
db.commit()
sessions = {}  # session token -> user

VISIBLE = (
    "thread_id NOT IN (SELECT thread_id FROM archived_threads) "
    "AND thread_id NOT IN (SELECT thread_id FROM trashed_threads) "
    "AND id NOT IN (SELECT message_id FROM trashed_messages)"
)


def key_user(key):
    row = db.execute("SELECT user FROM api_keys WHERE key = ? AND is_active = 1", (key,)).fetchone()
    return row["user"] if row else None


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


rendered = [0]  # bytes rendered by the request being served (under the lock)


def message(row):
    # The real broker renders every message it returns (markdown to HTML), in its one loop.
    rendered[0] += len(row["body"])
    if opts.render_ms_per_kb:
        time.sleep(len(row["body"]) / 1024 * opts.render_ms_per_kb / 1000)
    out = {
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
    # A fault for tests (issue 36), as a proxy that alters the broker's answers would make it.
    if opts.malformed_subject is not None and row["subject"] == opts.malformed_subject:
        del out["from_agent"]
    return out


HUGE = re.compile(rb"@@HUGE:(\d+)@@")
BLOCK = memoryview(b"x" * (1 << 20))


def write_answer(handler, status, content_type, parts):
    """Sends `parts` (JSON text, then a size, then text...: HUGE.split of the answer) with each
    size sent as that many bytes of "x", made while written: a 150 MB body is never held."""
    length = sum(len(p) if i % 2 == 0 else int(p) for i, p in enumerate(parts))
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(length))
    handler.end_headers()
    for i, part in enumerate(parts):
        if i % 2 == 0:
            handler.wfile.write(part)
            continue
        left = int(part)
        while left > 0:
            handler.wfile.write(BLOCK[: min(left, len(BLOCK))])
            left -= len(BLOCK)


files = {}  # uploaded files: id -> (filename, mime_type, bytes)


class Answered(Exception):
    """A route that answered before the JSON routes (an upload)."""

    def __init__(self, status, out):
        self.status, self.out = status, out


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
        entry = {"method": method, "path": url.path, "query": url.query, "ua": self.headers.get("User-Agent", "")}
        try:
            if method == "POST" and url.path == "/files/upload":
                user = key_user(self.headers.get("X-API-Key", ""))
                if user is None:
                    raise Fail(401, "Authentication required")
                status, out = self.upload(raw, user)
                entry["upload"] = {k: out.get(k) for k in ("filename", "mime_type", "size")} if status == 200 else out
                raise Answered(status, out)
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError:
                    raise Invalid("body is not JSON")
            entry["body"] = body
            with lock:
                rendered[0] = 0
                if url.path.startswith(("/users/", "/admin/")):
                    status, out = self.console(method, url, body)
                else:
                    user = key_user(self.headers.get("X-API-Key", ""))
                    if user is None:
                        raise Fail(401, "Invalid or missing API key")
                    status, out = self.route(method, url, body, user)
                entry["rendered_bytes"] = rendered[0]
        except Invalid as e:
            entry["invalid"] = str(e)
            status, out = 422, {"detail": str(e)}
        except Fail as e:
            status, out = e.status, {"detail": e.detail}
        except Answered as e:
            status, out = e.status, e.out
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
        huge = opts.huge_bodies and method in ("GET", "PATCH")
        write_answer(self, status, "application/json", HUGE.split(data) if huge else [data])

    def upload(self, raw, user):
        """`POST /files/upload` as agent-mailer's routes/files.py: one multipart `file` field;
        only PNG, JPEG, GIF and WebP (told by their first bytes), at most 10 MB; else 400."""
        ctype = self.headers.get("Content-Type", "")
        if "boundary=" not in ctype:
            raise Invalid("file: field required")
        boundary = ctype.split("boundary=", 1)[1].strip('"').encode()
        for part in raw.split(b"--" + boundary):
            head, _, data = part.partition(b"\r\n\r\n")
            if b'name="file"' not in head:
                continue
            data = data[:-2] if data.endswith(b"\r\n") else data
            name = re.search(rb'filename="([^"]*)"', head)
            filename = name.group(1).decode() if name else "untitled"
            if len(data) > 10 * 1024 * 1024:
                return 400, {"detail": "File too large: %d bytes. Maximum: 10485760 bytes (10MB)" % len(data)}
            mime = None
            for sig, kind in ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
                              (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif")):
                if data.startswith(sig):
                    mime = kind
            if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
                mime = "image/webp"
            if mime is None:
                return 400, {"detail": "Unsupported file type. Allowed: PNG, JPG, GIF, WebP"}
            fid = str(uuid.uuid4())
            files[fid] = (filename, mime, data)
            return 200, {"id": fid, "filename": filename, "mime_type": mime, "size": len(data),
                         "url": "http://127.0.0.1:%d/files/%s" % (opts.port, fid)}
        raise Invalid("file: field required")

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PATCH(self):
        self.handle_any("PATCH")

    def console(self, method, url, body):
        """The console's routes: a session token from /users/login."""
        parts = [p for p in url.path.split("/") if p]
        if method == "POST" and parts == ["users", "login"]:
            if not isinstance(body, dict) or not isinstance(body.get("username"), str) or not isinstance(body.get("password"), str):
                raise Invalid("username and password required")
            if body["username"] not in users or body["password"] != "pw-" + body["username"]:
                raise Fail(401, "Invalid username or password")
            token = str(uuid.uuid4())
            sessions[token] = body["username"]
            return 200, {"token": token, "user": {"username": body["username"]}}
        auth = self.headers.get("Authorization", "")
        user = sessions.get(auth[7:]) if auth.startswith("Bearer ") else None
        if user is None:
            raise Fail(401, "Not authenticated")
        if method == "POST" and parts == ["users", "api-keys"]:
            if not isinstance(body, dict) or not isinstance(body.get("name"), str):
                raise Invalid("name: field required")
            key_id, raw_key = str(uuid.uuid4()), "amk_" + uuid.uuid4().hex
            db.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, 1)", (key_id, user, raw_key, body["name"]))
            db.commit()
            return 201, {"id": key_id, "name": body["name"], "key_prefix": raw_key[:8] + "..." + raw_key[-4:],
                         "created_at": now(), "last_used_at": None, "is_active": True, "raw_key": raw_key}
        if method == "POST" and len(parts) == 4 and parts[:2] == ["users", "api-keys"] and parts[3] == "deactivate":
            cur = db.execute("UPDATE api_keys SET is_active = 0 WHERE id = ? AND user = ?", (parts[2], user))
            db.commit()
            if not cur.rowcount:
                raise Fail(404, "API key not found")
            return 200, {"detail": "API key deactivated"}
        if method == "POST" and len(parts) == 4 and parts[:2] == ["users", "api-keys"] and parts[3] == "reactivate":
            # As agent-mailer's routes/users.py: the recoverable counterpart of deactivate.
            cur = db.execute("UPDATE api_keys SET is_active = 1 WHERE id = ? AND user = ?", (parts[2], user))
            db.commit()
            if not cur.rowcount:
                raise Fail(404, "API key not found")
            return 200, {"detail": "API key activated"}
        if method == "PATCH" and len(parts) == 4 and parts[:2] == ["admin", "messages"] and parts[3] == "read":
            row = db.execute("SELECT * FROM messages WHERE id = ?", (parts[2],)).fetchone()
            if row is None:
                raise Fail(404, "Message not found")
            db.execute("UPDATE messages SET is_read = 1 WHERE id = ?", (parts[2],))
            db.commit()
            return 200, message(db.execute("SELECT * FROM messages WHERE id = ?", (parts[2],)).fetchone())
        if method == "POST" and len(parts) == 4 and parts[:2] == ["admin", "threads"] and parts[3] in ("archive", "trash"):
            table = {"archive": "archived_threads", "trash": "trashed_threads"}[parts[3]]
            db.execute(f"INSERT OR IGNORE INTO {table} VALUES (?)", (parts[2],))
            db.commit()
            return 200, {"thread_id": parts[2], parts[3] + "d": True}
        if method == "POST" and len(parts) == 4 and parts[:2] == ["admin", "messages"] and parts[3] == "trash":
            db.execute("INSERT OR IGNORE INTO trashed_messages VALUES (?)", (parts[2],))
            db.commit()
            return 200, {"message_id": parts[2], "trashed": True}
        raise Fail(404, "Not Found")

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
            where = f"to_agent = ? {unread} AND {VISIBLE}"
            if "page" in query:
                page, size = query["page"], query.get("page_size", "20")
                if not page.isdigit() or int(page) < 1:
                    raise Invalid("page: must be >= 1")
                if not size.isdigit() or not 1 <= int(size) <= 100:
                    raise Invalid("page_size: must be 1..100")
                page, size = int(page), int(size)
                total = db.execute(f"SELECT COUNT(*) FROM messages WHERE {where}", (address,)).fetchone()[0]
                rows = db.execute(f"SELECT * FROM messages WHERE {where} ORDER BY created_at DESC LIMIT ? OFFSET ?",
                                  (address, size, (page - 1) * size)).fetchall()
                return 200, {"messages": [message(r) for r in rows], "total": total, "page": page,
                             "page_size": size, "total_pages": max(1, -(-total // size))}
            rows = db.execute(f"SELECT * FROM messages WHERE {where} ORDER BY created_at", (address,)).fetchall()
            return 200, [message(r) for r in rows]
        if method == "GET" and len(parts) == 3 and parts[:2] == ["messages", "thread"]:
            rows = db.execute("SELECT * FROM messages WHERE thread_id = ? AND id NOT IN (SELECT message_id FROM trashed_messages) ORDER BY created_at", (parts[2],)).fetchall()
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
opts.port = server.server_address[1]  # --port 0: the one the OS gave
server.daemon_threads = True
print("listening", opts.port, flush=True)
server.serve_forever()
