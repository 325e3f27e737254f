#!/usr/bin/env python3
"""A deterministic ACP (v1) agent for tests: newline-delimited JSON-RPC 2.0 on stdio, stdlib
only, scripted per test.

The script is a JSON file named by $ACP_TEST_SCRIPT:
  {
    "auth": "none" | "required",        # session/new answers -32000 until authenticate
    "auth_methods": [{"id": ...}],      # offered in initialize (default: one API-key method)
    "load": false, "resume": false,     # advertised session capabilities
    "replay_after_load": false,         # session/load answers first, then replays the history
                                        # (as gemini --acp 0.61 does: it does not await it)
    "on_cancel": "honour" | "ignore",
    "modes": ["read-only", ...],        # session modes it takes with session/set_mode
    "offer_modes": true,                # session/new also names them (availableModes)
    "record": "/path/messages.jsonl",   # every message from the client, one per line
    "state": "/path/sessions.json",     # sessions kept across processes (for load/resume)
    "steps": [ ... ]                    # what each prompt does, in order
  }
Steps: {"say": text} {"think": text} {"plan": [[content, status], ...]}
  {"tool": {"id", "title", "kind", "input"}} {"tool_done": {"id", "output", "failed"}}
  {"diff": {"id", "path", "old", "new"}} {"permission": {"id", "title", "kind"}}
  {"read": path} {"write": [path, content]} {"sleep": seconds} {"crash": exit_code}
  {"write_here": [name, content]} {"resource_link": name} {"resource": [name, text]}
  {"big_line": bytes} {"unknown_update": true} {"stderr": text} {"stop": reason}
  {"fail": {"code", "message", "data"}} answers the prompt with that JSON-RPC error
  {"terminal": {"id", "command", "args", "cwd", "limit", "wait": true, "release": true}} runs a
  command in a client terminal (as codex-acp does): a tool call whose content is the terminal,
  then (with "wait") its exit and output said as "exit CODE: OUTPUT"; a refusal is said as
  "terminal refused: MESSAGE"
Hostile steps, done by the agent itself (as an agent with its own shell can): {"mkfifo": path}
  {"hardlink": [existing, new]} {"symlink": [target, new]} {"sparse": [path, bytes]}
  {"mknod": path} (a character device like /dev/null; needs root). A "permission" step may carry
  "input" (the tool call's rawInput). A read that takes over 5 s says so.
{"say_prompt": true} says the prompt's text back. "ignore_eof": true keeps the process alive
after stdin closes.
"""
import json
import os
import sys
import threading
import time
import uuid

script = json.load(open(os.environ["ACP_TEST_SCRIPT"]))
out_lock = threading.Lock()
pending = {}
pending_lock = threading.Lock()
cancelled = threading.Event()
authenticated = script.get("auth", "none") != "required"
state_path = script.get("state")


def send(message):
    with out_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def record(message):
    if script.get("record"):
        with open(script["record"], "a") as f:
            f.write(json.dumps(message) + "\n")


def load_state():
    if state_path and os.path.exists(state_path):
        return json.load(open(state_path))
    return {}


def save_state(state):
    if state_path:
        json.dump(state, open(state_path, "w"))


def update(session_id, body):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": body}})


def say(session_id, text):
    update(session_id, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})
    state = load_state()
    if session_id in state:
        state[session_id].append(text)
        save_state(state)


def request(method, params):
    """Sends a request to the client and waits for its answer (the main thread reads it)."""
    rid = str(uuid.uuid4())
    event = threading.Event()
    with pending_lock:
        pending[rid] = [event, None]
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    event.wait()
    with pending_lock:
        return pending.pop(rid)[1]


