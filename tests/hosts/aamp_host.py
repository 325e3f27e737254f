#!/usr/bin/env python3
"""A small AAMP service for tests and the local demo: the HTTP helper API that hosted AAMP
deployments put in front of their mail server. Stdlib only.

    aamp_host.py --port PORT --record FILE [--jmap http://127.0.0.1:18080]

Serves:
  GET  /.well-known/aamp                      discovery (api.url, stream capability)
  POST /api/aamp?action=aamp.mailbox.send     {"to", "subject", "text", "aampHeaders", "attachments"?}
                                              sent over SMTP as the caller -> {"ok", "from", "to", "messageId"}
  POST /api/aamp?action=aamp.stream.create    {"taskId", "peerEmail"} -> TaskStreamState
  POST /api/aamp?action=aamp.stream.append    {"streamId", "type", "payload"} -> StreamEvent (409 when closed)
  POST /api/aamp?action=aamp.stream.close     {"streamId", "payload"?} -> TaskStreamState
  GET  /api/aamp?action=aamp.stream.get       &streamId= or &taskId= -> TaskStreamState (404 when none)
  GET  /api/aamp/streams/{id}/events          server-sent events, resumable with Last-Event-ID
  /.well-known/jmap, /jmap/...                passed through to the mail server, WebSocket
                                              upgrades and event streams included (with
                                              --no-push, the session offers no push)
Every request is checked for HTTP Basic auth against the mail server (a JMAP session request),
and every action is appended to the record file as one JSON line, so tests can assert on what
the bridge sent and in which order. Prints "listening PORT" once ready (--port 0: a port the OS picks).
"""
import argparse
import base64
import datetime
import http.client
import json
import select
import socket
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = argparse.ArgumentParser()
args.add_argument("--port", type=int, required=True)
args.add_argument("--record", required=True)
args.add_argument("--jmap", default="http://127.0.0.1:18080")
args.add_argument("--mailhost", help="scripts/mailhost.sh, to create registered mailboxes")
args.add_argument("--domain", default="example.test")
args.add_argument("--smtp", default="127.0.0.1:15587", help="the mail server's submission port")
args.add_argument("--no-push", action="store_true", help="hide the mail server's JMAP push (WebSocket, EventSource) from the session, as a server without push")
opts = args.parse_args()

lock = threading.Condition()
registrations = {}  # registrationCode -> credentials
streams = {}  # streamId -> state dict (with "events" list)
auth_ok = {}  # Authorization header -> email, once the mail server accepted it


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record(entry):
    with lock:
        with open(opts.record, "a") as f:
            f.write(json.dumps(entry) + "\n")


