"""``python -m ebctl.sim``: the ``simulate`` command on its own."""

from ebctl.sim.cli import main

main()
