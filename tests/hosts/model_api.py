#!/usr/bin/env python3
"""A stand-in for a model's API, for running the real agent CLIs in tests without a key or
the internet. Stdlib only.

    model_api.py --port N --record FILE

The Anthropic Messages API (`POST /v1/messages`, streamed as server-sent events or not), as
Claude Code and the Claude ACP adapters call it. What it answers is made from what it was
sent, so a test can tell whether the agent kept its context: every `remember: WORD` found in
the conversation's user messages (in order, each once) is named in the answer,
"I remember: WORD1, WORD2." (or "I remember nothing."), streamed in three deltas. Every request
is appended to the record file as a JSON line {path, body}.

What it leaves out: tool use, errors and overload answers, token counting
(`/v1/messages/count_tokens` answers a fixed count), other providers' APIs.
"""
import argparse
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = argparse.ArgumentParser()
args.add_argument("--port", type=int, required=True)
args.add_argument("--record", required=True)
opts = args.parse_args()


def texts(message):
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text"]


def answer_for(body):
    words = []
    for message in body.get("messages", []):
        if message.get("role") != "user":
            continue
        for text in texts(message):
            for word in re.findall(r"remember: (\w+)", text):
                if word not in words:
                    words.append(word)
    return "I remember: %s." % ", ".join(words) if words else "I remember nothing."


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

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
        if path == "/v1/messages/count_tokens":
            return self.send_json(200, {"input_tokens": 100})
        if path != "/v1/messages":
            return self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
        answer = answer_for(body)
        message = {"id": "msg_standin", "type": "message", "role": "assistant", "model": body.get("model", "standin"),
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 100, "output_tokens": 1}}
        if not body.get("stream"):
            message.update(content=[{"type": "text", "text": answer}], stop_reason="end_turn")
            return self.send_json(200, message)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

        def event(kind, data):
            self.wfile.write(("event: %s\ndata: %s\n\n" % (kind, json.dumps(data))).encode())
            self.wfile.flush()

        event("message_start", {"type": "message_start", "message": message})
        event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        third = max(1, len(answer) // 3)
        for part in (answer[:third], answer[third:2 * third], answer[2 * third:]):
            event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}})
        event("content_block_stop", {"type": "content_block_stop", "index": 0})
        event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                "usage": {"output_tokens": 10}})
        event("message_stop", {"type": "message_stop"})
        self.close_connection = True


server = ThreadingHTTPServer(("127.0.0.1", opts.port), Handler)
server.daemon_threads = True
print("listening", opts.port, flush=True)
server.serve_forever()
