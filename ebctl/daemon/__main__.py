"""``python -m ebctl.daemon --config FILE [--set KEY=VALUE ...] [--insecure]``: the daemon alone."""

import sys

from ebctl.daemon.core import cli_main

sys.exit(cli_main())
