"""The ``ebctl`` command line: run the daemon, start a supervised daemon + engine pair, read and steer it.

Exit codes: 0 ok, 2 usage or validation (bad flag, bad key/value, a refused ``tune`` or ``reload``),
1 runtime failure (daemon unreachable, a child died, a missing engine), 130 interrupted (Ctrl-C, except where
it is the way to stop: ``daemon``, ``start``, ``status --watch``). Every command takes the global
options ``--config PATH``, ``--set KEY=VALUE`` (repeatable), ``--runtime-dir DIR`` and ``--insecure``, before
or after its name. Shell only: it loads one ``Config``, talks to the daemon through ``link.ControlClient``
and prints; it decides nothing.

Modules, each importing only those listed before it: ``interrupt`` (Ctrl-C, from the first import on),
``view`` (printing: JSON, tables), ``common`` (the Typer app, global options, the ``command`` decorator,
control requests), ``supervisor`` (``start``'s process groups), ``run`` (``daemon``, ``start``), ``control``
(``status``, ``tune``, ``reload``, ``config``), ``local`` (``profiles``, ``keygen``, ``simulate``), ``ab`` (the A/B
on the user's server, ``ebctl.ab``). This package imports the last four so that their commands register on ``app``
in that order; the console script is ``ebctl.cli:app``.
"""

from ebctl.cli.interrupt import ends_quietly

with ends_quietly():  # the console script imports this before it runs anything: Ctrl-C here is no traceback either
    # The order in which the commands register on ``app`` (and show in --help): run's first.
    # isort: off
    from ebctl.cli import run  # noqa: F401
    from ebctl.cli import control, local  # noqa: F401
    from ebctl.cli import ab  # noqa: F401
    # isort: on
    from ebctl.cli.common import app

__all__ = ["app"]
