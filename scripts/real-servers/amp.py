"""The AMP items of issue 21 against the real broker (study8677/agent-mailer 46ca115 under
uvicorn) and a real aamp-bridge: answered once with `Re: <subject>`, a task opened in the
console first, an arrival the inbox counts hide (archive + arrival + console read between two
polls), a 1 MB task, 105 tasks waiting, nothing answered twice; issue 37: the bridge's key
deleted in the console and a new one written to api_key_file, with SIGHUP and without, the
task that waited answered within 5 s; issue 36: the key deactivated and reactivated while a
task waits, an image attached and another file named, a task opened in the console before the
first start answered without answering the others again, a message over max_message_bytes
answered rejected. Run by run.sh."""
import atexit, json, socket, os, re, signal, subprocess, sys, time, urllib.request, tempfile, shutil

children = []
atexit.register(lambda: [c.kill() for c in children if c.poll() is None])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BIN = os.environ["AAMP_BRIDGE_BIN"]
PORT = free_port()
work = tempfile.mkdtemp(prefix="amp-real-")
os.makedirs(f"{work}/broker")
env = dict(os.environ, AGENT_MAILER_SECRET_KEY="s" * 40, AGENT_MAILER_DOMAIN="amp.test")
broker = subprocess.Popen([os.environ["AMP_UVICORN"], "agent_mailer.main:app", "--port", str(PORT)],
                          cwd=f"{work}/broker", env=env, stdout=open(f"{work}/broker.out", "w"), stderr=subprocess.STDOUT)
children.append(broker)
base = f"http://127.0.0.1:{PORT}"

def call(method, path, body=None, headers=None, ok=True):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        if ok:
            raise SystemExit(f"{method} {path}: {e.code} {e.read()[:300]}")
        return e.code, None

for _ in range(100):
    try:
        urllib.request.urlopen(base + "/docs", timeout=1); break
    except Exception:
        time.sleep(0.2)
invite = re.search(r"invite code: (\S+)", open(f"{work}/broker.out").read()).group(1)
call("POST", "/users/register", {"username": "alice", "password": "password-alice", "invite_code": invite})
_, login = call("POST", "/users/login", {"username": "alice", "password": "password-alice"})
person = {"Authorization": f"Bearer {login['token']}"}
_, key = call("POST", "/users/api-keys", {"name": "bridge"}, person)
api = {"X-API-Key": key["raw_key"]}
_, coder = call("POST", "/agents/register", {"name": "coder", "role": "coder", "system_prompt": "t"}, api)
_, boss = call("POST", "/agents/register", {"name": "boss", "role": "boss", "system_prompt": "t"}, api)
print("coder", coder["address"], "boss", boss["address"])

cfg = f"{work}/bridge"
os.makedirs(cfg)
with open(f"{cfg}/amp.key", "w") as f:
    f.write(key["raw_key"])
os.chmod(f"{cfg}/amp.key", 0o600)
def write_config(extra=""):
    open(f"{cfg}/config.toml", "w").write(f"""state_dir = "state"
[mailboxes.coder]
kind = "amp"
amp_url = "{base}"
address = "{coder['address']}"
agent_id = "{coder['id']}"
api_key_file = "amp.key"
poll_interval_secs = 1
{extra}
[[agents]]
name = "coder"
mailbox = "coder"
profile = "echo"
allow_from = ["{boss['address']}"]
""")
write_config("recheck_secs = 3")

bridge = None
def start():
    global bridge
    bridge = subprocess.Popen([BIN, "--config", f"{cfg}/config.toml", "start"], stdout=subprocess.DEVNULL,
                              stderr=open(f"{cfg}/bridge.log", "a"))
    children.append(bridge)
def stop():
    bridge.send_signal(signal.SIGTERM); bridge.wait(60)

def send(subject, body):
    return call("POST", "/messages/send", {"agent_id": boss["id"], "from_agent": boss["address"], "to_agent": coder["address"],
                                           "action": "send", "subject": subject, "body": body}, api)[1]

def replies(msg, deadline=120):
    end = time.time() + deadline
    while time.time() < end:
        _, inbox = call("GET", f"/messages/inbox/{boss['address']}?agent_id={boss['id']}&all=true", headers=api)
        got = [m for m in inbox if m["parent_id"] == msg["id"]]
        if got:
            return got
        time.sleep(0.3)
    return []

results = {}
t0 = time.time()
start()
first = send("First", "say hello")
r = replies(first); results["first answered once, titled Re:"] = (len(r) == 1 and r[0]["subject"] == "Re: First", time.time() - t0)

# Item 7: read in the console before the bridge saw it.
stop()
opened = send("Opened", "read by a person first")
call("PATCH", f"/admin/messages/{opened['id']}/read", None, person)
t0 = time.time(); start()
r = replies(opened); results["console-read task answered once"] = (len(r) == 1, time.time() - t0)

# Masked counts: archive + arrival + console read between polls (bridge held still).
bridge.send_signal(signal.SIGSTOP)
call("POST", f"/admin/threads/{first['thread_id']}/archive", None, person)
masked = send("Masked", "hidden by the counts")
call("PATCH", f"/admin/messages/{masked['id']}/read", None, person)
t0 = time.time(); bridge.send_signal(signal.SIGCONT)
r = replies(masked); results["masked arrival answered by the recheck"] = (len(r) == 1, time.time() - t0)

# Item 8: a 1 MB message.
t0 = time.time()
big = send("Big", ("word " * 200 + "\n\n") * 1000)
r = replies(big, 600); results["1 MB task answered once"] = (len(r) == 1, time.time() - t0)

