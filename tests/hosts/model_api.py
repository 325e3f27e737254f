#!/usr/bin/env python3
"""A stand-in for a model's API, for running the real agent CLIs in tests without a key or
the internet. Stdlib only.

    model_api.py --port N --record FILE [--ledger FILE]

The Anthropic Messages API (`POST /v1/messages`, streamed as server-sent events or not), as
Claude Code and the Claude ACP adapters call it; and the OpenAI Responses API
(`POST /v1/responses`, streamed), as Codex calls it through a custom `model_providers` entry
(`wire_api = "responses"`); and Gemini's `generateContent` / `streamGenerateContent?alt=sse`,
as the Gemini CLI calls it with `GOOGLE_GEMINI_BASE_URL` (a call that asks for JSON of a schema,
the CLI's model router, gets a value of that shape); and the OpenAI Chat Completions API
(`POST /v1/chat/completions`, streamed as `data:` chunks ending with `data: [DONE]` or not,
usage in a last chunk when `stream_options.include_usage` asks for it), as Qwen Code calls it
with `OPENAI_BASE_URL` (a call with a JSON-schema `response_format` gets a value of that shape).
What it answers is made from what it was sent, so a test can tell whether the agent kept its
context: every `remember: WORD` found in the conversation's user messages (in order, each
once) is named in the answer, "I remember: WORD1, WORD2." (or "I remember nothing."),
streamed in three deltas. Every request
is appended to the record file as a JSON line {path, body}.

`plan: A; B` in a turn's prompt scripts a plan the way Claude Code 2.x makes one: a text,
`TaskCreate` for each item, then `TaskUpdate` of the first to completed, then a final text.

`delegate: ADDRESS: TEXT` in an Anthropic turn scripts a call of the bridge's MCP tool
`mcp__aamp__delegate` (to ADDRESS, body TEXT), then a final text quoting what it returned.
`run: COMMAND` in a Gemini turn scripts a `run_shell_command` call the same way; in an
Anthropic turn, a text ("Planning first.") and a `Bash` call, then (once its result came back)
"All done. The command said: LAST LINE." (a refused call's result is its error text).
`fail: 500` anywhere in a Responses conversation is answered HTTP 500 with OpenAI's overload
error. `run: COMMAND` in a Responses turn scripts a call of Codex's `exec_command` tool, then a final
text naming the last line the command's output ended with; in a Chat Completions turn, a call of
Qwen Code's `run_shell_command` the same way.

Usage: every answer reports tokens in its API's own shape (Anthropic `message_start` usage
with `cache_read_input_tokens` and `cache_creation_input_tokens` and the final `output_tokens`
in `message_delta`; Responses `response.completed` usage whose `input_tokens` count the
`cached_tokens`; Gemini `usageMetadata` in every chunk; Chat Completions `usage` with
`prompt_tokens_details.cached_tokens`, streamed in a last chunk when asked), made per request
(see `usage_of`). `--ledger FILE` gets a JSON line per answered request: `api`, `model`,
`input` (not cached), `cache_read`, `cache_write`, `output`, `task` (the last `Task ID: X`
of the bridge's prompt in the request, else the last `ledger: WORD`, else null) and `system`
(the start of its system prompt).

What it leaves out: other tools, other errors and
overload answers, WebSocket transports, token counting
(`/v1/messages/count_tokens` answers a fixed count), other providers' APIs.
"""
import argparse
import json
import itertools
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = argparse.ArgumentParser()
args.add_argument("--port", type=int, required=True)
args.add_argument("--record", required=True)
args.add_argument("--ledger", help="a JSON line per answered request: its API, task and tokens")
args.add_argument("--limits", help="a JSON file of limit windows (see limit_window)")
opts = args.parse_args()


# What OpenAI answers with a 500 when it is overloaded.
OVERLOADED = "We're currently experiencing high demand, which may cause temporary errors."


def texts(message):
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text"]


