"""Every function of the product reads in one sitting (``make lint``).

    python -m tools.function_sizes            # nothing printed, exit 0: all within

Two rules, over ``edge_agent``, ``edge_core`` and ``cloud_gateway``:

- **Cyclomatic complexity at radon's grade C or better** (at most 20 paths through
  a function): past that, the branches of one function no longer fit in a reader's
  head, and the rules inside it should be functions named for them.
- **At most 60 lines of body** (the docstring not counted: prose explains, it is
  not code to hold in mind), unless the line of the ``def`` or the one above it
  says why in a comment that begins ``# long:``, as a migration's one table of DDL
  or a command's one table of options may.

Radon measures the complexity (the tool the issue that asked for this named); the
length is read from the syntax tree, so that a decorator or a docstring does not
count.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_rank, cc_visit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edge_agent", "edge_core", "cloud_gateway")
MAX_LINES = 60
WORST_RANK = "C"
REASON = "# long:"


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the function's end."""
    body = node.body
    first = body[0]
    if ast.get_docstring(node, clean=False) is not None and len(body) > 1:
        first = body[1]
    end = node.end_lineno or node.lineno
    return end - first.lineno + 1


def has_reason(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A ``# long:`` comment on the ``def`` line or the line above it."""
    at = node.lineno - 1
    return any(REASON in lines[i] for i in (at - 1, at) if 0 <= i < len(lines))


def problems(path: Path) -> Iterator[str]:
    """What in ``path`` breaks either rule, one line each."""
    source = path.read_text(encoding="utf-8")
    where = path.relative_to(ROOT)
    for block in cc_visit(source):
        rank = cc_rank(block.complexity)
        if rank > WORST_RANK:
            yield f"{where}:{block.lineno} {block.fullname}: complexity {block.complexity} ({rank})"
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            size = body_lines(node)
            if size > MAX_LINES and not has_reason(lines, node):
                yield f"{where}:{node.lineno} {node.name}: {size} lines (say why: {REASON} ...)"


def main() -> int:
    found = [
        problem
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for problem in problems(path)
    ]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
