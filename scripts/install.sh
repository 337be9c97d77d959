#!/usr/bin/env bash
# Installs (or uninstalls) ctcache: the binaries ctcached, ctcachectl,
# ctcache-onnxruntime-worker and ctcache-openvino-worker (the daemon runs
# them from beside itself), the
# systemd units, sysusers.d / tmpfiles.d files, the example config, the man
# pages (ctcached(8), ctcachectl(1) and one per ctcachectl command) and shell
# completions (when the binaries can print them) and the operations guide.
# See docs/operations/install.md.
#
#   scripts/install.sh [install|uninstall|units] [VAR=value ...]
#   make install PREFIX=/usr DESTDIR=/tmp/pkg      (the same, through make)
#
#   install    everything below (the default)
#   uninstall  removes what install put there; keeps the cache, the ctcache
#              user and a config file that was edited
#   units      only writes the systemd units (with the binary paths
#              substituted) into $DESTDIR$UNITDIR; tests/run.sh uses it
#
# Variables (environment or VAR=value arguments):
#   DESTDIR      staging root prepended to every path (default: empty)
#   PREFIX       /usr/local
#   BINDIR       $PREFIX/bin (the units' ExecStart= points here)
#   UNITDIR      $PREFIX/lib/systemd/system for PREFIX /usr or /usr/local
#                (both are on systemd's unit path), else /etc/systemd/system
#   SYSUSERSDIR  $PREFIX/lib/sysusers.d (same rule; else /etc/sysusers.d)
#   TMPFILESDIR  $PREFIX/lib/tmpfiles.d (same rule; else /etc/tmpfiles.d)
#   MANDIR       $PREFIX/share/man
#   DOCDIR       $PREFIX/share/doc/ctcache
#   DATADIR      $PREFIX/share (shell completions below it)
#   BUILD_DIR    where the built binaries are: $CARGO_TARGET_DIR/release,
#                else target/release
#   POSTINSTALL  auto (default): with DESTDIR empty, as root, on a systemd
#                host, run systemd-sysusers, systemd-tmpfiles --create and
#                systemctl daemon-reload (uninstall: disable --now first);
#                0 never, 1 always (failing if it cannot)
# The config goes to $DESTDIR/etc/ctcache (the daemon reads
# /etc/ctcache/ctcached.toml) and is never overwritten.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
action=install
for arg in "$@"; do
  case "$arg" in
    install | uninstall | units) action="$arg" ;;
    *=*) export "${arg?}" ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install.sh: unknown argument $arg (try --help)" >&2
      exit 2
      ;;
  esac
done

DESTDIR="${DESTDIR:-}"
PREFIX="${PREFIX:-/usr/local}"
PREFIX="${PREFIX%/}"
BINDIR="${BINDIR:-$PREFIX/bin}"
case "$PREFIX" in
  /usr | /usr/local) libdir="$PREFIX/lib" ;;
  *) libdir="" ;;
esac
UNITDIR="${UNITDIR:-${libdir:+$libdir/systemd/system}}"
UNITDIR="${UNITDIR:-/etc/systemd/system}"
SYSUSERSDIR="${SYSUSERSDIR:-${libdir:+$libdir/sysusers.d}}"
SYSUSERSDIR="${SYSUSERSDIR:-/etc/sysusers.d}"
TMPFILESDIR="${TMPFILESDIR:-${libdir:+$libdir/tmpfiles.d}}"
TMPFILESDIR="${TMPFILESDIR:-/etc/tmpfiles.d}"
DATADIR="${DATADIR:-$PREFIX/share}"
MANDIR="${MANDIR:-$DATADIR/man}"
DOCDIR="${DOCDIR:-$DATADIR/doc/ctcache}"
CONFDIR=/etc/ctcache
POSTINSTALL="${POSTINSTALL:-auto}"
if [ -z "${BUILD_DIR:-}" ]; then
  if [ -n "${CARGO_TARGET_DIR:-}" ] && [ -x "$CARGO_TARGET_DIR/release/ctcached" ]; then
    BUILD_DIR="$CARGO_TARGET_DIR/release"
  else
    BUILD_DIR="$here/target/release"
  fi
