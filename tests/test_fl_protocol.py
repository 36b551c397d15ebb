"""The federated protocol and its simulator: every algorithm jitted and vmapped over clients
and seeds, released outputs hold only message-derived and public values, unselected slots
contribute exactly nothing, keys and noise are independent per run."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.combined import CombinedAggregator
from swarmjax.fl.algorithms.common import ModelServer
from swarmjax.fl.algorithms.fed_dp_pso import FedDPPSO, fedpso
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.algorithms.local_only import LocalOnly, centralised_clients
from swarmjax.fl.client.training import LocalTraining, RecordDP, clip_update
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.private import Private
from swarmjax.fl.protocol import (
    UNDECLARED,
    Algorithm,
    Exchange,
    RunSpec,
    Slots,
    Update,
    Variants,
    client_key,
    coverage,
    everyone,
    privacy_unit,
    run_keys,
    server_key,
    variant_identities,
)
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.fl.runtime import simulator as sim
from swarmjax.models import mlp, param_bytes
from swarmjax.privacy.accounting import Rates
from swarmjax.privacy.ledger import Ledger
from swarmjax.privacy.participation import Poisson
from swarmjax.privacy.user_level import ClippedUpdate
from tests.conftest import REPO
from tests.reproducible import OTHER, SECRET

N, ROUNDS, SEEDS = 3, 2, [0, 1]
MODEL = mlp((8,), 10, (8, 8, 1))
BYTES = param_bytes(jax.eval_shape(MODEL.init, jax.random.key(0)))


@pytest.fixture(scope="module")
def setup():
    data = load_dataset("digits")
    part = iid_partition(data.y_train[:600], N, seed=0)
    clients = stack_clients(data.x_train, data.y_train, part.indices)
    return clients, (data.x_test[:200], data.y_test[:200])


def _dp_training(clients, batch_size=32):
    return LocalTraining(
        batch_size=batch_size, optimizer="adam", record_dp=RecordDP.for_sizes(clients.sizes, 32)
    )


def _algorithms(clients):
    """(name, algorithm, data, variants kwargs) for every algorithm of the protocol."""
    dp = _dp_training(clients)
    return {
        "fedavg": (FedAvg(MODEL, LocalTraining(batch_size=32)), {"learning_rate": 0.3}),
        "fedavg_record_dp": (FedAvg(MODEL, dp), {"learning_rate": 0.01, "epsilon_target": 8.0}),
        "combined": (
            FedAvg(MODEL, LocalTraining(batch_size=32), combine=CombinedAggregator(0.01)),
            {"learning_rate": 0.3},
        ),
        "client_level_dp_fedavg": (
            dp_fedavg(MODEL, training=LocalTraining(batch_size=32), participation=Poisson(None)),
            {"sample_rate": 0.7, "noise_multiplier": 0.8, "initial_clip": 0.5},
        ),
        "fed_dp_pso": (
            FedDPPSO(MODEL, dataclasses.replace(dp, optimizer="adamw"), particles=2),
            {"epsilon_target": 8.0},
        ),
        "fed_dp_pso_private_selection": (
            FedDPPSO(MODEL, dp, particles=2, private_selection=True),
            {"epsilon_target": 8.0},
        ),
        "fedpso": (fedpso(MODEL), {"learning_rate": 0.05}),
        "clients_alone": (LocalOnly(MODEL, LocalTraining(batch_size=32)), {"learning_rate": 0.3}),
    }


NAMES = [
    "fedavg",
    "fedavg_record_dp",
    "combined",
    "client_level_dp_fedavg",
    "fed_dp_pso",
    "fed_dp_pso_private_selection",
    "fedpso",
    "clients_alone",
]


def _run(alg, kwargs, clients, test, **extra):
    """One ``simulate`` call under the tests' supplied secret (reproducible mode), so that
    runs of separate calls can be compared draw for draw."""
    extra.setdefault("secret", SECRET)
    return simulate(alg, clients, test, _variants(alg, kwargs, clients), **extra)


class _Runs(dict):
    """Each algorithm's run, computed on first use (so a ``-k`` selection compiles only what
    it needs)."""

    def __init__(self, clients, test):
        super().__init__()
        self.clients, self.test = clients, test

    def __missing__(self, name: str):
        alg, kwargs = _algorithms(self.clients)[name]
        self[name] = _run(
            alg, kwargs, self.clients, self.test, execution=Execution(diagnostics=True)
        )
        return self[name]


@pytest.fixture(scope="module")
def results(setup):
    return _Runs(*setup)


@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_runs_jitted_and_vmapped_over_clients_and_seeds(setup, results, name):
    clients, _ = setup
    alg, _ = _algorithms(clients)[name]
    res = results[name]
    runs = len(SEEDS)
    chex.assert_shape(res.privacy.epsilon, (runs, ROUNDS, N))
    assert len(res.history) == runs * ROUNDS
    assert list(res.history["seed"]) == [0] * ROUNDS + [1] * ROUNDS
    for leaf in jax.tree.leaves(res.clients):
        assert leaf.shape[:2] == (runs, N)
    loss = res.metrics["test_loss"]  # (runs, rounds) or per client (runs, rounds, N)
    assert loss.shape[:2] == (runs, ROUNDS) and np.all(np.isfinite(loss))
    assert not np.array_equal(loss[0], loss[1])  # the two seeds are different runs
    # the privacy record follows the unit
    eps = res.privacy.final_epsilon
    if privacy_unit(alg.accounting()) is None:
        assert np.all(np.isinf(eps))
    else:
        assert np.all(np.isfinite(eps)) and np.all(eps > 0)
    if name.startswith("fedavg_record") or name == "fed_dp_pso_private_selection":
        assert res.privacy.end_to_end
    if name == "fed_dp_pso":
        assert any("score" in line for line in res.privacy.not_covered)


@pytest.mark.parametrize("name", NAMES)
def test_released_outputs_hold_only_message_derived_and_public_values(setup, results, name):
    """Every Reply field declares its protection; the history is the algorithm's evaluation
    of the server state (rebuilt here from the final server state) plus labels and bytes;
    private diagnostics are empty unless asked for."""
    clients, test = setup
    alg, kwargs = _algorithms(clients)[name]
    res = results[name]
    data = alg.client_data(clients)
    one = jax.tree.map(lambda a: a[0], data)
    server = jax.tree.map(lambda a: a[0], res.server)
    state = jax.tree.map(lambda a: a[0, 0], res.clients)
    hyper = jax.tree.map(lambda a: a[0], _variants(alg, kwargs, clients).hyper)
    for ex in alg.setup + alg.exchanges:
        request = jax.eval_shape(ex.request, server)
        _, reply = jax.eval_shape(ex.client, state, one, request, jax.random.key(0), hyper)
        if isinstance(reply, tuple) and not reply:
            fields = set()  # nothing is sent
        elif dataclasses.is_dataclass(reply):
            fields = {
                f.name for f in dataclasses.fields(reply) if getattr(reply, f.name) is not None
            }
        else:
            fields = set(ex.protection) if len(ex.protection) == 1 else {"<one bare reply>"}
        assert fields == set(ex.protection), (ex.name, fields, ex.protection)
    public = set(alg.evaluate(server, test))
    released = set(res.history.columns)
    labels = set(res.runs.columns) | {"round"}
    byte_cols = {"bytes_up", "bytes_down", "cum_bytes_up", "cum_bytes_down", "epsilon_max"}
    counts = {f"selected_{ex.name}" for ex in alg.exchanges}  # released client counts
    assert released <= public | labels | byte_cols | counts
    last = alg.evaluate(server, test)
    row = res.history[res.history["seed"] == SEEDS[0]].iloc[-1]
    for k, v in last.items():
        if np.ndim(v) == 0:
            np.testing.assert_allclose(row[k], np.asarray(v), rtol=1e-6)
    for forbidden in ("train_loss", "participants", "fraction_clipped", "median_update_norm"):
        assert forbidden not in released


def _variants(alg, kwargs, clients):
    delta = 1e-3 if privacy_unit(alg.accounting()) == "client" else 1e-5
    return Variants.grid(alg, clients, RunSpec(ROUNDS, delta, tuple(SEEDS)), **kwargs)


@dataclasses.dataclass(frozen=True)
class _Undeclared(FedAvg):
    """FedAvg with DP-SGD whose exchange declares nothing about its replies' protection."""

    @property
    def exchanges(self):
        return tuple(dataclasses.replace(ex, protection=None) for ex in super().exchanges)


