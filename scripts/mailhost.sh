#!/usr/bin/env bash
# A private, loopback-only mail host for aamp-bridge: two mail domains, each Cyrus IMAP (its
# JMAP server) + Postfix + OpenDKIM, all from Debian's packages, each running as its own
# instance under its own folder.
#
#   scripts/mailhost.sh install             apt-get the packages (idempotent, needs root)
#   scripts/mailhost.sh start [USER ...]    write config, start both domains, create users
#   scripts/mailhost.sh adduser USER [PASS] create a mailbox (USER is a local part of the first
#                                           domain, or an address of either domain)
#   scripts/mailhost.sh passwd USER PASS    change a mailbox's password (new logins need it)
#   scripts/mailhost.sh check               exit 0 when JMAP and SMTP submission answer
#   scripts/mailhost.sh env                 print the MAILHOST_* settings as shell exports
#   scripts/mailhost.sh stop                stop every daemon, keep the mail
#   scripts/mailhost.sh clean               stop and delete the folders
#
# The first domain ($MAILHOST_DOMAIN, example.test) lives under $MAILHOST_DIR; the second
# ($MAILHOST2_DOMAIN, example2.test) under $MAILHOST2_DIR (default: the first's with a 2),
# with ports from MAILHOST2_* variables named as the first domain's (defaults: the first's
# plus 10000). MAILHOST2_DOMAIN= (empty) runs the first alone.
#
# Two organisations, for real: each domain's Postfix is the other's MX. A transport map sends
# the other domain's mail to the other's inbound port on 127.0.0.1 (no DNS); every other
# domain is bounced, so nothing leaves the machine. Each domain has its own OpenDKIM (a milter
# on its Postfix, one process doing both jobs):
#   - signing: what its users submit (an authenticated SMTP client: OpenDKIM signs when
#     Postfix passes the {auth_type} macro) is signed with the domain's key (d=DOMAIN, s=mail;
#     an RSA key made by openssl at the first start, kept in $DIR/dkim/). The signature covers
#     the Message-ID and every X-AAMP-* field too, not only RFC 6376's list, so a signed
#     dispatch cannot be sent again as another task;
#   - verifying: everything else arriving over SMTP. No loopback client counts as internal
#     (InternalHosts names only TEST-NET-1, which no client here has): OpenDKIM's default,
#     127.0.0.1, would sign what a stranger hands the inbound port. A signed mail gets
#     "Authentication-Results: mx.DOMAIN; dkim=pass header.d=... header.i=..." above the
#     server's own Received field, which is what the bridge reads
#     (sender_auth = "authentication-results", authserv_id = "mx.DOMAIN");
#   - public keys without DNS: OpenDKIM's TestPublicKeys file ($DIR/dkim/public-keys, one
#     line per "SELECTOR._domainkey.DOMAIN" and its TXT record text), holding both domains'
#     keys, is where the verifier looks them up instead of the DNS;
#   - forged results: Authentication-Results fields that a sender wrote naming this domain's
#     authserv-id are removed on the way in (RemoveARFrom mx.DOMAIN, RemoveARAll: not only
#     those with a DKIM result), so a mail claims no pass the server did not write.
# Mail that Cyrus' JMAP EmailSubmission sends enters the inbound port without a login, so it
# leaves unsigned: across domains, submit over SMTP (as the bridge does).
# The first domain's Postfix calls itself localhost, as before; the second's
# mx.example2.test (two Postfix servers of one name refuse each other's mail as a loop).
# Every user's password defaults to $MAILHOST_PASSWORD.
set -euo pipefail

