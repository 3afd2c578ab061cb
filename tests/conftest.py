"""Options for the whole suite (pytest reads them from this top-level conftest before parsing the command
line; a conftest further down would be too late for ``--sglang-venv``)."""

import pytest
from polling import SCALE


def pytest_report_header() -> str:
    return f"ebctl test timeouts x {SCALE:g} (EBCTL_TEST_TIMEOUT_SCALE)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sglang-venv", default=None, metavar="PATH",
                     help="SGLang CPU virtualenv from tools/sglang_env.sh (default: the cached one, if built); "
                          "given, the SGLang tests must run (a missing environment is an error, not a skip)")