def test_an_exchange_that_declares_no_protection_is_counted_as_exact(setup, tmp_path):
    """``Exchange.protection=None`` (the default) puts the exchange in ``not_covered``: a
    record-level DP algorithm that forgets to declare is no longer end to end, and the
    ledger lists its runs as not private; ``{}`` (nothing sent) adds no line."""
    clients, test = setup
    alg = _Undeclared(MODEL, _dp_training(clients))
    assert hash(alg.exchanges[0]) == hash(alg.exchanges[0])  # still a static argument
    line = f"train: unprotected: {UNDECLARED}"
    assert coverage(alg.exchanges) == ((), (line,))
    nothing_sent = dataclasses.replace(alg.exchanges[0], protection={})
    assert coverage((nothing_sent,)) == ((), ())
    res = _run(alg, {"learning_rate": 0.01, "epsilon_target": 8.0}, clients, test)
    assert res.privacy.unit == "record" and np.all(np.isfinite(res.privacy.final_epsilon))
    assert res.privacy.not_covered == (line,) and not res.privacy.end_to_end
    assert "NOT covered: 1 message field or undeclared exchange (privacy" in repr(res)
    ledger = Ledger(tmp_path, "undeclared")
    index = ledger.add_result(res, algorithm="undeclared", path=tmp_path / "h.csv")[0]
    release = ledger.releases[index]
    assert release.unit is None and UNDECLARED in release.variant["not_covered"]


