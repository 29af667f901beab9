"""The code's layout holds: every module imports, the folders of common/, ps/ and worker/ import each other
only in the directions their __init__.py files draw (worker/ and ps/ side by side on common/, neither
importing the other), no imports form a cycle, and modules stay short enough to read.

Imports are read from the source (ast), lazy ones inside functions included, so a dependency cannot
hide in a function body; what a module imports by name at run time (common.job.registry's factories)
is the user's and not counted."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "ps", "worker", "deploy", "benchmarks")
FIRST_PARTY = (*PACKAGES, "protos", "tests")
MAX_LINES = 400

# Modules allowed over MAX_LINES, each one concept that would read worse cut in two. Empty: split by concern.
LONGER_ALLOWED: dict[str, str] = {}

# The parts of the code and what each may import: a folder of ps/ or common/ is one part, a module
# at the top of either is one, worker/, deploy/, benchmarks/ and protos/ are one each.
ANY = frozenset({"*"})
COMMON_PARTS = ("common.job", "common.transport", "common.params", "common.ops", "common.errors",
                "common.number_checks")
WORKER_ROOMS = ("worker.transport", "worker.paths", "worker.data", "worker.probes", "worker.timing", "worker.session")
PS_PARTS = ("ps.control", "ps.serving", "ps.shards", "ps.rounds", "ps.ops", "ps.checkpoint", "ps.servicer",
            "ps.server", "ps.server_run", "ps.server_flags", "ps.flag_checks", "ps.server_job")
ALLOWED: dict[str, frozenset[str]] = {
    "common": frozenset(),  # the package map, a docstring
    "common.errors": frozenset(),  # leaves: they import nothing of the project
    "common.number_checks": frozenset(),
    "common.ops": frozenset(),
    "common.transport": frozenset({"common.errors", "protos"}),
    "common.job": frozenset({"common.transport", "common.errors", "common.number_checks"}),
    "common.params": frozenset({"common.job", "common.transport", "common.errors", "common.number_checks"}),
    "ps": frozenset(),
    "ps.control": frozenset({"common.number_checks"}),  # pure: no transport, no torch (below)
    "ps.ops": frozenset(COMMON_PARTS),
    "ps.checkpoint": frozenset(COMMON_PARTS),
    # the server's side of gRPC (handlers, replies, push streams, options, worker secrets, blobs)
    "ps.serving": frozenset({*COMMON_PARTS, "protos"}),
    "ps.shards": frozenset({*COMMON_PARTS, "ps.serving", "ps.ops", "protos"}),
    "ps.rounds": frozenset({*COMMON_PARTS, "ps.control", "ps.serving", "ps.shards", "ps.ops", "ps.checkpoint"}),
    "ps.servicer": frozenset({*COMMON_PARTS, *PS_PARTS, "protos"}),
    "ps.server": frozenset({*COMMON_PARTS, *PS_PARTS, "protos"}),
    "ps.server_run": frozenset({*COMMON_PARTS, *PS_PARTS, "protos"}),
    # ps-server's flags, parsed without building anything (the policy names from ps.control.registry,
    # the flags of the calls held at once, shared with ps-shard, from ps.serving.server_options)
    "ps.server_flags": frozenset({*COMMON_PARTS, "ps.control", "ps.ops", "ps.serving"}),
    # ps-server's flags checked against each other, by ps-server and by the launchers before they start anything
    "ps.flag_checks": frozenset({*COMMON_PARTS, "ps.control", "ps.shards", "ps.server_flags"}),
    # ps-server's job built from its flags (what ps.server serves; the tests build one without a process)
    "ps.server_job": frozenset({*COMMON_PARTS, "ps.control", "ps.ops", "ps.checkpoint", "ps.rounds", "ps.serving",
                                "ps.shards", "ps.server_flags", "ps.flag_checks"}),
    # the worker stands beside the server on what they share: it never imports ps. Its rooms: the wire
    # (the only one that knows protos), the probes (leaves), the two paths, the data, the step's times,
    # and the session's parts that compose them; the Session, connect(), the device and the CLI at the top.
    "worker": frozenset({"worker.connection", "worker.runtime"}),  # the package's face: connect, Session
    "worker.probes": frozenset({"common.ops"}),  # the machine's CPUs, its cgroup quota included
    "worker.transport": frozenset({*COMMON_PARTS, "protos", "worker.probes", "worker.flags"}),
    "worker.timing": frozenset({*COMMON_PARTS, "worker.transport", "worker.probes"}),
    "worker.paths": frozenset({*COMMON_PARTS, "worker.transport", "worker.probes"}),
    "worker.data": frozenset({*COMMON_PARTS, "worker.transport", "worker.probes"}),
    "worker.session": frozenset({*COMMON_PARTS, "worker.transport", "worker.paths", "worker.data", "worker.timing",
                                 "worker.probes", "worker.device"}),
    "worker.device": frozenset({"worker.flags"}),
    # ps-worker's flags, parsed before torch loads (the flag names the rooms' messages cite among them)
    "worker.flags": frozenset({*COMMON_PARTS, "worker.env_flags", "worker.probes"}),
    "worker.env_flags": frozenset(),
    "worker.stop_signal": frozenset(),
    "worker.accumulate": frozenset(COMMON_PARTS),
    "worker.runtime": frozenset({*COMMON_PARTS, *WORKER_ROOMS, "worker.device", "worker"}),
    "worker.connection": frozenset({*COMMON_PARTS, *WORKER_ROOMS, "worker.runtime"}),
    "worker.training_loop": frozenset({*COMMON_PARTS, *WORKER_ROOMS, "worker.runtime", "worker.connection",
                                       "worker.device", "worker.flags", "worker.accumulate", "worker.stop_signal"}),
    "worker.cli": frozenset({"worker.flags", "worker.training_loop"}),
    "deploy": ANY,
    "benchmarks": ANY,
    "protos": frozenset(),
}
# Third-party packages a pure part never imports.
NEVER: dict[str, tuple[str, ...]] = {
    "ps.control": ("torch", "grpc", "google.protobuf", "protos"),
    # the worker's inner rooms know no wire format: worker.transport turns it into plain values
    **{room: ("grpc", "google.protobuf", "protos") for room in WORKER_ROOMS if room != "worker.transport"},
}


def module_files() -> dict[str, Path]:
    """Every module of PACKAGES by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = module_files()