# A backlog over a page.
stop()
many = [send(f"Task {n}", "say hello") for n in range(105)]
t0 = time.time(); start()
wanted = {m["id"] for m in many}
while time.time() - t0 < 300:
    _, inbox = call("GET", f"/messages/inbox/{boss['address']}?agent_id={boss['id']}&all=true", headers=api)
    answered = [m["parent_id"] for m in inbox if m["parent_id"] in wanted]
    if len(set(answered)) == len(wanted):
        break
    time.sleep(0.5)
results["105 waiting tasks answered once each"] = (sorted(answered) == sorted(wanted), time.time() - t0)
stop()

# Issue 37: the bridge on a key of its own (the script sends with the first one), deleted in
# the console and replaced: with SIGHUP, then without.
def replace_key(raw):
    open(f"{cfg}/amp.key.new", "w").write(raw); os.chmod(f"{cfg}/amp.key.new", 0o600)
    os.replace(f"{cfg}/amp.key.new", f"{cfg}/amp.key")
def refusals():
    return open(f"{cfg}/bridge.log").read().count("refused the credentials")
_, own = call("POST", "/users/api-keys", {"name": "bridge, own"}, person)
replace_key(own["raw_key"]); start()
for label, sighup in (("with SIGHUP", True), ("without SIGHUP", False)):
    before = refusals()
    call("DELETE", f"/users/api-keys/{own['id']}", None, person)
    pending = send(f"Rotated {label}", "sent while the key was refused")
    end = time.time() + 60
    while time.time() < end and refusals() == before:
        time.sleep(0.3)
    _, own = call("POST", "/users/api-keys", {"name": f"bridge, {label}"}, person)
    replace_key(own["raw_key"]); t0 = time.time()
    if sighup:
        bridge.send_signal(signal.SIGHUP)
    r = replies(pending, 5); results[f"key replaced {label}: the waiting task answered within 5 s"] = (len(r) == 1, time.time() - t0)
st = subprocess.run([BIN, "--config", f"{cfg}/config.toml", "status"], capture_output=True, text=True).stdout
results["status says the new key works"] = ("credentials work" in st, "")

# Issue 36, item 3: the key deactivated while a task waits, then made active again: the
# waiting task is answered within seconds of the reactivation (not at the 5-minute retry).
before = refusals()
call("POST", f"/users/api-keys/{own['id']}/deactivate", None, person)
pending = send("Deactivated", "sent while the key was inactive")
end = time.time() + 60
while time.time() < end and refusals() == before:
    time.sleep(0.3)
call("POST", f"/users/api-keys/{own['id']}/reactivate", None, person); t0 = time.time()
r = replies(pending, 30); results["key reactivated: the waiting task answered within 15 s"] = (len(r) == 1 and time.time() - t0 < 15, time.time() - t0)

# Issue 36, item 5: an image the agent hands over is the reply's attachment; another file is
# named in it.
stop()
open(f"{cfg}/files.toml", "w").write('command = "sh"\nargs = ["-c", "printf \'\\\\211PNG\\\\r\\\\n\\\\032\\\\nchart\' > chart.png; echo notes > notes.txt; echo Here; echo FILE: chart.png; echo FILE: notes.txt"]\n')
conf = open(f"{cfg}/config.toml").read()
open(f"{cfg}/config.toml", "w").write(conf.replace('profile = "echo"', 'profile = "files.toml"'))
start()
filed = send("Files", "make the files")
r = replies(filed)
atts = r[0]["attachments"] if r else []
results["an image goes as the reply's attachment, another file is named"] = (
    len(atts) == 1 and atts[0].get("mime_type") == "image/png" and "notes.txt" in r[0]["body"], len(atts))
stop()
open(f"{cfg}/config.toml", "w").write(conf)

# Issue 36, item 4: a task opened in the console before the bridge's first start (a fresh
# state folder) is answered; the ones answered before are not answered again (below).
opened_first = send("Opened before", "looked at before the first start")
call("PATCH", f"/admin/messages/{opened_first['id']}/read", None, person)
open(f"{cfg}/config.toml", "w").write(conf.replace('state_dir = "state"', 'state_dir = "state-fresh"'))
t0 = time.time(); start()
r = replies(opened_first); results["console-read task before the first start answered once"] = (len(r) == 1, time.time() - t0)
time.sleep(5)  # what a wrong first start would answer again has time to show below
stop()

# Issue 36, item 2, on AMP: a message over max_message_bytes is answered rejected, never run.
fresh = open(f"{cfg}/config.toml").read()
open(f"{cfg}/config.toml", "w").write(fresh.replace("poll_interval_secs", "max_message_bytes = 2000\npoll_interval_secs", 1))
start()
big = send("Too big", "x" * 5000)
r = replies(big)
body = r[0]["body"] if r else ""
results["a message over max_message_bytes answered rejected, its text not echoed"] = (
    len(r) == 1 and "rejected" in body and "max_message_bytes" in body and "xxxxx" not in body, len(body))
stop()
# Nothing answered twice.
_, inbox = call("GET", f"/messages/inbox/{boss['address']}?agent_id={boss['id']}&all=true", headers=api)
parents = [m["parent_id"] for m in inbox]
results["no message answered twice"] = (len(parents) == len(set(parents)), len(parents))
broker.send_signal(signal.SIGTERM); broker.wait(30)
for k, v in results.items():
    print("PASS" if v[0] else "FAIL", k, f"({v[1]:.1f} s)" if isinstance(v[1], float) else f"({v[1]})")
print("work dir", work)
sys.exit(0 if all(v[0] for v in results.values()) else 1)