PASSWORD=${MAILHOST_PASSWORD:-secret}
# The first domain.
DIR_1=${MAILHOST_DIR:-/tmp/aamp-mailhost}
DOMAIN_1=${MAILHOST_DOMAIN:-example.test}
MYHOSTNAME_1=localhost
JMAP_PORT_1=${MAILHOST_JMAP_PORT:-18080}    # JMAP over HTTP (session at /.well-known/jmap)
IMAP_PORT_1=${MAILHOST_IMAP_PORT:-11143}    # IMAP, used to create a user's folders and for debugging
SUBMIT_PORT_1=${MAILHOST_SUBMIT_PORT:-15587} # SMTP submission: AUTH required, plain text (loopback)
# SMTP submission as clients that insist on STARTTLS see it (the PyPI aamp-sdk does): TLS
# required before AUTH, with a self-signed certificate made at start ($DIR/tls/cert.pem).
SUBMIT_TLS_PORT_1=${MAILHOST_SUBMIT_TLS_PORT:-15588}
# SMTP submission as Postfix ships it: AUTH required, but no smtpd_sasl_authenticated_header,
# so its Received field says ESMTPA without naming the login (the bridge cannot tell who sent).
SUBMIT_STOCK_PORT_1=${MAILHOST_SUBMIT_STOCK_PORT:-15589}
MX_PORT_1=${MAILHOST_MX_PORT:-12525}         # SMTP inbound: no AUTH, local domain only
# The second domain: the same, from MAILHOST2_* (empty MAILHOST2_DOMAIN: none).
DOMAIN_2=${MAILHOST2_DOMAIN-example2.test}
DIR_2=${MAILHOST2_DIR:-${DIR_1}2}
MYHOSTNAME_2=mx.$DOMAIN_2
JMAP_PORT_2=${MAILHOST2_JMAP_PORT:-28080}
IMAP_PORT_2=${MAILHOST2_IMAP_PORT:-21143}
SUBMIT_PORT_2=${MAILHOST2_SUBMIT_PORT:-25587}
SUBMIT_TLS_PORT_2=${MAILHOST2_SUBMIT_TLS_PORT:-25588}
SUBMIT_STOCK_PORT_2=${MAILHOST2_SUBMIT_STOCK_PORT:-25589}
MX_PORT_2=${MAILHOST2_MX_PORT:-22525}
CYRUS=/usr/lib/cyrus/bin
# Cyrus' httpd rebuilt with WebSocket support (scripts/cyrus-ws.sh), for real JMAP push; Debian's
# own httpd has none. MAILHOST_PUSH=0 skips it and runs Debian's httpd (clients then poll).
WS_HTTPD=/usr/local/lib/cyrus-ws/httpd
PUSH=${MAILHOST_PUSH:-1}

# The domains this host runs: 1, and 2 unless MAILHOST2_DOMAIN is empty.
instances() { if [ -n "$DOMAIN_2" ]; then echo 1 2; else echo 1; fi; }

# Makes instance N (1 or 2) the one the functions below work on: DIR, DOMAIN, the ports, and
# its peer (the other domain, PEER_DOMAIN, reached at PEER_MX_PORT; empty when there is none).
use_instance() {
  local n=$1 other=$(( 3 - $1 )) v src
  for v in DIR DOMAIN MYHOSTNAME JMAP_PORT IMAP_PORT SUBMIT_PORT SUBMIT_TLS_PORT SUBMIT_STOCK_PORT MX_PORT; do
    src=${v}_$n; printf -v "$v" '%s' "${!src}"
  done
  AUTHSERV_ID=mx.$DOMAIN
  PEER_DOMAIN=""; PEER_MX_PORT=""
  if [ -n "$DOMAIN_2" ]; then
    src=DOMAIN_$other; PEER_DOMAIN=${!src}
    src=MX_PORT_$other; PEER_MX_PORT=${!src}
  fi
}
use_instance 1

say() { echo "mailhost: $*" >&2; }
die() { say "$*"; exit 1; }

cmd_install() {
  install_packages
  if [ "$PUSH" = 1 ]; then install_ws_httpd; fi
}

# The WebSocket httpd matching the installed Cyrus, from the build cache or built now (~1-2 min).
install_ws_httpd() {
  local want have
  want=$(dpkg-query -W -f='${Version}' cyrus-common)
  have=$(sed -n 's/^cyrus-common //p' "${WS_HTTPD%/*}/BUILDINFO" 2>/dev/null || true)
  if [ -x "$WS_HTTPD" ] && [ "$have" = "$want" ]; then say "WebSocket httpd present"; return 0; fi
  dpkg -s libwslay1 >/dev/null 2>&1 || apt-get install -y -q --no-install-recommends libwslay1 >/dev/null
  local tarball
  tarball=$(bash "$(dirname "$(readlink -f "$0")")/cyrus-ws.sh")
  tar -xzf "$tarball" -C /
  say "WebSocket httpd installed for cyrus $want"
}

install_packages() {
  if dpkg -s cyrus-imapd cyrus-caldav cyrus-clients sasl2-bin libsasl2-modules postfix openssl opendkim >/dev/null 2>&1; then
    say "packages already installed"; return 0
  fi
  [ "$(id -u)" = 0 ] || die "install needs root (apt-get); run it as root or with sudo"
  export DEBIAN_FRONTEND=noninteractive
  # No system-wide mail setup: postfix gets "No configuration", and a policy-rc.d keeps the
  # packages' init scripts from starting the system instances while apt runs.
  echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
  local guard=/usr/sbin/policy-rc.d ours=0
  if [ ! -e "$guard" ]; then printf '#!/bin/sh\nexit 101\n' >"$guard"; chmod 755 "$guard"; ours=1; fi
  apt-get update -qq
  # cyrus-caldav carries httpd, which is Cyrus' JMAP server; postfix also stops apt from
  # choosing exim4 for cyrus-common's default-mta dependency. opendkim signs and verifies
  # (its keys are made with openssl, so opendkim-tools is not needed).
  apt-get install -y -q --no-install-recommends \
    cyrus-imapd cyrus-caldav cyrus-clients sasl2-bin libsasl2-modules postfix openssl opendkim >/dev/null
  if [ "$ours" = 1 ]; then rm -f "$guard"; fi
  say "installed cyrus $(dpkg-query -W -f='${Version}' cyrus-imapd), postfix $(dpkg-query -W -f='${Version}' postfix), opendkim $(dpkg-query -W -f='${Version}' opendkim)"
}

