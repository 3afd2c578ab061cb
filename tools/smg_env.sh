#!/usr/bin/env bash
# Build, once per machine, a virtual environment with SGLang's gateway, smg (Shepherd Model Gateway), for the
# fleet tests and tools: its own environment, not sglang's (smg is a Rust binary with a thin Python CLI and
# pulls in grpcio, which sglang's pins need not agree with).
#
#   SMG=$(bash tools/smg_env.sh | tail -1)/bin/smg
#   "$SMG" launch --worker-urls http://127.0.0.1:30000 http://127.0.0.1:30001 --policy least_load --port 30080
#
# Cached in ${EBCTL_SGLANG_CACHE:-$HOME/.cache/ebctl}/smg-<version>-<key> (<key>: a hash of this script and the
# Python version), built in a temporary directory and renamed into place with a `.complete` marker, under a
# lock, as tools/sglang_env.sh does. Logs go to stderr; the last line on stdout is the environment's path.
set -euo pipefail

SMG_VERSION=1.13.0
PYTHON="${EBCTL_PYTHON:-python3}"
CACHE="${EBCTL_SGLANG_CACHE:-$HOME/.cache/ebctl}"
log() { printf '[smg_env %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

PYVER="$("$PYTHON" -c 'import platform, sys; print(sys.version.split()[0], platform.machine())')"
KEY="$( { cat "${BASH_SOURCE[0]}"; echo "$PYVER"; } | sha256sum | cut -c1-12)"
VENV="$CACHE/smg-$SMG_VERSION-$KEY"
if [[ -f "$VENV/.complete" ]]; then
    log "cached: $VENV"
    echo "$VENV"
    exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.smg-$KEY.lock"
flock 9
if [[ -f "$VENV/.complete" ]]; then
    echo "$VENV"
    exit 0
fi
START=$(date +%s)
rm -rf "$VENV" "$CACHE"/smg-"$SMG_VERSION-$KEY".partial.*
TMP="$CACHE/smg-$SMG_VERSION-$KEY.partial.$$"
trap 'rm -rf "$TMP"' EXIT
"$PYTHON" -m venv "$TMP"
"$TMP/bin/python" -m pip install --no-input --progress-bar off -q "smg==$SMG_VERSION" >&2
"$TMP/bin/smg" --version >&2 || "$TMP/bin/smg" --help >/dev/null
grep -rlF --null "$TMP" "$TMP/bin" "$TMP/pyvenv.cfg" 2>/dev/null | xargs -0 -r sed -i "s|$TMP|$VENV|g"
date -u +%FT%TZ > "$TMP/.complete"
mv -T "$TMP" "$VENV"
trap - EXIT
log "built $VENV in $(( $(date +%s) - START )) s ($(du -sh "$VENV" | cut -f1))"
echo "$VENV"
