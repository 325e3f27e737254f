// An ACP agent built on the official TypeScript SDK (npm @agentclientprotocol/sdk 2.4), which we
// did not write: it answers each prompt with a tool call and the prompt's text, and honours
// session/cancel. The SDK's entry file comes from $ACP_SDK_ENTRY (scripts/test-agents.sh
// installs it outside the repository).
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const acp = await import(pathToFileURL(process.env.ACP_SDK_ENTRY).href);
const cancelled = new Set();
let sessions = 0;

const update = (client, sessionId, body) => client.notify("session/update", { sessionId, update: body });

acp
  .agent()
  .onRequest("initialize", () => ({
    protocolVersion: acp.PROTOCOL_VERSION,
    agentCapabilities: { loadSession: false },
    agentInfo: { name: "ts-sdk-test-agent", version: "1.0.0" },
  }))
  .onRequest("session/new", () => ({ sessionId: `ts-sdk-${++sessions}` }))
  .onRequest("session/prompt", async ({ params, client }) => {
    const { sessionId } = params;
    const text = params.prompt.filter((b) => b.type === "text").map((b) => b.text).join(" ");
    await update(client, sessionId, { sessionUpdate: "tool_call", toolCallId: "echo-1", title: "Echo", kind: "think", status: "in_progress" });
    if (text.includes("TAKE-YOUR-TIME")) {
      const deadline = Date.now() + 60_000;
      while (!cancelled.has(sessionId) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    }
    if (cancelled.has(sessionId)) return { stopReason: "cancelled" };
    await update(client, sessionId, { sessionUpdate: "tool_call_update", toolCallId: "echo-1", status: "completed" });
    await update(client, sessionId, { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "ts-sdk: " + text } });
    return { stopReason: "end_turn" };
  })
  .onNotification("session/cancel", ({ params }) => {
    cancelled.add(params.sessionId);
  })
  .connect(acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