def public(state):
    return {k: v for k, v in state.items() if k != "events"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The handler writes a response in several small writes; with Nagle's algorithm each
    # would wait for the client's delayed ACK (~40 ms per request).
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def user(self):
        header = self.headers.get("Authorization", "")
        if header in auth_ok:
            return auth_ok[header]
        if not header.startswith("Basic "):
            return None
        request = urllib.request.Request(opts.jmap + "/jmap/", headers={"Authorization": header})
        try:
            urllib.request.urlopen(request, timeout=10).read()
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                return None
        except OSError:
            return None
        email = base64.b64decode(header[6:]).decode().split(":", 1)[0]
        auth_ok[header] = email
        return email

    def passthrough(self):
        """Forwards the request to the mail server, streaming the answer back; a WebSocket
        upgrade becomes a raw byte relay in both directions."""
        upstream = urllib.parse.urlparse(opts.jmap)
        if self.headers.get("Upgrade", "").lower() == "websocket":
            sock = socket.create_connection((upstream.hostname, upstream.port or 80), timeout=10)
            # The PyPI SDK asks for /jmap/ws; Cyrus serves /jmap/ws/.
            path = "/jmap/ws/" if self.path == "/jmap/ws" else self.path
            head = "%s %s HTTP/1.1\r\n" % (self.command, path) + "".join("%s: %s\r\n" % kv for kv in self.headers.items()) + "\r\n"
            sock.sendall(head.encode())
            sock.settimeout(None)
            client = self.connection
            try:
                while True:
                    ready, _, _ = select.select([client, sock], [], [], 600)
                    if not ready:
                        break
                    for r in ready:
                        data = r.recv(65536)
                        if not data:
                            raise ConnectionError
                        (sock if r is client else client).sendall(data)
            except OSError:
                pass
            finally:
                sock.close()
                self.close_connection = True
            return
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection(upstream.hostname, upstream.port or 80, timeout=600)
        skip = {"connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection", "te", "trailer"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        conn.request(self.command, self.path, body=body, headers=headers)
        answer = conn.getresponse()
        self.send_response(answer.status)
        streaming = answer.getheader("Content-Type", "").startswith("text/event-stream")
        for k, v in answer.getheaders():
            if k.lower() not in skip and k.lower() != "content-length":
                self.send_header(k, v)
        if streaming:
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                while True:
                    chunk = answer.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True
        else:
            data = answer.read()
            if opts.no_push and self.command == "GET" and answer.status == 200 and b'"apiUrl"' in data:
                session = json.loads(data)  # the JMAP session, wherever it was asked for
                session.pop("eventSourceUrl", None)
                session.get("capabilities", {}).pop("urn:ietf:params:jmap:websocket", None)
                data = json.dumps(session).encode()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        conn.close()

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/.well-known/jmap" or url.path.startswith("/jmap"):
            return self.passthrough()
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/api/aamp" and query.get("action") == "aamp.mailbox.credentials":
            record({"action": "aamp.mailbox.credentials", "owner": None, "body": {}})
            with lock:
                creds = registrations.pop(query.get("code"), None)
            return self.reply(200, creds) if creds else self.reply(404, {"error": "unknown or used registration code"})
        if url.path == "/.well-known/aamp":
            return self.reply(200, {
                "protocol": "aamp", "version": "1.1", "api": {"url": "/api/aamp"},
                "capabilities": {"stream": {"transport": "sse", "subscribeUrlTemplate": "/api/aamp/streams/{streamId}/events"}},
            })
        owner = self.user()
        if owner is None:
            return self.reply(401, {"error": "unauthorized"})
        if url.path == "/api/aamp" and query.get("action") == "aamp.mailbox.thread":
            record({"action": "aamp.mailbox.thread", "owner": owner, "body": query})
            return self.thread(owner, query.get("taskId", ""))
        if url.path == "/api/aamp" and query.get("action") == "aamp.stream.get":
            with lock:
                found = [s for s in streams.values() if s["streamId"] == query.get("streamId") or s["taskId"] == query.get("taskId")]
            return self.reply(200, public(found[-1])) if found else self.reply(404, {"error": "Task stream not found"})
        if url.path.startswith("/api/aamp/streams/") and url.path.endswith("/events"):
            return self.sse(url.path.split("/")[4], self.headers.get("Last-Event-ID") or query.get("lastEventId"))
        self.reply(404, {"error": "not found"})

    def sse(self, stream_id, last_id):
        with lock:
            state = streams.get(stream_id)
        if state is None:
            return self.reply(404, {"error": "Task stream not found"})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        # No length and no chunking: the end of the stream is the end of the connection.
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        sent = 0
        if last_id:
            sent = next((i + 1 for i, e in enumerate(state["events"]) if e["id"] == last_id), 0)
        while True:
            with lock:
                while sent >= len(state["events"]) and state["status"] != "closed":
                    lock.wait(timeout=15)
                pending = state["events"][sent:]
                closed = state["status"] == "closed"
            for event in pending:
                self.wfile.write(f"id: {event['id']}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
            sent += len(pending)
            if closed and not pending:
                return

    def jmap(self, calls):
        request = urllib.request.Request(
            opts.jmap + "/jmap/", method="POST",
            data=json.dumps({"using": ["urn:ietf:params:jmap:core", "urn:ietf:params:jmap:mail"], "methodCalls": calls}).encode(),
            headers={"Authorization": self.headers["Authorization"], "Content-Type": "application/json"})
        return json.load(urllib.request.urlopen(request, timeout=20))["methodResponses"]

    def thread(self, owner, task_id):
        """The task's mails in the caller's mailbox (Inbox and Sent), oldest first."""
        query = ["Email/query", {"accountId": owner, "filter": {"header": ["X-AAMP-TaskId", task_id]},
                                 "sort": [{"property": "receivedAt", "isAscending": True}], "limit": 100}, "q"]
        get = ["Email/get", {"accountId": owner, "#ids": {"resultOf": "q", "name": "Email/query", "path": "/ids"},
                             "properties": ["from", "to", "receivedAt", "subject", "headers", "textBody", "bodyValues"],
                             "fetchTextBodyValues": True}, "g"]
        try:
            emails = self.jmap([query, get])[1][1]["list"]
        except (OSError, KeyError, IndexError, ValueError) as e:
            return self.reply(502, {"error": "mail store: %s" % e})
        events = []
        for email in emails:
            headers = {h["name"].lower(): h["value"].strip() for h in email["headers"]}
            body = "".join(email["bodyValues"][p["partId"]]["value"] for p in email["textBody"] if p["partId"] in email["bodyValues"])
            output = body.split("Output:", 1)[1].strip() if "Output:" in body else None
            events.append({"intent": headers.get("x-aamp-intent"), "from": email["from"][0]["email"],
                           "to": email["to"][0]["email"], "createdAt": email["receivedAt"], "subject": email["subject"],
                           "bodyText": body, "output": output, "status": headers.get("x-aamp-status")})
        if not events:
            return self.reply(404, {"error": "Task not found"})
        self.reply(200, {"taskId": task_id, "events": events})

    def send_mail(self, owner, body):
        """The HTTP send path: like SMTP, but with no In-Reply-To or References."""
        import email.message
        import email.utils
        import smtplib
        message = email.message.EmailMessage()
        message["From"] = owner
        message["To"] = body.get("to", "")
        message["Subject"] = body.get("subject", "")
        message["Message-ID"] = email.utils.make_msgid(domain=opts.domain)
        for name, value in (body.get("aampHeaders") or {}).items():
            message[name] = str(value)
        message.set_content(body.get("text", ""))
        for a in body.get("attachments") or []:
            maintype, _, subtype = a.get("contentType", "application/octet-stream").partition("/")
            message.add_attachment(base64.b64decode(a["content"]), maintype=maintype, subtype=subtype or "octet-stream", filename=a.get("filename"))
        password = base64.b64decode(self.headers["Authorization"][6:]).decode().split(":", 1)[1]
        host, port = opts.smtp.rsplit(":", 1)
        try:
            with smtplib.SMTP(host, int(port), timeout=30) as smtp:
                smtp.login(owner, password)
                smtp.send_message(message)
        except (OSError, smtplib.SMTPException) as e:
            return self.reply(502, {"error": "SMTP delivery failed: %s" % e})
        self.reply(200, {"ok": True, "from": owner, "to": body.get("to"), "messageId": message["Message-ID"]})

    def register(self, body):
        """Creates a real mailbox on the mail host and hands out a one-time code for it."""
        slug = str(body.get("slug", ""))
        if not slug or not all(c.isalnum() and c.isascii() and (c.islower() or c.isdigit()) or c == "-" for c in slug):
            return self.reply(400, {"error": "slug must match ^[a-z0-9-]+$"})
        local = "%s-%s" % (slug, uuid.uuid4().hex[:6])
        email = "%s@%s" % (local, opts.domain)
        password = uuid.uuid4().hex
        done = subprocess.run(["bash", opts.mailhost, "adduser", local, password], capture_output=True, text=True)
        if done.returncode != 0:
            return self.reply(500, {"error": "could not create the mailbox: " + done.stderr.strip()})
        code = uuid.uuid4().hex
        token = base64.b64encode(("%s:%s" % (email, password)).encode()).decode()
        with lock:
            registrations[code] = {"email": email, "mailbox": {"token": token}, "smtp": {"password": password}}
        record({"action": "aamp.mailbox.register", "owner": None, "body": body, "email": email})
        self.reply(201, {"id": local, "email": email, "description": body.get("description"), "registrationCode": code,
                         "expiresInSeconds": 600, "credentialsAction": "aamp.mailbox.credentials"})

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        if url.path.startswith("/jmap"):
            return self.passthrough()
        action = dict(urllib.parse.parse_qsl(url.query)).get("action")
        length = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self.reply(400, {"error": "body is not JSON"})
        if action == "aamp.mailbox.register":
            return self.register(body)
        owner = self.user()
        if owner is None:
            return self.reply(401, {"error": "unauthorized"})
        record({"action": action, "owner": owner, "body": body})
        with lock:
            if action == "aamp.mailbox.send":
                return self.send_mail(owner, body)
            if action == "aamp.directory.upsert":
                return self.reply(200, {"ok": True, "profile": {"email": owner, "summary": body.get("summary"), "cardText": body.get("cardText")}})
            if action == "aamp.stream.create":
                existing = [s for s in streams.values() if s["taskId"] == body.get("taskId") and s["status"] != "closed"]
                if existing:
                    return self.reply(200, public(existing[0]))
                sid = "str_" + uuid.uuid4().hex[:12]
                streams[sid] = {"streamId": sid, "taskId": body.get("taskId"), "ownerEmail": owner,
                                "peerEmail": body.get("peerEmail"), "status": "opened", "createdAt": now(),
                                "openedAt": now(), "events": []}
                return self.reply(201, public(streams[sid]))
            state = streams.get(body.get("streamId"))
            if state is None:
                return self.reply(404, {"error": "Task stream not found"})
            if action == "aamp.stream.append":
                if state["status"] == "closed":
                    return self.reply(409, {"error": "Task stream is already closed"})
                event = {"id": "evt_" + uuid.uuid4().hex[:12], "streamId": state["streamId"], "taskId": state["taskId"],
                         "seq": len(state["events"]) + 1, "timestamp": now(), "type": body.get("type"),
                         "payload": body.get("payload") or {}}
                state["events"].append(event)
                state["latestEvent"] = event
                lock.notify_all()
                return self.reply(200, event)
            if action == "aamp.stream.close":
                state["status"] = "closed"
                state["closedAt"] = now()
                lock.notify_all()
                return self.reply(200, public(state))
        self.reply(404, {"error": "unknown action %s" % action})


server = ThreadingHTTPServer(("127.0.0.1", opts.port), Handler)
opts.port = server.server_address[1]  # --port 0: the one the OS gave
server.daemon_threads = True
print("listening", opts.port, flush=True)
server.serve_forever()
