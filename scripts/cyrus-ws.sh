#!/usr/bin/env bash
# Builds a WebSocket-capable Cyrus httpd, for real JMAP push (RFC 8887 and EventSource) on the
# test mail host, from Debian's own cyrus-imapd source. Needs root; Debian 12.
#
#   scripts/cyrus-ws.sh        prints the path of a tarball holding usr/local/lib/cyrus-ws/httpd,
#                              building it first unless the cache has one for this Cyrus version
#
# Why: Debian's libwslay-dev has no libwslay.pc, so Cyrus' configure quietly leaves WebSockets
# out although wslay is a build dependency. Configuring with --with-wslay and explicit
# WSLAY_CFLAGS/WSLAY_LIBS enables it. Only httpd uses it, so only httpd is compiled, and it is
# linked against the libcyrus libraries of Debian's cyrus-common of the same version.
# About 70 s with the build dependencies present, ~2.5 min without (they are installed).
#   AAMP_CYRUS_WS_CACHE  where built tarballs are kept (default /var/cache/aamp-mailhost)
#   AAMP_CYRUS_WS_WORK   scratch folder (default /tmp/aamp-cyrus-ws)
set -euo pipefail
cache=${AAMP_CYRUS_WS_CACHE:-/var/cache/aamp-mailhost}
work=${AAMP_CYRUS_WS_WORK:-/tmp/aamp-cyrus-ws}
say() { echo "cyrus-ws: $*" >&2; }
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8

version=$(dpkg-query -W -f='${Version}' cyrus-common 2>/dev/null) || { say "cyrus-common is not installed"; exit 1; }
arch=$(dpkg --print-architecture)
tarball=$cache/cyrus-httpd-ws_${version}_${arch}.tar.gz
if [ -s "$tarball" ]; then echo "$tarball"; exit 0; fi
mkdir -p "$cache"
started=$(date +%s)

# 1. Source package entries, made from the configured Debian ones.
if [ "$(apt-cache showsrc cyrus-imapd 2>/dev/null | grep -c '^Package: cyrus-imapd')" = 0 ]; then
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > /etc/apt/sources.list.d/aamp-cyrus-src.sources
  else
    sed -n 's/^deb \(.*debian.*\)$/deb-src \1/p' /etc/apt/sources.list > /etc/apt/sources.list.d/aamp-cyrus-src.list
  fi
  apt-get update -qq
fi

# 2. The source files of this version, checked against the signed Sources index. A partial
# mirror may hold some of them only under another revision (the orig tarball is shared).
src_version=$(apt-cache show "cyrus-common=$version" | sed -n 's/^Source: cyrus-imapd (\(.*\))$/\1/p' | head -1)
src_version=${src_version:-$version}
rm -rf "$work"; mkdir -p "$work/download" "$work/src"
cd "$work/download"
chown _apt . 2>/dev/null || true
apt-cache showsrc cyrus-imapd | awk -v want="Version: $src_version" '
  /^Version: / { on = ($0 == want) }
  on && /^Checksums-Sha256:/ { grab = 1; next }
  grab && /^ / { if ($3 !~ /\.(dsc|asc)$/) print $1 "  " $3; next }
  { grab = 0 }' > SHA256SUMS
[ -s SHA256SUMS ] || { say "no cyrus-imapd $src_version in the Sources index"; exit 1; }
complete() { sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1; }
for v in "$src_version" $(apt-cache showsrc cyrus-imapd | sed -n 's/^Version: //p'); do
  complete && break
  apt-get source -q --download-only "cyrus-imapd=$v" >/dev/null 2>&1 || true
done
sha256sum -c SHA256SUMS >&2 || { say "could not get the source of cyrus-imapd $src_version"; exit 1; }

# 3. Unpack, apply Debian's patches, and configure with WebSockets.
cd "$work/src"
tar -xf "$work/download/$(awk '$2 ~ /orig\.tar/ { print $2 }' "$work/download/SHA256SUMS")" --strip-components=1
tar -xf "$work/download/$(awk '$2 ~ /debian\.tar/ { print $2 }' "$work/download/SHA256SUMS")"
dpkg-source --before-build . >/dev/null
grep -c -- '--enable-http \\$' debian/rules >/dev/null || { say "debian/rules has no --enable-http line"; exit 1; }
sed -i 's#^\(\s*--enable-http \\\)$#\1\n\t --with-wslay WSLAY_CFLAGS=-I/usr/include/wslay WSLAY_LIBS=-lwslay \\#' debian/rules
say "installing the build dependencies"
apt-get build-dep -y -q --no-install-recommends ./ >/dev/null
say "configuring"
debian/rules override_dh_auto_configure > "$work/configure.log" 2>&1 || { tail -30 "$work/configure.log" >&2; exit 1; }
grep -c '^#define HAVE_WSLAY' config.h >/dev/null || { say "configure left WebSockets out"; exit 1; }

# 4. Compile httpd alone and link it against cyrus-common's libraries of the same version.
printf 'value-%%:\n\t@echo $($*)\n' > "$work/value.mk"
value() { make -s -f Makefile -f "$work/value.mk" "value-$1"; }
objects=$(value imap_httpd_OBJECTS)
say "compiling $(echo $objects | wc -w) objects"
make -j"$(nproc)" $(value BUILT_SOURCES) $objects > "$work/make.log" 2>&1 || { tail -30 "$work/make.log" >&2; exit 1; }
(cd "$work/download" && apt-get download -q "cyrus-common=$version" >/dev/null 2>&1)
dpkg-deb -x "$work"/download/cyrus-common_*.deb "$work/common"
libdir=$work/common/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libs=""
for word in $(value imap_httpd_LDADD); do
  case $word in
    */libcyrus_imap.la) libs="$libs $libdir/libcyrus_imap.so.0" ;;
    */libcyrus_sieve.la) libs="$libs $libdir/libcyrus_sieve.so.0" ;;
    */libcyrus_min.la) libs="$libs $libdir/libcyrus_min.so.0" ;;
    */libcyrus.la) libs="$libs $libdir/libcyrus.so.0" ;;
    -lnsl) ls /usr/lib/*/libnsl.so >/dev/null 2>&1 && libs="$libs $word" ;;
    *) libs="$libs $word" ;;
  esac
done
export DEB_BUILD_MAINT_OPTIONS=hardening=+all
gcc $(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get LDFLAGS) -Wl,--as-needed -Wl,-rpath-link,"$libdir" \
  -o "$work/httpd" $objects $libs $(value HTTP_LIBS) $(value LIBS)
strip --strip-unneeded "$work/httpd"
[ "$(ldd "$work/httpd" | grep -c libwslay)" != 0 ] || { say "httpd is not linked with libwslay"; exit 1; }

# 5. Package it.
mkdir -p "$work/stage/usr/local/lib/cyrus-ws"
install -m 755 "$work/httpd" "$work/stage/usr/local/lib/cyrus-ws/httpd"
echo "cyrus-common $version" > "$work/stage/usr/local/lib/cyrus-ws/BUILDINFO"
tar -czf "$tarball.tmp" -C "$work/stage" --owner=0 --group=0 usr/local/lib/cyrus-ws
mv "$tarball.tmp" "$tarball"
say "built in $(( $(date +%s) - started )) s: $tarball"
echo "$tarball"