def test_the_contract_docs_count_is_the_codes():
    """docs/federated.md's member table and count name exactly the members
    :class:`Algorithm` defines (its required ones: those whose base raises, and
    ``exchanges``), and an exchange needs no :class:`Protection` to be built."""
    text = (REPO / "docs" / "federated.md").read_text()
    table = text.split("| member | side | what it is | default |")[1].split("\n\n")[0]
    rows = re.findall(r"^\| `(\w+)[(`].*\| ([^|]+) \|$", table, re.M)
    documented = {name for name, _ in rows}
    defined = {n for n in vars(Algorithm) if not n.startswith("_")}
    assert documented == defined, documented ^ defined

    def required(name):
        member = vars(Algorithm)[name]
        if not callable(member):
            return name == "exchanges"  # the base's () runs nothing
        return "raise NotImplementedError" in inspect.getsource(member)

    needed = {n for n in defined if required(n)}
    assert needed == {n for n, default in rows if default.startswith("required")}
    count = re.search(r"Counted from .*?: (\d+) members,\s+(\d+) required", text, re.S)
    assert count and (int(count[1]), int(count[2])) == (len(defined), len(needed))
    bare = Exchange("x", everyone, lambda s: s, lambda *a: a[:2], lambda *a: a[0])
    assert bare.protection is None


def test_fed_dp_pso_uploads_one_model_and_counts_one_observation_per_round(results):
    res = results["fed_dp_pso"]
    # up: N scores (float32) + ONE model; down: N models (gbest); the upload request is empty
    assert set(res.history["bytes_up"]) == {N * 4 + BYTES}
    assert set(res.history["bytes_down"]) == {N * BYTES}
    diag = res.private_diagnostics
    np.testing.assert_array_equal(diag["swarm.iteration"][:, -1], ROUNDS)  # once per round
    np.testing.assert_array_equal(diag["selected"][:, :, 1], 1)
    # the setup's upload plus one per round picked a client among the top 3
    assert set(np.unique(res.metrics["leader"])) <= set(range(N))


