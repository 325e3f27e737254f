#!/usr/bin/env python3
"""A small ASMTP operator for tests, written from the wire rules of the reference operator
(RobotNetworks/robonet-cli `src/operator`, see docs/mailboxes/asmtp.md): the agent routes
a bridge uses, with their validation, keyset pagination, read state, idempotent resend and the
`/connect` WebSocket that pushes `envelope.notify` frames (push only: no replay on connect).

    asmtp_operator.py --port N --db FILE --record FILE --agent @owner.name:TOKEN [...]
                      [--allow @owner.name=ENTRY ...] [--open @owner.name ...]
                      [--stall-first-reply] [--frozen-clock MS] [--no-size-hint]
                      [--admin-token TOKEN] [--malformed-subject SUBJECT] [--huge-bodies]

As the reference operator (3ab187e): an agent's inbound policy is `allowlist` unless made
`open`, and an envelope is refused with 404 (never 403) unless each recipient can be reached
*both ways* (each lists the other, or `@owner.*`) and has not blocked the sender; request bodies
over 1 MiB are cut off (the connection is closed, no HTTP answer); `POST /files` takes up to
10 MiB and a content part may then name its `file_id`; `created_at` is `Date.now()`, so it can
tie (`--frozen-clock` makes every envelope tie); the push socket also carries `monitor.fact`
frames for a sender that asked (`monitor` on the envelope), and SIGTERM closes every socket
with code 1001. `--no-size-hint` stores rows without `size_hint` (older operators).
`--huge-bodies`: a text part `@@HUGE:N@@` is returned by GET as N bytes, made as they are sent,
while its row's `size_hint` is the stored part's (a hint that understates, issue 43).

Every request and every push frame is appended to the record file as a JSON line; a request
or frame that breaks the rules is recorded with "invalid" (the tests assert there are none).
State is kept in the SQLite file, so the operator can be stopped and started again.

A fault for tests, as a proxy that alters the operator's answers would make it (issue 36):
`--malformed-subject S` returns every envelope whose subject is S without its `from` (in
`GET /messages` and `GET /messages/{id}`), and the `/mailbox` rows listed with it carry an extra
row with no `created_at`.

  POST /messages                       envelope (client id, no from) -> 202
  GET  /messages?ids=a,b               {envelopes: [...]}, marks read
  GET  /messages/{id}                  the envelope, marks read
  GET  /mailbox?direction=in|out&order=asc|desc&limit=&unread=true|false&after_created_at=&after_envelope_id=
  POST /mailbox/read                   {ids: [...]}
  POST /files                          multipart/form-data, one `file` field -> 201 {id, ...}
  GET  /files/{id}                     the bytes (uploader, or a party to its envelope)
  GET  /agents/me                      {canonical_handle, id, local_name, namespace, ...}
  GET|POST /agents/me/allowlist        {entries: [...]}; DELETE /agents/me/allowlist/{entry}
  POST /agents/me/blocks               {handle}
  POST /_admin/agents/{handle}/rotate-token   (Authorization: Bearer ADMIN_TOKEN) -> {token}
  GET  /connect                        WebSocket (Authorization: Bearer, or ?token=)

What it leaves out: agent registration and profiles, search, direction=out/both feeds, magic
byte checks on uploads, file expiry, and storage of tokens (a rotated token lasts until the
operator stops).
"""
import argparse
import base64
import hashlib
import json
import os
import re
import signal
import sqlite3
import struct
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = argparse.ArgumentParser()
args.add_argument("--port", type=int, required=True)
args.add_argument("--db", required=True)
args.add_argument("--record", required=True)
args.add_argument("--agent", action="append", default=[], help="@owner.name:TOKEN")
args.add_argument("--stall-first-reply", action="store_true")
args.add_argument("--allow", action="append", default=[], help="@owner.name=ENTRY")
args.add_argument("--open", action="append", default=[], help="@owner.name")
args.add_argument("--frozen-clock", type=int, default=None)
args.add_argument("--no-size-hint", action="store_true")
args.add_argument("--admin-token", default=None)
args.add_argument("--malformed-subject", default=None)
# A text part `@@HUGE:N@@` is returned by GET as N bytes of "x", made while sent; its row's
# size_hint is the stored part's, so it understates the envelope (issue 43).
args.add_argument("--huge-bodies", action="store_true")
opts = args.parse_args()

