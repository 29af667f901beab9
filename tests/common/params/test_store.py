"""The parameter store steps piece by piece, and a deferred step equals a whole one; the payload frames
a version's chunks as they are reached and never mixes two versions in one reply."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from common.job.spec import JobSpec
from common.params.store import ParameterStore
from common.transport.chunked import ChunkedVector
from common.transport.magnitude import LIMIT, OverflowRisk, exact_magnitude, magnitude
from common.transport.payload import Payload
from common.transport.wire import encode, split
from tests.state_compare import assert_same
from tests.torch_reference import torch_optimizer

SPECS = {
    "sgd": JobSpec(momentum=0.0),
    "momentum+wd": JobSpec(momentum=0.9, weight_decay=1e-3),
    "nesterov": JobSpec(momentum=0.9, nesterov=True),
    "adam": JobSpec(optimizer="adam", momentum=0.0, weight_decay=1e-4),
}


def rand(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def whole_reference(flat: torch.Tensor, grads: list[torch.Tensor], spec: JobSpec, lr_after: float) -> ParameterStore:
    """The same steps on one optimizer over the whole vector (a piece as large as the vector)."""
    store = ParameterStore(flat, spec, piece_values=flat.numel())
    for i, g in enumerate(grads):
        if i == 1:
            store.set_lr(lr_after)
        store.apply_gradient(g)
    return store


@pytest.mark.parametrize("name", sorted(SPECS))
def test_piecewise_deferred_steps_equal_whole_steps_bit_for_bit(name: str) -> None:
    spec, n = SPECS[name], 10_007
    flat, grads = rand(n, 0), [rand(n, s) for s in (1, 2, 3)]
    store = ParameterStore(flat, spec, piece_values=1024)
    assert len(store.pieces) == 10 and store.pieces[-1] == (9216, n)
    for i, g in enumerate(grads):
        if i == 1:
            store.set_lr(0.05)
        store.begin_step(g)
        store.values_into(0, 100, torch.empty(100))  # read a little; the rest steps when the next change comes
    reference = whole_reference(flat, grads, spec, 0.05)
    assert torch.equal(store.flat, reference.flat)
    ours, theirs = store.optimizer_state(), reference.optimizer_state()
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for key, value in theirs["state"].get(0, {}).items():
        assert torch.equal(torch.as_tensor(ours["state"][0][key]), torch.as_tensor(value)), key


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("piece_values", [None, 1000, 10_007])
def test_pieces_equal_torch_optim_bit_for_bit(name: str, piece_values: int | None) -> None:
    """SGD and Adam are written out per piece (common.params.stepping); they must be torch.optim's arithmetic
    exactly: the same parameters and state after steps with a learning-rate change, and a state dict
    torch's optimizer loads."""
    spec, n = SPECS[name], 10_007
    flat, grads = rand(n, 0), [rand(n, s) for s in (1, 2, 3)]
    store = ParameterStore(flat, spec, piece_values=piece_values)
    param = torch.nn.Parameter(flat.clone())
    reference = torch_optimizer(param, spec)
    for i, g in enumerate(grads):
        if i == 1:
            store.set_lr(0.05)
            reference.param_groups[0]["lr"] = 0.05
        store.begin_step(g)
        store.values_into(0, 1500, torch.empty(1500))
        param.grad = g.clone()
        reference.step()
    assert torch.equal(store.flat, param.detach())
    ours, theirs = store.optimizer_state(), reference.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys() == ({0} if name != "sgd" else set())
    for key, value in theirs["state"].get(0, {}).items():
        assert torch.equal(ours["state"][0][key], value) and ours["state"][0][key].dtype == value.dtype, key
    torch_optimizer(torch.nn.Parameter(flat.clone()), spec).load_state_dict(ours)