fi

UNITS=(ctcached.service ctcached.socket ctcache-gc.service ctcache-gc.timer)
COMPLETIONS=(
  "bash:$DATADIR/bash-completion/completions/ctcachectl"
  "zsh:$DATADIR/zsh/site-functions/_ctcachectl"
  "fish:$DATADIR/fish/vendor_completions.d/ctcachectl.fish"
)

say() { printf 'install.sh: %s\n' "$*"; }
d() { printf '%s%s' "$DESTDIR" "$1"; }

# A unit with the install paths: the sources say /usr/bin and /usr/share/doc.
render_unit() {
  sed -e "s|/usr/bin/|$BINDIR/|g" -e "s|/usr/share/doc/ctcache|$DOCDIR|g" "$here/systemd/$1"
}

install_units() {
  install -d -m 0755 "$(d "$UNITDIR")"
  for u in "${UNITS[@]}"; do
    render_unit "$u" >"$(d "$UNITDIR")/$u.tmp"
    chmod 0644 "$(d "$UNITDIR")/$u.tmp"
    mv -f "$(d "$UNITDIR")/$u.tmp" "$(d "$UNITDIR")/$u"
  done
}

# Whether to touch the running system (users, folders, systemd).
post_ok() {
  case "$POSTINSTALL" in
    0 | no | false) return 1 ;;
    1 | yes | true) return 0 ;;
  esac
  [ -z "$DESTDIR" ] && [ "$(id -u)" = 0 ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null
}