def turn_of(body):
    """The turn's prompt (the newest user message that is not tool results) and the names of
    the tools called since it."""
    messages = body.get("messages", [])
    def is_prompt(m):
        content = m.get("content")
        results = isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
        return m.get("role") == "user" and not results
    start = max((i for i, m in enumerate(messages) if is_prompt(m)), default=0)
    prompt = " ".join(texts(messages[start])) if messages else ""
    # Claude Code merges an assistant's consecutive messages into one: the tools called
    # since the prompt tell the step.
    used = [b.get("name") for m in messages[start:] if m.get("role") == "assistant"
            for b in (m.get("content") if isinstance(m.get("content"), list) else [])
            if isinstance(b, dict) and b.get("type") == "tool_use"]
    return prompt, used


def tool_results(body):
    """The tool results the newest user message carries: {tool_use_id: text}."""
    messages = body.get("messages", [])
    out = {}
    for block in (messages[-1].get("content") if messages and isinstance(messages[-1].get("content"), list) else []):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            content = block.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            out[block.get("tool_use_id")] = content or ""
    return out


def script_for(body):
    """What this request is answered with: a list of content blocks, text or tool_use.

    `plan: A; B` in the turn's prompt: first TaskCreate for each item (Claude Code 2.x plans
    with them), then TaskUpdate of the first to completed, then the final text."""
    prompt, used = turn_of(body)
    plan = re.search(r"plan: ([^\n]+)", prompt)
    if plan:
        items = [i.strip() for i in plan.group(1).split(";") if i.strip()]
        if "TaskCreate" not in used:
            return [{"type": "text", "text": "Planning first. "}] + [
                {"type": "tool_use", "id": "toolu_create_%d" % n, "name": "TaskCreate",
                 "input": {"subject": item, "description": item, "activeForm": item}}
                for n, item in enumerate(items)]
        if "TaskUpdate" not in used:
            first = re.search(r"#(\d+)", " ".join(tool_results(body).values()) or "")
            return [{"type": "tool_use", "id": "toolu_update", "name": "TaskUpdate",
                     "input": {"taskId": first.group(1) if first else "1", "status": "completed"}}]
        return [{"type": "text", "text": "All done. The plan is finished."}]
    delegate = re.search(r"delegate: ([^\s:]+): ([^\n]+)", prompt)
    if delegate:
        if "mcp__aamp__delegate" not in used:
            return [{"type": "text", "text": "Handing it on. "},
                    {"type": "tool_use", "id": "toolu_delegate", "name": "mcp__aamp__delegate",
                     "input": {"to": delegate.group(1), "title": "sub-task",
                               "body": delegate.group(2).strip(), "timeout": 120}}]
        said = tool_results(body).get("toolu_delegate", "")
        return [{"type": "text", "text": "All done. The delegate said: %s" % str(said).strip()}]
    run = re.search(r"run: ([^\n]+)", prompt)
    if run:
        if "Bash" not in used:
            return [{"type": "text", "text": "Planning first. "},
                    {"type": "tool_use", "id": "toolu_bash", "name": "Bash",
                     "input": {"command": run.group(1).strip(), "description": "Run it"}}]
        said = tool_results(body).get("toolu_bash", "")
        lines = [l.strip() for l in str(said).splitlines() if l.strip()]
        return [{"type": "text", "text": "All done. The command said: %s." % (lines[-1] if lines else "nothing")}]
    return [{"type": "text", "text": answer_for(body)}]


