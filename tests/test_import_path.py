"""The checkout's kernels/ and quant/ are never importable as top-level packages: not in this test
process, not in any Python child that edge-runtime, its tests or its tools start, on every Python
we support (edge_runtime/import_path.py). Were they, Hugging Face's `kernels` package (which
transformers imports when a model module loads) would resolve to our folder."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_runtime import import_path
from edge_runtime.import_path import CHECKOUT_ROOT, code_argv, module_argv

ROOT = Path(__file__).resolve().parent.parent
# prints where `kernels` and `quant` resolve from, as JSON; run in the checkout root
PROBE = ("import importlib.util, json\n"
         "specs = {n: importlib.util.find_spec(n) for n in ('kernels', 'quant')}\n"
         "print(json.dumps({n: s and s.origin for n, s in specs.items()}))")
SUPPORTED = [(3, 10), (sys.version_info.major, sys.version_info.minor)]


def _inside_checkout(origin: str | None) -> bool:
    """Whether a module origin is one of our top-level folders (not, say, a .venv in the tree)."""
    return origin is not None and Path(origin).resolve().parent in (ROOT / "kernels", ROOT / "quant")


def _resolved_in_child(argv: list[str]) -> dict[str, str | None]:
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_this_process_resolves_kernels_and_quant_outside_the_checkout():
    assert CHECKOUT_ROOT == ROOT
    for name in ("kernels", "quant"):
        spec = importlib.util.find_spec(name)
        origin = spec and spec.origin
        assert not _inside_checkout(origin), (
            f"`import {name}` resolves to {origin}, the checkout's own folder: the test run put the "
            f"checkout root on sys.path. Run the suite with .venv/bin/pytest (make test), never "
            f"`python -m pytest` from the checkout.")


@pytest.mark.parametrize("version", SUPPORTED, ids=lambda v: f"py{v[0]}.{v[1]}")
def test_code_children_started_in_the_checkout_do_not_see_it(version):
    """As built for this Python and for 3.10 (which has no -P): the checkout root, the working
    directory, is not on the child's sys.path."""
    resolved = _resolved_in_child(code_argv(PROBE, version=version))
    assert not any(_inside_checkout(o) for o in resolved.values()), resolved


@pytest.mark.parametrize("version", SUPPORTED, ids=lambda v: f"py{v[0]}.{v[1]}")
def test_module_children_run_the_module_with_its_arguments_outside_the_checkout(tmp_path, version):
    (tmp_path / "probe_module.py").write_text(
        "import sys\n" + PROBE.replace("json.dumps({", "json.dumps({'argv': sys.argv[1:], **{")
        .replace(".items()}))", ".items()}}))") + "\n")
    proc = subprocess.run(module_argv("probe_module", "--flag", "value", version=version), cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    resolved = json.loads(proc.stdout.splitlines()[-1])
    assert resolved.pop("argv") == ["--flag", "value"]
    assert not any(_inside_checkout(o) for o in resolved.values()), resolved


def test_a_bare_child_in_the_checkout_would_see_it():
    """What the checks above guard against is real: `python -c` started in the checkout root
    resolves `kernels` and `quant` to our folders when nothing else provides them, and to ours
    ahead of an installed `kernels` when one is."""
    resolved = _resolved_in_child([sys.executable, "-c", PROBE])
    assert all(_inside_checkout(o) for o in resolved.values()), resolved


def test_importing_edge_runtime_with_the_checkout_on_sys_path_says_how_to_start_instead():
    proc = subprocess.run([sys.executable, "-c", "import edge_runtime"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "ImportError: edge-runtime: the checkout root" in proc.stderr
    assert ".venv/bin" in proc.stderr and "python -P -m" in proc.stderr


def test_the_refusal_names_each_entry_and_ignores_other_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert import_path.checkout_entries(["", str(ROOT), str(tmp_path)], ROOT) == [str(ROOT)]
    monkeypatch.chdir(ROOT)
    assert import_path.checkout_entries(["", str(tmp_path)], ROOT) == [""]
    assert import_path.checkout_entries([str(ROOT)], tmp_path) == []  # no kernels/ + quant/ there
    with pytest.raises(ImportError, match=r"is on sys.path as '.*/tests/\.\.'"):
        import_path.refuse_checkout_on_path([str(tmp_path), str(ROOT / "tests" / "..")], ROOT)
    import_path.refuse_checkout_on_path([str(tmp_path)], ROOT)


def _python_starts(tree: ast.AST) -> list[int]:
    """Lines of list displays that start a Python child by hand: [sys.executable, "-m"/"-c"/"-P", ...]."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List) and len(node.elts) >= 2:
            first, second = node.elts[0], node.elts[1]
            if (ast.unparse(first) == "sys.executable" and isinstance(second, ast.Constant)
                    and second.value in ("-m", "-c", "-P")):  # -P: not on 3.10 (JetPack 6)
                lines.append(node.lineno)
    return lines


def test_every_python_child_is_started_through_import_path():
    """A hand-built `[sys.executable, "-m", ...]` started in the checkout would see it; scripts run
    by path (`[sys.executable, "tools/x.py"]`) get their own folder first and are fine."""
    allowed = {ROOT / "tests/test_import_path.py"}  # the demonstrations above
    found = []
    for folder in ("edge_runtime", "kernels", "quant", "tests", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in allowed or ".venv" in path.parts:
                continue
            found += [f"{path.relative_to(ROOT)}:{n}" for n in _python_starts(ast.parse(path.read_text()))]
    assert not found, ("start these with edge_runtime.import_path.module_argv / code_argv: "
                       + ", ".join(found))


def test_the_scan_finds_a_hand_built_start():
    tree = ast.parse('import subprocess, sys\nsubprocess.run([sys.executable, "-m", "edge_runtime"])\n')
    assert _python_starts(tree) == [2]


def test_no_tool_puts_the_checkout_root_on_sys_path():
    offenders = []
    for path in sorted((ROOT / "tools").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.path.insert"
                    and len(node.args) == 2):
                target = ast.unparse(node.args[1])
                if target in ("'.'", "''", "str(ROOT)", "str(REPO)") or target.endswith("parents[1])"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {target}")
    assert not offenders, offenders


def test_tools_import_the_checkouts_package_where_none_is_installed(tmp_path):
    """tools/source_tree.py on a machine given the working tree only (here: no site packages, so
    no installed edge_runtime): the checkout's package, its kernels/ and quant/ as pyproject.toml
    maps them, and still no top-level `kernels`."""
    code = (f"import importlib.util, sys; sys.path.insert(0, {str(ROOT / 'tools')!r})\n"
            "assert importlib.util.find_spec('edge_runtime') is None\n"
            "from source_tree import import_edge_runtime\n"
            "er = import_edge_runtime()\n"
            "spec = lambda n: importlib.util.find_spec(n)\n"
            "print(er.__file__, spec('edge_runtime.kernels').origin, spec('edge_runtime.quant').origin,"
            " spec('kernels'))\n")
    proc = subprocess.run([sys.executable, "-S", *code_argv(code)[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(ROOT / "edge_runtime/__init__.py"), str(ROOT / "kernels/__init__.py"),
                                   str(ROOT / "quant/__init__.py"), "None"]