MAX_BODY = 1 << 20
MAX_FILE = 10 * 1024 * 1024

ENVELOPE_ID = re.compile(r"^01[0-9A-HJKMNP-TV-Z]{24}\Z")
HANDLE = re.compile(r"^@[a-z0-9_-]+\.[a-z0-9_-]+\Z")
MONITOR = re.compile(r"^mon_[0-9A-Za-z_-]{1,64}\Z")
tokens = {}
for entry in opts.agent:
    handle, token = entry.rsplit(":", 1)
    assert HANDLE.match(handle), handle
    tokens[token] = handle

lock = threading.Lock()
stalled = threading.Event()
db = sqlite3.connect(opts.db, check_same_thread=False)
db.row_factory = sqlite3.Row
db.executescript(
    """
CREATE TABLE IF NOT EXISTS envelopes (id TEXT PRIMARY KEY, sender TEXT NOT NULL, subject TEXT,
  in_reply_to TEXT, date_ms INTEGER NOT NULL, created_at INTEGER NOT NULL, type_hint TEXT NOT NULL,
  size_hint INTEGER, body_json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS mailbox (handle TEXT NOT NULL, envelope_id TEXT NOT NULL,
  created_at INTEGER NOT NULL, unread INTEGER NOT NULL, PRIMARY KEY (handle, envelope_id));
CREATE TABLE IF NOT EXISTS allowlist (owner TEXT NOT NULL, entry TEXT NOT NULL, PRIMARY KEY (owner, entry));
CREATE TABLE IF NOT EXISTS blocks (blocker TEXT NOT NULL, blocked TEXT NOT NULL, PRIMARY KEY (blocker, blocked));
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, owner TEXT NOT NULL, filename TEXT NOT NULL,
  content_type TEXT NOT NULL, bytes BLOB NOT NULL, envelope_id TEXT);
"""
)
for entry in opts.allow:
    owner, allowed = entry.split("=", 1)
    db.execute("INSERT OR IGNORE INTO allowlist VALUES (?, ?)", (owner, allowed))
db.commit()


def reachable(sender, target):
    if target in opts.open:
        return True
    entries = {r["entry"] for r in db.execute("SELECT entry FROM allowlist WHERE owner = ?", (target,))}
    return sender in entries or sender.split(".", 1)[0] + ".*" in entries


def can_initiate(initiator, peer):
    if initiator == peer:
        return peer in tokens.values()
    return reachable(initiator, peer) and reachable(peer, initiator)
sockets = {}  # handle -> list of (socket, lock)
last_ms = [0]


HUGE = re.compile(rb"@@HUGE:(\d+)@@")
BLOCK = memoryview(b"x" * (1 << 20))


def record(entry):
    with open(opts.record, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Fail(Exception):
    def __init__(self, status, code, message):
        self.status, self.code, self.message = status, code, message


def bad(code, message):
    return Fail(400, code, message)


def now_ms():
    if opts.frozen_clock is not None:
        return opts.frozen_clock
    # Strictly increasing, so keyset order is the order of acceptance.
    with lock:
        t = max(int(time.time() * 1000), last_ms[0] + 1)
        last_ms[0] = t
        return t


def envelope_id(value, field):
    if not isinstance(value, str) or not ENVELOPE_ID.match(value):
        raise bad("INVALID_ENVELOPE_ID", f"{field} must be a 26-char Crockford-base32 ULID")
    return value


def handles(value, field):
    if not isinstance(value, list) or not value:
        raise bad("INVALID_REQUEST", f"{field} must be a non-empty array of handles")
    for i, h in enumerate(value):
        if not isinstance(h, str) or not HANDLE.match(h):
            raise bad("INVALID_HANDLE", f"{field}[{i}] must match @<owner>.<name>")
    return value


def content_parts(value):
    if not isinstance(value, list) or not value:
        raise bad("INVALID_CONTENT", "content_parts must be a non-empty array")
    for i, part in enumerate(value):
        if not isinstance(part, dict):
            raise bad("INVALID_CONTENT", f"content_parts[{i}] must be an object")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str) or not part["text"]:
                raise bad("INVALID_CONTENT", f"content_parts[{i}].text must be a non-empty string")
        elif kind in ("image", "file"):
            if isinstance(part.get("file_id"), str):
                continue
            if not isinstance(part.get("url"), str) or part["url"].startswith("data:"):
                raise bad("INVALID_CONTENT", f"content_parts[{i}] needs a url or a file_id (not data:)")
        elif kind == "data":
            if not isinstance(part.get("data"), dict):
                raise bad("INVALID_CONTENT", f"content_parts[{i}].data must be a JSON object")
        else:
            raise bad("INVALID_CONTENT", f"content_parts[{i}].type must be one of text/image/file/data")
    return value


