#!/usr/bin/env bash
# Build, once per machine, a virtual environment with the real sglang 0.5.23 running on CPU.
#
#   VENV=$(bash tools/sglang_env.sh | tail -1)
#   "$VENV/bin/pip" install --no-deps --no-build-isolation -e .      # the caller's checkout
#   SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tools/sglang_cpu "$VENV/bin/python" -m sglang.launch_server ...
#
# The environment lives in ${EBCTL_SGLANG_CACHE:-$HOME/.cache/ebctl}/sglang-cpu-<key>, where <key> is a
# short hash of tools/sglang_cpu/requirements-cpu.txt, this script and the Python version: change any of
# them and a new environment is built beside the old one. A complete environment holds a `.complete`
# marker; it is built in a temporary directory, its paths fixed, then renamed into place, so an
# interrupted build is never taken for a complete one. Concurrent callers wait on a lock.
# It does NOT install ebctl itself (CI uses fresh clones: each caller installs its own checkout).
#
# Why each step: docs/sglang-cpu.md (CPU torch wheel, sglang with --no-deps plus pure-Python pins,
# torchvision's CUDA-only meta registrations guarded, sgl_kernel stand-in on PYTHONPATH).
# Logs go to stderr; the last line on stdout is the environment's path.
# Environment: EBCTL_SGLANG_CACHE (cache root), EBCTL_PYTHON (interpreter, default python3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQS="$HERE/sglang_cpu/requirements-cpu.txt"
PYTHON="${EBCTL_PYTHON:-python3}"
CACHE="${EBCTL_SGLANG_CACHE:-$HOME/.cache/ebctl}"

TORCH_VERSION=2.13.0
SGLANG_VERSION=0.5.23
TORCHVISION_VERSION=0.28.0
PYTEST_VERSION=9.2.0

log() { printf '[sglang_env %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

[[ -f "$REQS" ]] || { log "missing $REQS"; exit 1; }
PYVER="$("$PYTHON" -c 'import platform, sys; print(sys.version.split()[0], platform.machine())')"
KEY="$( { cat "$REQS" "${BASH_SOURCE[0]}"; echo "$PYVER"; } | sha256sum | cut -c1-12)"
VENV="$CACHE/sglang-cpu-$KEY"

if [[ -f "$VENV/.complete" ]]; then
    log "cached: $VENV"
    echo "$VENV"
    exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.sglang-cpu-$KEY.lock"
log "waiting for the build lock ($CACHE/.sglang-cpu-$KEY.lock)"
flock 9
if [[ -f "$VENV/.complete" ]]; then  # another caller built it while we waited
    log "cached (built by another caller): $VENV"
    echo "$VENV"
    exit 0
fi

START=$(date +%s)
rm -rf "$VENV" "$CACHE"/sglang-cpu-"$KEY".partial.*   # leftovers of interrupted builds (we hold the lock)
TMP="$CACHE/sglang-cpu-$KEY.partial.$$"
trap 'rm -rf "$TMP"' EXIT
log "building $VENV (python $PYVER) in $TMP"

"$PYTHON" -m venv "$TMP"
PIP=("$TMP/bin/python" -m pip install --no-input --progress-bar off)
step() { local t0; t0=$(date +%s); log "$1"; shift; "$@" >&2; log "  done in $(( $(date +%s) - t0 )) s"; }

step "pip + setuptools + wheel" "${PIP[@]}" --upgrade pip setuptools wheel
# The CPU wheel torch-2.13.0+cpu lies on disk (pip's find-links); `==2.13.0` prefers it over PyPI's.
step "torch==$TORCH_VERSION (CPU wheel)" "${PIP[@]}" "torch==$TORCH_VERSION"
"$TMP/bin/python" -c 'import torch, sys; v = torch.__version__; print("torch", v, file=sys.stderr); assert torch.version.cuda is None, v'
# sglang pins a CUDA torch and many CUDA packages: install it alone, then its pure-Python needs.
step "sglang==$SGLANG_VERSION (--no-deps)" "${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
step "pinned pure-Python requirements (--no-deps)" "${PIP[@]}" --no-deps -r "$REQS"
step "torchvision==$TORCHVISION_VERSION (--no-deps)" "${PIP[@]}" --no-deps "torchvision==$TORCHVISION_VERSION"
# What the tests need beyond the pins (ebctl's runtime deps are all pinned above; listed again so
# a change of pins cannot drop them silently). -c keeps every pin where it is.
step "pytest + ebctl runtime deps" "${PIP[@]}" -c "$REQS" "pytest==$PYTEST_VERSION" \
    numpy scipy pyzmq msgspec typer rich prometheus-client

# torchvision's PyPI wheel is a CUDA build: its fake registrations for torchvision::nms / ::qnms fail
# on import ("operator torchvision::nms does not exist"). Apply them only when the C++ ops are loaded.
META="$("$TMP/bin/python" -c 'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])')/_meta_registrations.py"
sed -i -E 's/^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$/@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda f: f))/' "$META"
[[ "$(grep -c '_has_ops() else (lambda f: f))' "$META")" == 2 ]] || { log "torchvision guard not applied to $META"; exit 1; }
log "guarded torchvision::nms/qnms in $META"

step "smoke import (torch, torchvision, sglang scheduler, transformers)" env SGLANG_USE_CPU_ENGINE=1 \
    PYTHONPATH="$HERE/sglang_cpu" "$TMP/bin/python" -c '
import torch, torchvision, transformers, triton, zmq, msgspec, scipy, pytest
import sglang, sglang.srt.managers.scheduler
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
print("sglang", sglang.__version__, "torch", torch.__version__, "torchvision", torchvision.__version__)'

# venvs hold their absolute path (script shebangs, activate): point them at the final location.
grep -rlF --null "$TMP" "$TMP/bin" "$TMP/pyvenv.cfg" 2>/dev/null | xargs -0 -r sed -i "s|$TMP|$VENV|g"
date -u +%FT%TZ > "$TMP/.complete"
mv -T "$TMP" "$VENV"
trap - EXIT
log "built $VENV in $(( $(date +%s) - START )) s ($(du -sh "$VENV" | cut -f1))"
echo "$VENV"
