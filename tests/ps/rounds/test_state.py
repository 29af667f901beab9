"""ps/rounds/state.py's rule holds: every object of ps/rounds owns its fields, so only its own methods
assign them (`self.x = ...`); a concern moves the shared state through JobState's methods, the batch
policy is replaced by JobState.replace_policy alone, and a concern changes another through its methods
or the round events, never by assigning its fields or filling its collections."""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest

from ps.rounds.events import Event
from tests.repo import ROOT

ROUNDS = ROOT / "ps" / "rounds"
MUTATORS = frozenset({"add", "discard", "insert", "clear", "append", "extend", "setdefault", "popitem", "appendleft"})
"""Calls that change the collection they are called on."""
LISTENER_PREFIXES = ("before_", "after_", "on_")
"""Listener lists (a store's `before_change`) take subscriptions from anyone."""
POLICY_OWNER = ("state.py", "replace_policy")


def _chain(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _own(chain: list[str] | None) -> bool:
    """Whether a change through `chain` stays in the changing object: its own field (`self.x`) or a local."""
    return chain is not None and (len(chain) == 1 or (chain[0] == "self" and len(chain) == 2))


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every node with the name of the function it is in ("" at module level)."""
    def walk(node: ast.AST, function: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            yield name, child
            yield from walk(child, name)
    yield from walk(tree, "")


def foreign_writes(source: str, module: str) -> list[str]:
    """The changes in `source` (the module named `module`) to fields of objects it does not own."""
    found = []
    for function, node in _functions(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and not isinstance(part.ctx, ast.Load):
                    chain = _chain(part)
                    if not (chain is not None and chain[0] == "self" and len(chain) == 2):
                        found.append(f"{module}:{part.lineno}: assigns {ast.unparse(part)}")
                    elif part.attr in ("_policy", "policy") and (module, function) != POLICY_OWNER:
                        found.append(f"{module}:{part.lineno}: replaces the batch policy outside "
                                     "JobState.replace_policy")
                elif isinstance(part, ast.Subscript) and not isinstance(part.ctx, ast.Load) and not _own(_chain(part.value)):
                    found.append(f"{module}:{part.lineno}: stores into {ast.unparse(part.value)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            chain = _chain(node.func.value)
            if chain is not None and not _own(chain) and not chain[-1].startswith(LISTENER_PREFIXES):
                found.append(f"{module}:{node.lineno}: changes {ast.unparse(node.func.value)}")
    return found


def test_no_module_of_ps_rounds_assigns_the_fields_of_an_object_it_does_not_own() -> None:
    found = [w for path in sorted(ROUNDS.glob("*.py")) for w in foreign_writes(path.read_text(), path.name)]
    assert not found, "\n".join(["write through the owner's methods or a round event (ps/rounds/state.py):", *found])


@pytest.mark.parametrize(("source", "what"), [
    ("def f(s):\n    s.samples += 1\n", "assigns s.samples"),
    ("class A:\n    def f(self):\n        self.bsp.committing = True\n", "assigns self.bsp.committing"),
    ("class A:\n    def f(self, member):\n        member.last_seen = 1.0\n", "assigns member.last_seen"),
    ("class A:\n    def f(self):\n        self.end.told_done.discard(1)\n", "changes self.end.told_done"),
    ("class A:\n    def f(self):\n        self.whole_model.waiting.insert(0, 1)\n", "changes self.whole_model.waiting"),
    ("class A:\n    def f(self):\n        self.state.shares['a'] = 1\n", "stores into self.state.shares"),
    ("class A:\n    def f(self):\n        self._policy = None\n", "replaces the batch policy"),
])
def test_the_scan_finds_each_kind_of_foreign_write(source: str, what: str) -> None:
    found = foreign_writes(source, "example.py")
    assert len(found) == 1 and what in found[0], found


@pytest.mark.parametrize("source", [
    "class A:\n    def f(self, x):\n        self.count += x\n        self.seen.add(x)\n        self.by_id[x] = 1\n",
    "def f(xs):\n    out = {}\n    out['a'] = 1\n    xs.append(1)\n",
    "class A:\n    def f(self):\n        self.store.before_change.append(print)\n",
    "class A:\n    def f(self):\n        def inner():\n            self.done = True\n        return inner\n",
])
def test_the_scan_passes_own_fields_locals_and_subscriptions(source: str) -> None:
    assert foreign_writes(source, "example.py") == []


def test_the_policy_is_replaced_in_one_place() -> None:
    source = (ROUNDS / "state.py").read_text()
    assert foreign_writes(source, "state.py") == []
    assert "replaces the batch policy" in foreign_writes(source, "other.py")[0]


def test_an_event_calls_its_listeners_in_the_order_they_subscribed() -> None:
    heard: list[tuple[str, int]] = []
    event: Event[[int]] = Event()
    event.subscribe(lambda n: heard.append(("first", n)))
    event.subscribe(lambda n: heard.append(("second", n)))
    event.emit(3)
    assert heard == [("first", 3), ("second", 3)]