def test_fed_dp_pso_epsilon_per_client_is_the_accountants_and_within_target(setup, results):
    """Each client's epsilon after each round recomputes from its own (q_i, sigma_i, steps)
    with the Poisson buffer's overflow; it stays within the target, close to it at the end."""
    from swarmjax.privacy.accounting import epsilon as accounted

    clients, _ = setup
    res = results["fed_dp_pso"]
    alg, _ = _algorithms(clients)["fed_dp_pso"]
    sizes = np.asarray(clients.sizes)
    over = alg.training.sampler_overflow(sizes, clients.mask.shape[1])
    per_round = -(-sizes // alg.training.batch_size)
    pr = res.privacy
    assert pr.unit == "record" and any("DP-Adam" in line for line in pr.covers)
    # <= the target; here well below it: the 1e-9-per-step buffer's overflow, charged with
    # its e^epsilon factor, leaves the accountant no delta above epsilon ~6.3 (see
    # RecordDP.for_sizes(steps=...) for a buffer sized to the run)
    assert np.all(pr.final_epsilon <= 8.0) and np.all(pr.final_epsilon > 6.0)
    for r in range(len(SEEDS)):
        for i in range(N):
            q, sigma = float(pr.sample_rate[r, i]), float(pr.noise_multiplier[r, i])
            assert q == pytest.approx(alg.training.batch_size / sizes[i])
            for t in range(ROUNDS):
                assert pr.steps[r, t, i] == (t + 1) * per_round[i]
                want = accounted(q, sigma, (t + 1) * per_round[i], pr.delta, overflow_prob=over[i])
                assert pr.epsilon[r, t, i] == pytest.approx(want, rel=1e-9)


def _uniform_spend(*, runs, rounds, clients, sample_rate, noise_multiplier):
    """Client-level accounting where every client takes one step per round at the same
    ``(q_c, z)``: the record's ``steps`` and ``privacy_record`` keywords."""
    shape = (runs, rounds, clients)
    steps = np.broadcast_to(np.arange(1, rounds + 1)[None, :, None], shape)
    rates = {
        "sample_rate": np.full(shape, sample_rate),
        "noise_multiplier": np.full(shape, noise_multiplier),
    }
    return steps, rates


def _plan_overflow(alg, spend, n):
    """The overflow a user-level plan's accounting charges (its ``rates``) for runs of
    ``spend``'s ``(q_c, z)``."""
    from types import SimpleNamespace

    steps, rates = spend
    plan = SimpleNamespace(
        sample_rate=rates["sample_rate"][:, -1, 0],
        noise_multiplier=rates["noise_multiplier"][:, -1, 0],
    )
    return alg.accounting().rates(SimpleNamespace(plan=plan), steps.shape[1], n).overflow


def test_client_level_sampling_overflow_is_charged_to_delta(setup):
    """Client-level DP's draw of at most ``capacity`` clients is redrawn when it overflows:
    that chance (per round) is charged to delta as the record-level buffers' is; no capacity
    (or one holding every client) charges nothing."""
    from swarmjax.fl.runtime.result import privacy_record
    from swarmjax.privacy.accounting import epsilon as accounted
    from swarmjax.privacy.sampling import overflow_probability

    n, q = 1000, 0.05
    alg = dp_fedavg(MODEL, participation=Poisson(90))
    spend = _uniform_spend(runs=2, rounds=3, clients=n, sample_rate=q, noise_multiplier=1.0)
    over = _plan_overflow(alg, spend, n)
    chex.assert_shape(over, (2, 1, n))
    p = overflow_probability(n, q, 90, add_one=True)  # the add-one neighbour: N + 1
    assert 0 < p < 1e-6
    np.testing.assert_allclose(over, p)
    record = privacy_record(
        spend[0], (), unit="client", delta=1e-6, rates=Rates(**spend[1], overflow=over)
    )
    want = accounted(q, 1.0, 3, 1e-6, overflow_prob=p)
    np.testing.assert_allclose(record.final_epsilon, want)
    assert want > accounted(q, 1.0, 3, 1e-6)
    assert _plan_overflow(dp_fedavg(MODEL), spend, n) is None
    assert _plan_overflow(dp_fedavg(MODEL, participation=Poisson(n + 1)), spend, n) is None
    # a capacity of exactly N overflows on the add-one neighbour (N + 1 clients): charged
    exactly_n = _plan_overflow(dp_fedavg(MODEL, participation=Poisson(n)), spend, n)
    np.testing.assert_allclose(exactly_n, q ** (n + 1), rtol=1e-6)


def test_client_level_plan_calibration_meets_the_target_of_the_charged_record():
    """Calibrating without the overflow charge misses the target once the record charges it
    (DP-FedAvg's experiment at epsilon 8 reported 8.30); the plan calibrates against the same
    record (same accountant, same charge) and lands just below the target."""
    from swarmjax.fl.runtime.result import privacy_record
    from swarmjax.privacy.accounting import sigma_for_epsilon
    from swarmjax.privacy.sampling import poisson_capacity

    n, q, rounds, delta = 1000, 0.1, 50, 1000**-1.1
    alg = dp_fedavg(MODEL, participation=Poisson(poisson_capacity(n, q)))
    spec = RunSpec(rounds, delta)

    def recorded(z: float, accountant: str = "pld") -> float:
        spend = _uniform_spend(runs=1, rounds=rounds, clients=n, sample_rate=q, noise_multiplier=z)
        over = _plan_overflow(alg, spend, n)
        record = privacy_record(
            spend[0],
            (),
            unit="client",
            delta=delta,
            rates=Rates(**spend[1], overflow=over),
            accountant=accountant,
        )
        return float(record.final_epsilon.max())

    for target in (2.0, 8.0):
        z = alg.plan.privacy_plan(n, q, spec).calibrate(target).noise_multiplier
        assert target * 0.99 <= recorded(z) <= target
    z_rdp = alg.plan.privacy_plan(n, q, RunSpec(rounds, delta, accountant="rdp")).calibrate(8.0)
    assert 8.0 * 0.99 <= recorded(z_rdp.noise_multiplier, "rdp") <= 8.0
    assert (
        z_rdp.noise_multiplier > alg.plan.privacy_plan(n, q, spec).calibrate(8.0).noise_multiplier
    )
    assert recorded(sigma_for_epsilon(8.0, q, rounds, delta)) > 8.2  # the uncharged calibration
    unbounded = dp_fedavg(MODEL)  # no capacity: nothing to charge
    assert unbounded.plan.privacy_plan(n, q, spec).calibrate(
        8.0
    ).noise_multiplier == sigma_for_epsilon(8.0, q, rounds, delta)


def test_fed_dp_pso_private_selection_adds_its_budget_end_to_end(setup, results):
    """Every score is noised: nothing is left uncovered, and the selection's epsilon (1.0 by
    default, spread over S + rounds (S + 1) scores) adds to DP-Adam's, round by round."""
    from swarmjax.fl.algorithms.fed_dp_pso import selection_releases
    from swarmjax.privacy.accounting import epsilon as accounted

    clients, _ = setup
    alg, _ = _algorithms(clients)["fed_dp_pso_private_selection"]
    pr = results["fed_dp_pso_private_selection"].privacy
    assert pr.end_to_end, pr.not_covered
    assert any("Laplace" in line for line in pr.covers)
    over = alg.training.sampler_overflow(np.asarray(clients.sizes), clients.mask.shape[1])
    per_score = 1.0 / selection_releases(alg.particles, ROUNDS)
    for i in range(N):
        q, sigma = float(pr.sample_rate[0, i]), float(pr.noise_multiplier[0, i])
        for t in range(ROUNDS):
            adam = accounted(q, sigma, int(pr.steps[0, t, i]), pr.delta, overflow_prob=over[i])
            scores = alg.particles + (t + 1) * (alg.particles + 1)
            assert pr.epsilon[0, t, i] == pytest.approx(adam + scores * per_score, rel=1e-6)
    assert pr.final_epsilon.max() <= 9.0 + 1e-5


def test_client_level_dp_fedavg_releases_expected_not_realised_participants(setup, results):
    res = results["client_level_dp_fedavg"]
    expected = np.float32(0.7) * N
    request = BYTES + 4  # the model and the clip norm C_t (float32)
    np.testing.assert_allclose(res.history["bytes_down"], expected * request, rtol=1e-6)
    assert "selected" in res.private_diagnostics  # realised counts: diagnostics only


@functools.partial(jax.jit, static_argnums=(0, 1))
def _call(alg, method: str, *args):
    """``alg.method(*args)`` in one jitted program per algorithm and method (the poison
    value is an argument: every parametrisation below runs the programs of the first)."""
    return getattr(alg, method)(*args)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e30])
