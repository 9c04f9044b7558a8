"""The package's shape: one folder per stage named like its rule file, thin scripts, and no
import cycle anywhere inside circuitflow (module-level and function-level imports alike)."""

from __future__ import annotations

import ast
import re

from helpers.dag import REPO

SRC = REPO / "src" / "circuitflow"


def _modules() -> dict[str, object]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        mods[".".join(parts).removesuffix(".__init__")] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """circuitflow module -> the circuitflow modules it imports (anywhere in the file)."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("circuitflow"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in mods else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("circuitflow")}
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v) :] + [v]
            if v not in state and (found := visit(v)):
                return found
        stack.pop()
        state[u] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_every_import_names_a_module():
    mods = _modules()
    unknown = {(m, d) for m, deps in import_graph().items() for d in deps if d not in mods}
    assert not unknown, unknown


def test_no_import_cycle_inside_circuitflow():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_config_sections_and_the_model_package_do_not_import_config():
    """`config` (load, validate, resolve) reads the model package (its depth, auto_active_heads),
    so nothing there imports `config` back; the section dataclasses build on `schema`, which
    imports nothing of circuitflow's but `errors`."""
    graph = import_graph()
    model = {m for m in graph if m == "circuitflow.model" or m.startswith("circuitflow.model.")}
    assert not {m for m in model if "circuitflow.config" in graph[m]}
    assert graph["circuitflow.schema"] <= {"circuitflow.errors"}


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_each_rule_file_names_its_code_and_scripts_exist():
    """A newcomer who opens workflow/rules/<stage>.smk finds the code it names, and every
    script a rule runs exists."""
    for rules in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = rules.read_text()
        if rules.stem == "common":
            continue
        named = re.findall(r"Code: (src/circuitflow/[\w/]+(?:\.py)?)", text)
        assert named, f"{rules.name} names no code folder"
        for path in named:
            assert (REPO / path).exists(), f"{rules.name}: {path} does not exist"
        for script in re.findall(r'stage\(\s*"(\w+)"', text):
            assert (REPO / "scripts" / f"{script}.py").is_file(), f"{rules.name}: {script}"


def test_each_stage_package_has_one_module_that_writes_its_files():
    for stage in ("capture", "sae", "attribution", "interventions", "report"):
        assert (SRC / stage / "stage.py").is_file(), stage