def run_prompt(rid, params):
    sid = params["sessionId"]
    stop = "end_turn"
    for step in script.get("steps", []):
        if cancelled.is_set() and script.get("on_cancel", "honour") == "honour":
            stop = "cancelled"
            break
        if "say" in step:
            say(sid, step["say"])
        elif "say_prompt" in step:
            say(sid, " ".join(b.get("text", "") for b in params.get("prompt", [])))
        elif "think" in step:
            update(sid, {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": step["think"]}})
        elif "plan" in step:
            entries = [{"content": c, "priority": "medium", "status": s} for c, s in step["plan"]]
            update(sid, {"sessionUpdate": "plan", "entries": entries})
        elif "tool" in step:
            t = step["tool"]
            update(sid, {"sessionUpdate": "tool_call", "toolCallId": t["id"], "title": t["title"],
                         "kind": t.get("kind", "other"), "status": "in_progress", "rawInput": t.get("input")})
        elif "tool_done" in step:
            t = step["tool_done"]
            update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": t["id"],
                         "status": "failed" if t.get("failed") else "completed",
                         "content": [{"type": "content", "content": {"type": "text", "text": t.get("output", "")}}]})
        elif "diff" in step:
            d = step["diff"]
            update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": d["id"], "status": "completed",
                         "content": [{"type": "diff", "path": d["path"], "oldText": d.get("old"), "newText": d["new"]}]})
        elif "permission" in step:
            p = step["permission"]
            answer = request("session/request_permission", {
                "sessionId": sid,
                "toolCall": dict({"toolCallId": p["id"], "title": p["title"], "kind": p.get("kind", "edit")},
                                 **({"rawInput": p["input"]} if "input" in p else {})),
                "options": [
                    {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
                    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                ],
            })
            outcome = (answer.get("result") or {}).get("outcome", {})
            say(sid, "permission %s: %s " % (p["id"], outcome.get("optionId", outcome.get("outcome"))))
        elif "read" in step:
            started = time.time()
            answer = request("fs/read_text_file", {"sessionId": sid, "path": step["read"]})
            if time.time() - started > 5:
                say(sid, "(slow read: %.1fs) " % (time.time() - started))
            if "result" in answer:
                say(sid, "read: %s " % answer["result"]["content"])
            else:
                say(sid, "read refused: %s " % answer["error"]["message"])
        elif "write" in step:
            path, content = step["write"]
            answer = request("fs/write_text_file", {"sessionId": sid, "path": path, "content": content})
            say(sid, "write: %s " % ("ok" if "result" in answer else "refused: " + answer["error"]["message"]))
        elif "write_here" in step:
            # fs/write_text_file of a file in the agent's working directory (its workspace).
            name, content = step["write_here"]
            path = os.path.join(os.getcwd(), name)
            answer = request("fs/write_text_file", {"sessionId": sid, "path": path, "content": content})
            say(sid, "wrote %s. " % name if "result" in answer else "write refused. ")
        elif "resource_link" in step:
            # A link to a file: a resource_link content block with a file:// URI.
            name = step["resource_link"]
            path = name if os.path.isabs(name) else os.path.join(os.getcwd(), name)
            update(sid, {"sessionUpdate": "agent_message_chunk",
                         "content": {"type": "resource_link", "name": os.path.basename(name), "uri": "file://" + path}})
        elif "resource" in step:
            # An embedded text resource: the content itself.
            name, text = step["resource"]
            update(sid, {"sessionUpdate": "agent_message_chunk",
                         "content": {"type": "resource", "resource": {"uri": "file:///virtual/" + name, "text": text, "mimeType": "text/plain"}}})
        elif "mkfifo" in step:
            os.mkfifo(step["mkfifo"])
        elif "hardlink" in step:
            os.link(*step["hardlink"])
        elif "symlink" in step:
            os.symlink(*step["symlink"])
        elif "sparse" in step:
            path, size = step["sparse"]
            with open(path, "wb") as f:
                f.truncate(size)
        elif "mknod" in step:
            import stat
            os.mknod(step["mknod"], 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        elif "sleep" in step:
            deadline = time.time() + step["sleep"]
            while time.time() < deadline:
                if cancelled.is_set() and script.get("on_cancel", "honour") == "honour":
                    break
                time.sleep(0.02)
        elif "crash" in step:
            sys.stdout.flush()
            os._exit(step["crash"])
        elif "big_line" in step:
            update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x" * step["big_line"]}})
        elif "unknown_update" in step:
            update(sid, {"sessionUpdate": "some_future_kind", "whatever": 1})
        elif "stderr" in step:
            sys.stderr.write(step["stderr"] + "\n")
            sys.stderr.flush()
        elif "stop" in step:
            stop = step["stop"]
        elif "terminal" in step:
            t = step["terminal"]
            params = {"sessionId": sid, "command": t["command"], "args": t.get("args", [])}
            if "cwd" in t:
                params["cwd"] = t["cwd"]
            if "limit" in t:
                params["outputByteLimit"] = t["limit"]
            created = request("terminal/create", params)
            if "error" in created:
                say(sid, "terminal refused: %s " % created["error"]["message"])
                continue
            tid = created["result"]["terminalId"]
            update(sid, {"sessionUpdate": "tool_call", "toolCallId": t["id"], "title": "Run " + t["command"],
                         "kind": "execute", "status": "in_progress",
                         "content": [{"type": "terminal", "terminalId": tid}]})
            if t.get("wait", True):
                exited = request("terminal/wait_for_exit", {"sessionId": sid, "terminalId": tid})["result"]
                out = request("terminal/output", {"sessionId": sid, "terminalId": tid})["result"]
                update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": t["id"], "status": "completed",
                             "content": [{"type": "terminal", "terminalId": tid}]})
                say(sid, "exit %s: %s%s " % (exited.get("exitCode"), "[cut] " if out["truncated"] else "", out["output"].strip()))
            if t.get("release", True):
                request("terminal/release", {"sessionId": sid, "terminalId": tid})
        elif "fail" in step:
            send({"jsonrpc": "2.0", "id": rid, "error": step["fail"]})
            return
    if cancelled.is_set() and script.get("on_cancel", "honour") == "honour":
        stop = "cancelled"
    send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": stop}})


