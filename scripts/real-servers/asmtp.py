"""The ASMTP items of issue 21 against the real operator (RobotNetworks/robonet-cli 3ab187e on
Node 24) and a real aamp-bridge: the unread backlog at the first start, three turns sent as
`robotnet send --in-reply-to` sends them, a 3 MB answer, 40 envelopes at once (created_at
ties), an operator restart (1001), a reply refused with 404, a rotated token, nothing
answered twice; issue 37: the rotated token written to token_file, with SIGHUP and without,
the task that waited answered within 5 s; issue 36: files handed over go as file parts, an envelope read before a first start answered
without answering the others again. Run
by run.sh."""
import atexit, hashlib, json, socket, os, random, signal, subprocess, sys, time, urllib.request, tempfile, threading

children = []
atexit.register(lambda: [c.kill() for c in children if c.poll() is None])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BIN = os.environ["AAMP_BRIDGE_BIN"]
NODE = os.environ["ASMTP_NODE"]
OP = os.environ["ASMTP_OPERATOR"]
PORT = free_port()
ADMIN = "admin-" + os.urandom(8).hex()
work = tempfile.mkdtemp(prefix="asmtp-real-")
env = dict(os.environ, ROBOTNET_OPERATOR_NETWORK_NAME="local", ROBOTNET_OPERATOR_HOST="127.0.0.1",
           ROBOTNET_OPERATOR_PORT=str(PORT), ROBOTNET_OPERATOR_DATABASE_PATH=f"{work}/op.sqlite",
           ROBOTNET_OPERATOR_FILES_DIR=f"{work}/files", ROBOTNET_OPERATOR_ADMIN_TOKEN_HASH=hashlib.sha256(ADMIN.encode()).hexdigest(),
           ROBOTNET_OPERATOR_VERSION="0.3.7")
base = f"http://127.0.0.1:{PORT}"
op = None
def op_start():
    global op
    op = subprocess.Popen([NODE, OP], env=env, stdout=open(f"{work}/op.out", "a"), stderr=subprocess.STDOUT)
    children.append(op)
    for _ in range(100):
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1); return
        except Exception:
            time.sleep(0.2)
    raise SystemExit("operator did not start")
def op_stop():
    op.send_signal(signal.SIGTERM); op.wait(30)

def call(method, path, body=None, token=None, ok=True):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw and r.headers.get_content_type() == "application/json" else raw)
    except urllib.error.HTTPError as e:
        if ok:
            raise SystemExit(f"{method} {path}: {e.code} {e.read()[:300]}")
        return e.code, None

op_start()
tokens = {}
for h in ("@alice.coder", "@alice.boss"):
    _, a = call("POST", "/_admin/agents", {"handle": h, "policy": "allowlist"}, ADMIN)
    tokens[h] = a["token"]
call("POST", "/agents/me/allowlist", {"entries": ["@alice.boss"]}, tokens["@alice.coder"])
call("POST", "/agents/me/allowlist", {"entries": ["@alice.coder"]}, tokens["@alice.boss"])

CROCK = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
def ulid():
    t = int(time.time() * 1000)
    s = ""
    for _ in range(10):
        s = CROCK[t % 32] + s; t //= 32
    return s + "".join(random.choice(CROCK) for _ in range(16))
def post(body):
    body = {"id": ulid(), "to": ["@alice.coder"], "date_ms": int(time.time() * 1000), **body}
    call("POST", "/messages", body, tokens["@alice.boss"])
    return body["id"]
def send(text, **extra):
    return post({"content_parts": [{"type": "text", "text": text}], **extra})
def replies(parent, deadline=120):
    end = time.time() + deadline
    while time.time() < end:
        _, l = call("GET", "/mailbox?direction=in&order=asc&limit=1000", None, tokens["@alice.boss"])
        ids = [h["id"] for h in l["envelope_headers"] if h.get("in_reply_to") == parent]
        if ids:
            _, b = call("GET", "/messages?ids=" + ",".join(ids), None, tokens["@alice.boss"])
            return b["envelopes"]
        time.sleep(0.3)
    return []
