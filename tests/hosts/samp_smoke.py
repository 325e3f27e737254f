#!/usr/bin/env python3
"""Smoke check of samp_server.py through the official MCP client (PyPI `mcp`): starts the server
on a free port with a fresh state file, drives it as two (then three) agents and as the admin,
and checks the shapes, limits and refusals. Run it with the venv of scripts/test-agents.sh:

    target/test-agents/venv/bin/python tests/hosts/samp_smoke.py [-v] [--stateful]

Prints each tool's name and input schema, then one line per check; exits non-zero on the first
failure.
"""
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

HERE = os.path.dirname(os.path.abspath(__file__))
VERBOSE = "-v" in sys.argv
STATEFUL = "--stateful" in sys.argv  # run the server with sessions and SSE answers
ADMIN = "amk_admin-for-smoke"


def check(cond, what, quiet=False):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    if not quiet or VERBOSE:
        print(f"ok: {what}")


class Server:
    def __init__(self, state):
        self.state = state
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "samp_server.py"), "--port", "0", "--state", self.state, "--admin-key", ADMIN]
            + (["--stateful"] if STATEFUL else []),
            stdout=subprocess.PIPE,
            text=True,
        )
        admin_line = self.proc.stdout.readline().strip()
        listen_line = self.proc.stdout.readline().strip()
        check(admin_line == f"samp: admin key {ADMIN}", f"admin key line: {admin_line!r}")
        check(listen_line.startswith("samp: listening on http://127.0.0.1:"), f"listening line: {listen_line!r}")
        self.url = listen_line.split(" on ", 1)[1]
        self.base = self.url[: -len("/mcp")]

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def http(self, method, path, body=None, key=ADMIN, headers=None):
        req = urllib.request.Request(self.base + path, method=method, data=None if body is None else json.dumps(body).encode())
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", "Bearer " + key)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), dict(e.headers)

    def test(self, method, path, body=None):
        status, text, _ = self.http(method, path, body)
        assert status == 200, (status, text)
        return json.loads(text)


class Agent:
    """One MCP connection with one bearer key: `async with Agent(url, key).open() as a`."""

    def __init__(self, url, key):
        self.url, self.key = url, key

    @contextlib.asynccontextmanager
    async def open(self):
        headers = {"Authorization": "Bearer " + self.key}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as client:
            async with streamable_http_client(self.url, http_client=client) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    self.session = session
                    yield self

    async def call(self, tool, **args):
        """-> (is_error, the JSON object in the result's one text content)"""
        r = await self.session.call_tool(tool, args)
        check(len(r.content) == 1 and r.content[0].type == "text", f"{tool}: one text content", quiet=True)
        body = json.loads(r.content[0].text)
        if VERBOSE:
            print(f"   {tool} {json.dumps(args)[:120]} -> error={r.is_error} {json.dumps(body)[:300]}")
        return r.is_error, body

    async def ok(self, tool, **args):
        is_error, body = await self.call(tool, **args)
        check(not is_error, f"{tool} succeeds: {body}", quiet=True)
        return body

    async def refused(self, tool, code, **args):
        is_error, body = await self.call(tool, **args)
        check(is_error and body.get("error") == code, f"{tool} refused with isError and error={code!r}: {body}")
        return body