httpd_binary() {
  if [ "$PUSH" = 1 ] && [ -x "$WS_HTTPD" ]; then echo "$WS_HTTPD"; else echo "$CYRUS/httpd"; fi
}

write_cyrus_config() {
  cat >"$DIR/imapd.conf" <<CONF
configdirectory: $DIR/cyrus/conf
partition-default: $DIR/cyrus/spool
defaultpartition: default
proc_path: $DIR/cyrus/run/proc
mboxname_lockpath: $DIR/cyrus/run/lock
lmtpsocket: $DIR/cyrus/run/socket/lmtp
idlesocket: $DIR/cyrus/run/socket/idle
notifysocket: $DIR/cyrus/run/socket/notify
sievedir: $DIR/cyrus/sieve
servername: localhost
# Users are full addresses, so the JMAP accountId and Identity email are the address.
virtdomains: userid
unixhierarchysep: no
altnamespace: yes
lmtp_downcase_rcpt: yes
allowplaintext: yes
sasl_pwcheck_method: auxprop
sasl_auxprop_plugin: sasldb
sasl_sasldb_path: $DIR/sasldb2
sasl_mech_list: PLAIN LOGIN
sasl_auto_transition: no
# A user's first IMAP login creates INBOX and the special-use folders (JMAP mailbox roles).
autocreate_quota: 0
autocreate_post: no
autocreate_inbox_folders: Drafts | Sent | Trash | Junk | Archive
autocreate_subscribe_folders: Drafts | Sent | Trash | Junk | Archive
xlist-drafts: Drafts
xlist-sent: Sent
xlist-trash: Trash
xlist-junk: Junk
xlist-archive: Archive
httpmodules: jmap
conversations: yes
conversations_counted_flags: \\Draft \\Flagged \$IsMailingList \$IsNotification \$HasAttachment
jmap_preview_annot: /shared/vendor/messagingengine.com/preview
jmap_pushpoll: 1s
websocket_timeout: 30m
httpallowcompress: no
httpallowcors: *
httptimeout: 5m
# JMAP submission capability and EmailSubmission go to Postfix over SMTP, not /usr/sbin/sendmail.
smtp_backend: host
smtp_host: 127.0.0.1:$MX_PORT
# Email/query text and header filters are answered by Xapian; without it they fail.
search_engine: xapian
search_index_headers: yes
defaultsearchtier: t1
t1searchpartition-default: $DIR/cyrus/search
sync_log: yes
sync_log_channels: squatter
umask: 077
# Every delivery is kept, a second one of the same Message-ID too: the tests check that the
# bridge itself sends each answer once and runs a mail delivered twice once.
duplicatesuppression: 0
CONF
  # Cyrus' master does not hand its -C to the services: each command names the config itself.
  # One httpd process serves one connection, and every bridge a test starts holds some: its push
  # WebSocket and its HTTP client's idle ones, for a minute and a half. With the suite's lanes
  # side by side, 50 (the imap service's figure) was reached, and a connection past it waited
  # unanswered: a bridge's first read hung and its agent never became ready.
  cat >"$DIR/cyrus.conf" <<CONF
START {
  recover  cmd="$CYRUS/ctl_cyrusdb -C $DIR/imapd.conf -r"
}
SERVICES {
  imap     cmd="$CYRUS/imapd -C $DIR/imapd.conf" listen="127.0.0.1:$IMAP_PORT" prefork=0 maxchild=50
  http     cmd="$(httpd_binary) -C $DIR/imapd.conf" listen="127.0.0.1:$JMAP_PORT" prefork=0 maxchild=400
  lmtpunix cmd="$CYRUS/lmtpd -C $DIR/imapd.conf" listen="$DIR/cyrus/run/socket/lmtp" prefork=0 maxchild=20
}
DAEMON {
  idled    cmd="$CYRUS/idled -C $DIR/imapd.conf"
  squatter cmd="$CYRUS/squatter -C $DIR/imapd.conf -R"
}
EVENTS {
  checkpoint cmd="$CYRUS/ctl_cyrusdb -C $DIR/imapd.conf -c" period=30
}
CONF
}