def text_of(e):
    return "\n".join(p.get("text", "") for p in e["content_parts"] if p["type"] == "text")

cfg = f"{work}/bridge"; os.makedirs(cfg)
open(f"{cfg}/asmtp.token", "w").write(tokens["@alice.coder"]); os.chmod(f"{cfg}/asmtp.token", 0o600)
open(f"{cfg}/session.toml", "w").write('stdin = "{{prompt}}"\ncommand = "python3"\nargs = ["-c", "import os,sys; t=sys.stdin.read(); print(\'session=\' + os.environ.get(\'AAMP_SESSION_KEY\', \'\')); sys.stdout.write(\'line of a long answer\\\\n\' * 140000 if \'write a lot\' in t else \'\')"]\ntimeout_secs = 60\n[output]\nmax_bytes = 5000000\n')
open(f"{cfg}/config.toml", "w").write(f"""state_dir = "state"
[mailboxes.coder]
kind = "asmtp"
asmtp_url = "{base}"
handle = "@alice.coder"
token_file = "asmtp.token"
poll_interval_secs = 2

[[agents]]
name = "coder"
mailbox = "coder"
profile = "session.toml"
allow_from = ["@alice.boss"]
""")
bridge = None
def start():
    global bridge
    bridge = subprocess.Popen([BIN, "--config", f"{cfg}/config.toml", "start"], stdout=subprocess.DEVNULL, stderr=open(f"{cfg}/bridge.log", "a"))
    children.append(bridge)
def stop():
    bridge.send_signal(signal.SIGTERM); bridge.wait(60)
def run(*args):
    return subprocess.run([BIN, "--config", f"{cfg}/config.toml", *args], capture_output=True, text=True).stdout

results = {}
# Item 3: waiting before the first start.
early = [send(f"early {n}") for n in range(3)]
t0 = time.time(); start()
results["backlog before the first start answered once each"] = (all(len(replies(e)) == 1 for e in early), time.time() - t0)

# Item 1: three turns the CLI way (in_reply_to alone).
first = send("remember 7")
r = replies(first)[0]
session = text_of(r).split("session=")[1].split()[0]
ok, answered = True, r["id"]
for turn in (2, 3):
    nxt = send(f"turn {turn}", in_reply_to=answered)
    r = replies(nxt)[0]
    ok &= text_of(r).split("session=")[1].split()[0] == session
    answered = r["id"]
results["three turns sent like the reference CLI keep one session"] = (ok, session)

# Item 2: a 3 MB answer.
t0 = time.time()
big = send("write a lot")
r = replies(big)
files = [p for p in r[0]["content_parts"] if p["type"] == "file"] if r else []
got = b""
if files:
    req = urllib.request.Request(files[0]["url"], headers={"Authorization": f"Bearer {tokens['@alice.boss']}"})
    got = urllib.request.urlopen(req, timeout=60).read()
results["3 MB answer arrives (as a file part)"] = (len(r) == 1 and got.count(b"line of a long answer") == 140000, f"{len(got)} bytes, {time.time() - t0:.1f}s")

# Item 5: a burst within few milliseconds, ids not time-ordered.
burst = []
def one(n):
    burst.append(post({"id": "01" + "".join(random.choice(CROCK) for _ in range(24)), "content_parts": [{"type": "text", "text": f"burst {n}"}]}))
threads = [threading.Thread(target=one, args=(n,)) for n in range(40)]
[t.start() for t in threads]; [t.join() for t in threads]
_, l = call("GET", "/mailbox?direction=in&order=asc&limit=1000", None, tokens["@alice.coder"])
stamps = [h["created_at"] for h in l["envelope_headers"] if h["id"] in burst]
results["40 at once (ties in created_at) each answered once"] = (all(len(replies(b)) == 1 for b in burst), f"{len(stamps) - len(set(stamps))} ties")

# Operator stops (1001) and starts again.
op_stop(); op_start()
after = send("after the restart")
results["answered after an operator restart"] = (len(replies(after)) == 1, "")

