"""docs/SEMANTICS.md names the test behind each claim: every test it names must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
_QUALIFIED = re.compile(r"(test_\w+)\.py::(test_\w+)")
_BARE = re.compile(r"`(test_\w+)`")


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")}


def test_every_test_named_in_semantics_exists():
    text = (ROOT / "docs" / "SEMANTICS.md").read_text()
    by_file = {path.stem: _test_functions(path) for path in (ROOT / "tests").glob("test_*.py")}
    everywhere = set().union(*by_file.values())
    missing = [f"{module}.py::{name}" for module, name in _QUALIFIED.findall(text)
               if name not in by_file.get(module, set())]
    missing += [name for name in _BARE.findall(text) if name not in everywhere]
    assert not missing, f"docs/SEMANTICS.md names tests that do not exist: {missing}"
    assert len(_QUALIFIED.findall(text)) >= 20
