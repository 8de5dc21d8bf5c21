"""Give every class, method, property and function of ``python/kvpool/_core.pyi`` the docstring
the compiled module has (written once, as ``///`` comments in ``src/bindings/``), so editors
show it from the stubs.

    python scripts/stub_docstrings.py          # rewrite the stubs in place
    python scripts/stub_docstrings.py --check  # exit 1 if any docstring differs (run by the tests)

Dunder methods other than ``__new__`` are left alone: their runtime docs are Python's generic ones.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

STUB = Path(__file__).resolve().parent.parent / "python" / "kvpool" / "_core.pyi"


def runtime_doc(module: Any, path: list[str]) -> str | None:
    """The cleaned ``__doc__`` of ``module.<path>`` (``None`` if missing or empty); a class's
    ``__new__`` takes the class's own doc (PyO3 documents the constructor on the class)."""
    obj = module
    for i, name in enumerate(path):
        if name == "__new__" and i == len(path) - 1:
            break
        owner = obj
        obj = inspect.getattr_static(owner, name, None) if inspect.isclass(owner) else getattr(owner, name, None)
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__  # the wrapper's own doc is Python's generic one
        if obj is None:
            return None
    if path[-1] == "__new__":
        return None  # the class carries it
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    return inspect.cleandoc(doc)


def docstring_lines(doc: str, indent: str) -> list[str]:
    """``doc`` as the lines of a triple-quoted docstring at ``indent``."""
    doc = doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = doc.splitlines()
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}'] + [f"{indent}{line}".rstrip() for line in lines[1:]] + [f'{indent}"""']


def _has_docstring(node: ast.ClassDef | ast.FunctionDef) -> bool:
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def rewrite(text: str, module: Any) -> str:
    """The stub ``text`` with every documented item's docstring set to the runtime's."""
    lines = text.splitlines()
    edits: list[tuple[int, int, list[str]]] = []  # (first line, last line) 0-based, inclusive -> new lines

    def visit(node: ast.AST, path: list[str], indent: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name_path = [*path, child.name]
                doc = runtime_doc(module, name_path)
                inner = indent + "    "
                if doc is not None:
                    if _has_docstring(child):
                        first = child.body[0]
                        edits.append((first.lineno - 1, first.end_lineno - 1, docstring_lines(doc, inner)))  # type: ignore[operator]
                    elif len(child.body) == 1 and isinstance(child.body[0], ast.Expr):
                        body = child.body[0]  # a bare "..." body
                        edits.append((body.lineno - 1, body.end_lineno - 1, docstring_lines(doc, inner)))  # type: ignore[operator]
                visit(child, name_path, inner)
            elif isinstance(child, ast.FunctionDef):
                if child.name.startswith("__") and child.name != "__new__":
                    continue
                doc = runtime_doc(module, [*path, child.name])
                if doc is None:
                    continue
                body = child.body[0]
                inner = indent + "    "
                if _has_docstring(child):
                    edits.append((body.lineno - 1, body.end_lineno - 1, docstring_lines(doc, inner)))  # type: ignore[operator]
                    continue
                # ``def f(...) -> T: ...`` on its last line: the "..." becomes the docstring.
                row = body.lineno - 1
                head = lines[row][: body.col_offset].rstrip()
                edits.append((row, row, [head, *docstring_lines(doc, inner)]))

    visit(ast.parse(text), [], "")
    for first, last, new in sorted(edits, reverse=True):
        lines[first : last + 1] = new
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report differences instead of writing")
    args = parser.parse_args()
    module = importlib.import_module("kvpool._core")
    old = STUB.read_text()
    new = rewrite(old, module)
    if args.check:
        if new != old:
            print(f"{STUB}: docstrings differ from the compiled module's; run python scripts/stub_docstrings.py",
                  file=sys.stderr)
            return 1
        return 0
    if new != old:
        STUB.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