write_postfix_config() {
  local etc=$DIR/postfix/etc
  cat >"$etc/main.cf" <<CONF
compatibility_level = 3.6
queue_directory = $DIR/postfix/queue
data_directory = $DIR/postfix/data
mail_owner = postfix
setgid_group = postdrop
myhostname = $MYHOSTNAME
mydomain = $DOMAIN
myorigin = $DOMAIN
mydestination = $DOMAIN, $MYHOSTNAME
mynetworks = 127.0.0.0/8
inet_interfaces = loopback-only
inet_protocols = ipv4
local_recipient_maps =
local_transport = lmtp:unix:$DIR/cyrus/run/socket/lmtp
alias_maps =
alias_database =
relayhost =
# The other domain's mail goes to its inbound port; no other domain is reached.
transport_maps = texthash:$etc/transport
default_transport = error:this test mail host delivers only to $DOMAIN${PEER_DOMAIN:+ and $PEER_DOMAIN}
biff = no
maillog_file = $DIR/log/postfix.log
maillog_file_prefixes = $DIR/log
smtpd_tls_security_level = none
smtp_tls_security_level = none
smtpd_sasl_type = cyrus
smtpd_sasl_path = smtpd
smtpd_sasl_security_options = noanonymous
smtpd_relay_restrictions = permit_mynetworks permit_sasl_authenticated reject_unauth_destination
message_size_limit = 52428800
# Each mailbox gets its mail in the order it was accepted (one delivery at a time per
# recipient; recipients in parallel): an ack never lands after its result.
lmtp_destination_recipient_limit = 1
lmtp_destination_concurrency_limit = 1
# A test host: mail deferred while Cyrus starts or restarts (its LMTP socket not there yet) is
# tried again within seconds; Postfix's defaults wait five minutes or more.
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 5s
# OpenDKIM signs what users submit and verifies what comes in. Without it no mail moves (a
# mail would otherwise leave unsigned, or arrive without its verdict).
smtpd_milters = unix:$DIR/dkim/opendkim.sock
milter_default_action = tempfail
CONF
  if [ -n "$PEER_DOMAIN" ]; then
    echo "$PEER_DOMAIN smtp:[127.0.0.1]:$PEER_MX_PORT" >"$etc/transport"
  else
    : >"$etc/transport"
  fi
  cat >"$etc/master.cf" <<CONF
127.0.0.1:$MX_PORT inet n - n - - smtpd
  -o smtpd_sasl_auth_enable=no
127.0.0.1:$SUBMIT_PORT inet n - n - - smtpd
  -o syslog_name=postfix/submission
  -o smtpd_sasl_auth_enable=yes
  -o smtpd_sasl_authenticated_header=yes
  -o smtpd_client_restrictions=permit_sasl_authenticated,reject
  -o smtpd_relay_restrictions=permit_sasl_authenticated,reject
127.0.0.1:$SUBMIT_STOCK_PORT inet n - n - - smtpd
  -o syslog_name=postfix/submission-stock
  -o smtpd_sasl_auth_enable=yes
  -o smtpd_client_restrictions=permit_sasl_authenticated,reject
  -o smtpd_relay_restrictions=permit_sasl_authenticated,reject
127.0.0.1:$SUBMIT_TLS_PORT inet n - n - - smtpd
  -o syslog_name=postfix/submission-tls
  -o smtpd_tls_security_level=encrypt
  -o smtpd_tls_auth_only=yes
  -o smtpd_tls_cert_file=$DIR/tls/cert.pem
  -o smtpd_tls_key_file=$DIR/tls/key.pem
  -o smtpd_sasl_auth_enable=yes
  -o smtpd_sasl_authenticated_header=yes
  -o smtpd_client_restrictions=permit_sasl_authenticated,reject
  -o smtpd_relay_restrictions=permit_sasl_authenticated,reject
pickup    unix  n - n 60 1 pickup
tlsmgr    unix  - - n 1000? 1 tlsmgr
cleanup   unix  n - n -  0 cleanup
qmgr      unix  n - n 300 1 qmgr
rewrite   unix  - - n -  - trivial-rewrite
bounce    unix  - - n -  0 bounce
defer     unix  - - n -  0 bounce
trace     unix  - - n -  0 bounce
verify    unix  - - n -  1 verify
flush     unix  n - n 1000? 0 flush
proxymap  unix  - - n -  - proxymap
smtp      unix  - - n -  - smtp
relay     unix  - - n -  - smtp
showq     unix  n - n -  - showq
error     unix  - - n -  - error
retry     unix  - - n -  - error
discard   unix  - - n -  - discard
local     unix  - n n -  - local
lmtp      unix  - - n -  - lmtp
anvil     unix  - - n -  1 anvil
scache    unix  - - n -  1 scache
postlog   unix-dgram n - n - 1 postlogd
CONF
  # Debian's smtpd reads its SASL settings from <config_directory>/sasl/smtpd.conf.
  mkdir -p "$etc/sasl"
  cat >"$etc/sasl/smtpd.conf" <<CONF
pwcheck_method: auxprop
auxprop_plugin: sasldb
sasldb_path: $DIR/sasldb2
mech_list: PLAIN LOGIN
CONF
}

