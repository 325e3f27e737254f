#!/usr/bin/env python3
"""A dispatcher's side on the PyPI AAMP SDK (aamp-sdk): watches EMAIL's mailbox with the
SDK's JMAP client, and for TASK_ID's task.result decodes the structured result and downloads
the attached files. Prints `ready` once watching, then one JSON line
{status, output, structuredResult, files: {name: text}}.

    sdk_dispatcher.py EMAIL PASSWORD JMAP_BASE_URL TASK_ID
"""
import json
import sys
import threading

from aamp_sdk.jmap_push import JmapPushClient

email, password, jmap_url, task_id = sys.argv[1:5]
client = JmapPushClient(email=email, password=password, jmap_url=jmap_url, reject_unauthorized=False)
done = threading.Event()
result = {}


def on_result(message):
    if message.get("taskId") != task_id:
        return
    # Cyrus writes a host-less downloadUrl (`/jmap/download/...`) in its session, which
    # aamp-sdk 0.1.2 does not resolve against the server; resolve it as RFC 8620 readers do.
    session = client.session or client.fetch_session()
    client.session = session
    if session.get("downloadUrl", "").startswith("/"):
        session["downloadUrl"] = jmap_url.rstrip("/") + session["downloadUrl"]
    files = {}
    for item in message.get("attachments", []):
        data = client.download_blob(item["blobId"], item["filename"])
        files[item["filename"]] = data.decode("utf-8", "replace")
    result.update(
        status=message.get("status"),
        output=message.get("output"),
        structuredResult=message.get("structuredResult"),
        files=files,
    )
    done.set()


client.on("task.result", on_result)
client.on("error", lambda err: print(f"sdk error: {err}", file=sys.stderr, flush=True))
client.start()
print("ready", flush=True)
ok = done.wait(60)
client.stop()
print(json.dumps(result), flush=True)
sys.exit(0 if ok else 1)