# Item 4: a refused reply shows as undelivered.
call("POST", "/agents/me/blocks", {"handle": "@alice.coder"}, tokens["@alice.boss"])
blocked = send("you are blocked")
end = time.time() + 60
while time.time() < end and "UNDELIVERED" not in run("tasks", "--state", "undelivered"):
    time.sleep(0.5)
results["a reply refused with 404 shows as undelivered"] = ("UNDELIVERED" in run("tasks", "--state", "undelivered") and "could not be delivered" in run("status"), "")

# Item 6: token rotation.
_, rotated = call("POST", "/_admin/agents/@alice.coder/rotate-token", None, ADMIN)
call("DELETE", "/agents/me/blocks/@alice.coder", None, tokens["@alice.boss"], ok=False)
send("after rotation")
end = time.time() + 60
while time.time() < end and "auth_failed" not in run("status"):
    time.sleep(0.5)
st = run("status")
results["after a token rotation status says refused, not push"] = ("auth_failed" in st and "push over websocket" not in st, "")

# Issue 37: the new token written to token_file, then SIGHUP; then rotated again, no SIGHUP.
def replace_token(token):
    open(f"{cfg}/asmtp.token.new", "w").write(token); os.chmod(f"{cfg}/asmtp.token.new", 0o600)
    os.replace(f"{cfg}/asmtp.token.new", f"{cfg}/asmtp.token")
pending = send("sent while the token was refused")
replace_token(rotated["token"]); t0 = time.time(); bridge.send_signal(signal.SIGHUP)
results["rotated token + SIGHUP: the waiting task answered within 5 s"] = (len(replies(pending, 5)) == 1, time.time() - t0)
_, again = call("POST", "/_admin/agents/@alice.coder/rotate-token", None, ADMIN)
refusals = open(f"{cfg}/bridge.log").read().count("refused the credentials")
pending = send("sent while the second token was refused")
end = time.time() + 60
while time.time() < end and open(f"{cfg}/bridge.log").read().count("refused the credentials") == refusals:
    time.sleep(0.3)
replace_token(again["token"]); t0 = time.time()
results["rotated token, no SIGHUP: the waiting task answered within 5 s"] = (len(replies(pending, 5)) == 1, time.time() - t0)
st = run("status")
results["status says the new token works"] = ("credentials work" in st, "")

# Issue 36, item 5: files the agent hands over go as file parts of the reply.
stop()
open(f"{cfg}/files.toml", "w").write('command = "sh"\nargs = ["-c", "echo report > report.md; echo a,b > data.csv; echo Here; echo FILE: report.md; echo FILE: data.csv"]\n')
conf = open(f"{cfg}/config.toml").read()
open(f"{cfg}/config.toml", "w").write(conf.replace('profile = "session.toml"', 'profile = "files.toml"'))
start()
filed = send("make the files")
r = replies(filed)
names = [p.get("name") for p in r[0]["content_parts"] if p["type"] == "file"] if r else []
results["files handed over go as file parts"] = (names == ["report.md", "data.csv"], names)
stop()

# Issue 36, item 4: an envelope a person read (as the agent) before the first start (a fresh
# state folder) is answered; the ones answered before are not answered again (below).
open(f"{cfg}/config.toml", "w").write(conf.replace('state_dir = "state"', 'state_dir = "state-fresh"'))
looked = send("looked at before the first start")
call("GET", f"/messages?ids={looked}", None, open(f"{cfg}/asmtp.token").read().strip())
t0 = time.time(); start()
r = replies(looked); results["read before the first start answered once"] = (len(r) == 1, time.time() - t0)
time.sleep(5)  # what a wrong first start would answer again has time to show below
stop()
# Nothing answered twice.
_, l = call("GET", "/mailbox?direction=in&order=asc&limit=1000", None, tokens["@alice.boss"])
parents = [h.get("in_reply_to") for h in l["envelope_headers"]]
results["no envelope answered twice"] = (len(parents) == len(set(parents)), len(parents))
op_stop()
for k, v in results.items():
    print("PASS" if v[0] else "FAIL", k, f"({v[1]:.1f} s)" if isinstance(v[1], float) else f"({v[1]})")
print("work dir", work)
sys.exit(0 if all(v[0] for v in results.values()) else 1)
