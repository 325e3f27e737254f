#!/usr/bin/env python3
"""The benchmark's baseline: a zero-work AAMP responder on the PyPI SDK (aamp-sdk). It reads
the mailbox with the SDK's JMAP push client and answers every task.dispatch at once with
task.ack and task.result (completed, the task's text), built with the SDK's header builders
and sent over one SMTP connection kept open. No journal, no policy, no agent: what answering
costs when nothing else is done.

    responder.py EMAIL PASSWORD JMAP_SESSION_URL SMTP_HOST SMTP_PORT

Prints `ready` once watching; logs `answered TASK_ID` per task on stderr.
"""
import smtplib
import sys
import threading
import uuid
from email.message import EmailMessage

from aamp_sdk.jmap_push import JmapPushClient
from aamp_sdk.protocol import build_ack_headers, build_result_headers

email, password, jmap_url, smtp_host, smtp_port = sys.argv[1:6]
lock = threading.Lock()
smtp = None


def send(to, subject, headers, text, in_reply_to):
    global smtp
    msg = EmailMessage()
    msg["From"] = email
    msg["To"] = to
    msg["Subject"] = subject
    msg["Message-ID"] = "<%s@%s>" % (uuid.uuid4(), email.split("@")[1])
    msg["In-Reply-To"] = in_reply_to
    msg["References"] = in_reply_to
    for k, v in headers.items():
        msg[k] = v
    msg.set_content(text)
    with lock:
        for attempt in range(2):
            try:
                if smtp is None:
                    smtp = smtplib.SMTP(smtp_host, int(smtp_port), timeout=30)
                    smtp.login(email, password)
                smtp.send_message(msg)
                return
            except (OSError, smtplib.SMTPException):
                smtp = None
                if attempt:
                    raise


def on_dispatch(message):
    task_id = message["taskId"]
    reply_to = message["from"]
    in_reply_to = message.get("messageId", "")
    send(reply_to, "[AAMP ACK] " + task_id, build_ack_headers(task_id), "ack", in_reply_to)
    output = message.get("bodyText", "")
    headers = build_result_headers(task_id, "completed", output)
    send(reply_to, "[AAMP Result] " + task_id, headers, "Output:\n" + output, in_reply_to)
    print("answered", task_id, file=sys.stderr, flush=True)


# aamp-sdk 0.1.2 reads at most 50 changes per push and does not ask for the rest, so at the
# end of a burst mail is left unread until the next push, which never comes (its safety sync
# only looks at the 20 newest). A baseline that loses tasks measures nothing: read until the
# server has no more changes.
_fetch_once = JmapPushClient._fetch_emails_since


def _fetch_all(self, account_id, since_state):
    emails = []
    while True:
        emails.extend(_fetch_once(self, account_id, since_state))
        if not self.email_state or self.email_state == since_state:
            return emails
        since_state = self.email_state


JmapPushClient._fetch_emails_since = _fetch_all

base = jmap_url.replace("/.well-known/jmap", "")
client = JmapPushClient(email=email, password=password, jmap_url=base, reject_unauthorized=False)
client.on("task.dispatch", on_dispatch)
client.on("error", lambda err: print("sdk error:", err, file=sys.stderr, flush=True))
client.start()
print("ready", flush=True)
threading.Event().wait()