# A self-signed certificate for the STARTTLS submission port, made once per $DIR.
write_certificate() {
  [ -s "$DIR/tls/cert.pem" ] && return 0
  command -v openssl >/dev/null || die "openssl is missing: run '$0 install' first"
  mkdir -p "$DIR/tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$DIR/tls/key.pem" -out "$DIR/tls/cert.pem" 2>>"$DIR/log/openssl.log"
  chmod 600 "$DIR/tls/key.pem"
}

# The domain's DKIM key (selector "mail"), made once per $DIR, and its public half as the
# line OpenDKIM's TestPublicKeys file takes: the record's name, then the TXT record's text.
make_dkim_key() {
  local keys=$DIR/dkim
  mkdir -p "$keys"
  if [ ! -s "$keys/mail.private" ]; then
    command -v openssl >/dev/null || die "openssl is missing: run '$0 install' first"
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$keys/mail.private" \
      2>>"$DIR/log/openssl.log" || die "no DKIM key made; see $DIR/log/openssl.log"
  fi
  chown opendkim "$keys" "$keys/mail.private"
  chmod 600 "$keys/mail.private"
  chmod 755 "$keys"
  printf 'mail._domainkey.%s v=DKIM1; k=rsa; p=%s\n' "$DOMAIN" \
    "$(openssl pkey -in "$keys/mail.private" -pubout -outform DER 2>/dev/null | base64 -w0)" \
    >"$keys/mail.txt"
}

# OpenDKIM's configuration (see the top of this file); every domain's public key must have
# been made (make_dkim_key) first.
SIGN_HEADERS=from,reply-to,subject,date,to,cc,resent-*,in-reply-to,references,list-*,sender,message-id,mime-version,content-type,content-transfer-encoding,x-aamp-*,traceparent,tracestate
write_dkim_config() {
  local keys=$DIR/dkim
  cat >"$keys/opendkim.conf" <<CONF
Syslog yes
SyslogName opendkim-$DOMAIN
Mode sv
Socket local:$keys/opendkim.sock
PidFile $keys/opendkim.pid
UserID opendkim
UMask 000
Background yes
Canonicalization relaxed/relaxed
# Signed: RFC 6376's list, and what a mail's meaning rests on past it: its Message-ID, its
# MIME structure, every AAMP header (which task, which intent). Each From field, one more
# than the mail has: a From added on the way breaks the signature.
SignHeaders $SIGN_HEADERS
OversignHeaders From
AuthservID $AUTHSERV_ID
RemoveARFrom $AUTHSERV_ID
RemoveARAll yes
InternalHosts 192.0.2.1
# The key is the opendkim user's alone (0600), but under /tmp, which others may write: the
# check of every folder above it would refuse it.
RequireSafeKeys no
KeyTable file:$keys/key-table
SigningTable refile:$keys/signing-table
TestPublicKeys $keys/public-keys
CONF
  echo "mail $DOMAIN:mail:$keys/mail.private" >"$keys/key-table"
  echo "*@$DOMAIN mail" >"$keys/signing-table"
  chmod 644 "$keys"/{opendkim.conf,key-table,signing-table}
}

# Every domain's public key, where this domain's OpenDKIM looks keys up (it reads the file
# at each lookup: a running one sees a key made since it started).
write_public_keys() {
  local n other tmp=$DIR/dkim/public-keys.new
  : >"$tmp"
  for n in $(instances); do
    other=DIR_$n
    cat "${!other}/dkim/mail.txt" >>"$tmp"
  done
  chmod 644 "$tmp"
  mv "$tmp" "$DIR/dkim/public-keys"
}

dkim_running() { [ -s "$DIR/dkim/opendkim.pid" ] && kill -0 "$(cat "$DIR/dkim/opendkim.pid")" 2>/dev/null; }

start_opendkim() {
  command -v opendkim >/dev/null || die "OpenDKIM is not installed: run '$0 install' first"
  rm -f "$DIR/dkim/opendkim.sock" "$DIR/dkim/opendkim.pid"
  opendkim -x "$DIR/dkim/opendkim.conf" 2>>"$DIR/log/opendkim.log" \
    || die "opendkim did not start; see $DIR/log/opendkim.log"
  for _ in $(seq 1 100); do [ -S "$DIR/dkim/opendkim.sock" ] && return 0; sleep 0.05; done
  die "opendkim made no socket at $DIR/dkim/opendkim.sock; see $DIR/log/opendkim.log and syslog.log"
}

