"""Write docs/configuration.md from the key specifications in ebctl/config.py (``config.reference_markdown()``).

    python tools/gen_config_doc.py [--check]

``--check`` writes nothing and exits 1 when the file is stale (what tests/unit/test_config.py checks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ebctl import config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file is stale")
    a = ap.parse_args(argv)
    path = REPO / config.REFERENCE_PATH
    text = config.reference_markdown()
    current = path.read_text() if path.is_file() else None
    if current == text:
        print(f"{config.REFERENCE_PATH} is up to date")
        return 0
    if a.check:
        print(f"{config.REFERENCE_PATH} is stale: run `{config.REFERENCE_COMMAND}`")
        return 1
    path.write_text(text)
    print(f"wrote {config.REFERENCE_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
