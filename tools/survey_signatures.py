"""Survey the SGLang symbols the plugin touches in released SGLang wheels; write patches/signature_table.json.

    pip download --no-deps sglang==0.5.17 -d /tmp/sgl   # one wheel per supported release
    python -m tools.survey_signatures /tmp/sgl/sglang-0.5.*.whl

Reads each wheel's source without importing it (releases pin different torch versions, so no one
environment holds them all): for every hooked target (``Hook(...)`` in patches/) and every symbol in
``patches/signatures.CALLED``, the parameter list of the function or method, resolved through
``from X import Y`` re-exports. The table keeps the releases where a symbol's parameters changed
(null: absent from that release on); the launch check (patches/signatures.py) compares the
installed SGLang against the row of its release.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "patches" / "signature_table.json"


class Wheel:
    """One release's ``sglang`` sources, read from its wheel."""

    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())
        self.version = re.match(r"sglang-([^-]+)-", path.name).group(1)
        self._trees: dict[str, ast.Module] = {}

    def module(self, dotted: str) -> ast.Module | None:
        base = dotted.replace(".", "/")
        for name in (f"{base}.py", f"{base}/__init__.py"):
            if name in self.names:
                if name not in self._trees:
                    self._trees[name] = ast.parse(self.zip.read(name))
                return self._trees[name]
        return None


def _find(body: list[ast.stmt], name: str) -> ast.AST | None:
    """The statement defining or importing ``name`` in a module or class body (also inside if/try)."""
    nested = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return node
        if isinstance(node, (ast.If, ast.Try)):
            nested += [node.body, node.orelse, *(h.body for h in getattr(node, "handlers", ()))]
    for block in nested:
        if (found := _find(block, name)) is not None:
            return found
    return None


def _source_module(module: str, node: ast.ImportFrom, wheel: Wheel) -> str:
    """The absolute module a (possibly relative) ``from ... import`` in ``module`` reads."""
    if not node.level:
        return node.module
    package = module.split(".")
    if f"{module.replace('.', '/')}/__init__.py" not in wheel.names:
        package = package[:-1]
    package = package[: len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def resolve(wheel: Wheel, dotted: str, depth: int = 0) -> ast.AST | None:
    """The def of ``dotted`` (module path, then attributes) in ``wheel``; None where it is absent."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        tree = wheel.module(module)
        if tree is None:
            continue
        node, rest = _find(tree.body, parts[cut]), parts[cut + 1 :]
        if node is None and depth < 6:  # `from .x import *` re-exports
            for star in (n for n in tree.body if isinstance(n, ast.ImportFrom) and n.names[0].name == "*"):
                if found := resolve(wheel, ".".join([_source_module(module, star, wheel), *parts[cut:]]), depth + 1):
                    return found
        if isinstance(node, ast.ImportFrom) and depth < 6:
            original = next(a.name for a in node.names if (a.asname or a.name) == parts[cut])
            return resolve(wheel, ".".join([_source_module(module, node, wheel), original, *rest]), depth + 1)
        for attr in rest:
            node = _find(node.body, attr) if isinstance(node, ast.ClassDef) else None
        return node
    return None


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def _dataclass_fields(node: ast.ClassDef) -> list[str]:
    """A dataclass's own fields in order (annotated names, not ClassVar or InitVar-free pseudo fields)."""
    return [
        n.target.id
        for n in node.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and "ClassVar" not in ast.unparse(n.annotation)
    ]


def signature(node: ast.AST | None) -> str | None:
    """``(a, b, /, c, *args, d, **kw)``: parameter names and kinds, as patches/signatures.py formats them;
    a dataclass (its own fields, without an ``__init__`` of its own) as the parameters of its constructor."""
    if isinstance(node, ast.ClassDef) and _is_dataclass(node) and _find(node.body, "__init__") is None:
        return f"({', '.join(_dataclass_fields(node))})"
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = node.args
    names = [p.arg for p in a.posonlyargs] + (["/"] if a.posonlyargs else []) + [p.arg for p in a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        names.append("*")
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return f"({', '.join(names)})"


def surveyed_symbols() -> list[str]:
    """Every SGLang target of a ``Hook(...)`` in patches/, and ``signatures.CALLED``."""
    symbols = set()
    for path in (REPO / "patches").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Hook" and node.args:
                target = node.args[0]
                if isinstance(target, ast.Constant) and target.value.startswith("sglang."):
                    symbols.add(target.value)
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "CALLED":
                symbols.update(ast.literal_eval(node.value))
    return sorted(symbols)


def changes(wheels: list[Wheel], symbol: str) -> dict[str, str | None]:
    """The releases where ``symbol``'s parameters changed, oldest first (a leading None is dropped)."""
    row: dict[str, str | None] = {}
    last: object = object()
    for wheel in wheels:
        sig = signature(resolve(wheel, symbol))
        if sig != last and (row or sig is not None):
            row[wheel.version] = sig
        last = sig
    return row


def render(wheels: list[Wheel]) -> str:
    """The table as JSON, one symbol a line: {"releases": [...], "signatures": {symbol: {release: params}}}."""
    rows = [f"  {json.dumps(symbol)}: {json.dumps(changes(wheels, symbol))}" for symbol in surveyed_symbols()]
    releases = json.dumps([w.version for w in wheels])
    return '{\n "releases": ' + releases + ',\n "signatures": {\n' + ",\n".join(rows) + "\n }\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", nargs="+", type=Path, help="one sglang wheel per supported release")
    parser.add_argument("--out", type=Path, default=TABLE)
    args = parser.parse_args()
    wheels = sorted((Wheel(p) for p in args.wheels), key=lambda w: tuple(int(x) for x in re.findall(r"\d+", w.version)))
    args.out.write_text(render(wheels))
    print(f"{args.out}: {len(surveyed_symbols())} symbols over {', '.join(w.version for w in wheels)}")


if __name__ == "__main__":
    main()