@pytest.mark.parametrize("name", ["nesterov", "adam"])
def test_a_store_continues_from_a_torch_optim_state_dict(name: str) -> None:
    """A checkpoint written by torch.optim (momentum buffer, Adam's moments and step count) loads, and
    the steps after it equal torch's own."""
    n = 3001
    spec = SPECS[name]
    flat, grads = rand(n, 0), [rand(n, s) for s in (1, 2, 3)]
    param = torch.nn.Parameter(flat.clone())
    reference = torch_optimizer(param, JobSpec(**{**spec.__dict__, "lr": 0.07, "weight_decay": 1e-3}))
    for g in grads[:2]:
        param.grad = g.clone()
        reference.step()
    store = ParameterStore(param.detach().clone(), spec, piece_values=1000)
    store.load_optimizer_state(reference.state_dict())
    assert store.lr == 0.07  # the saved hyperparameters replace the job's, as in torch
    store.apply_gradient(grads[2])
    param.grad = grads[2].clone()
    reference.step()
    assert torch.equal(store.flat, param.detach())


@pytest.mark.parametrize(
    "state",
    [
        [],
        {"state": {}},
        {"state": {}, "param_groups": [{"lr": 0.1}, {"lr": 0.2}]},
        {"state": {1: {"momentum_buffer": torch.zeros(10)}}, "param_groups": [{"lr": 0.1}]},
        {"state": {0: {"momentum_buffer": torch.zeros(9)}}, "param_groups": [{"lr": 0.1}]},
        {"state": {0: {"momentum_buffer": torch.zeros(10, dtype=torch.int64)}}, "param_groups": [{"lr": 0.1}]},
        {"state": {0: "buffer"}, "param_groups": [{"lr": 0.1}]},
    ],
)
def test_a_malformed_sgd_state_is_refused_and_changes_nothing(state: object) -> None:
    store = ParameterStore(torch.zeros(10), SPECS["momentum+wd"])
    store.apply_gradient(torch.ones(10))
    before = store.optimizer_state()
    with pytest.raises(ValueError):
        store.load_optimizer_state(state)  # type: ignore[arg-type]
    after = store.optimizer_state()
    assert after["param_groups"] == before["param_groups"]
    assert torch.equal(after["state"][0]["momentum_buffer"], before["state"][0]["momentum_buffer"])