async def scenario(srv):
    check(srv.http("GET", "/healthz", key=None)[:2] == (200, "ok"), "GET /healthz answers ok")
    status, _, _ = srv.http("POST", "/test/agents", {"name": "x"}, key=None)
    check(status == 401, "test routes need the admin key")
    alice = srv.test("POST", "/test/agents", {"name": "alice", "display_name": "Alice"})
    bob = srv.test("POST", "/test/agents", {"name": "bob"})
    carol = srv.test("POST", "/test/agents", {"name": "carol"})
    check(alice["key"].startswith("amk_") and alice["key_id"].startswith("key_"), "test agents get an amk_ key")
    check(srv.http("POST", "/test/agents", {"name": "bob"})[0] == 409, "creating an existing agent: 409")

    async with Agent(srv.url, alice["key"]).open() as a, Agent(srv.url, bob["key"]).open() as b, Agent(srv.url, carol["key"]).open() as c:
        tools = (await a.session.list_tools()).tools
        print("agent tools:")
        for t in tools:
            print(f"  {t.name}: {json.dumps(t.input_schema)}")
        names = {t.name for t in tools}
        check(
            names == {"whoami", "list_agents", "send_message", "check_inbox", "ack", "read_thread", "block_sender",
                      "unblock_sender", "list_blocked", "update_profile", "get_usage"},
            "an agent key is offered the eleven agent tools",
        )

        me = await a.ok("whoami")
        check(me["name"] == "alice" and me["display_name"] == "Alice" and me["unread"] == 0, f"whoami: {me}")
        check(me["limits"]["max_unread"] == 10 and me["limits"]["sends_per_minute"] == 30, "whoami tells the limits")
        agents = await a.ok("list_agents")
        check({x["name"] for x in agents["agents"]} == {"alice", "bob", "carol"}, "list_agents")

        sent = await a.ok("send_message", to="bob", subject="hello", body="first body", data={"task": 1, "files": ["a.rs"]})
        check(sent["status"] == "sent" and sent["message_id"].startswith("msg_") and sent["thread_id"].startswith("thr_"), f"send_message: {sent}")
        inbox = await b.ok("check_inbox")
        check(inbox["unread"] == 1 and len(inbox["messages"]) == 1, "check_inbox as bob: one message")
        m = inbox["messages"][0]
        check(m["id"] == sent["message_id"] and m["thread_id"] == sent["thread_id"], "same message and thread ids")
        check(m["from"] == "alice" and m["to"] == "bob", "sender stamped from the key")
        check(m["subject"] == "hello" and m["body"] == "first body" and m["data"] == {"task": 1, "files": ["a.rs"]}, "subject, body and data carried")
        check(m["in_reply_to"] is None and m["created_at"].endswith("Z") and m["expires_at"] > m["created_at"], "in_reply_to null, created_at and expires_at")
        check((await b.ok("check_inbox"))["unread"] == 1, "check_inbox does not mark read")

        reply = await b.ok("send_message", to="alice", subject="Re: hello", body="answer", in_reply_to=m["id"])
        check(reply["thread_id"] == m["thread_id"], "a reply (in_reply_to) joins the thread")
        await b.refused("send_message", "not_found", to="alice", subject="x", body="x", in_reply_to="msg_nope")

        acked = await b.ok("ack", message_ids=[m["id"], "msg_nope"])
        check(acked["acked"] == [m["id"]] and acked["not_found"] == ["msg_nope"] and acked["unread"] == 0, f"ack: {acked}")
        again = await b.ok("ack", message_ids=[m["id"]])
        check(again["already_acked"] == [m["id"]], "ack again: already_acked")
        check((await b.ok("check_inbox"))["messages"] == [], "an acked message leaves check_inbox")
        stored = srv.test("GET", "/test/mailbox/bob")["inbox"][0]
        check(stored["acked_at"] and stored["subject"] is None and stored["body"] is None and stored["data"] is None, "ack cleared subject, body and data (DELETE_ON_ACK)")
        thread = await a.ok("read_thread", thread_id=m["thread_id"])
        check([x["id"] for x in thread["messages"]] == [m["id"], reply["message_id"]], "read_thread: both messages, oldest first")
        check(thread["messages"][0]["acked"] and thread["messages"][0]["body"] is None, "read_thread: the acked one without content, metadata kept")
        check(thread["messages"][1]["body"] == "answer" and not thread["messages"][1]["acked"], "read_thread: the unacked reply whole")
        await c.refused("read_thread", "not_found", thread_id=m["thread_id"])

        # Limits.
        await a.refused("send_message", "body_too_long", to="bob", subject="s", body="x" * (32 * 1024 + 1))
        await a.ok("send_message", to="carol", subject="s", body="é" * (16 * 1024))  # 32 KB exactly, in bytes
        await a.refused("send_message", "subject_too_long", to="bob", subject="s" * 201, body="b")
        await a.refused("send_message", "data_too_large", to="bob", subject="s", body="b", data={"x": "y" * (64 * 1024)})
        await a.refused("send_message", "unknown_recipient", to="nobody", subject="s", body="b")
        await a.refused("send_message", "invalid_argument", to="bob", body="no subject")
        await c.ok("ack", message_ids=[x["id"] for x in (await c.ok("check_inbox"))["messages"]])

        # inbox_full at 10 unread.
        srv.test("POST", "/test/clock", {"advance_seconds": 61})
        for i in range(10):
            await c.ok("send_message", to="bob", subject=f"n{i}", body="fill")
        full = await c.refused("send_message", "inbox_full", to="bob", subject="n10", body="fill")
        check(full.get("recipient") == "bob" and full.get("max_unread") == 10, f"inbox_full names the recipient and the cap: {full}")
        ids = [x["id"] for x in (await b.ok("check_inbox", limit=100))["messages"]]
        await b.ok("ack", message_ids=ids[:1])
        await c.ok("send_message", to="bob", subject="n11", body="room again after an ack")

        # 30 sends a minute.
        srv.test("POST", "/test/clock", {"advance_seconds": 61})
        srv.test("POST", "/test/config", {"max_unread": 1000})
        for i in range(30):
            await a.ok("send_message", to="carol", subject=f"r{i}", body="rate")
        limited = await a.refused("send_message", "rate_limited", to="carol", subject="r30", body="rate")
        check(1 <= limited["retry_after_seconds"] <= 60, f"rate_limited gives retry_after_seconds: {limited}")
        await b.ok("send_message", to="carol", subject="other sender", body="not limited")
        srv.test("POST", "/test/clock", {"advance_seconds": 61})
        await a.ok("send_message", to="carol", subject="r31", body="a minute later")

        # Blocked senders: silent by default, reject on request.
        check((await b.ok("block_sender", agent="carol")) == {"blocked": "carol"}, "block_sender")
        check((await b.ok("list_blocked"))["blocked"] == ["carol"], "list_blocked")
        before = srv.test("GET", "/test/mailbox/bob")["unread"]
        silent = await c.ok("send_message", to="bob", subject="blocked", body="dropped")
        check(silent["status"] == "sent", "a blocked sender sees sent (silent)")
        check(srv.test("GET", "/test/mailbox/bob")["unread"] == before, "... and nothing is delivered")
        srv.test("POST", "/test/config", {"blocked_sender_feedback": "reject"})
        await c.refused("send_message", "blocked", to="bob", subject="blocked", body="refused")
        await b.ok("unblock_sender", agent="carol")

        # Quota, when billing is on.
        srv.test("POST", "/test/config", {"billing": True, "monthly_send_limit": 0, "upgrade_url": "https://example.invalid/upgrade"})
        q = await a.refused("send_message", "quota_exceeded", to="bob", subject="q", body="q")
        check(q.get("upgrade_url") == "https://example.invalid/upgrade", "quota_exceeded carries the upgrade hint")
        srv.test("POST", "/test/config", {"billing": False})
        usage = await a.ok("get_usage")
        check(usage["sends_this_period"] >= 30, f"get_usage: {usage}")

        # 7-day expiry.
        srv.test("POST", "/test/clock", {"advance_seconds": 7 * 86400})
        check((await b.ok("check_inbox"))["unread"] == 0, "messages are gone after 7 days")
        await a.refused("read_thread", "not_found", thread_id=m["thread_id"])

    # Bad and revoked keys: HTTP 401 before MCP.
    status, text, headers = srv.http("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, key="amk_wrong")
    check(status == 401 and json.loads(text)["error"] == "unauthorized", f"a bad key: HTTP 401 {text}")
    check(headers.get("www-authenticate", headers.get("WWW-Authenticate", "")).startswith("Bearer"), "... with WWW-Authenticate: Bearer")
    check(srv.http("POST", "/mcp", {}, key=None)[0] == 401, "no key: HTTP 401")
    try:
        async with Agent(srv.url, "amk_wrong").open():
            pass
        check(False, "the MCP client fails with a bad key")
    except BaseException as e:  # the SDK raises from its task group
        check(True, f"the MCP client fails with a bad key ({type(e).__name__})")
    srv.test("POST", "/test/revoke", {"key_id": alice["key_id"]})
    check(srv.http("POST", "/mcp", {}, key=alice["key"])[0] == 401, "a revoked key: HTTP 401")
    srv.test("POST", "/test/disable", {"agent": "carol", "disabled": True})
    check(srv.http("POST", "/mcp", {}, key=carol["key"])[0] == 403, "a disabled agent's key: HTTP 403")

    # The admin's connection: admin tools only.
    async with Agent(srv.url, ADMIN).open() as adm:
        names = {t.name for t in (await adm.session.list_tools()).tools}
        check("admin_create_agent" in names and "send_message" not in names, "the admin key is offered the admin tools")
        await adm.refused("send_message", "unknown_tool", to="bob", subject="s", body="b")
        created = await adm.ok("admin_create_agent", name="dave", description="made by the admin")
        check(created["agent"]["name"] == "dave", "admin_create_agent")
        issued = await adm.ok("admin_issue_key", agent="dave")
        check(issued["key"].startswith("amk_"), "admin_issue_key gives an amk_ key")
        listed = await adm.ok("admin_list_agents")
        check({x["name"] for x in listed["agents"]} == {"alice", "bob", "carol", "dave"}, "admin_list_agents")
    async with Agent(srv.url, issued["key"]).open() as d:
        check((await d.ok("whoami"))["name"] == "dave", "the issued key works")
        await d.ok("send_message", to="bob", subject="from dave", body="kept across a restart")
    async with Agent(srv.url, ADMIN).open() as adm:
        await adm.ok("admin_revoke_key", key_id=issued["key_id"])
    check(srv.http("POST", "/mcp", {}, key=issued["key"])[0] == 401, "admin_revoke_key: HTTP 401 after")
    return bob


async def after_restart(srv, bob):
    async with Agent(srv.url, bob["key"]).open() as b:
        inbox = await b.ok("check_inbox")
        check([x["subject"] for x in inbox["messages"]] == ["from dave"], "state survives kill -9 and a restart")
    calls = srv.test("GET", "/test/calls")["calls"]
    check(calls and not any(x["invalid"] for x in calls), "no invalid call recorded since the restart")
    # The per-address lockout after failed authentications (last: it locks this address out).
    srv.test("POST", "/test/config", {"lockout_threshold": 3, "lockout_window_seconds": 900})
    for _ in range(3):
        srv.http("POST", "/mcp", {}, key="amk_wrong")
    status, text, headers = srv.http("POST", "/mcp", {}, key=bob["key"])
    check(status == 429 and json.loads(text)["error"] == "too_many_failed_attempts" and "retry-after" in {k.lower() for k in headers},
          f"after 3 failures even a good key from that address: HTTP 429 {text}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        srv = Server(os.path.join(tmp, "state.json"))
        srv.start()
        try:
            bob = asyncio.run(scenario(srv))
        finally:
            srv.kill()
        srv.start()
        try:
            asyncio.run(after_restart(srv, bob))
        finally:
            srv.kill()
    print("samp smoke: all passed")


if __name__ == "__main__":
    main()