def test_unselected_slots_contribute_exactly_nothing(setup, bad):
    """NaN / inf / 1e30 in an unselected slot leave every aggregate bit-identical to zeros."""
    clients, _ = setup
    mask = jnp.array([True, True, False])
    params = MODEL.init(jax.random.key(0))
    stacked = jax.tree.map(lambda a: jnp.stack([a, 2 * a, a]), params)

    def poison(tree, value):
        return jax.tree.map(lambda a: a.at[2].set(value), tree)

    key = jax.random.key(1)
    fedavg = FedAvg(MODEL)
    server = ModelServer(params=params)
    reply = Update(delta=stacked, weight=jnp.array([10.0, 20.0, 30.0]))
    agg = [
        _call(
            fedavg,
            "aggregate",
            server,
            Update(poison(stacked, v), reply.weight.at[2].set(v)),
            Slots.everyone(mask),
            key,
            None,
        )
        for v in (0.0, bad)
    ]
    chex.assert_trees_all_equal(*agg)

    dp = dp_fedavg(MODEL, participation=Poisson(None))
    spec = RunSpec(1, 1e-3)
    hyper = dp.resolve(
        dp.default_hyper(clients, spec).with_values(sample_rate=0.5), clients, spec, None
    )
    dserver = dp.server_init(jax.random.key(0), hyper)
    upd = ClippedUpdate(update=stacked, unclipped=jnp.array([1.0, 0.0, 1.0]))
    out = [
        _call(
            dp,
            "aggregate",
            dserver,
            ClippedUpdate(poison(stacked, v), upd.unclipped.at[2].set(v)),
            Slots.everyone(mask),
            key,
            hyper,
        )
        for v in (0.0, bad)
    ]
    chex.assert_trees_all_equal(*out)

    pso = FedDPPSO(MODEL)
    pserver = pso.server_init(jax.random.key(0), pso.default_hyper(clients, spec))
    one_hot = jnp.array([False, True, False])
    models = [
        _call(pso, "take_gbest", pserver, poison(stacked, v), Slots.everyone(one_hot), key, None)
        for v in (0.0, bad)
    ]
    chex.assert_trees_all_equal(*models)
    reports = [
        _call(
            pso, "store_reports", pserver, jnp.array([1.0, 2.0, v]), Slots.everyone(mask), key, None
        )
        for v in (0.0, bad)
    ]
    chex.assert_trees_all_equal(*reports)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_update_is_clipped_to_nothing(bad):
    params = MODEL.init(jax.random.key(0))
    poisoned = jax.tree.map(lambda a: a.at[(0,) * a.ndim].set(bad), params)
    clipped, norm, finite = clip_update(poisoned, 0.5)
    assert not finite and norm == np.inf
    chex.assert_trees_all_equal(clipped, jax.tree.map(jnp.zeros_like, params))
    big = jax.tree.map(lambda a: a * 1e3, params)
    clipped, norm, finite = clip_update(big, 0.5)
    total = np.sqrt(sum(float(jnp.sum(c**2)) for c in jax.tree.leaves(clipped)))
    assert finite and total == pytest.approx(0.5, rel=1e-5)