def handle(message):
    global authenticated
    method, rid, params = message.get("method"), message.get("id"), message.get("params") or {}
    if method is None:
        with pending_lock:
            if rid in pending:
                pending[rid][1] = message
                pending[rid][0].set()
        return
    if method == "initialize":
        caps = {"loadSession": bool(script.get("load"))}
        if script.get("resume"):
            caps["sessionCapabilities"] = {"resume": {}}
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": 1, "agentCapabilities": caps,
            "authMethods": script.get("auth_methods", [{"id": "test-api-key", "name": "Test key", "description": "any value works"}]),
            "agentInfo": {"name": "acp-test-agent", "version": "1.0.0"}}})
    elif method == "authenticate":
        authenticated = True
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    elif method == "session/new":
        if not authenticated:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "Authentication required"}})
            return
        sid = "sess-" + uuid.uuid4().hex[:12]
        state = load_state()
        state[sid] = []
        save_state(state)
        result = {"sessionId": sid}
        if script.get("offer_modes"):
            modes = script.get("modes", [])
            result["modes"] = {"currentModeId": modes[0] if modes else "",
                               "availableModes": [{"id": m, "name": m} for m in modes]}
        send({"jsonrpc": "2.0", "id": rid, "result": result})
    elif method in ("session/load", "session/resume"):
        state = load_state()
        sid = params.get("sessionId")
        if sid not in state:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32002, "message": "Resource not found: " + str(sid)}})
            return
        def replay():
            for text in state[sid]:
                update(sid, {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "(earlier prompt)"}})
                update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})
        if method == "session/load" and script.get("replay_after_load"):
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
            threading.Thread(target=replay, daemon=True).start()
            return
        if method == "session/load":
            replay()  # the history is replayed before the answer
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    elif method == "session/prompt":
        cancelled.clear()
        threading.Thread(target=run_prompt, args=(rid, params), daemon=True).start()
    elif method == "session/cancel":
        cancelled.set()
    elif method == "session/set_mode":
        if params.get("modeId") in script.get("modes", []):
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "Unknown mode: " + str(params.get("modeId"))}})
    elif rid is not None:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found: " + method}})


for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    message = json.loads(line)
    record(message)
    handle(message)

if script.get("ignore_eof"):
    # Like agents that do not exit when their client goes away.
    while True:
        time.sleep(60)
