"""The package's import graph, read statically from the source (nothing is imported).

- No import cycle among edge_runtime's modules (kernels/ and quant/ included, as installed:
  edge_runtime.kernels, edge_runtime.quant). Imports inside functions count: one placed there
  to dodge a cycle still makes the two modules depend on each other.
- No private name (`_x`) imported from another module of the package: what a module shares is
  public.
- In edge_runtime/cache/ (the KV bookkeeping, where objects share a pool, a tree and block
  tables), no `x._name` on anything but `self` or `cls`: each object is used through its public
  methods and attributes, so what one may touch of another is written down in that one.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# installed package -> source folder (pyproject.toml's package-dir)
PACKAGE_DIRS = {"edge_runtime": ROOT / "edge_runtime", "edge_runtime.kernels": ROOT / "kernels",
                "edge_runtime.quant": ROOT / "quant"}
CACHE_DIR = ROOT / "edge_runtime" / "cache"


def package_modules() -> dict[str, Path]:
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def imported_from(module: str, path: Path, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(modules: dict[str, Path]):
    """(importer, imported module, names imported, line) for every import of a package module."""
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        yield module, alias.name, [], node.lineno
            elif isinstance(node, ast.ImportFrom):
                source = imported_from(module, path, node)
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in modules:
                        yield module, submodule, [], node.lineno
                    elif source in modules:
                        yield module, source, [alias.name], node.lineno


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph = {module: set() for module in modules}
    for importer, imported, _, _ in imports(modules):
        if imported != importer:
            graph[importer].add(imported)
    return graph


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


def test_cache_objects_use_only_each_others_public_surface():
    paths = sorted(CACHE_DIR.glob("*.py"))
    assert CACHE_DIR / "kv_manager.py" in paths, paths  # it looks where the code is
    found = [f"{path.relative_to(ROOT)}:{line}: {expression}" for path in paths
             for line, expression in private_attributes_of_others(path.read_text())]
    assert not found, "private attributes of another object used in edge_runtime/cache/ (add " \
                      "a public method or attribute to its class and document it):\n" + \
                      "\n".join(found)