prepare_dirs() {
  mkdir -p "$DIR"/cyrus/{conf/socket,conf/db,spool,search,sieve,run/socket,run/proc,run/lock} \
           "$DIR"/postfix/{etc,queue,data} "$DIR"/log
  write_cyrus_config
  write_postfix_config
  write_certificate
  write_dkim_config
  chown -R cyrus:mail "$DIR/cyrus"
  chown postfix "$DIR/postfix/data"
  chmod 755 "$DIR" "$DIR/cyrus" "$DIR/cyrus/run" "$DIR/cyrus/run/socket"
}

# Cyrus logs only through syslog. Where nothing listens on /dev/log (containers, CI) a small
# sink writes what it gets to $DIR/log/syslog.log, so Cyrus' errors can be read.
start_syslog_sink() {
  if python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM); s.connect("/dev/log")' 2>/dev/null; then
    return 0
  fi
  nohup python3 -c '
import os, socket, sys
log = open(sys.argv[1], "ab", buffering=0)
if os.path.exists("/dev/log"): os.unlink("/dev/log")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("/dev/log"); os.chmod("/dev/log", 0o666)
while True: log.write(s.recv(65536).rstrip(b"\0\n") + b"\n")
' "$DIR/log/syslog.log" >/dev/null 2>&1 &
  echo $! >"$DIR/syslog.pid"
  for _ in $(seq 1 50); do [ -S /dev/log ] && return 0; sleep 0.05; done
}

wait_for_port() {
  for _ in $(seq 1 150); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  die "port $1 did not open; see $DIR/log/"
}

running() { [ -f "$DIR/cyrus.pid" ] && kill -0 "$(cat "$DIR/cyrus.pid")" 2>/dev/null; }

# Selects the instance of USER's domain (a bare local part is the first domain's) and sets
# ADDRESS to the full address.
for_user() {
  local user=$1
  [[ $user == *@* ]] || user="$user@$DOMAIN_1"
  if [ -n "$DOMAIN_2" ] && [ "${user#*@}" = "$DOMAIN_2" ]; then use_instance 2; else use_instance 1; fi
  ADDRESS=$user
}

cmd_adduser() {
  for_user "$1"
  local user=$ADDRESS pass=${2:-$PASSWORD}
  [[ $user =~ ^[a-z0-9._-]+@[a-z0-9.-]+$ ]] || die "bad user name '$user': use lower-case letters, digits, . _ -"
  echo -n "$pass" | saslpasswd2 -p -c -f "$DIR/sasldb2" -u "${user#*@}" "${user%@*}"
  chmod 644 "$DIR/sasldb2"   # read by Cyrus (user cyrus) and Postfix; test credentials only
  # The first IMAP login creates INBOX, Drafts, Sent, Trash, Junk and Archive.
  python3 - "$IMAP_PORT" "$user" "$pass" <<'PY'
import imaplib, sys
port, user, pw = int(sys.argv[1]), sys.argv[2], sys.argv[3]
m = imaplib.IMAP4("127.0.0.1", port)
m.login(user, pw)
_, boxes = m.list()
m.logout()
if len(boxes) < 6:
    sys.exit(f"mailhost: folders for {user} were not created: {boxes}")
PY
  # An empty search index now, so text and header queries work before the first mail.
  runuser -u cyrus -- "$CYRUS/squatter" -C "$DIR/imapd.conf" -u "$user" 2>>"$DIR/log/squatter.log"
  say "user $user ready"
}

cmd_passwd() {
  for_user "$1"
  local user=$ADDRESS pass=$2
  echo -n "$pass" | saslpasswd2 -p -f "$DIR/sasldb2" -u "${user#*@}" "${user%@*}"
  chmod 644 "$DIR/sasldb2"
  say "password of $user changed"
}

check_instance() {
  (exec 3<>"/dev/tcp/127.0.0.1/$JMAP_PORT") 2>/dev/null || die "$DOMAIN: JMAP port $JMAP_PORT is closed"
  (exec 3<>"/dev/tcp/127.0.0.1/$SUBMIT_PORT") 2>/dev/null || die "$DOMAIN: SMTP submission port $SUBMIT_PORT is closed"
  (exec 3<>"/dev/tcp/127.0.0.1/$SUBMIT_TLS_PORT") 2>/dev/null || die "$DOMAIN: SMTP STARTTLS submission port $SUBMIT_TLS_PORT is closed"
  (exec 3<>"/dev/tcp/127.0.0.1/$SUBMIT_STOCK_PORT") 2>/dev/null || die "$DOMAIN: SMTP stock submission port $SUBMIT_STOCK_PORT is closed"
  (exec 3<>"/dev/tcp/127.0.0.1/$MX_PORT") 2>/dev/null || die "$DOMAIN: inbound SMTP port $MX_PORT is closed"
  dkim_running || die "$DOMAIN: OpenDKIM is not running (no mail moves without it): start the host with '$0 start'"
  local push="no push (clients poll)"
  if [ "$(grep -c "$WS_HTTPD" "$DIR/cyrus.conf" 2>/dev/null)" != 0 ]; then push="WebSocket push"; fi
  say "$DOMAIN running: JMAP http://127.0.0.1:$JMAP_PORT/.well-known/jmap ($push), SMTP 127.0.0.1:$SUBMIT_PORT (STARTTLS: $SUBMIT_TLS_PORT, stock: $SUBMIT_STOCK_PORT), inbound $MX_PORT, DKIM results by $AUTHSERV_ID"
}

