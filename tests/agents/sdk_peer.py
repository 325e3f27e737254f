#!/usr/bin/env python3
"""A third-party dispatcher on the PyPI AAMP SDK (aamp-sdk), sending and reading as that SDK
does: it submits over SMTP with mandatory STARTTLS (not the service's HTTP send shortcut) and
reads its mailbox with the SDK's JMAP client. It runs one scenario against the bridge and
prints one JSON line: what it saw for each step.

    sdk_peer.py EMAIL PASSWORD JMAP_BASE_URL SMTP_TLS_PORT AGENT SLOW DOOR PAIR_CODE

1. a task to AGENT (an agent that hands back fields and files): ack, stream.opened, result,
   and the attached files downloaded;
2. a task to SLOW (an agent that never finishes): its ack, then a cancel; the result;
3. a card.query to AGENT: the card.response;
4. a pair.request with PAIR_CODE to DOOR (which does not know this sender), then a task to
   DOOR: the pair.respond and that task's result.
"""
import base64
import json
import sys
import threading
import time

from aamp_sdk import AampClient

email, password, jmap_url, tls_port, agent, slow, door, pair_code = sys.argv[1:9]
token = base64.b64encode(f"{email}:{password}".encode()).decode()
client = AampClient(
    email=email,
    mailbox_token=token,
    base_url=jmap_url,
    smtp_password=password,
    smtp_host="127.0.0.1",
    smtp_port=int(tls_port),
    reconnect_interval=0.5,
    # The test host's certificate is self-signed.
    reject_unauthorized=False,
)
# Same-domain mail would go through the AAMP service's HTTP send action; send as a
# cross-domain dispatcher does, over SMTP with STARTTLS.
client.smtp_sender.http_base_url = None

seen = {}
cond = threading.Condition()
errors = []


def record(intent):
    def handler(message):
        with cond:
            seen.setdefault((message.get("taskId"), intent), []).append(message)
            cond.notify_all()

    return handler


for intent in ["task.ack", "task.stream.opened", "task.result", "card.response", "pair.respond"]:
    client.on(intent, record(intent))
client.on("error", lambda err: errors.append(str(err)))


def wait(task_id, intent, timeout=60):
    deadline = time.monotonic() + timeout
    with cond:
        while (task_id, intent) not in seen:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            cond.wait(left)
        return seen[(task_id, intent)][0]


def fix_download_url():
    # Cyrus writes a host-less downloadUrl (`/jmap/download/...`) in its session, which
    # aamp-sdk 0.1.2 does not resolve against the server; resolve it as RFC 8620 readers do.
    jmap = client.jmap_client
    session = jmap.session or jmap.fetch_session()
    jmap.session = session
    if session.get("downloadUrl", "").startswith("/"):
        session["downloadUrl"] = jmap_url.rstrip("/") + session["downloadUrl"]


def brief(message):
    if message is None:
        return None
    keep = ["status", "output", "errorMsg", "structuredResult", "summary", "bodyText", "streamId", "reason"]
    return {k: message.get(k) for k in keep if message.get(k) is not None}


client.connect()
out = {}

# 1. A task with files back.
task, _ = client.send_task(to=agent, title="Report", body_text="Write the report.")
result = wait(task, "task.result")
files = {}
if result:
    fix_download_url()
    for item in result.get("attachments", []):
        files[item["filename"]] = client.jmap_client.download_blob(item["blobId"], item["filename"]).decode("utf-8", "replace")
out["task"] = {
    "ack": wait(task, "task.ack", 5) is not None,
    "streamOpened": brief(wait(task, "task.stream.opened", 5)),
    "result": brief(result),
    "files": files,
}

# 2. A cancel of a running task.
slow_task, slow_message_id = client.send_task(to=slow, title="Slow", body_text="Take your time.")
acked = wait(slow_task, "task.ack")
client.send_cancel(to=slow, task_id=slow_task, in_reply_to=slow_message_id)
out["cancel"] = {"ack": acked is not None, "result": brief(wait(slow_task, "task.result"))}

# 3. The agent's card.
card_task, _ = client.send_card_query(to=agent)
out["card"] = brief(wait(card_task, "card.response"))

# 4. Pairing with an agent that does not know this sender yet.
pair_task, _ = client.send_pair_request(to=door, pair_code=pair_code)
out["pair"] = brief(wait(pair_task, "pair.respond"))
after, _ = client.send_task(to=door, title="After pairing", body_text="Hello.")
out["paired_task"] = brief(wait(after, "task.result"))

out["errors"] = errors
out["polling"] = client.is_using_polling_fallback()
client.disconnect()
print(json.dumps(out), flush=True)