do_install() {
  for b in ctcached ctcachectl ctcache-onnxruntime-worker ctcache-openvino-worker; do
    if [ ! -x "$BUILD_DIR/$b" ]; then
      echo "install.sh: $BUILD_DIR/$b is missing: build first (make build, or" \
        "cargo build --release --locked -p ctcached -p ctcachectl -p ctcache-onnxruntime-worker" \
        "-p ctcache-openvino-worker)," \
        "or set BUILD_DIR" >&2
      exit 1
    fi
  done
  install -d -m 0755 "$(d "$BINDIR")"
  install -m 0755 "$BUILD_DIR/ctcached" "$BUILD_DIR/ctcachectl" "$BUILD_DIR/ctcache-onnxruntime-worker" \
    "$BUILD_DIR/ctcache-openvino-worker" "$(d "$BINDIR")/"
  install_units
  install -d -m 0755 "$(d "$SYSUSERSDIR")" "$(d "$TMPFILESDIR")"
  install -m 0644 "$here/systemd/sysusers.d/ctcache.conf" "$(d "$SYSUSERSDIR")/ctcache.conf"
  install -m 0644 "$here/systemd/tmpfiles.d/ctcache.conf" "$(d "$TMPFILESDIR")/ctcache.conf"

  # Docs and pristine examples (always current), then the live config files
  # only where none exist yet.
  install -d -m 0755 "$(d "$DOCDIR")/examples" "$(d "$DOCDIR")/operations"
  install -m 0644 "$here/docs/OPERATIONS.md" "$(d "$DOCDIR")/OPERATIONS.md"
  install -m 0644 "$here"/docs/operations/*.md "$(d "$DOCDIR")/operations/"
  install -m 0644 "$here/systemd/ctcached.toml" "$(d "$DOCDIR")/examples/ctcached.toml"
  install -m 0644 "$here/systemd/gc.env" "$(d "$DOCDIR")/examples/gc.env"
  install -d -m 0755 "$(d "$CONFDIR")"
  for f in ctcached.toml gc.env; do
    if [ -e "$(d "$CONFDIR")/$f" ]; then
      say "kept the existing $CONFDIR/$f (the shipped one is $DOCDIR/examples/$f)"
    else
      install -m 0644 "$here/systemd/$f" "$(d "$CONFDIR")/$f"
    fi
  done

  # Man pages and completions come from the binaries themselves (hidden
  # `ctcachectl man --dir` and `completions`, `ctcached --print-man`); an
  # older build without them is skipped.
  local ctl="$BUILD_DIR/ctcachectl" tmp pages
  tmp="$(mktemp)"
  pages="$(mktemp -d)"
  if "$ctl" man --dir "$pages" >/dev/null 2>&1 && grep -q '^\.TH' "$pages/ctcachectl.1"; then
    install -d -m 0755 "$(d "$MANDIR")/man1"
    install -m 0644 "$pages"/ctcachectl*.1 "$(d "$MANDIR")/man1/"
  else
    say "this ctcachectl writes no man pages (no 'ctcachectl man --dir'); skipped"
  fi
  rm -rf "$pages"
  if "$BUILD_DIR/ctcached" --print-man >"$tmp" 2>/dev/null && grep -q '^\.TH' "$tmp"; then
    install -d -m 0755 "$(d "$MANDIR")/man8"
    install -m 0644 "$tmp" "$(d "$MANDIR")/man8/ctcached.8"
  else
    say "this ctcached prints no man page (no 'ctcached --print-man'); skipped"
  fi
  for c in "${COMPLETIONS[@]}"; do
    if "$ctl" completions "${c%%:*}" >"$tmp" 2>/dev/null && [ -s "$tmp" ]; then
      install -d -m 0755 "$(d "$(dirname "${c#*:}")")"
      install -m 0644 "$tmp" "$(d "${c#*:}")"
    fi
  done
  rm -f "$tmp"

  if post_ok; then
    systemd-sysusers ${DESTDIR:+--root="$DESTDIR"} "$(d "$SYSUSERSDIR")/ctcache.conf"
    systemd-tmpfiles ${DESTDIR:+--root="$DESTDIR"} --create "$(d "$TMPFILESDIR")/ctcache.conf"
    [ -n "$DESTDIR" ] || systemctl daemon-reload
    say "installed; start with: systemctl enable --now ctcached.socket ctcache-gc.timer"
  else
    say "installed under ${DESTDIR:-/}; on the target run: systemd-sysusers;" \
      "systemd-tmpfiles --create; systemctl daemon-reload;" \
      "systemctl enable --now ctcached.socket ctcache-gc.timer"
  fi
}

do_uninstall() {
  if post_ok; then
    systemctl disable --now ctcache-gc.timer ctcached.socket ctcached.service 2>/dev/null || true
  fi
  rm -f "$(d "$BINDIR")/ctcached" "$(d "$BINDIR")/ctcachectl" "$(d "$BINDIR")/ctcache-onnxruntime-worker" \
    "$(d "$BINDIR")/ctcache-openvino-worker"
  for u in "${UNITS[@]}"; do rm -f "$(d "$UNITDIR")/$u"; done
  rm -f "$(d "$SYSUSERSDIR")/ctcache.conf" "$(d "$TMPFILESDIR")/ctcache.conf"
  rm -f "$(d "$MANDIR")"/man1/ctcachectl.1 "$(d "$MANDIR")"/man1/ctcachectl-*.1 "$(d "$MANDIR")/man8/ctcached.8"
  for c in "${COMPLETIONS[@]}"; do rm -f "$(d "${c#*:}")"; done
  # Config files go only when unchanged from what install wrote.
  for f in ctcached.toml gc.env; do
    if [ -e "$(d "$CONFDIR")/$f" ] && cmp -s "$here/systemd/$f" "$(d "$CONFDIR")/$f"; then
      rm -f "$(d "$CONFDIR")/$f"
    elif [ -e "$(d "$CONFDIR")/$f" ]; then
      say "kept $CONFDIR/$f (edited)"
    fi
  done
  rmdir "$(d "$CONFDIR")" 2>/dev/null || true
  rm -rf "$(d "$DOCDIR")"
  if post_ok; then systemctl daemon-reload; fi
  say "uninstalled; the cache /var/cache/ctcache and the user ctcache were left in place"
}

case "$action" in
  install) do_install ;;
  uninstall) do_uninstall ;;
  units)
    install_units
    say "units written to $(d "$UNITDIR") (ExecStart under $BINDIR)"
    ;;
esac
