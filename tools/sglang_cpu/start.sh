#!/usr/bin/env bash
# ebctl steering the real sglang 0.5.23 on a machine without a GPU: `ebctl start --engine sglang` with a tiny
# model made locally (2 layers, nothing downloaded), torch on one pinned OpenMP thread.
#
#   bash tools/sglang_cpu/start.sh [MORE SGLANG FLAGS ...]      # Ctrl-C stops it; `ebctl status` in another shell
#
# What it runs, step by step (docs/sglang-cpu.md says why each is needed):
#   1. tools/sglang_env.sh: the CPU environment of sglang 0.5.23 (CPU torch, sglang --no-deps and its pure-Python
#      pins), built once per machine under ~/.cache/ebctl (this VM: 5 minutes and 2.7 GB the first time);
#   2. this checkout installed into it (pip --no-deps -e), so its `ebctl` and the plugin are this code;
#   3. the tiny model, once, in ~/.cache/ebctl/tiny-model (EBCTL_TINY_MODEL overrides);
#   4. ebctl start --engine sglang with the flags a CPU needs (port 30000 unless MORE FLAGS say --port).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$(bash "$REPO/tools/sglang_env.sh" | tail -n 1)"
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$REPO"
MODEL="${EBCTL_TINY_MODEL:-${EBCTL_SGLANG_CACHE:-$HOME/.cache/ebctl}/tiny-model}"
if [ ! -f "$MODEL/config.json" ]; then
  "$VENV/bin/python" "$REPO/tools/sglang_cpu/make_tiny_model.py" "$MODEL" >/dev/null
fi
export SGLANG_USE_CPU_ENGINE=1 SGLANG_CPU_OMP_THREADS_BIND=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO/tools/sglang_cpu${PYTHONPATH:+:$PYTHONPATH}"  # the sgl_kernel stand-in
exec "$VENV/bin/ebctl" start --engine sglang -- --model-path "$MODEL" --host 127.0.0.1 --port 30000 \
  --device cpu --attention-backend torch_native --disable-cuda-graph --mem-fraction-static 0.1 \
  --max-total-tokens 16384 --max-running-requests 16 --chunked-prefill-size 256 --enable-mixed-chunk \
  --sleep-on-idle "$@"
