#!/usr/bin/env python3
"""A test agent that delegates through the bridge's MCP server, as an agent with MCP tools
would: it starts `aamp-bridge mcp` (which finds the bridge and the task's credential in the
environment it inherits), lists the tools, calls list_agents and delegate(TARGET), and
answers with what they returned, as JSON. It also tries the same server from a process
without the task's run tag (refused), and saves its credential to TOKEN_FILE so the test can
show it is refused once the task ended.

    delegating_agent.py BRIDGE TARGET TOKEN_FILE
"""
import json
import os
import subprocess
import sys

bridge, target, token_file = sys.argv[1:4]
task = sys.stdin.read()


class Mcp:
    def __init__(self, env):
        self.proc = subprocess.Popen([bridge, "mcp"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)
        self.next = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "delegating-agent", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg):
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next += 1
        self.send({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"the MCP server closed during {method}")
            msg = json.loads(line)
            if msg.get("id") == self.next:
                if "error" in msg:
                    raise SystemExit(f"{method}: {msg['error']}")
                return msg["result"]

    def call(self, name, args):
        result = self.request("tools/call", {"name": name, "arguments": args})
        text = "".join(c.get("text", "") for c in result.get("content", []))
        return {"error": bool(result.get("isError")), "text": text}

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


with open(token_file, "w") as f:
    f.write(os.environ.get("AAMP_BRIDGE_MCP_TOKEN", ""))
mcp = Mcp(dict(os.environ))
tools = [t["name"] for t in mcp.request("tools/list", {})["tools"]]
agents = mcp.call("list_agents", {})
answer = mcp.call("delegate", {"to": target, "title": "sub-task",
                               "body": "child work: the parser's tests", "timeout": 120})
nobody = mcp.call("delegate", {"to": "nobody@nowhere.test", "title": "x", "body": "y"})
mcp.close()

stranger_env = {k: v for k, v in os.environ.items() if k != "AAMP_BRIDGE_RUN"}
stranger = Mcp(stranger_env)
foreign = stranger.call("list_agents", {})
stranger.close()

print(json.dumps({"tools": tools, "agents": agents, "answer": answer, "nobody": nobody,
                  "foreign": foreign}))