ADAM_GROUP = [{"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8}]


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        ({"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(10)}}, "param_groups": ADAM_GROUP},
         "all of exp_avg, exp_avg_sq or none"),
        ({"state": {0: {"step": torch.tensor(0.0), "exp_avg": torch.zeros(10), "exp_avg_sq": torch.zeros(10)}},
          "param_groups": ADAM_GROUP}, "step count must be a whole number >= 1"),
        ({"state": {0: {"step": torch.ones(2), "exp_avg": torch.zeros(10), "exp_avg_sq": torch.zeros(10)}},
          "param_groups": ADAM_GROUP}, "step count must be a whole number >= 1"),
        ({"state": {0: {"exp_avg": torch.zeros(10), "exp_avg_sq": torch.zeros(10)}}, "param_groups": ADAM_GROUP},
         "step count must be a whole number >= 1, got None"),
        ({"state": {0: {"step": 2, "exp_avg": torch.zeros(9), "exp_avg_sq": torch.zeros(10)}}, "param_groups": ADAM_GROUP},
         "the exp_avg must be a float tensor of 10 values"),
        ({"state": {}, "param_groups": [{**ADAM_GROUP[0], "amsgrad": True}]}, "amsgrad"),
    ],
)
def test_a_malformed_adam_state_is_refused_and_changes_nothing(state: dict, needle: str) -> None:
    store = ParameterStore(torch.zeros(10), SPECS["adam"])
    store.apply_gradient(torch.ones(10))
    before = store.optimizer_state()
    with pytest.raises(ValueError, match=needle):
        store.load_optimizer_state(state)
    after = store.optimizer_state()
    assert after["param_groups"] == before["param_groups"]
    assert all(torch.equal(after["state"][0][k], v) for k, v in before["state"][0].items())


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_store_builds_no_torch_optimizer(optimizer: str) -> None:
    """The first torch optimizer a process builds imports torch._dynamo (~1.5 s of CPU, ~12 s for a
    fast-path worker on a 1/8-core quota); a store steps, saves and loads without one."""
    code = (
        "import sys, torch\n"
        "from common.job.spec import JobSpec\n"
        "from common.params.store import ParameterStore\n"
        f"store = ParameterStore(torch.zeros(100), JobSpec(optimizer={optimizer!r}, momentum=0.9))\n"
        "store.apply_gradient(torch.ones(100))\n"
        "store.load_state_dict(store.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_a_deferred_step_applies_only_as_far_as_values_are_read() -> None:
    flat, g = rand(4000, 0), rand(4000, 1)
    store = ParameterStore(flat, JobSpec(momentum=0.0, lr=0.5), piece_values=1000)
    store.begin_step(g)
    head = torch.empty(1500)
    store.values_into(0, 1500, head)
    assert torch.equal(head, flat[:1500] - 0.5 * g[:1500])
    untouched = store._flat[2000:].clone()  # noqa: SLF001 (what the store has not stepped yet)
    assert torch.equal(untouched, flat[2000:])
    assert torch.equal(store.flat, flat - 0.5 * g)  # reading everything settles everything


@pytest.mark.parametrize("name", ["adam", "momentum+wd"])
def test_optimizer_state_round_trips_across_piece_sizes(name: str) -> None:
    """A checkpoint's optimizer state is one optimizer's format, whatever the store's piece size."""
    spec, n = SPECS[name], 5000
    flat, grads = rand(n, 0), [rand(n, s) for s in (1, 2)]
    pieces = ParameterStore(flat, spec, piece_values=777)
    for g in grads:
        pieces.apply_gradient(g)
    whole = ParameterStore(flat, spec, piece_values=n)
    whole.load_state_dict(pieces.state_dict())
    again = ParameterStore(flat, spec, piece_values=333)
    again.load_state_dict(whole.state_dict())
    g = rand(n, 9)
    for store in (pieces, whole, again):
        store.apply_gradient(g)
    assert torch.equal(pieces.flat, whole.flat) and torch.equal(pieces.flat, again.flat)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_flat_optimizer_state_carries_the_whole_state(name: str) -> None:
    """The fast path moves the optimizer state as one fp32 vector (common.params.flat_state): a store loaded from
    it (before its first step: None) steps on exactly as the store it came from."""
    spec, n = SPECS[name], 5000
    flat = rand(n, 0)
    source = ParameterStore(flat, spec, piece_values=777)
    expected = {"sgd": 0, "momentum+wd": n, "nesterov": n, "adam": 1 + 2 * n}[name]
    assert source.optimizer_state_numel == expected and source.flat_optimizer_state() is None
    for g in (rand(n, 1), rand(n, 2)):
        source.apply_gradient(g)
    state = source.flat_optimizer_state()
    assert (state is None) if expected == 0 else (state.shape == (expected,) and state.dtype == torch.float32)
    target = ParameterStore(flat, spec, piece_values=333)
    target.assign(source.flat)
    target.load_flat_optimizer_state(state)
    g = rand(n, 9)
    for store in (source, target):
        store.apply_gradient(g)
    assert torch.equal(source.flat, target.flat)


@pytest.mark.parametrize(
    ("name", "edit", "needle"),
    [
        ("momentum+wd", lambda v: v[:-1], "an optimizer state of 4999 values; this job's sgd keeps 5000"),
        ("sgd", lambda v: v[:10], "an optimizer state of 10 values; this job's sgd keeps 0"),
        ("adam", lambda v: torch.cat([torch.tensor([2.5]), v[1:]]), "step count must be a whole number >= 1, got tensor\\(2.5"),
        ("adam", lambda v: torch.cat([torch.tensor([0.0]), v[1:]]), "step count must be a whole number >= 1, got tensor\\(0."),
    ],
)
def test_a_malformed_flat_optimizer_state_is_refused_and_changes_nothing(name: str, edit, needle: str) -> None:
    spec, n = SPECS[name], 5000
    store = ParameterStore(rand(n, 0), spec)
    store.apply_gradient(rand(n, 1))
    good = ParameterStore(rand(n, 0), SPECS["adam" if name == "adam" else "momentum+wd"])
    good.apply_gradient(rand(n, 2))
    before = store.optimizer_state()
    with pytest.raises(ValueError, match=needle):
        store.load_flat_optimizer_state(edit(good.flat_optimizer_state()))
    after = store.optimizer_state()
    assert before["param_groups"] == after["param_groups"] and before["state"].keys() == after["state"].keys()
    for key, per in before["state"].items():
        assert all(torch.equal(per[k], after["state"][key][k]) for k in per)


def test_before_change_runs_after_the_deferred_step_and_before_any_change() -> None:
    store = ParameterStore(rand(3000, 0), JobSpec(momentum=0.0, lr=1.0), piece_values=1000)
    seen: list[torch.Tensor] = []
    store.before_change.append(lambda: seen.append(store._flat.clone()))  # noqa: SLF001
    g = rand(3000, 1)
    start = store.flat.clone()
    store.begin_step(g)
    store.apply_update(torch.ones(3000))
    store.assign(torch.zeros(3000))
    assert len(seen) == 3
    assert torch.equal(seen[0], start)
    assert torch.equal(seen[1], start - g)  # the deferred step was finished before the update
    assert torch.equal(seen[2], start - g + 1)


def test_payload_frames_chunks_lazily_and_a_version_stays_whole_across_a_step() -> None:
    """A reply that has read only chunk 0 of version 1 when the next step begins still gets version 1
    in every chunk (the store's before_change completes the payload), and the chunks equal the
    eager encoding."""
    n, per_chunk = 3000, 256  # 1 KiB chunks of fp32
    spec = JobSpec(momentum=0.0, lr=1.0)
    store = ParameterStore(rand(n, 0), spec, piece_values=1024)
    payload = Payload(chunk_bytes=per_chunk * 4)
    store.before_change.append(payload.complete)
    g1, g2 = rand(n, 1), rand(n, 2)
    store.begin_step(g1)
    version1 = store._flat.clone() - g1  # noqa: SLF001
    chunks = payload.get(1, store, "float32")
    assert len(chunks) == 12
    assert chunks[0] == split(encode(version1), per_chunk * 4)[0]
    assert not chunks.complete and store._next_piece == 1  # noqa: SLF001 (only the first piece stepped)
    store.begin_step(g2)  # the next round closes while a reply is still streaming version 1
    assert chunks.complete
    assert list(chunks) == split(encode(version1), per_chunk * 4)
    assert list(payload.get(2, store, "float32")) == split(encode(version1 - g2), per_chunk * 4)


@pytest.mark.parametrize("wire_dtype", ["bfloat16", "float16"])
def test_lazy_chunks_in_a_narrow_wire_dtype_equal_the_eager_encoding(wire_dtype: str) -> None:
    values = rand(5000, 3)
    chunks = Payload(chunk_bytes=2048).get(0, values, wire_dtype)
    assert list(chunks) == split(encode(values, wire_dtype), 2048)
    assert chunks[-1] == chunks[len(chunks) - 1] and chunks[1:3] == list(chunks)[1:3]


def test_a_version_dropped_by_invalidate_is_framed_whole_before_it_goes() -> None:
    """Payload.invalidate (a new frame, a reload) completes the version a reply may still be reading."""
    n = 3000
    values = rand(n, 6)
    original = values.clone()
    payload = Payload(chunk_bytes=1024)
    chunks = payload.get(0, values, "float32")
    assert chunks[0] == split(encode(values), 1024)[0] and not chunks.complete
    payload.invalidate()
    values.add_(1.0)  # a change that no before_change hook saw
    assert list(chunks) == split(encode(original), 1024)


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_steps_written_into_reply_messages_equal_steps_in_place(name: str, in_place: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With fp32 chunks of one piece each, a step writes a piece's new values straight into its reply
    message and reads them from there at the next step (common.params.store's resident pieces). Steps framed
    whole, framed in part, read through `flat`, mixed with an ASP update and a load must give what
    steps in place give, bit for bit; and a message, once handed out, never changes. The same where
    messages cannot be built in place (common.transport.message_buffer's bytearray fallback)."""
    monkeypatch.setattr("common.transport.message_buffer.IN_PLACE", in_place)
    spec, n, per_piece = SPECS[name], 5000, 512
    flat = rand(n, 0)
    store = ParameterStore(flat, spec, piece_values=per_piece)
    reference = ParameterStore(flat, spec, piece_values=per_piece)
    payload = Payload(chunk_bytes=per_piece * 4)
    store.before_change.append(payload.complete)
    sent: list[tuple[list[bytes], list[bytes]]] = []  # (the messages, a copy of their contents)
    for version in range(6):
        g = rand(n, version + 1)
        store.begin_step(g)
        reference.apply_gradient(g)
        chunks = payload.get(version, store, "float32")
        if version == 2:
            chunks[0]  # noqa: B018 (framed in part: the rest is stepped in place when the next change comes)
        elif version == 3:
            assert torch.equal(store.flat, reference.flat)  # read whole between steps
        elif version == 4:
            store.apply_update(rand(n, 50))
            reference.apply_update(rand(n, 50))
        else:
            assert list(chunks) == split(encode(reference.flat), per_piece * 4)
            assert store._resident  # noqa: SLF001 (the step did write into the messages)
            sent.append((list(chunks), [bytes(bytearray(c)) for c in chunks]))
    assert torch.equal(store.flat, reference.flat)
    for messages, contents in sent:
        assert messages == contents
    store.assign(rand(n, 99))
    reference.assign(rand(n, 99))
    store.begin_step(rand(n, 100))
    reference.apply_gradient(rand(n, 100))
    assert list(payload.get(7, store, "float32")) == split(encode(reference.flat), per_piece * 4)
    assert torch.equal(store.flat, reference.flat)
    assert torch.equal(store.flat_optimizer_state() if spec.momentum or spec.optimizer == "adam" else torch.zeros(0),
                       reference.flat_optimizer_state() if spec.momentum or spec.optimizer == "adam" else torch.zeros(0))


def test_a_narrow_wire_payload_reads_values_a_step_left_in_messages() -> None:
    """A bf16 payload of a version whose fp32 pieces live in the previous version's messages encodes
    the same values as one from a store stepped in place."""
    spec, n, per_piece = SPECS["momentum+wd"], 3000, 256
    store = ParameterStore(rand(n, 0), spec, piece_values=per_piece)
    reference = ParameterStore(rand(n, 0), spec, piece_values=per_piece)
    payload = Payload(chunk_bytes=per_piece * 4)
    store.before_change.append(payload.complete)
    store.begin_step(rand(n, 1))
    reference.apply_gradient(rand(n, 1))
    list(payload.get(0, store, "float32"))
    assert store._resident  # noqa: SLF001
    narrow = Payload(chunk_bytes=per_piece * 4).get(0, store, "bfloat16")
    assert list(narrow) == split(encode(reference.flat, "bfloat16"), per_piece * 4)


# ------------------------------------------------------------------ overflow
OVERFLOW_SPECS = {**SPECS, "dampened lr 10": JobSpec(lr=10.0, momentum=0.5)}
MAGNITUDES = st.sampled_from([0.0, 1e-3, 1.0, 1e3, 1e18, 1e19, 1e30, 1e36, 2e37, 8e37, 1e38, 3e38])


def fp32_values(n: int, top: float, seed: int) -> torch.Tensor:
    """n fp32 values whose largest magnitude is `top` (one of them exactly), signs and sizes mixed."""
    values = (rand(n, seed).clamp(-1.0, 1.0) * top).float()
    values[seed % n] = top if seed % 2 else -top
    return values


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(OVERFLOW_SPECS)), params=MAGNITUDES, grads=st.lists(MAGNITUDES, min_size=1, max_size=4),
       seed=st.integers(0, 1000), chunked=st.booleans())
def test_no_step_leaves_a_value_that_is_not_finite(name: str, params: float, grads: list[float], seed: int,
                                                   chunked: bool) -> None:
    """Any sequence of finite gradients, however large: each step either runs, leaving every parameter and
    every optimizer state value finite, or is refused (OverflowRisk) with the values and the state
    bit for bit as they were."""
    spec, n = OVERFLOW_SPECS[name], 300
    store = ParameterStore(fp32_values(n, params, seed), spec, piece_values=128)
    for i, top in enumerate(grads):
        g = fp32_values(n, top, seed + 1 + i)
        grad = ChunkedVector([g[:100], g[100:]]) if chunked else g
        before_flat, before_state = store.flat.clone(), copy.deepcopy(store.optimizer_state())
        try:
            store.begin_step(grad)
        except OverflowRisk:
            event("a step refused")
            assert torch.equal(store.flat, before_flat)
            assert_same(store.optimizer_state(), before_state)
            continue
        event("a step ran")
        assert bool(torch.isfinite(store.flat).all()), f"step {i} left a value that is not finite"
        state = store.flat_optimizer_state()
        assert state is None or bool(torch.isfinite(state).all()), f"step {i} left optimizer state that is not finite"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_training_sized_values_are_never_refused(name: str) -> None:
    """The bounds are loose but far from what training reaches: a thousand steps of gradients up to 1e3
    on parameters up to 1e3 all run, and the bound stays far below the limit."""
    store = ParameterStore(fp32_values(1000, 1e3, 1), SPECS[name], piece_values=256)
    for step in range(1000):
        store.begin_step(fp32_values(1000, 1e3, step))
    store.settle()
    assert store._bound < 1e-20 * LIMIT


def test_an_asp_update_that_could_overflow_is_refused_and_changes_nothing() -> None:
    """θ + Δ: the issue's two updates of 2e38 are each refused; 5e37 twice: the first is applied (exact
    bounds then say the second could reach 1e38), the second refused; the parameters stay finite."""
    store = ParameterStore(torch.zeros(10), JobSpec(mode="asp"))
    for _ in range(2):
        with pytest.raises(OverflowRisk, match="could overflow"):
            store.apply_update(torch.full((10,), 2e38))
        assert torch.equal(store.flat, torch.zeros(10))
    store.apply_update(torch.full((10,), 5e37))
    with pytest.raises(OverflowRisk):
        store.apply_update(torch.full((10,), 5e37))
    assert torch.equal(store.flat, torch.full((10,), 5e37))


def test_loads_of_values_that_are_not_finite_are_refused() -> None:
    store = ParameterStore(torch.zeros(4), SPECS["momentum+wd"])
    with pytest.raises(ValueError, match="NaN or Inf"):
        store.assign(torch.tensor([0.0, math.inf, 0.0, 0.0]))
    state = {"state": {0: {"momentum_buffer": torch.tensor([0.0, math.nan, 0.0, 0.0])}},
             "param_groups": store.optimizer_state()["param_groups"]}
    with pytest.raises(ValueError, match="NaN or Inf"):
        store.load_optimizer_state(state)
    assert torch.equal(store.flat, torch.zeros(4)) and store.flat_optimizer_state() is None


@settings(max_examples=100, deadline=None)
@given(top=MAGNITUDES, n=st.integers(1, 3000), dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
       seed=st.integers(0, 1000))
def test_magnitude_is_an_upper_bound_of_the_largest_value(top: float, n: int, dtype: str, seed: int) -> None:
    values = fp32_values(n, top, seed).to(getattr(torch, dtype))
    exact = float(values.float().abs().max())
    if not math.isfinite(exact):  # a value beyond the narrow dtype's range
        assert magnitude(values) == math.inf
        return
    assert exact_magnitude(values) == exact <= magnitude(values)
    poisoned = values.clone()
    poisoned[seed % n] = math.nan
    assert magnitude(poisoned) == exact_magnitude(poisoned) == math.inf