def check_frame(frame):
    """The envelope.notify shape (a /mailbox row), or a monitor.fact."""
    problems = []
    if frame.get("op") == "monitor.fact":
        for key in ("monitor", "envelope_id", "recipient_handle", "fact", "at_ms"):
            if key not in frame:
                problems.append(key)
        return problems
    if frame.get("op") != "envelope.notify":
        problems.append("op")
    if not ENVELOPE_ID.match(frame.get("id", "")):
        problems.append("id")
    if not HANDLE.match(frame.get("from", "")):
        problems.append("from")
    if not isinstance(frame.get("to"), list) or not all(HANDLE.match(h) for h in frame["to"]):
        problems.append("to")
    for key in ("created_at", "date_ms", "size_hint"):
        if key == "size_hint" and key not in frame:
            continue
        if not isinstance(frame.get(key), int) or frame[key] < 0:
            problems.append(key)
    if frame.get("type_hint") not in ("text", "image", "file", "data", "mixed"):
        problems.append("type_hint")
    return problems


def malformed(envelope):
    """The envelope as --malformed-subject alters it."""
    if opts.malformed_subject is not None and envelope.get("subject") == opts.malformed_subject:
        envelope = dict(envelope)
        envelope.pop("from", None)
    return envelope


def header_of(row):
    body = json.loads(row["body_json"])
    frame = {
        "op": "envelope.notify",
        "id": row["id"],
        "from": row["sender"],
        "to": body["to"],
        "type_hint": row["type_hint"],
        "created_at": row["created_at"],
        "date_ms": row["date_ms"],
    }
    if row["subject"] is not None:
        frame["subject"] = row["subject"]
    if row["in_reply_to"] is not None:
        frame["in_reply_to"] = row["in_reply_to"]
    if row["size_hint"] is not None:
        frame["size_hint"] = row["size_hint"]
    if "cc" in body:
        frame["cc"] = body["cc"]
    if row["subject"] is not None:
        frame["subject"] = row["subject"]
    if row["in_reply_to"] is not None:
        frame["in_reply_to"] = row["in_reply_to"]
    return frame


def ws_frame(text):
    data = text.encode()
    head = bytes([0x81])
    if len(data) < 126:
        head += bytes([len(data)])
    elif len(data) < 65536:
        head += bytes([126]) + struct.pack(">H", len(data))
    else:
        head += bytes([127]) + struct.pack(">Q", len(data))
    return head + data