def fill(schema):
    """A value of the JSON schema's shape (Gemini's upper-case type names or JSON Schema's)."""
    kind = str(schema.get("type", "object")).lower()
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object":
        return {k: fill(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 10
    if kind == "boolean":
        return False
    return "standin"


def remembered(user_texts):
    """The answer to a conversation whose user messages are `user_texts`: every
    `remember: WORD` in them, in order, each once."""
    words = []
    for text in user_texts:
        for word in re.findall(r"remember: (\w+)", text or ""):
            if word not in words:
                words.append(word)
    return "I remember: %s." % ", ".join(words) if words else "I remember nothing."


def answer_for(body):
    """The Anthropic Messages answer."""
    return remembered(t for m in body.get("messages", []) if m.get("role") == "user" for t in texts(m))


def thirds(text):
    """A text in three deltas (empty ones left out)."""
    third = max(1, len(text) // 3)
    return [p for p in (text[:third], text[third:2 * third], text[2 * third:]) if p]

# Usage: every answer reports tokens that vary per request and that a test can check: input
# from the request's size (a token per 40 bytes of its JSON, at least 7), output from the
# answer's words (and 5 per tool call), at least 1. The Anthropic answer puts a third of the
# input in cache reads and a seventh in cache writes; the Responses answer counts a quarter
# of its (total) input as cached. Each answered request is one line of the ledger.
LEDGER_LOCK = threading.Lock()
IDS = itertools.count(1)
# Gemini names its model in the path (`/v1beta/models/NAME:generateContent`), by thread.
MODEL_IN_PATH = {}


def next_id(prefix):
    return "%s%d" % (prefix, next(IDS))


def words_of(blocks):
    count = 0
    for b in blocks:
        text = b.get("text") if isinstance(b, dict) else None
        count += len(str(text).split()) if text else 5
    return count


def usage_of(body, blocks, cache=False, cached=False):
    """The tokens a request and its answer report, in the bridge's own terms: `input` not read
    from a cache, `cache_read`, `cache_write`, `output`."""
    size = max(7, len(json.dumps(body)) // 40)
    out = {"input": size, "output": max(1, words_of(blocks)), "cache_read": 0, "cache_write": 0}
    if cache:
        out["cache_read"], out["cache_write"] = size // 3, size // 7
        out["input"] = size - out["cache_read"] - out["cache_write"]
    if cached:
        out["cache_read"] = size // 4
        out["input"] = size - out["cache_read"]
    return out


def responses_usage(tokens):
    """Responses' usage: `input_tokens` counts the cached ones too."""
    total_in = tokens["input"] + tokens["cache_read"]
    return {"input_tokens": total_in, "input_tokens_details": {"cached_tokens": tokens["cache_read"]},
            "output_tokens": tokens["output"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": total_in + tokens["output"]}


def task_marker(body):
    """The task a request works for: the last `Task ID: ...` the bridge's prompt carries (a
    resumed conversation carries earlier tasks' prompts before it), else the last
    `ledger: WORD`; None when there is neither."""
    text = json.dumps(body)
    found = re.findall(r"Task ID: ([A-Za-z0-9._@:+-]+)", text) or re.findall(r"ledger: (\w+)", text)
    return found[-1] if found else None


def system_head(body):
    """The start of the request's system prompt, telling a side call (a router, a memory
    subagent) from the agent's own turn in a ledger line."""
    system = body.get("system") or body.get("instructions") or body.get("systemInstruction")
    messages = body.get("messages") or []
    if system is None and messages and messages[0].get("role") == "system":
        system = messages[0].get("content")
    if isinstance(system, dict):
        system = system.get("parts")
    if isinstance(system, list):
        system = " ".join(p.get("text", "") for p in system if isinstance(p, dict))
    return (system or "")[:60]


def ledger(api, body, tokens):
    """Appends one answered request to the ledger (`--ledger FILE`)."""
    if not opts.ledger:
        return
    model = body.get("model") or MODEL_IN_PATH.get(threading.get_ident())
    line = dict(tokens, api=api, model=model, task=task_marker(body), system=system_head(body))
    with LEDGER_LOCK, open(opts.ledger, "a") as f:
        f.write(json.dumps(line) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def start_sse(self):
        """A streamed answer's head: server-sent events until the connection closes."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def send_json(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not found"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self.send_json(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "not JSON"}})
        path = self.path.split("?")[0]
        with open(opts.record, "a") as f:
            f.write(json.dumps({"path": path, "body": body}) + "\n")
        MODEL_IN_PATH[threading.get_ident()] = path.rsplit("/", 1)[-1].split(":")[0]
        if limited(self, path):
            return
        if ":streamGenerateContent" in path or ":generateContent" in path:
            return self.gemini(body, stream=":streamGenerateContent" in path)
        if ":countTokens" in path:
            return self.send_json(200, {"totalTokens": 100})
        if path in ("/v1/responses", "/responses"):
            if re.search(r"fail: 500", json.dumps(body.get("input"))):
                return self.send_json(500, {"error": {"message": OVERLOADED, "type": "server_error",
                                                      "param": None, "code": "server_error"}})
            return self.openai_responses(body)
        if path in ("/v1/chat/completions", "/chat/completions"):
            return self.chat_completions(body)
        if path == "/v1/messages/count_tokens":
            return self.send_json(200, {"input_tokens": 100})
        if path != "/v1/messages":
            return self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
        blocks = script_for(body)
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        tokens = usage_of(body, blocks, cache=True)
        ledger("anthropic", body, tokens)
        usage = {"input_tokens": tokens["input"], "cache_creation_input_tokens": tokens["cache_write"],
                 "cache_read_input_tokens": tokens["cache_read"], "output_tokens": 1}
        message = {"id": next_id("msg_standin_"), "type": "message", "role": "assistant",
                   "model": body.get("model", "standin"),
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            message.update(content=blocks, stop_reason=stop, usage=dict(usage, output_tokens=tokens["output"]))
            return self.send_json(200, message)
        self.start_sse()

        def event(kind, data):
            self.wfile.write(("event: %s\ndata: %s\n\n" % (kind, json.dumps(data))).encode())
            self.wfile.flush()

        event("message_start", {"type": "message_start", "message": message})
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                event("content_block_start", {"type": "content_block_start", "index": index,
                                              "content_block": {"type": "text", "text": ""}})
                for part in thirds(block["text"]):
                    event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                  "delta": {"type": "text_delta", "text": part}})
            else:
                event("content_block_start", {"type": "content_block_start", "index": index,
                                              "content_block": {"type": "tool_use", "id": block["id"],
                                                                "name": block["name"], "input": {}}})
                event("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta",
                                                        "partial_json": json.dumps(block["input"])}})
            event("content_block_stop", {"type": "content_block_stop", "index": index})
        event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                "usage": {"output_tokens": tokens["output"]}})
        event("message_stop", {"type": "message_stop"})


    def gemini(self, body, stream):
        """Gemini's generateContent / streamGenerateContent (`?alt=sse`): the same answer rule
        over `contents`, and `run: COMMAND` scripted as a `run_shell_command` call."""
        config = body.get("generationConfig") or {}
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        if config.get("responseMimeType") == "application/json" and schema:
            # A side call that wants JSON (the CLI's model router): an answer of that shape.
            parts = [{"text": json.dumps(fill(schema))}]
        else:
            parts = gemini_script(body.get("contents", []))
        tokens = usage_of(body, parts)
        ledger("gemini", body, tokens)
        usage = {"promptTokenCount": tokens["input"], "candidatesTokenCount": tokens["output"],
                 "totalTokenCount": tokens["input"] + tokens["output"]}

        def chunk(parts, last):
            candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
            if last:
                candidate["finishReason"] = "STOP"
            return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "gemini-standin"}

        if not stream:
            return self.send_json(200, chunk(parts, True))
        self.start_sse()
        pieces = [[{"text": t}] for p in parts if "text" in p for t in thirds(p["text"])]
        pieces += [[p] for p in parts if "text" not in p]
        for n, piece in enumerate(pieces):
            self.wfile.write(("data: %s\r\n\r\n" % json.dumps(chunk(piece, n == len(pieces) - 1))).encode())
            self.wfile.flush()

    def openai_responses(self, body):
        """The OpenAI Responses API, streamed (Codex): the same answer rule over `input`, and
        `run: COMMAND` scripted as a call of Codex's `exec_command` tool."""
        self.start_sse()

        def event(kind, data):
            data = dict(data, type=kind)
            self.wfile.write(("event: %s\ndata: %s\n\n" % (kind, json.dumps(data))).encode())
            self.wfile.flush()

        response = {"id": "resp_standin", "object": "response", "status": "in_progress", "model": body.get("model"), "output": []}
        event("response.created", {"response": response})
        done = []
        blocks = responses_script(body)
        tokens = usage_of(body, blocks, cached=True)
        ledger("responses", body, tokens)
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                mid = "msg_standin_%d" % index
                item = {"type": "message", "id": mid, "role": "assistant", "status": "in_progress", "content": []}
                event("response.output_item.added", {"output_index": index, "item": item})
                event("response.content_part.added", {"item_id": mid, "output_index": index, "content_index": 0,
                                                     "part": {"type": "output_text", "text": "", "annotations": []}})
                for part in thirds(block["text"]):
                    event("response.output_text.delta", {"item_id": mid, "output_index": index, "content_index": 0, "delta": part})
                event("response.output_text.done", {"item_id": mid, "output_index": index, "content_index": 0, "text": block["text"]})
                item = dict(item, status="completed", content=[{"type": "output_text", "text": block["text"], "annotations": []}])
            else:
                fid = "fc_standin_%d" % index
                item = {"type": "function_call", "id": fid, "call_id": block["call_id"], "name": block["name"],
                        "arguments": "", "status": "in_progress"}
                event("response.output_item.added", {"output_index": index, "item": item})
                arguments = json.dumps(block["arguments"])
                event("response.function_call_arguments.delta", {"item_id": fid, "output_index": index, "delta": arguments})
                event("response.function_call_arguments.done", {"item_id": fid, "output_index": index, "arguments": arguments})
                item = dict(item, arguments=arguments, status="completed")
            event("response.output_item.done", {"output_index": index, "item": item})
            done.append(item)
        event("response.completed", {"response": dict(response, status="completed", output=done,
                                                      usage=responses_usage(tokens))})

    def chat_completions(self, body):
        """The OpenAI Chat Completions API, streamed or not (Qwen Code): the same answer rule over
        `messages`, and `run: COMMAND` scripted as a `run_shell_command` call."""
        response_format = body.get("response_format") or {}
        schema = (response_format.get("json_schema") or {}).get("schema")
        if response_format.get("type") == "json_schema" and schema:
            # A side call that wants JSON: an answer of that shape.
            blocks = [{"type": "text", "text": json.dumps(fill(schema))}]
        else:
            blocks = chat_script(body.get("messages", []))
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        calls = [{"id": b["id"], "type": "function",
                  "function": {"name": b["name"], "arguments": json.dumps(b["arguments"])}}
                 for b in blocks if b["type"] == "function_call"]
        finish = "tool_calls" if calls else "stop"
        tokens = usage_of(body, blocks, cached=True)
        ledger("chat", body, tokens)
        prompt = tokens["input"] + tokens["cache_read"]
        usage = {"prompt_tokens": prompt, "completion_tokens": tokens["output"],
                 "total_tokens": prompt + tokens["output"],
                 "prompt_tokens_details": {"cached_tokens": tokens["cache_read"]}}
        head = {"id": "chatcmpl-standin", "created": 0, "model": body.get("model", "standin")}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            return self.send_json(200, dict(head, object="chat.completion", usage=usage, choices=[
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}]))
        self.start_sse()
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta, finish=None, **extra):
            data = dict(head, object="chat.completion.chunk", choices=[
                {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}])
            if with_usage:
                data["usage"] = None  # but in the last chunk, as OpenAI streams it
            data.update(extra)
            self.wfile.write(("data: %s\n\n" % json.dumps(data)).encode())
            self.wfile.flush()

        chunk({"role": "assistant", "content": ""})
        for part in thirds(text):
            chunk({"content": part})
        for index, call in enumerate(calls):
            chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                   "function": {"name": call["function"]["name"], "arguments": ""}}]})
            chunk({"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]})
        chunk({}, finish)
        if with_usage:
            chunk({}, choices=[], usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def chat_script(messages):
    """What a Chat Completions request is answered with: text blocks and function calls.

    `run: COMMAND` in the turn's prompt: a text and a call of `run_shell_command` with it; once
    its result came back (a `tool` message), "All done. The command said: LAST LINE." Otherwise
    the remembered words."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    prompt = "\n".join(texts(messages[users[-1]])) if users else ""
    # At a line's start: Qwen Code's own side calls say "Available tools in this run: ...".
    run = re.search(r"(?m)^run: ([^\n]+)", prompt)
    if run:
        outputs = [m for m in messages[users[-1]:] if m.get("role") == "tool"]
        if not outputs:
            return [{"type": "text", "text": "Running it. "},
                    {"type": "function_call", "id": "call_standin", "name": "run_shell_command",
                     "arguments": {"command": run.group(1).strip(), "description": "run it",
                                   "is_background": False}}]
        said = "\n".join(texts(outputs[-1]))
        # Qwen Code's shell result: "Command: ...\nDirectory: ...\nOutput: ...\nError: ...\nExit Code: ...".
        output = re.search(r"(?ms)^Output: (.*?)(?=^Error: |^Exit Code: |\Z)", said)
        lines = [l.strip() for l in (output.group(1) if output else said).splitlines() if l.strip()]
        return [{"type": "text", "text": "All done. The command said: %s." % (lines[-1] if lines else "nothing")}]
    return [{"type": "text", "text": remembered(t for m in messages if m.get("role") == "user" for t in texts(m))}]


def gemini_script(contents):
    """What a Gemini request is answered with: parts (text, function calls).

    `run: COMMAND` in the turn's prompt: a text and a `run_shell_command` call; once its answer
    came back, "All done. The command said: LAST LINE." Otherwise the remembered words."""
    prompts = [i for i, c in enumerate(contents) if c.get("role", "user") == "user"
               and any("text" in p for p in c.get("parts", []))]
    prompt = " ".join(p.get("text", "") for p in contents[prompts[-1]].get("parts", [])) if prompts else ""
    run = re.search(r"run: ([^\n]+)", prompt)
    if run:
        answers = [p["functionResponse"] for c in contents[prompts[-1]:] for p in c.get("parts", [])
                   if "functionResponse" in p]
        if not answers:
            return [{"text": "Running it. "},
                    {"functionCall": {"name": "run_shell_command",
                                      "args": {"command": run.group(1).strip(), "description": "run it"}}}]
        said = json.dumps(answers[-1].get("response", {}))
        said = answers[-1].get("response", {}).get("output", said) if isinstance(answers[-1].get("response"), dict) else said
        lines = [l.strip() for l in str(said).splitlines() if l.strip()]
        return [{"text": "All done. The command said: %s." % (lines[-1] if lines else "nothing")}]
    return [{"text": remembered(part.get("text") for content in contents
                                if content.get("role", "user") == "user" for part in content.get("parts", []))}]


def responses_script(body):
    """What a Responses request is answered with: text blocks and function calls.

    `run: COMMAND` in the turn's prompt: a text and a call of `exec_command` with it; once its
    output came back, "All done. The command said: LAST LINE." Otherwise the remembered words."""
    items = body.get("input", [])
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": items}]}]
    users = [i for i, item in enumerate(items) if item.get("type") == "message" and item.get("role") == "user"]
    prompt = " ".join(p.get("text", "") for p in items[users[-1]].get("content", [])) if users else ""
    run = re.search(r"run: ([^\n]+)", prompt)
    if run:
        outputs = [item for item in items[users[-1]:] if item.get("type") == "function_call_output"]
        if not outputs:
            return [{"type": "text", "text": "Running it. "},
                    {"type": "function_call", "call_id": "call_standin", "name": "exec_command",
                     "arguments": {"cmd": run.group(1).strip(), "workdir": "."}}]
        said = outputs[-1].get("output")
        if isinstance(said, list):
            said = " ".join(p.get("text", "") for p in said if isinstance(p, dict))
        lines = [l.strip() for l in str(said or "").splitlines() if l.strip()]
        return [{"type": "text", "text": "All done. The command said: %s." % (lines[-1] if lines else "nothing")}]
    return [{"type": "text", "text": remembered(part.get("text") for item in items
                                                if item.get("type") == "message" and item.get("role") == "user"
                                                for part in item.get("content", []))}]


# ---- Limit windows (issue 45) -------------------------------------------------------------
# `--limits FILE`: a JSON object a test writes (and rewrites, by rename) saying, per API, until
# when every request is answered with that provider's own usage-limit error:
#   {"anthropic": {"until": EPOCH, "reset": true}, "openai": {...}, "gemini": {...}}
# `until` is seconds since the epoch; `reset: false` leaves the stated reset time out (a limit
# that does not say when it ends). Each answered request is counted in the file's
# `FILE.hits` (one line per refused request: API and time), so a test can see the probes.
# The shapes, and what was guessed, are in tests/hosts/README.md.
import time

def limit_window(api):
    """The window the limits file holds for `api` now, or None."""
    if not opts.limits:
        return None
    try:
        with open(opts.limits) as f:
            windows = json.load(f)
    except (OSError, ValueError):
        return None
    window = windows.get(api)
    if not isinstance(window, dict) or time.time() >= float(window.get("until", 0)):
        return None
    return window


def api_of(path):
    if ":streamGenerateContent" in path or ":generateContent" in path:
        return "gemini"
    if path in ("/v1/responses", "/responses"):
        return "openai"
    if path in ("/v1/chat/completions", "/chat/completions"):
        return "chat"
    if path == "/v1/messages":
        return "anthropic"
    return None


def limited(handler, path):
    """Answers the request with its API's limit error when a window is open; says whether."""
    api = api_of(path)
    window = limit_window(api) if api else None
    if window is None:
        return False
    until = float(window["until"])
    stated = window.get("reset", True)
    with open(opts.limits + ".hits", "a") as f:
        f.write(json.dumps({"api": api, "at": time.time()}) + "\n")
    left = max(1, int(until - time.time() + 0.999))
    if api == "anthropic":
        # A subscription's window as the unified rate-limit headers say it (Claude Code reads
        # `anthropic-ratelimit-unified-*`); `x-should-retry: false` as the API sends with it.
        headers = {"x-should-retry": "false"}
        if stated:
            headers.update({"anthropic-ratelimit-unified-status": "rejected",
                            "anthropic-ratelimit-unified-reset": str(int(until + 0.999)),
                            "anthropic-ratelimit-unified-representative-claim": "five_hour",
                            "retry-after": str(left)})
        body = {"type": "error", "error": {"type": "rate_limit_error",
                                           "message": "This request would exceed your account's rate limit. Please try again later."}}
    elif api in ("openai", "chat"):
        # Codex's ChatGPT plan limit: `usage_limit_reached` with its reset (`resets_at`, and
        # the older `resets_in_seconds`).
        error = {"type": "usage_limit_reached", "message": "The usage limit has been reached",
                 "plan_type": "pro", "code": None, "param": None}
        if stated:
            error.update(resets_at=int(until + 0.999), resets_in_seconds=left)
        headers, body = {}, {"error": error}
    else:
        # Google's RESOURCE_EXHAUSTED with a RetryInfo delay (stated) or a per-day quota
        # violation (no time: the Gemini CLI calls it its daily quota).
        details = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
                    "domain": "generativelanguage.googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}]
        if stated:
            details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "%ds" % left})
        else:
            details.append({"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [
                {"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                 "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]})
        headers = {}
        body = {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": details,
                          "message": "You exceeded your current quota, please check your plan and billing details."}}
    data = json.dumps(body).encode()
    handler.send_response(429)
    for key, value in dict(headers, **{"Content-Type": "application/json", "Content-Length": str(len(data))}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(data)
    return True
# ---- end of limit windows -------------------------------------------------------------------


server = ThreadingHTTPServer(("127.0.0.1", opts.port), Handler)
opts.port = server.server_address[1]  # --port 0: the one the OS gave
server.daemon_threads = True
print("listening", opts.port, flush=True)
server.serve_forever()
