"""An ACP agent built on the official Python SDK (PyPI agent-client-protocol 0.12), which we did
not write: it answers each prompt with a plan and the prompt's text. Run with the venv that
scripts/test-agents.sh makes."""
import asyncio

import acp
from acp import InitializeResponse, NewSessionResponse, PromptResponse, run_agent
from acp.helpers import plan_entry, update_agent_message_text, update_plan


class EchoAgent:
    def on_connect(self, conn):
        self.conn = conn

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kwargs):
        return InitializeResponse(protocol_version=acp.PROTOCOL_VERSION)

    async def new_session(self, cwd, additional_directories=None, mcp_servers=None, **kwargs):
        return NewSessionResponse(session_id="py-sdk-session")

    async def authenticate(self, method_id, **kwargs):
        return None

    async def prompt(self, session_id, prompt, **kwargs):
        text = " ".join(getattr(block, "text", "") for block in prompt)
        await self.conn.session_update(session_id, update_plan([plan_entry("Echo the prompt", status="in_progress")]))
        await self.conn.session_update(session_id, update_agent_message_text("python-sdk: " + text))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id, **kwargs):
        return None


asyncio.run(run_agent(EchoAgent()))