cmd_check() {
  local user=${1:-} pass=${2:-$PASSWORD} n
  for n in $(instances); do use_instance "$n"; check_instance; done
  if [ -n "$user" ]; then
    for_user "$user"
    curl -fsS -L -u "$ADDRESS:$pass" "http://127.0.0.1:$JMAP_PORT/.well-known/jmap" >/dev/null \
      || die "JMAP session for $ADDRESS failed"
  fi
}

# What a running instance was started with; one started otherwise (an older version of this
# script, another peer domain) is restarted.
stamp() { echo "opendkim, stock submission, peer ${PEER_DOMAIN:-none}:${PEER_MX_PORT:-none}"; }

# Starts what of the instance is not running; launch_instance returns while Cyrus starts (the
# domains start side by side), await_instance waits for its ports.
launch_instance() {
  if running && [ "$(cat "$DIR/instance.stamp" 2>/dev/null)" != "$(stamp)" ]; then
    say "$DOMAIN runs from an older version of this script or for another peer domain: restarting it"
    stop_instance
  fi
  if running && dkim_running; then say "$DOMAIN already running"; return 0; fi
  prepare_dirs
  start_syslog_sink
  start_opendkim
  if running; then return 0; fi   # OpenDKIM had stopped alone
  "$CYRUS/master" -C "$DIR/imapd.conf" -M "$DIR/cyrus.conf" -p "$DIR/cyrus.pid" -d -L "$DIR/log/cyrus-master.log"
  # `postfix start` checks the installation first (a second or so): the domains' run at once.
  postfix -c "$DIR/postfix/etc" start 2>>"$DIR/log/postfix-start.log" &
  POSTFIX_START=$!
}

await_instance() {
  if [ -n "$POSTFIX_START" ]; then
    wait "$POSTFIX_START" || die "postfix of $DOMAIN did not start; see $DIR/log/postfix.log and postfix-start.log"
  fi
  for p in "$IMAP_PORT" "$JMAP_PORT" "$SUBMIT_PORT" "$SUBMIT_TLS_PORT" "$SUBMIT_STOCK_PORT" "$MX_PORT"; do wait_for_port "$p"; done
  # master writes its pid file a moment after it forks
  for _ in $(seq 1 50); do [ -s "$DIR/cyrus.pid" ] && break; sleep 0.1; done
  stamp >"$DIR/instance.stamp"
}

cmd_start() {
  [ "$(id -u)" = 0 ] || die "start needs root (Cyrus' master binds as root, then drops to user cyrus)"
  command -v "$CYRUS/master" >/dev/null || die "Cyrus is not installed: run '$0 install' first"
  command -v opendkim >/dev/null || die "OpenDKIM is not installed: run '$0 install' first"
  mkdir -p "$DIR_1"
  # Tests start the host concurrently: one of them starts it, the others wait for it.
  exec 9>"$DIR_1.lock"
  flock 9
  local n u
  # Every domain's key first: each verifier is given all the public keys.
  for n in $(instances); do use_instance "$n"; mkdir -p "$DIR/log"; make_dkim_key; done
  for n in $(instances); do use_instance "$n"; write_public_keys; done
  local -A postfix_start=()
  for n in $(instances); do
    use_instance "$n"; POSTFIX_START=""; launch_instance; postfix_start[$n]=$POSTFIX_START
  done
  for n in $(instances); do use_instance "$n"; POSTFIX_START=${postfix_start[$n]}; await_instance; done
  for u in "$@"; do cmd_adduser "$u"; done
  flock -u 9
  cmd_check
}

# Stopping: each domain's daemons are told to stop (signal_instance), all are waited for at
# once (await_stopped), then their pid files go (tidy_instance).
STOPPING=()
signal_instance() {
  if [ -d "$DIR/postfix/etc" ]; then postfix -c "$DIR/postfix/etc" stop 2>/dev/null || true; fi
  local pid
  if [ -s "$DIR/cyrus.pid" ]; then
    pid=$(cat "$DIR/cyrus.pid")
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; STOPPING+=("$pid"); fi
  fi
  # OpenDKIM keeps nothing, and on SIGTERM its milter library waits out a poll of seconds.
  if [ -s "$DIR/dkim/opendkim.pid" ]; then
    pid=$(cat "$DIR/dkim/opendkim.pid")
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; STOPPING+=("$pid"); fi
  fi
}

