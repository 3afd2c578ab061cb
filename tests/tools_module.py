"""A script of tools/ loaded as a module for its tests (tools/ is not a package)."""

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@contextmanager
def tool(name: str) -> Iterator[ModuleType]:
    """tools/<name>.py, registered in ``sys.modules`` under ``name`` while in use (dataclasses look their module
    up there; a tool importing a sibling finds it), removed after."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
