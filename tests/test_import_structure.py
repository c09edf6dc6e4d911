"""The package's import graph, read statically from the source (nothing is imported).

- The packages (and the top-level modules) have a declared order, ORDER, lowest first: each
  imports only those below it, so no package imports another in a cycle. A new package or
  top-level module is added to ORDER where it belongs (docs/architecture.md draws the same order).
- An import of the package's own modules sits at the top of its file (a module-level try or if,
  for an optional library, counts as the top); one inside a function carries a comment on its
  line, or on the line above, that says why (an optional library, start-up time).
- No import cycle among edge_runtime's modules (kernels/ and quant/ included, as installed:
  edge_runtime.kernels, edge_runtime.quant). Imports inside functions count: one placed there
  to dodge a cycle still makes the two modules depend on each other.
- No private name (`_x`) imported from another module of the package: what a module shares is
  public.
- The KV bookkeeping (KV_BOOKKEEPING: page pool, prefix tree, tail allocator, manager...) imports
  no torch, directly or through the package's modules. In it, where objects share a pool, a tree
  and block tables, no `x._name` on anything but `self` or `cls`: each object is used through its
  public methods and attributes, so what one may touch of another is written down in that one.
- Outside edge_runtime/kv/ only the KV modules of KV_INTERFACE are imported: the rest is the
  package's inside.
"""

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# installed package -> source folder (pyproject.toml's package-dir)
PACKAGE_DIRS = {"edge_runtime": ROOT / "edge_runtime", "edge_runtime.kernels": ROOT / "kernels",
                "edge_runtime.quant": ROOT / "quant"}

# Lowest first. A room is a package under edge_runtime (kernels, quant included) or a top-level
# module; `edge_runtime` itself is the root package's __init__.
ORDER = [
    "import_path", "edge_runtime", "errors", "env", "paths", "config_checks",  # foundations
    "listen_address",  # a TCP listen address: parsing, the loopback rule, binding
    "guard_config", "service_limits",  # the budget's guard: and service: schemas
    "quant",  # weight formats and the AWQ algorithm (no kernels)
    "kernels",  # C and Triton kernels, each with its torch reference
    "model",  # the model (forward, loading, quantized layers); reads KV through kv_interface
    "kv",  # the KV cache: bookkeeping, storage, per-back-end step contexts
    "budget", "plan",  # the memory budget and what it gives a model
    "engine",  # scheduling, the step, sampling, back ends
    "guard",  # memory pressure: telemetry, states, actions on the engine
    "service", "voice",  # the API server; the voice loop (uses the service's tool calls)
    "bench", "commands", "cli", "__main__",
]
KV_BOOKKEEPING = {"edge_runtime.kv"} | {f"edge_runtime.kv.{m}" for m in (
    "checks", "inline_arena", "manager", "observability", "page_math", "page_pool", "pool_shrink",
    "prefix_cache", "recent_window", "seq_kv", "simulator", "tail_allocator")}
# what the rest of the package may import of kv/: the KVManager facade and its types, the rules
# the plan and the benches count with, the simulator, what builds the storage and resizes it, the
# step contexts the back ends hand the forward (flat_index: the attention bench builds its rows)
KV_INTERFACE = {"edge_runtime.kv"} | {f"edge_runtime.kv.{m}" for m in (
    "manager", "seq_kv", "page_math", "recent_window", "simulator", "setup", "storage",
    "pool_resize", "flat_context", "paged_context", "decode_shape", "flat_index")}


def package_modules() -> dict[str, Path]:
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def module_sources(modules: dict[str, Path]) -> dict[str, tuple[str, bool]]:
    """module -> (its source, whether it is a package's __init__)."""
    return {module: (path.read_text(), path.name == "__init__.py") for module, path in modules.items()}


