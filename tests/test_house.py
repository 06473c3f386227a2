"""The house's own rules that no linter states: no function in the package over 100 lines (a longer one is
several steps; name them). Complexity is ruff's (C901, at most 15: pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "chorus"
MAX_LINES = 100


def long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (n lines)`` of every function or method under ``root`` longer than ``limit``
    lines, from its ``def`` (decorators excluded) to its last line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_the_package_is_over_100_lines():
    assert long_functions(PACKAGE, MAX_LINES) == []


def test_the_rule_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path, MAX_LINES) == [f"{tmp_path.name}/long.py:1 long (101 lines)"]
