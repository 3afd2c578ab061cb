"""SGLang plugin of ebctl: entry point ``ebctl`` in the group ``sglang.srt.plugins`` (pyproject.toml).

Enabled with ``SGLANG_PLUGINS=ebctl`` (``ebctl start --engine sglang`` sets it, with ``EBCTL_CONFIG``).
SGLang runs :func:`register` in every process it starts (launcher, scheduler per rank, detokenizer, the
data-parallel controller); it only registers hooks (``hooks.py``; and ``dispatch.py`` where sglang's DP
controller module is loaded, without importing it anywhere else). The config is read and the sockets opened
lazily, on the first hook call inside a scheduler (or the DP controller's event loop). Design and fail-open
rules: docs/design.md; hook points: tools/sglang_cpu/HOOKS.md.
"""

from __future__ import annotations

import logging
import os
import sys

TESTED_SGLANG = "0.5.23"  # the hook points were read from and tested against this release only

log = logging.getLogger("ebctl.sglang")


def register() -> None:
    """Install the hooks, unless this sglang is not the tested one (then stock, one warning) and the
    config does not say ``engine.force_version = true``."""
    version = sglang_version()
    if version != TESTED_SGLANG:
        if not _forced():
            log.warning("ebctl: sglang %s is not the version this plugin was tested with (%s): no hooks "
                        "installed, sglang runs stock. Set engine.force_version = true in the ebctl config "
                        "to run the plugin anyway.", version, TESTED_SGLANG)
            return
        log.warning("ebctl: sglang %s is not the tested %s; engine.force_version = true: hooks installed",
                    version, TESTED_SGLANG)
    from sglang_patch.hooks import install

    install()
    from sglang_patch.shutdown import install as install_shutdown

    install_shutdown()  # the launcher answers SIGTERM at once (``ebctl start``'s Ctrl-C)
    if "sglang.srt.managers.data_parallel_controller" in sys.modules:  # the DP controller (and the launcher)
        from sglang_patch.dispatch import install as install_dispatch

        install_dispatch()


def sglang_version() -> str:
    try:
        import sglang

        return str(sglang.__version__)
    except Exception:
        return "unknown"


def _forced() -> bool:
    """engine.force_version from the config (read only on a version mismatch); False if unreadable."""
    try:
        from ebctl import config

        return config.load(os.environ.get("EBCTL_CONFIG") or None).engine.force_version
    except Exception:
        log.warning("ebctl: cannot read the ebctl config to check engine.force_version", exc_info=True)
        return False