def imports_of(name: str, path: Path) -> Iterator[str]:
    """The dotted names `name`'s source imports, anywhere in the file (a submodule where
    `from package import module` names one)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*package, base] if base else package)
            yield base
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    yield f"{base}.{alias.name}"


def first_party(target: str) -> str | None:
    """The module of this tree that `target` names (its longest known prefix), or None."""
    if target.split(".")[0] not in FIRST_PARTY:
        return None
    parts = target.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) if parts else target.split(".")[0]


def graph() -> dict[str, set[str]]:
    """Module -> the first-party modules it imports (protos as "protos")."""
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {first_party(t) for t in imports_of(name, path)}
        edges[name] = {"protos" if t.startswith("protos") else t for t in targets if t and t != name}
    return edges


def part_of(module: str) -> str:
    """The part a module belongs to (see ALLOWED)."""
    parts = module.split(".")
    if parts[0] not in ("ps", "common", "worker") or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2])


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports(name: str) -> None:
    importlib.import_module(name)


def test_every_part_is_in_the_table_and_ps_folders_say_what_they_hold() -> None:
    parts = {part_of(m) for m in MODULES}
    assert parts - set(ALLOWED) == set(), "a new part of the code: add it to ALLOWED and to its package's __init__.py"
    for folder in [*(ROOT / "ps").iterdir(), *(ROOT / "common").iterdir(), *(ROOT / "worker").iterdir()]:
        if folder.is_dir() and folder.name != "__pycache__":
            init = folder / "__init__.py"
            assert init.exists(), f"{folder} has no __init__.py"
            assert ast.get_docstring(ast.parse(init.read_text())), f"{init} needs a docstring: what it holds, what it may import"


def test_folders_import_only_in_the_allowed_directions() -> None:
    wrong = []
    for module, targets in graph().items():
        source = part_of(module)
        allowed = ALLOWED[source]
        for target in sorted(targets):
            goal = part_of(target)
            if goal != source and allowed != ANY and goal not in allowed:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_pure_parts_import_no_transport_or_torch() -> None:
    wrong = []
    for module, path in MODULES.items():
        for target in imports_of(module, path):
            banned = NEVER.get(part_of(module), ())
            if any(target == b or target.startswith(b + ".") for b in banned):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


CONTROL_FACES = ("ps.control.policy", "ps.control.registry", "ps.control.config", "ps.control.settings",
                 "ps.control.micro", "ps.control.performance", "ps.control.global_batch")
"""What the rest of ps sees of ps.control: the batch-policy contract (policy.py), the list of policies,
their settings (and how a policy declares its own, which the server's flags are made from), the
micro-batch bounds, the model of a round's time and the global-batch choice; the policies' shared base
(worker_plan) and each policy's own modules stay inside."""


def test_the_rounds_know_batch_policies_only_through_their_interface() -> None:
    wrong = sorted(f"{module} -> {target}" for module, targets in graph().items() if part_of(module) != "ps.control"
                   and module.startswith(("ps.", "common.", "worker."))
                   for target in targets if part_of(target) == "ps.control"
                   and not any(target == f or target.startswith(f + ".") for f in CONTROL_FACES))
    assert wrong == []


def test_no_import_cycles_between_modules_or_parts() -> None:
    edges = graph()
    assert cycles(edges) == []
    parts: dict[str, set[str]] = {}
    for module, targets in edges.items():
        parts.setdefault(part_of(module), set()).update(part_of(t) for t in targets if part_of(t) != part_of(module))
    assert cycles(parts) == []


def test_modules_stay_short() -> None:
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in MODULES.values()}
    too_long = {p: n for p, n in lengths.items() if n > MAX_LINES and p not in LONGER_ALLOWED}
    assert too_long == {}, f"split these by concern, or justify them in LONGER_ALLOWED: {too_long}"
    stale = {p: lengths.get(p) for p in LONGER_ALLOWED if lengths.get(p, 0) <= MAX_LINES}
    assert stale == {}, f"no longer over {MAX_LINES} lines (or gone): drop them from LONGER_ALLOWED"