await_stopped() {
  local pid alive
  for _ in $(seq 1 50); do
    alive=0
    for pid in "${STOPPING[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${STOPPING[@]}"; do kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"; done
  STOPPING=()
}

tidy_instance() {
  rm -f "$DIR/cyrus.pid" "$DIR/dkim/opendkim.pid" "$DIR/dkim/opendkim.sock" "$DIR/instance.stamp"
  if [ -f "$DIR/syslog.pid" ]; then
    kill "$(cat "$DIR/syslog.pid")" 2>/dev/null || true
    rm -f "$DIR/syslog.pid" /dev/log
  fi
  say "$DOMAIN stopped"
}

stop_instance() { signal_instance; await_stopped; tidy_instance; }

cmd_stop() {
  local n
  for n in $(instances); do use_instance "$n"; signal_instance; done
  await_stopped
  for n in $(instances | rev); do use_instance "$n"; tidy_instance; done
}

cmd_env() {
  cat <<ENV
export MAILHOST_DOMAIN=$DOMAIN_1
export MAILHOST_PASSWORD=$PASSWORD
export MAILHOST_JMAP_URL=http://127.0.0.1:$JMAP_PORT_1/.well-known/jmap
export MAILHOST_SMTP_HOST=127.0.0.1
export MAILHOST_SMTP_PORT=$SUBMIT_PORT_1
export MAILHOST_SMTP_TLS_PORT=$SUBMIT_TLS_PORT_1
export MAILHOST_SMTP_STOCK_PORT=$SUBMIT_STOCK_PORT_1
export MAILHOST_MX_PORT=$MX_PORT_1
export MAILHOST_AUTHSERV_ID=mx.$DOMAIN_1
ENV
  [ -n "$DOMAIN_2" ] || return 0
  cat <<ENV
export MAILHOST2_DOMAIN=$DOMAIN_2
export MAILHOST2_JMAP_URL=http://127.0.0.1:$JMAP_PORT_2/.well-known/jmap
export MAILHOST2_SMTP_HOST=127.0.0.1
export MAILHOST2_SMTP_PORT=$SUBMIT_PORT_2
export MAILHOST2_SMTP_TLS_PORT=$SUBMIT_TLS_PORT_2
export MAILHOST2_SMTP_STOCK_PORT=$SUBMIT_STOCK_PORT_2
export MAILHOST2_MX_PORT=$MX_PORT_2
export MAILHOST2_AUTHSERV_ID=mx.$DOMAIN_2
ENV
}

# For a script that starts the mail host (SCRIPT, run by a user who is not root): unless it
# runs already, says what to run instead and fails.
cmd_need_root() {
  local script=${1:-this script}
  [ "$(id -u)" = 0 ] && return 0
  (cmd_check) >/dev/null 2>&1 && return 0
  if command -v sudo >/dev/null 2>&1; then
    echo "$script: the mail host it starts needs root (apt-get, Cyrus); run: sudo $script" >&2
  else
    echo "$script: the mail host it starts needs root (apt-get, Cyrus); run it as root (sudo is not installed)" >&2
  fi
  exit 1
}

case "${1:-}" in
  install) cmd_install ;;
  start) shift; cmd_start "$@" ;;
  adduser)
    shift; [ $# -ge 1 ] || die "usage: $0 adduser USER [PASSWORD]"
    exec 9>"$DIR_1.lock"; flock 9   # saslpasswd2 must not run twice at once on one sasldb
    for_user "$1"
    running || die "the mail host of $DOMAIN is not running: start it with '$0 start'"
    cmd_adduser "$@" ;;
  passwd)
    shift; [ $# -eq 2 ] || die "usage: $0 passwd USER PASSWORD"
    exec 9>"$DIR_1.lock"; flock 9
    for_user "$1"
    running || die "the mail host of $DOMAIN is not running: start it with '$0 start'"
    cmd_passwd "$@" ;;
  check) shift; cmd_check "$@" ;;
  need-root) shift; cmd_need_root "$@" ;;
  env) cmd_env ;;
  stop) cmd_stop ;;
  clean) cmd_stop; rm -rf "$DIR_1" "$DIR_1.lock"; if [ -n "$DOMAIN_2" ]; then rm -rf "$DIR_2"; fi ;;
  *) echo "usage: $0 install | start [USER ...] | adduser USER [PASSWORD] | passwd USER PASSWORD | check [USER] | env | stop | clean | need-root SCRIPT" >&2; exit 2 ;;
esac