def imported_from(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def comment_lines(source: str) -> set[int]:
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def import_statements(sources: dict[str, tuple[str, bool]]):
    """(importer, imported module, names imported, line, at the top, commented) for every import
    of a package module. At the top: not inside a function or class (a module-level try or if,
    as for an optional library, counts as the top). Commented: a comment on one of the
    statement's lines or on the line above it."""
    for module, (source, is_package) in sources.items():
        tree = ast.parse(source)
        comments = comment_lines(source)
        nested = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                nested.update(id(n) for n in ast.walk(node) if n is not node)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            top = id(node) not in nested
            commented = any(line in comments for line in range(node.lineno - 1, node.end_lineno + 1))
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in sources:
                        yield module, alias.name, [], node.lineno, top, commented
            else:
                source_module = imported_from(module, is_package, node)
                for alias in node.names:
                    submodule = f"{source_module}.{alias.name}"
                    if submodule in sources:
                        yield module, submodule, [], node.lineno, top, commented
                    elif source_module in sources:
                        yield module, source_module, [alias.name], node.lineno, top, commented


def imports(modules: dict[str, Path]):
    """(importer, imported module, names imported, line) for every import of a package module."""
    for importer, imported, names, line, _, _ in import_statements(module_sources(modules)):
        yield importer, imported, names, line


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph = {module: set() for module in modules}
    for importer, imported, _, _ in imports(modules):
        if imported != importer:
            graph[importer].add(imported)
    return graph


def room(module: str) -> str:
    """The package (or top-level module) under edge_runtime that a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def structure_problems(sources: dict[str, tuple[str, bool]], order: list[str],
                       kv_interface: set[str] = frozenset()) -> list[str]:
    """What breaks the package order, the imports-at-the-top rule or kv's boundary, one line each.
    kv_interface empty: kv's boundary is not checked."""
    rank = {name: i for i, name in enumerate(order)}
    problems = [f"{module}: its package {room(module)!r} is not in ORDER (declare where it sits)"
                for module in sorted(sources) if room(module) not in rank]
    room_graph: dict[str, set[str]] = {}
    for importer, imported, _, line, top, commented in import_statements(sources):
        low, high = room(importer), room(imported)
        where = f"{importer}:{line}"
        if low != high:
            room_graph.setdefault(low, set()).add(high)
            room_graph.setdefault(high, set())
            if low in rank and high in rank and rank[high] > rank[low]:
                problems.append(f"{where}: {low} imports {imported}, from {high}, which ORDER puts "
                                f"above it")
        if not top and not commented:
            problems.append(f"{where}: {imported} imported inside a function without a comment "
                            "saying why (move it to the top, or say: optional library, start-up time)")
        if kv_interface and high == "kv" and low != "kv" and imported not in kv_interface:
            problems.append(f"{where}: {imported} is inside the KV package (use kv's interface)")
    problems += [f"package cycle: {' <-> '.join(c)}" for c in cycles(room_graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph(package_modules()))
    assert not found, "import cycles (break each by moving what both sides need into a module " \
                      "of its own):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_private_names_imported_across_modules():
    modules = package_modules()
    found = [f"{modules[importer].relative_to(ROOT)}:{line}: {name} from {imported}"
             for importer, imported, names, line in imports(modules)
             for name in names if name.startswith("_") and not name.startswith("__")]
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def private_attributes_of_others(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every `x._name` (not a dunder) whose x is not `self` or `cls`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_private_attribute_finder_finds_another_objects_private_attribute():
    source = ("class Holder:\n"
              "    def total(self, other):\n"
              "        return self._own + other.count + len(other.__dict__)\n"
              "    def reach(self, other):\n"
              "        return other._hidden + self.pool._free()\n")
    assert private_attributes_of_others(source) == [(5, "other._hidden"), (5, "self.pool._free")]


def test_kv_bookkeeping_objects_use_only_each_others_public_surface():
    modules = package_modules()
    assert "edge_runtime.kv.manager" in KV_BOOKKEEPING and KV_BOOKKEEPING <= set(modules)
    found = [f"{modules[m].relative_to(ROOT)}:{line}: {expression}" for m in sorted(KV_BOOKKEEPING)
             for line, expression in private_attributes_of_others(modules[m].read_text())]
    assert not found, "private attributes of another object used in the KV bookkeeping (add " \
                      "a public method or attribute to its class and document it):\n" + \
                      "\n".join(found)


def imports_torch(source: str) -> bool:
    return any((isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names))
               or (isinstance(node, ast.ImportFrom) and not node.level
                   and (node.module or "").split(".")[0] == "torch")
               for node in ast.walk(ast.parse(source)))


def test_kv_bookkeeping_imports_no_torch():
    modules = package_modules()
    graph = import_graph(modules)
    reached, todo = set(), sorted(KV_BOOKKEEPING)
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += graph[module]
    found = sorted(m for m in reached if imports_torch(modules[m].read_text()))
    assert not found, f"the KV bookkeeping reaches torch through {found}"
    assert imports_torch("import torch.nn\n") and imports_torch("from torch import nn\n")


def test_the_tree_keeps_the_package_order_and_imports_at_the_top():
    problems = structure_problems(module_sources(package_modules()), ORDER, KV_INTERFACE)
    assert not problems, "\n".join(problems)


SYNTHETIC_ORDER = ["edge_runtime", "low", "kv", "high"]


def synthetic(**modules: str) -> dict[str, tuple[str, bool]]:
    return {"edge_runtime": ("", True),
            **{"edge_runtime." + name.replace("__", "."): (source, False)
               for name, source in modules.items()}}


def test_structure_check_finds_an_upward_import():
    sources = synthetic(low__a="from edge_runtime.high import b\n", high__b="X = 1\n")
    assert structure_problems(sources, SYNTHETIC_ORDER) == [
        "edge_runtime.low.a:1: low imports edge_runtime.high.b, from high, which ORDER puts above it"]
    assert structure_problems(synthetic(low__a="X = 1\n", high__b="from edge_runtime.low import a\n"),
                              SYNTHETIC_ORDER) == []


def test_structure_check_finds_a_package_cycle():
    sources = synthetic(low__a="import edge_runtime.high.b\n",
                        high__b="def f():\n    from ..low import a  # start-up time\n    return a\n")
    problems = structure_problems(sources, SYNTHETIC_ORDER)
    assert problems[-1] == "package cycle: high <-> low", problems
    assert any("low imports edge_runtime.high.b" in p for p in problems), problems


def test_structure_check_finds_an_undeclared_package():
    sources = synthetic(low__a="X = 1\n", new__c="from edge_runtime.low import a\n")
    assert structure_problems(sources, SYNTHETIC_ORDER) == [
        "edge_runtime.new.c: its package 'new' is not in ORDER (declare where it sits)"]


def test_structure_check_wants_a_reason_for_an_import_inside_a_function():
    bare = "def f():\n    from edge_runtime.low import a\n    return a\n"
    sources = synthetic(low__a="X = 1\n", high__b=bare)
    assert structure_problems(sources, SYNTHETIC_ORDER) == [
        "edge_runtime.high.b:2: edge_runtime.low.a imported inside a function without a comment "
        "saying why (move it to the top, or say: optional library, start-up time)"]
    said = bare.replace("import a\n", "import a  # start-up time: loads torch\n")
    assert structure_problems(synthetic(low__a="X = 1\n", high__b=said), SYNTHETIC_ORDER) == []
    optional = "try:\n    import edge_runtime.low.a\nexcept ImportError:\n    pass\n"
    assert structure_problems(synthetic(low__a="X = 1\n", high__b=optional), SYNTHETIC_ORDER) == []


def test_structure_check_keeps_kv_internals_inside_kv():
    sources = synthetic(kv__pool="X = 1\n", kv__facade="from edge_runtime.kv.pool import X\n",
                        high__b="from edge_runtime.kv.pool import X\n",
                        high__c="from edge_runtime.kv import facade\n")
    assert structure_problems(sources, SYNTHETIC_ORDER, {"edge_runtime.kv.facade"}) == [
        "edge_runtime.high.b:1: edge_runtime.kv.pool is inside the KV package (use kv's interface)"]
