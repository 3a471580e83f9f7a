"""ruff and mypy, as configured in pyproject.toml, pass on the shipped code; the packages
import one another in one direction."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_passes():
    out = _run("ruff", "check", "mmserve", "parsers", "connectors", "tts", "tests", "benchmarks")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_passes():
    out = _run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr


def _unit(module: str) -> str | None:
    """The unit an import lands in: a top-level package, or ``mmserve.<name>``."""
    parts = module.split(".")
    if parts[0] in ("parsers", "connectors", "tts"):
        return parts[0]
    return ".".join(parts[:2]) if parts[0] == "mmserve" and len(parts) > 1 else None


def _import_graph() -> dict[str, set[str]]:
    """unit -> the units it imports, counting imports inside functions too."""
    graph: dict[str, set[str]] = {}
    for pkg in ("mmserve", "parsers", "connectors", "tts"):
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            src = _unit(".".join(p for p in parts if p != "__init__")) or pkg
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [node.module]
                    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    else [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else []
                )
                for name in names:
                    dst = _unit(name)
                    if dst is not None and dst != src:
                        graph.setdefault(src, set()).add(dst)
    return graph


def test_packages_import_in_one_direction():
    """No cycle between mmserve's packages (e.g. the engine imports
    ``mmserve.speculative``, which never imports the engine); ``parsers`` imports nothing
    of mmserve; ``connectors`` and ``tts``, which mmserve may import and which may import
    mmserve's engine types, never import the server."""
    graph = _import_graph()
    assert all(u.split(".")[0] != "mmserve" for u in graph.get("parsers", ()))
    for pkg in ("connectors", "tts"):
        assert "mmserve.server" not in graph.get(pkg, set()), pkg

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    graph = {
        u: {v for v in vs if v.startswith("mmserve.")}
        for u, vs in graph.items()
        if u.startswith("mmserve.")
    }
    cycles = sorted(u for u in graph if reaches(u, u, set()))
    assert not cycles, f"packages on an import cycle: {cycles}"