def test_keys_are_fold_in_only_and_distinct_per_party():
    k = jax.random.key(3)
    a = client_key(k, 1, 0, 2)
    expected = jax.random.fold_in(
        jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(k, 3), 1), 0), 2
    )
    chex.assert_trees_all_equal(jax.random.key_data(a), jax.random.key_data(expected))
    assert not np.array_equal(
        jax.random.key_data(server_key(k, 1, 0)), jax.random.key_data(client_key(k, 1, 0, 0))
    )


@pytest.fixture(scope="module")
def two_targets(setup):
    """``fedavg_record_dp`` at two target epsilons (four runs) without diagnostics: one
    compiled call for the batch test below and the empty-diagnostics check after it."""
    clients, test = setup
    alg, kwargs = _algorithms(clients)["fedavg_record_dp"]
    return _run(alg, {**kwargs, "epsilon_target": [1.0, 8.0]}, clients, test)


def test_variants_draw_independent_noise_unless_common_random_numbers(setup, results, two_targets):
    """Two target epsilons with the same seed: different keys (independent noise); a run's
    numbers do not depend on the rest of its batch (same secret); common random numbers
    share keys; another secret gives other keys."""
    clients, _ = setup
    alg, kwargs = _algorithms(clients)["fedavg_record_dp"]
    two = _variants(alg, {**kwargs, "epsilon_target": [1.0, 8.0]}, clients)
    keys = jax.random.key_data(run_keys(SECRET, [0], variant_identities(alg, two), False))
    assert not np.array_equal(keys[0], keys[1])
    crn = jax.random.key_data(run_keys(SECRET, [0], variant_identities(alg, two), True))
    np.testing.assert_array_equal(crn[0], crn[1])
    other = jax.random.key_data(run_keys(OTHER, [0], variant_identities(alg, two), False))
    assert not np.array_equal(other[0], keys[0]) and not np.array_equal(other[1], keys[1])
    both = two_targets
    alone = results["fedavg_record_dp"].history  # target 8 only, same seeds
    at8 = both.history[both.history["epsilon_target"] == 8.0].reset_index(drop=True)
    # equal up to float32 rounding (XLA may vectorise a batch of 4 runs unlike one of 2)
    np.testing.assert_allclose(at8["test_loss"], alone["test_loss"], rtol=1e-6)
    at1 = both.history[both.history["epsilon_target"] == 1.0]
    assert not np.allclose(at1["test_loss"], alone["test_loss"], rtol=1e-4)


def test_equal_algorithms_compile_once(setup, results, two_targets):
    """An algorithm equal to one already run (built anew) reuses its compiled rounds;
    private diagnostics stay empty unless asked for (a call that did not ask: the
    two-target batch, so that no program is compiled for this check alone)."""
    clients, test = setup
    alg, kwargs = _algorithms(clients)["fedavg"]
    first = results["fedavg"]  # compiled here (the fixture is lazy)
    before = sim.run_rounds._cache_size()
    again = FedAvg(mlp((8,), 10, (8, 8, 1)), LocalTraining(batch_size=32))
    assert again == alg and hash(again) == hash(alg)
    res = _run(again, kwargs, clients, test, execution=Execution(diagnostics=True))
    assert sim.run_rounds._cache_size() == before
    pd.testing.assert_frame_equal(res.history, first.history)
    assert two_targets.private_diagnostics == {}
    assert results["fedavg_record_dp"].private_diagnostics  # the same algorithm, asked for