def push(handle, frame):
    problems = check_frame(frame)
    entry = {"push": handle, "frame": frame}
    if problems:
        entry["invalid"] = problems
    record(entry)
    for sock, slock in list(sockets.get(handle, [])):
        try:
            with slock:
                sock.sendall(ws_frame(json.dumps(frame)))
        except OSError:
            pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def caller(self, query):
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else query.get("token", "")
        handle = tokens.get(token)
        if handle is None:
            raise Fail(401, "UNAUTHORIZED", "missing or invalid bearer token")
        return handle

    def reply(self, status, body):
        data = json.dumps(body).encode()
        parts = HUGE.split(data) if opts.huge_bodies and self.command == "GET" else [data]
        # Each size in `parts` is sent as that many bytes of "x", made while written: a
        # 30 MB envelope is never held.
        length = sum(len(p) if i % 2 == 0 else int(p) for i, p in enumerate(parts))
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        for i, part in enumerate(parts):
            if i % 2 == 0:
                self.wfile.write(part)
                continue
            left = int(part)
            while left > 0:
                self.wfile.write(BLOCK[: min(left, len(BLOCK))])
                left -= len(BLOCK)

    def handle_any(self, method):
        url = urllib.parse.urlparse(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(self.headers.get("Content-Length") or 0)
        entry = {"method": method, "path": url.path, "query": url.query}
        cap = MAX_FILE + 64 * 1024 if url.path == "/files" else MAX_BODY
        if length > cap:
            # As the reference: the request is destroyed once the body passes the cap. No
            # HTTP answer at all.
            self.rfile.read(cap)
            entry.update(cut=True, length=length)
            record(entry)
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        raw = self.rfile.read(length) if length else b""
        try:
            if method == "GET" and url.path == "/connect":
                handle = self.caller(query)
                record({"method": "GET", "path": "/connect", "status": 101, "handle": handle})
                return self.websocket(handle)
            if url.path.startswith("/_admin/"):
                status, out = self.admin(method, url.path)
                entry["status"] = status
                record(entry)
                return self.reply(status, out)
            handle = self.caller(query)
            if method == "POST" and url.path == "/files":
                status, out = self.upload(raw, handle)
                entry["status"] = status
                entry["file"] = out.get("id") if isinstance(out, dict) else None
                record(entry)
                return self.reply(status, out)
            if method == "GET" and url.path.startswith("/files/"):
                return self.download(url.path.split("/")[2], handle, entry)
            body = None
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError:
                    raise bad("INVALID_JSON", "request body is not valid JSON")
                if not isinstance(body, dict):
                    raise bad("INVALID_JSON", "request body must be a JSON object")
            entry["body"] = body
            status, out = self.route(method, url.path, query, body or {}, handle)
        except Fail as e:
            status, out = e.status, {"error": {"code": e.code, "message": e.message}}
            if e.status == 400:
                entry["invalid"] = e.message
        entry["status"] = status
        if (
            opts.stall_first_reply
            and not stalled.is_set()
            and method == "POST"
            and status == 202
            and isinstance(entry.get("body"), dict)
            and entry["body"].get("in_reply_to")
        ):
            stalled.set()
            entry["stalled"] = True
            record(entry)
            threading.Event().wait()
        record(entry)
        self.reply(status, out)

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_DELETE(self):
        self.handle_any("DELETE")

    def admin(self, method, path):
        auth = self.headers.get("Authorization", "")
        if opts.admin_token is None or auth != "Bearer " + opts.admin_token:
            return 401, {"error": {"code": "UNAUTHORIZED", "message": "admin token required"}}
        parts = [p for p in path.split("/") if p]
        if method == "POST" and len(parts) == 4 and parts[1] == "agents" and parts[3] == "rotate-token":
            handle = urllib.parse.unquote(parts[2])
            old = [t for t, h in tokens.items() if h == handle]
            if not old:
                return 404, {"error": {"code": "NOT_FOUND", "message": "not found"}}
            for t in old:
                del tokens[t]
            fresh = "tok_" + hashlib.sha256(str(time.time()).encode() + handle.encode()).hexdigest()[:32]
            tokens[fresh] = handle
            return 200, {"handle": handle, "token": fresh}
        return 404, {"error": {"code": "NOT_FOUND", "message": "not found"}}

    def upload(self, raw, caller):
        ctype = self.headers.get("Content-Type", "")
        m = re.search(r'boundary=(?:"([^"]+)"|([^;]+))', ctype, re.I)
        if not ctype.lower().startswith("multipart/form-data") or not m:
            return 400, {"error": {"code": "INVALID_REQUEST", "message": "Content-Type must be multipart/form-data with a boundary"}}
        boundary = (m.group(1) or m.group(2)).strip().encode()
        start = raw.find(b"--" + boundary + b"\r\n")
        end = raw.find(b"\r\n--" + boundary, start + 1)
        head_end = raw.find(b"\r\n\r\n", start)
        if start < 0 or end < 0 or head_end < 0 or head_end > end:
            return 400, {"error": {"code": "INVALID_REQUEST", "message": "multipart: malformed"}}
        headers = raw[start + len(boundary) + 4:head_end].decode("utf-8", "replace")
        data = raw[head_end + 4:end]
        name = re.search(r'\bname="([^"]+)"', headers)
        filename = re.search(r'\bfilename="([^"]+)"', headers)
        part_type = re.search(r"(?im)^content-type:\s*(\S+)", headers)
        if not name or name.group(1) != "file" or not filename:
            return 400, {"error": {"code": "INVALID_REQUEST", "message": "multipart: one `file` field with a filename"}}
        content_type = part_type.group(1) if part_type else "application/octet-stream"
        if content_type not in ("application/json", "application/pdf", "image/gif", "image/jpeg", "image/png",
                                "text/csv", "text/markdown", "text/plain", "application/octet-stream"):
            return 400, {"error": {"code": "INVALID_FILE", "message": "content type not allowed"}}
        if not data:
            return 400, {"error": {"code": "INVALID_FILE", "message": "file cannot be empty"}}
        if len(data) > MAX_FILE:
            return 400, {"error": {"code": "INVALID_FILE", "message": "file exceeds maximum size of 10MB"}}
        fid = "file_" + hashlib.sha256(data + str(time.time()).encode()).hexdigest()[:26].upper()
        safe = re.sub(r"[^A-Za-z0-9._ -]+", "_", filename.group(1).split("/")[-1])[:180] or "file"
        with lock:
            db.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, NULL)", (fid, caller, safe, content_type, data))
            db.commit()
        now = int(time.time() * 1000)
        return 201, {"id": fid, "status": "ready", "filename": safe, "content_type": content_type,
                     "size_bytes": len(data), "created_at": now, "expires_at": now + 86400000}

    def download(self, fid, caller, entry):
        with lock:
            row = db.execute("SELECT * FROM files WHERE id = ?", (fid,)).fetchone()
            allowed = row is not None and (
                row["owner"] == caller
                or (row["envelope_id"] is not None and (
                    db.execute("SELECT 1 FROM mailbox WHERE handle = ? AND envelope_id = ?", (caller, row["envelope_id"])).fetchone()
                    or db.execute("SELECT 1 FROM envelopes WHERE id = ? AND sender = ?", (row["envelope_id"], caller)).fetchone())))
        entry["status"] = 200 if allowed else 404
        record(entry)
        if not allowed:
            return self.reply(404, {"error": {"code": "NOT_FOUND", "message": "not found"}})
        self.send_response(200)
        self.send_header("Content-Type", row["content_type"])
        self.send_header("Content-Length", str(len(row["bytes"])))
        self.end_headers()
        self.wfile.write(row["bytes"])

    def route(self, method, path, query, body, caller):
        if method == "POST" and path == "/messages":
            if "from" in body:
                raise bad("INVALID_REQUEST", "client must not supply `from`; operator stamps it")
            eid = envelope_id(body.get("id"), "id")
            to = handles(body.get("to"), "to")
            cc = handles(body["cc"], "cc") if "cc" in body else []
            subject = body.get("subject")
            if subject is not None and not isinstance(subject, str):
                raise bad("INVALID_REQUEST", "subject must be a string")
            in_reply_to = envelope_id(body["in_reply_to"], "in_reply_to") if "in_reply_to" in body else None
            references = body.get("references", [])
            if not isinstance(references, list):
                raise bad("INVALID_REQUEST", "references must be an array")
            for i, r in enumerate(references):
                envelope_id(r, f"references[{i}]")
            if references and in_reply_to and references[-1] != in_reply_to:
                raise bad("INVALID_REFERENCES", "references[-1] must equal in_reply_to")
            monitor = body.get("monitor")
            if monitor is not None and not (isinstance(monitor, str) and MONITOR.match(monitor)):
                raise bad("INVALID_MONITOR", "monitor must match mon_<token>")
            date_ms = body.get("date_ms")
            if not isinstance(date_ms, int) or isinstance(date_ms, bool) or date_ms < 0:
                raise bad("INVALID_REQUEST", "date_ms must be a non-negative integer (epoch ms)")
            parts = content_parts(body.get("content_parts"))
            recipients = list(dict.fromkeys(to + cc))
            with lock:
                for r in recipients:
                    if r not in tokens.values() or not can_initiate(caller, r):
                        raise Fail(404, "NOT_FOUND", "not found")
                    if db.execute("SELECT 1 FROM blocks WHERE blocker = ? AND blocked = ?", (r, caller)).fetchone():
                        raise Fail(404, "NOT_FOUND", "not found")
            # file_id parts become URLs (the stored, canonical form); each file is claimed once.
            claims = []
            resolved = []
            for i, part in enumerate(parts):
                if part.get("type") in ("image", "file") and isinstance(part.get("file_id"), str):
                    with lock:
                        row = db.execute("SELECT * FROM files WHERE id = ?", (part["file_id"],)).fetchone()
                    if row is None or row["owner"] != caller or (row["envelope_id"] not in (None, eid)):
                        raise bad("INVALID_FILE", "file_id is unknown, owned by another agent, or already claimed")
                    claims.append(part["file_id"])
                    part = {k: v for k, v in part.items() if k != "file_id"}
                    part["url"] = f"http://127.0.0.1:{opts.port}/files/{row['id']}"
                resolved.append(part)
            parts = resolved
            canonical = {"id": eid, "from": caller, "to": to, "date_ms": date_ms, "content_parts": parts}
            if cc:
                canonical["cc"] = cc
            if subject is not None:
                canonical["subject"] = subject
            if in_reply_to:
                canonical["in_reply_to"] = in_reply_to
            if references:
                canonical["references"] = references
            body_json = json.dumps(canonical, sort_keys=True)
            with lock:
                existing = db.execute("SELECT * FROM envelopes WHERE id = ?", (eid,)).fetchone()
            if existing is not None:
                if existing["sender"] != caller:
                    raise Fail(409, "ID_COLLISION", "envelope id already exists for a different sender")
                if existing["body_json"] != body_json:
                    raise Fail(409, "RETRY_MISMATCH", "envelope id already used with a different body")
                return 202, {"id": eid, "received_ms": existing["created_at"], "created_at": existing["created_at"],
                             "recipients": [{"handle": r} for r in recipients]}
            created = now_ms()
            kinds = {p["type"] for p in parts}
            type_hint = kinds.pop() if len(kinds) == 1 else "mixed"
            with lock:
                db.execute(
                    "INSERT INTO envelopes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (eid, caller, subject, in_reply_to, date_ms, created, type_hint,
                     None if opts.no_size_hint else (len(json.dumps(parts)) + 3) // 4, body_json),
                )
                for f in claims:
                    db.execute("UPDATE files SET envelope_id = ? WHERE id = ?", (eid, f))
                for r in recipients:
                    db.execute("INSERT INTO mailbox VALUES (?, ?, ?, 1)", (r, eid, created))
                db.commit()
                row = db.execute("SELECT * FROM envelopes WHERE id = ?", (eid,)).fetchone()
            for r in recipients:
                push(r, header_of(row))
            if isinstance(body.get("monitor"), str):
                for r in recipients:
                    push(caller, {"op": "monitor.fact", "monitor": body["monitor"], "envelope_id": eid,
                                  "recipient_handle": r, "fact": "stored", "at_ms": created})
            return 202, {"id": eid, "received_ms": created, "created_at": created,
                         "recipients": [{"handle": r} for r in recipients]}
        if method == "GET" and path == "/messages":
            ids = query.get("ids", "")
            if not ids:
                raise bad("INVALID_QUERY", "ids parameter is required")
            wanted = list(dict.fromkeys(ids.split(",")))
            if len(wanted) > 100:
                raise bad("INVALID_QUERY", "ids list exceeds 100")
            for i, e in enumerate(wanted):
                envelope_id(e, f"ids[{i}]")
            out = []
            with lock:
                for e in wanted:
                    if db.execute("SELECT 1 FROM mailbox WHERE handle = ? AND envelope_id = ?", (caller, e)).fetchone():
                        row = db.execute("SELECT body_json FROM envelopes WHERE id = ?", (e,)).fetchone()
                        out.append(malformed(json.loads(row["body_json"])))
                        db.execute("UPDATE mailbox SET unread = 0 WHERE handle = ? AND envelope_id = ?", (caller, e))
                db.commit()
            return 200, {"envelopes": out}
        if method == "GET" and path.startswith("/messages/"):
            eid = envelope_id(path.split("/")[2], "id")
            with lock:
                if not db.execute("SELECT 1 FROM mailbox WHERE handle = ? AND envelope_id = ?", (caller, eid)).fetchone():
                    raise Fail(404, "NOT_FOUND", "not found")
                db.execute("UPDATE mailbox SET unread = 0 WHERE handle = ? AND envelope_id = ?", (caller, eid))
                db.commit()
                return 200, malformed(json.loads(db.execute("SELECT body_json FROM envelopes WHERE id = ?", (eid,)).fetchone()["body_json"]))
        if method == "GET" and path == "/mailbox":
            direction = query.get("direction", "in")
            if direction not in ("in", "out"):
                raise bad("INVALID_QUERY", "this test operator serves direction=in and out")
            if query.get("unread") == "true" and direction != "in":
                raise bad("INVALID_QUERY", "unread=true is only meaningful with direction=in (recipient feed)")
            order = query.get("order", "asc")
            if order not in ("asc", "desc"):
                raise bad("INVALID_QUERY", "order must be 'asc' or 'desc'")
            limit = query.get("limit", "100")
            if not limit.isdigit() or not 1 <= int(limit) <= 1000:
                raise bad("INVALID_QUERY", "limit must be an integer between 1 and 1000")
            after_at, after_id = query.get("after_created_at"), query.get("after_envelope_id")
            if (after_at is None) != (after_id is None):
                raise bad("INVALID_QUERY", "after_created_at and after_envelope_id must be supplied together")
            if direction == "in":
                sql = "SELECT e.*, m.created_at AS listed FROM mailbox m JOIN envelopes e ON e.id = m.envelope_id WHERE m.handle = ?"
            else:
                # As the reference: the caller's own envelopes, anchored on their created_at.
                sql = "SELECT e.*, e.created_at AS listed FROM envelopes e WHERE e.sender = ?"
            params = [caller]
            if query.get("unread") == "true":
                sql += " AND m.unread = 1"
            elif query.get("unread") == "false" and direction == "in":
                sql += " AND m.unread = 0"
            if after_at is not None:
                if not after_at.isdigit():
                    raise bad("INVALID_QUERY", "after_created_at must be a non-negative integer")
                envelope_id(after_id, "after_envelope_id")
                cmp = ">" if order == "asc" else "<"
                col, idcol = ("m.created_at", "m.envelope_id") if direction == "in" else ("e.created_at", "e.id")
                sql += f" AND ({col} {cmp} ? OR ({col} = ? AND {idcol} {cmp} ?))"
                params += [int(after_at), int(after_at), after_id]
            sort = "ASC" if order == "asc" else "DESC"
            col, idcol = ("m.created_at", "m.envelope_id") if direction == "in" else ("e.created_at", "e.id")
            sql += f" ORDER BY {col} {sort}, {idcol} {sort} LIMIT ?"
            params.append(int(limit))
            with lock:
                rows = db.execute(sql, params).fetchall()
            items = [header_of(r) for r in rows]
            if opts.malformed_subject is not None and any(
                    json.loads(r["body_json"]).get("subject") == opts.malformed_subject for r in rows):
                items.insert(0, {"id": "01BADBADBADBADBADBADBADBAD", "from": "@eve.proxy"})
            cursor = None
            if rows and len(rows) == int(limit):
                cursor = {"created_at": rows[-1]["listed"], "envelope_id": rows[-1]["id"]}
            return 200, {"envelope_headers": items, "next_cursor": cursor}
        if method == "GET" and path == "/agents/me":
            # The reference's synthesizeAgentResponse (routes/self.ts), its identity fields.
            owner, _, local = caller[1:].partition(".")
            return 200, {"canonical_handle": caller, "id": caller, "local_name": local,
                         "namespace": owner, "owner_label": f"@{owner}", "owner_id": owner,
                         "owner_type": "account", "scope": "personal", "paused": False,
                         "inactive": False, "is_online": True}
        if path == "/agents/me/allowlist" or path.startswith("/agents/me/allowlist/"):
            with lock:
                if method == "POST":
                    entries = body.get("entries")
                    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
                        raise bad("INVALID_REQUEST", "entries must be an array of strings")
                    for e in entries:
                        db.execute("INSERT OR IGNORE INTO allowlist VALUES (?, ?)", (caller, e))
                elif method == "DELETE":
                    entry = urllib.parse.unquote(path.rsplit("/", 1)[1])
                    if not db.execute("DELETE FROM allowlist WHERE owner = ? AND entry = ?", (caller, entry)).rowcount:
                        raise Fail(404, "NOT_FOUND", f"allowlist entry {entry} not found on {caller}")
                db.commit()
                rows = db.execute("SELECT entry FROM allowlist WHERE owner = ? ORDER BY entry", (caller,)).fetchall()
            return 200, {"entries": [{"entry": r["entry"]} for r in rows]}
        if method == "POST" and path == "/agents/me/blocks":
            blocked = body.get("handle")
            if not isinstance(blocked, str) or not HANDLE.match(blocked) or blocked == caller:
                raise bad("INVALID_REQUEST", "handle must be another agent's handle")
            with lock:
                db.execute("INSERT OR IGNORE INTO blocks VALUES (?, ?)", (caller, blocked))
                db.commit()
            return 201, {"handle": blocked}
        if method == "POST" and path == "/mailbox/read":
            ids = body.get("ids")
            if not isinstance(ids, list) or not ids:
                raise bad("INVALID_REQUEST", "ids must be a non-empty array")
            for i, e in enumerate(ids):
                envelope_id(e, f"ids[{i}]")
            read = []
            with lock:
                for e in ids:
                    cur = db.execute("UPDATE mailbox SET unread = 0 WHERE handle = ? AND envelope_id = ? AND unread = 1", (caller, e))
                    if cur.rowcount:
                        read.append(e)
                db.commit()
            return 200, {"read": read}
        raise Fail(404, "NOT_FOUND", "not found")

    def websocket(self, handle):
        key = self.headers.get("Sec-WebSocket-Key", "")
        if self.headers.get("Upgrade", "").lower() != "websocket" or not key:
            raise Fail(400, "BAD_REQUEST", "a WebSocket upgrade is required")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        sock = self.connection
        entry = (sock, threading.Lock())
        sockets.setdefault(handle, []).append(entry)
        try:
            # Push only: inbound frames are read and dropped, until the client closes.
            while True:
                head = self.rfile.read(2)
                if len(head) < 2:
                    break
                opcode, length = head[0] & 0x0F, head[1] & 0x7F
                if length == 126:
                    length = struct.unpack(">H", self.rfile.read(2))[0]
                elif length == 127:
                    length = struct.unpack(">Q", self.rfile.read(8))[0]
                if head[1] & 0x80:
                    self.rfile.read(4)
                self.rfile.read(length)
                if opcode == 0x8:
                    break
        except OSError:
            pass
        finally:
            sockets[handle].remove(entry)
            self.close_connection = True


def shutdown(signum, frame):
    # As the reference: every push socket is closed with 1001 ("going away").
    close = bytes([0x88, 2 + len(b"operator shutting down")]) + struct.pack(">H", 1001) + b"operator shutting down"
    for conns in list(sockets.values()):
        for sock, slock in list(conns):
            try:
                with slock:
                    sock.sendall(close)
            except OSError:
                pass
    record({"shutdown": True})
    os._exit(0)


signal.signal(signal.SIGTERM, shutdown)
server = ThreadingHTTPServer(("127.0.0.1", opts.port), Handler)
opts.port = server.server_address[1]  # --port 0: the one the OS gave
server.daemon_threads = True
print("listening", opts.port, flush=True)
server.serve_forever()