PROTO_BUILDERS = ("common/transport/proto_convert.py", "common/transport/chunk_frames.py")
"""The one wire boundary: the only modules that build protobuf messages (protos/ps_pb2's). Every other
module hands them plain values (common.transport.messages) and gets plain values back."""

PROTO_CLIENTS = ("benchmarks/hostile/peers.py",)
"""Clients written from protos/ alone, as a stranger to the project's code would write one (benchmarks.hostile's
attackers and its Status poller): they build their messages themselves, not through the wire boundary."""

PROTO_BUILT_ELSEWHERE: dict[tuple[str, str], str] = {
    # (module, the function or method whose body builds messages): what it should call instead
}


def proto_builds(source: str) -> list[tuple[str, str]]:
    """(the enclosing function's qualified name, the message type) of every call that builds a
    protobuf message of protos/ps_pb2 in `source`: `ps_pb2.<Message>(...)`, or a message imported
    from it by name."""
    tree = ast.parse(source)
    by_name = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and (node.module or "").endswith("ps_pb2") for alias in node.names}
    found: list[tuple[str, str]] = []

    def message_type(func: ast.expr) -> str | None:
        if isinstance(func, ast.Attribute) and func.attr[:1].isupper():
            owner = func.value
            if (isinstance(owner, ast.Name) and owner.id == "ps_pb2") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "ps_pb2"):
                return func.attr
        if isinstance(func, ast.Name) and func.id in by_name:
            return func.id
        return None

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = (*scope, child.name)
            elif isinstance(child, ast.Call) and (kind := message_type(child.func)) is not None:
                found.append((".".join(scope) or "<module>", kind))
            visit(child, inner)

    visit(tree, ())
    return found


def test_only_the_wire_boundary_builds_protobuf_messages() -> None:
    built: dict[tuple[str, str], list[str]] = {}
    for path in MODULES.values():
        module = str(path.relative_to(ROOT))
        if module in PROTO_BUILDERS or module in PROTO_CLIENTS:
            continue
        for scope, kind in proto_builds(path.read_text()):
            owner = next((key for key in PROTO_BUILT_ELSEWHERE if key[0] == module
                          and (scope == key[1] or scope.startswith(key[1] + "."))), (module, scope))
            built.setdefault(owner, []).append(kind)
    wrong = {key: kinds for key, kinds in built.items() if key not in PROTO_BUILT_ELSEWHERE}
    assert wrong == {}, "build messages in common/transport/proto_convert.py or chunk_frames.py and call those"
    stale = sorted(key for key in PROTO_BUILT_ELSEWHERE if key not in built)
    assert stale == [], "these build no message any more: drop them from PROTO_BUILT_ELSEWHERE"


def test_the_checks_catch_a_cycle_and_a_wrong_direction() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert part_of("common.transport.wire") == "common.transport" and part_of("ps.server") == "ps.server"
    assert "ps.rounds" not in ALLOWED["common.transport"] and "common.transport" not in ALLOWED["ps.control"]
    source = ("from protos import ps_pb2\nfrom protos.ps_pb2 import LeaveReply as Bye\n"
              "class S:\n    def leave(self):\n        return Bye()\n"
              "def status(stub):\n    return stub.Status(protos.ps_pb2.StatusRequest(), timeout=ps_pb2.X.y(1))\n"
              "HEAD = ps_pb2.PushHeader(worker_id='w')\n")
    assert proto_builds(source) == [("S.leave", "Bye"), ("status", "StatusRequest"), ("<module>", "PushHeader")]