def test_centralised_reference_keeps_its_optimiser_across_rounds(setup):
    clients, test = setup
    union = centralised_clients(clients)
    assert int(union.sizes[0]) == int(np.sum(clients.sizes))
    alg = LocalOnly(
        MODEL, LocalTraining(batch_size=32, optimizer="adam"), keep_optimizer_state=True
    )
    # one seed's 3-round accuracy ranges 0.3-0.8 over draws (fresh secrets gave means of
    # 0.49 and above): the fixed test secret makes the check deterministic
    spec = RunSpec(3, 1e-5, (0, 1, 2))
    grid = Variants.grid(alg, union, spec, learning_rate=0.01)
    res = simulate(alg, union, test, grid, secret=SECRET)
    acc = res.history[res.history["round"] == 3]["test_accuracy"]
    assert acc.mean() > 0.5
    count = jax.tree.leaves(res.clients.opt_state)[0]
    assert int(np.ravel(count)[0]) == 3 * -(-int(union.sizes[0]) // 32)


def test_bad_input_fails_before_any_work(setup):
    clients, _ = setup
    spec = RunSpec(1, 1e-5)
    with pytest.raises(ValueError, match="capacity"):
        Variants.grid(dp_fedavg(MODEL, participation=Poisson(1)), clients, spec, sample_rate=0.9)
    with pytest.raises(ValueError, match="learning_rate"):
        Variants.grid(FedAvg(MODEL), clients, spec, learning_rate=-1.0)
    with pytest.raises(ValueError, match="epsilon_target"):
        Variants.grid(FedAvg(MODEL), clients, spec, epsilon_target=8.0)
    with pytest.raises(ValueError, match=r"record_dp\.capacity"):
        alg = FedAvg(MODEL, LocalTraining(record_dp=RecordDP(capacity=1)))
        Variants.grid(alg, clients, spec, epsilon_target=8.0)
    with pytest.raises(ValueError, match="no hyper-parameter 'lr'"):
        Variants.grid(FedAvg(MODEL), clients, spec, lr=0.1)
    with pytest.raises(ValueError, match="are the same run"):
        run_keys(SECRET, [0], [bytes(32)] * 2, common_random_numbers=False)
    with pytest.raises(TypeError, match="Secret first"):
        run_keys(0, [0], [bytes(32)], common_random_numbers=False)  # the old (seeds, ...) order
    small = FedAvg(mlp((8,), 3, (8, 8, 1)))  # 3 outputs, digits labels go to 9
    with pytest.raises(ValueError, match="labels must be in"):
        Variants.grid(small, clients, spec)
    with pytest.raises(ValueError, match="unknown accountant 'gdp'"):
        RunSpec(3, 1e-3, accountant="gdp")


def test_record_dp_accounts_the_samplers_overflow_over_the_whole_run(setup, results):
    """The Poisson buffer's overflow is charged to delta at every accounted step: the record's
    epsilon is the accountant's with ``overflow_prob``; a run-sized buffer adds at most
    1e-3 delta; a too-small buffer makes epsilon grow (or inf), never silently ignored."""
    from swarmjax.fl.runtime.result import privacy_record
    from swarmjax.privacy.accounting import epsilon as accounted
    from swarmjax.privacy.sampling import overflow_probability, sampler_delta

    clients, _ = setup
    sizes = np.asarray(clients.sizes)
    steps, delta, target = 400, 1e-5, 8.0
    run = RecordDP.for_sizes(sizes, 32, steps=steps, delta=delta, epsilon=target)
    small = RecordDP.for_sizes(sizes, 32)  # 1e-9 per step
    assert run.capacity >= small.capacity
    for n in sizes:
        p = overflow_probability(int(n), 32 / int(n), run.capacity)
        assert sampler_delta(p, steps, target) <= 1e-3 * delta
    training = LocalTraining(batch_size=32, record_dp=RecordDP(capacity=34))
    over = training.sampler_overflow(sizes, clients.mask.shape[1])
    chex.assert_shape(over, (N,))
    np.testing.assert_allclose(
        over, [overflow_probability(int(n), 32 / int(n), 34) for n in sizes], rtol=1e-12
    )
    assert np.all(over > 0)
    np.testing.assert_array_equal(
        LocalTraining(batch_size=32).sampler_overflow(sizes, clients.mask.shape[1]), 0.0
    )
    shape = (1, 2, N)
    steps = np.broadcast_to(np.array([10, 20])[None, :, None], shape)
    rates = {"sample_rate": np.full(shape, 0.16), "noise_multiplier": np.full(shape, 1.1)}
    exact = privacy_record(
        steps, (), unit="record", delta=delta, rates=Rates(**rates, overflow=over)
    )
    naive = privacy_record(steps, (), unit="record", delta=delta, rates=Rates(**rates))
    for i in range(N):
        assert exact.epsilon[0, 1, i] == pytest.approx(
            accounted(0.16, 1.1, 20, delta, overflow_prob=over[i])
        )
    assert np.all(exact.epsilon >= naive.epsilon) and np.any(exact.epsilon > naive.epsilon)
    # end to end: the simulator charges the configured buffer's overflow
    res = results["fedavg_record_dp"]
    alg, _ = _algorithms(clients)["fedavg_record_dp"]
    p = alg.training.sampler_overflow(sizes, clients.mask.shape[1])
    pr = res.privacy
    for i in range(N):
        expected = accounted(
            float(pr.sample_rate[0, i]),
            float(pr.noise_multiplier[0, i]),
            int(pr.steps[0, -1, i]),
            delta,
            overflow_prob=float(p[i]),
        )
        assert pr.final_epsilon[0, i] == pytest.approx(expected, rel=1e-9)


def test_slots_scatter_and_update_place_replies_by_client_id_and_drop_unused_slots():
    """A cohort's compact slots: slot s holds client ids[s]; an unused slot (mask False,
    id N) changes nothing, whatever it holds."""
    slots = Slots(
        mask=jnp.array([True, True, False]), ids=jnp.array([4, 1, 5], jnp.int32), num_clients=5
    )
    values = jnp.array([10.0, 11.0, jnp.nan])
    np.testing.assert_array_equal(
        np.asarray(slots.scatter(values, jnp.inf)), [np.inf, 11.0, np.inf, np.inf, 10.0]
    )
    old = {"w": jnp.arange(10.0).reshape(5, 2)}
    new = {"w": jnp.array([[1e30, 1e30], [7.0, 7.0], [jnp.nan, jnp.nan]])}
    got = np.asarray(slots.update(old, new)["w"])
    want = np.arange(10.0, dtype=np.float32).reshape(5, 2)
    want[4], want[1] = 1e30, 7.0
    np.testing.assert_array_equal(got, want)


def forty_clients():
    """40 IID digits clients of 20 rows, and the Poisson buffer of rate 0.1 for them:
    ``(clients, 40, capacity)``."""
    from swarmjax.privacy.sampling import poisson_capacity

    data = load_dataset("digits")
    part = iid_partition(data.y_train[:800], 40, seed=0)
    clients = stack_clients(data.x_train, data.y_train, part.indices)
    return clients, 40, poisson_capacity(40, 0.1)


_TRAINED: list[int] = []  # one entry per client block that trained (_Counted's callback)
_SUMMED: list[tuple[int, int]] = []  # (slots, clients) of each traced aggregate_sum


@dataclasses.dataclass(frozen=True)
class _Counted(Private):
    """DP-FedAvg whose client step counts the blocks that train, by a host callback (a
    callback in a vmapped block runs once for the block), and whose summed aggregate
    records, when traced, how many slots it is handed and checks it gets a sum."""

    def client(self, state, data, request, key, hyper):
        jax.debug.callback(lambda: _TRAINED.append(1))
        return super().client(state, data, request, key, hyper)

    def aggregate_sum(self, server, replies, slots, key, hyper):
        like = jax.tree.leaves(server.params)[0].shape
        assert jax.tree.leaves(replies.update)[0].shape == like  # a sum: no slot axis
        _SUMMED.append((slots.mask.shape[0], slots.num_clients))
        return super().aggregate_sum(server, replies, slots, key, hyper)


@pytest.fixture(scope="module")
def counted(setup):
    """``(alg, clients, grid, capacity, everyone, summed)``: :class:`_Counted` on
    :func:`forty_clients` over 3 rounds, its plain vmap over every slot (the numbers each
    client map must give; one run for all of them) and what that run's summed aggregate
    was handed."""
    _, test = setup
    clients, _, capacity = forty_clients()
    dp = dp_fedavg(MODEL, training=LocalTraining(batch_size=10), participation=Poisson(capacity))
    alg = _Counted(dp.algorithm, dp.plan)
    grid = Variants.grid(alg, clients, RunSpec(3, 1e-3), sample_rate=0.1)
    _SUMMED.clear()
    everyone = simulate(
        alg, clients, test, grid, secret=SECRET, execution=Execution(client_map="vmap")
    )
    return alg, clients, grid, capacity, everyone, list(_SUMMED)


def test_a_capped_exchange_runs_and_aggregates_only_the_cohorts_slots(counted):
    """With ``max_selected`` the simulator calls ``client`` and hands the aggregate that
    many slots (not N): a round's cost follows the cohort. DP-FedAvg's exchange is summed,
    so the simulator hands ``aggregate_sum`` the replies' sum, never their stack (checked
    while the shared vmapped run of the client-map tests below is traced)."""
    _, clients, _, capacity, everyone, summed = counted
    many = clients.mask.shape[0]
    assert many == 40 and capacity < many
    assert summed and all(s == (capacity, many) for s in summed)
    assert np.isfinite(everyone.history["test_loss"]).all()


@pytest.mark.parametrize("client_map", ["sequential", 2, 3])
def test_clients_in_turn_skip_unused_slots_and_give_the_vmapped_numbers(setup, counted, client_map):
    """Clients run one at a time or in blocks: a block with no sampled client (the Poisson
    buffer's unused tail) does not train (blocks counted by a host callback), and the numbers are
    those of the plain vmap over every slot. (3 does not divide the capacity: a tail block.)"""
    _, test = setup
    alg, clients, grid, capacity, everyone, _ = counted
    _TRAINED.clear()
    execution = Execution(client_map=client_map, diagnostics=True)
    turns = simulate(alg, clients, test, grid, secret=SECRET, execution=execution)
    selected = np.asarray(turns.private_diagnostics["selected"]).reshape(-1)
    k = 1 if client_map == "sequential" else client_map
    blocks = -(-selected // k)  # the used slots come first: ceil(selected / k) blocks run
    assert selected.max() < capacity and len(_TRAINED) == int(np.sum(blocks))
    np.testing.assert_allclose(turns.history["test_loss"], everyone.history["test_loss"], rtol=1e-5)
