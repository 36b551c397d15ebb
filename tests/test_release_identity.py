"""Issue 35 (items 3-5) and 45: run keys are derived from the call's secret, the release
identity (the algorithm, its static settings, every hyper value of the variant and its
labels) and the seed, so two different releases never share noise by accident and nothing
published regenerates it; keys of different purposes never coincide; checkpoint folders
refuse a changed ``common_random_numbers`` and are marked as not released."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.private import Private
from swarmjax.fl.protocol import (
    RunSpec,
    Variants,
    aggregate_key,
    client_init_key,
    client_key,
    describe,
    release_identity,
    run_keys,
    server_init_key,
    server_key,
    variant_identities,
)
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.fl.runtime.checkpoint import NOT_RELEASED, Checkpoints, fingerprint, not_released
from swarmjax.fl.runtime.flower.task import stacked_task
from swarmjax.models import mlp
from swarmjax.privacy.participation import Poisson
from tests.conftest import REPO
from tests.reproducible import OTHER, SECRET

MODEL = mlp((8,), 10, (8, 8, 1))
SPEC = RunSpec(rounds=1, delta=1e-5, seeds=(0,))


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    x, y = data.x_train[:160], data.y_train[:160]
    clients = stack_clients(x, y, iid_partition(y, 4, seed=0).indices)
    return clients, (data.x_test[:100], data.y_test[:100])


def _kd(keys) -> np.ndarray:
    """Key data, ``(..., words)`` uint32 (2 for Threefry, 8 for ChaCha20)."""
    return np.asarray(jax.random.key_data(keys))


def _dp(clipping: str, **settings) -> Private:
    return dp_fedavg(MODEL, training=LocalTraining(batch_size=40), clipping=clipping, **settings)


# Every client takes part, local steps do nothing (learning_rate ~ 0): the round-1 model minus
# the initial one is the server's Gaussian noise alone (scaled by the server step).
NOISE_ONLY = dict(sample_rate=1.0, noise_multiplier=10.0, initial_clip=1.0, learning_rate=1e-9)


# ------------------------------------------------------------------------- JAX facts


def test_split_children_are_fold_in_children_in_this_jax():
    """A documented fact of the pinned JAX (threefry, partitionable): ``split(k, n)[i] ==
    fold_in(k, i)``. It is why the aggregate key must not be a child of the select key:
    an aggregate's ``split`` keys would then be the select's redraw keys."""
    for seed in (0, 7, 12345):
        k = jax.random.key(seed)
        for n in (2, 3, 5):
            split = _kd(jax.random.split(k, n))
            folded = np.stack([_kd(jax.random.fold_in(k, i)) for i in range(n)])
            np.testing.assert_array_equal(split, folded)


# ---------------------------------------------------------------------- purpose keys


def _children(k) -> list[np.ndarray]:
    """``k`` and the keys an aggregate derives from it: ``split`` into 2 and 3,
    ``fold_in`` 0..4."""
    out = [_kd(k)]
    out += list(_kd(jax.random.split(k, 2))) + list(_kd(jax.random.split(k, 3)))
    out += [_kd(jax.random.fold_in(k, j)) for j in range(5)]
    return out


def test_aggregate_keys_are_never_select_redraw_or_client_keys():
    """For every round/exchange, the aggregate key and its split/fold_in children are none
    of the select keys' draw keys ``fold_in(select_key, attempt)``, attempts 0..64 (the
    sampler's ``_MAX_DRAWS`` redraws), nor the select keys, client keys or init keys."""
    run = run_keys(SECRET, [3], [b"\x01" * 32], False)[0]
    rounds, exchanges, clients = range(4), range(2), range(6)
    forbidden = {tuple(_kd(server_init_key(run)))}
    for r in rounds:
        for e in exchanges:
            select = server_key(run, r, e)
            forbidden.add(tuple(_kd(select)))
            draws = jax.vmap(lambda a, s=select: jax.random.fold_in(s, a))(jnp.arange(65))
            forbidden.update(map(tuple, _kd(draws)))
            for i in clients:
                forbidden.add(tuple(_kd(client_key(run, r, e, i))))
    for i in clients:
        forbidden.add(tuple(_kd(client_init_key(run, i))))
    assert len(forbidden) == 1 + 4 * 2 * (1 + 65 + 6) + 6  # all distinct themselves
    for r in rounds:
        for e in exchanges:
            # the old derivation, fold_in(select_key, 1), is a redraw key: the check can fail
            assert tuple(_kd(jax.random.fold_in(server_key(run, r, e), 1))) in forbidden
            for child in _children(aggregate_key(run, r, e)):
                assert tuple(child) not in forbidden, (r, e)


# --------------------------------------------------------------------------- identity


def test_two_dp_algorithms_with_equal_seeds_and_labels_draw_independent_noise(digits):
    """The audit's case: fixed and adaptive DP-FedAvg, two ``simulate`` calls with the same
    seed and labels, under the same supplied secret (two fresh secrets would make them
    independent trivially). Their round-1 noise must be independent (from two correlated
    noises the exact clipped sum comes back); with common random numbers it is shared on
    purpose, which the same measurement sees (the test can fail)."""
    clients, test = digits
    moved = {}
    for crn in (False, True):
        for clipping in ("fixed", "adaptive"):
            alg = _dp(clipping)
            spec = dataclasses.replace(SPEC, common_random_numbers=crn)
            variants = Variants.grid(alg, clients, spec, **NOISE_ONLY)
            res = simulate(alg, clients, test, variants, secret=SECRET)
            key = run_keys(SECRET, SPEC.seeds, variant_identities(alg, variants), crn)[0]
            start = MODEL.init(server_init_key(key))
            moved[crn, clipping] = np.concatenate(
                [
                    (np.asarray(a[0]) - np.asarray(b)).ravel()
                    for a, b in zip(
                        jax.tree.leaves(res.server.params), jax.tree.leaves(start), strict=True
                    )
                ]
            )
    assert moved[False, "fixed"].size > 500
    assert np.std(moved[False, "fixed"]) > 0.5  # noise, z C / (q N) = 2.5 per coordinate
    independent = np.corrcoef(moved[False, "fixed"], moved[False, "adaptive"])[0, 1]
    shared = np.corrcoef(moved[True, "fixed"], moved[True, "adaptive"])[0, 1]
    assert abs(independent) < 0.2, independent
    assert shared > 0.99, shared


def test_identities_tell_algorithms_settings_values_and_labels_apart(digits):
    clients, _ = digits
    fixed, adaptive = _dp("fixed"), _dp("adaptive")
    row = jax.tree.map(lambda a: a[0], Variants.grid(fixed, clients, SPEC, **NOISE_ONLY).hyper)
    labels = {"epsilon_target": 8.0}
    base = release_identity(fixed, row, labels)
    assert isinstance(base, bytes) and len(base) == 32
    others = {
        "algorithm": release_identity(adaptive, row, labels),
        "setting": release_identity(_dp("fixed", participation=Poisson(3)), row, labels),
        "model": release_identity(
            dataclasses.replace(
                fixed,
                algorithm=dataclasses.replace(fixed.algorithm, model=mlp((9,), 10, (8, 8, 1))),
            ),
            row,
            labels,
        ),
        "one hyper value": release_identity(
            fixed,
            row.with_values(learning_rate=jnp.nextafter(row.inner.learning_rate, 1.0)),
            labels,
        ),
        "hyper dtype": release_identity(
            fixed,
            row.with_values(learning_rate=np.asarray(row.inner.learning_rate, np.float64)),
            labels,
        ),
        "labels": release_identity(fixed, row, {"epsilon_target": 4.0}),
        "label names": release_identity(fixed, row, {"eps": 8.0}),
    }
    assert [name for name, ident in others.items() if ident == base] == []
    assert len(set(others.values())) == len(others)
    # the same configuration built anew, labels as NumPy scalars: the same identity
    again = release_identity(_dp("fixed"), jax.tree.map(np.asarray, row), {"epsilon_target": 8.0})
    assert again == base
    assert release_identity(fixed, row, {"epsilon_target": np.float64(8.0)}) == base


def test_rows_differing_in_one_hyper_value_get_different_keys_with_equal_labels(digits):
    """Two rows with equal (here: no) labels are two releases, not a duplicate: distinct
    keys, no error; a truly repeated row is an error unless common random numbers."""
    clients, _ = digits
    alg = FedAvg(MODEL, LocalTraining(batch_size=40))
    grid = Variants.grid(alg, clients, SPEC, learning_rate=[0.1, 0.2])
    variants = Variants(hyper=grid.hyper, labels={}, spec=SPEC)
    keys = _kd(run_keys(SECRET, [0, 1], variant_identities(alg, variants), False))
    assert len({tuple(k) for k in keys}) == 4
    twice = jax.tree.map(lambda a: jnp.stack([a[0], a[0]]), grid.hyper)
    repeated = variant_identities(alg, Variants(hyper=twice, labels={}, spec=SPEC))
    with pytest.raises(ValueError, match="variants 0 and 1 are the same run"):
        run_keys(SECRET, [0], repeated, False)
    shared = _kd(run_keys(SECRET, [5], repeated, True))
    np.testing.assert_array_equal(shared[0], shared[1])
    with pytest.raises(TypeError, match="release identities"):
        run_keys(SECRET, [0], [{}], False)


def test_same_configuration_and_seed_give_the_same_keys_in_any_batch(digits):
    """Reproducible under one secret: the same secret and configuration built anew give the
    same keys; a variant's key does not depend on the other variants of its call; another
    secret gives other keys for every run; common random numbers give every variant of a
    seed one key (a different one per seed, and none of them the seed's public Threefry
    key); the Flower task given the secret derives the simulator's key, one without a
    secret a key of its own."""
    clients, test = digits

    def build(lrs):
        alg = FedAvg(mlp((8,), 10, (8, 8, 1)), LocalTraining(batch_size=40))
        return alg, Variants.grid(alg, clients, RunSpec(1, 1e-5, (0, 3)), learning_rate=lrs)

    alg, both = build([0.1, 0.2])
    ids = variant_identities(alg, both)
    keys = _kd(run_keys(SECRET, both.spec.seeds, ids, False))
    assert keys.shape == (4, 8) and len({tuple(k) for k in keys}) == 4
    alg2, again = build([0.1, 0.2])
    np.testing.assert_array_equal(
        keys, _kd(run_keys(SECRET, again.spec.seeds, variant_identities(alg2, again), False))
    )
    _, alone = build([0.2])
    np.testing.assert_array_equal(
        keys[2:], _kd(run_keys(SECRET, alone.spec.seeds, variant_identities(alg, alone), False))
    )
    other = _kd(run_keys(OTHER, both.spec.seeds, ids, False))
    assert not any(np.array_equal(a, b) for a in other for b in keys)
    crn = _kd(run_keys(SECRET, [0, 3], ids, True))
    np.testing.assert_array_equal(crn[:2], crn[2:])  # variants of a seed share the key
    assert not np.array_equal(crn[0], crn[1])  # seeds still differ
    assert not any(np.array_equal(c, k) for c in crn for k in keys)
    assert not np.array_equal(_kd(run_keys(OTHER, [0, 3], ids, True)), crn)
    for s in (0, 3):  # the seed's public key is not the run's, even in its first words
        public = _kd(jax.random.key(s))
        assert not any(np.array_equal(c[: public.size], public) for c in crn)
    one = Variants(
        hyper=jax.tree.map(lambda a: a[1:], both.hyper),
        labels={"learning_rate": [0.2]},
        spec=RunSpec(1, 1e-5, (3,)),
    )
    task = stacked_task(alg, one, clients, test, secret=SECRET)
    np.testing.assert_array_equal(_kd(task.run_key), keys[3])
    own = stacked_task(alg, one, clients, test)  # no secret: this process draws its own
    assert not np.array_equal(_kd(own.run_key), keys[3])


def test_describe_sees_partial_arguments_and_closures_but_not_addresses():
    def scaled(x, factor):
        return x * factor

    def closing(factor):
        return lambda x: x * factor

    assert describe(functools.partial(scaled, factor=2)) != describe(
        functools.partial(scaled, factor=3)
    )
    assert describe(closing(2)) != describe(closing(3))
    assert describe(closing(2)) == describe(closing(2))
    assert describe(np.arange(3)) != describe(np.arange(3.0))

    class Opaque:
        pass

    assert describe(Opaque()) == describe(Opaque())  # default repr: address removed


IDENTITY_SCRIPT = r"""
import numpy as np
from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.protocol import describe, release_identity
from swarmjax.models import mlp

alg = dp_fedavg(mlp((8,), 10, (8, 8, 1)), training=LocalTraining(batch_size=40), clipping="fixed")
row = {"learning_rate": np.float32(0.5), "noise_multiplier": np.float32(1.25)}
out = release_identity(alg, row, {"epsilon_target": 8.0, "tag": {"a", "b", "c", "d"}}).hex()
print(out)
"""


def test_an_identity_is_the_same_in_another_process_whatever_its_hash_seed():
    """A deployment's server and clients each derive the run key: the identity must not
    depend on the process (memory addresses, set order under another hash seed)."""
    ns: dict = {}
    exec(IDENTITY_SCRIPT, ns)
    here = ns["out"]
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "JAX_PLATFORMS": "cpu"}
        proc = subprocess.run(
            [sys.executable, "-c", IDENTITY_SCRIPT],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == here, seed


# ------------------------------------------------------------------------- checkpoint


def test_resuming_with_another_common_random_numbers_is_refused(digits, tmp_path):
    clients, test = digits
    alg = FedAvg(MODEL, LocalTraining(batch_size=40))
    variants = Variants.grid(alg, clients, SPEC, learning_rate=[0.1, 0.2])
    folder = tmp_path / "ckpt"
    simulate(alg, clients, test, variants, execution=Execution(checkpoint_dir=folder))
    assert (folder / "secret.key").exists()  # the run's secret, kept for a resume
    assert (folder / "outputs_1.npz").exists()
    paired = dataclasses.replace(
        variants, spec=dataclasses.replace(SPEC, common_random_numbers=True)
    )
    with pytest.raises(ValueError, match="common_random_numbers") as err:
        simulate(alg, clients, test, paired, execution=Execution(checkpoint_dir=folder))
    assert "\n" not in str(err.value)
    # the digest itself covers the keys (seeds, identities, common random numbers)
    data = alg.client_data(clients)
    ids = variant_identities(alg, variants)
    digests = {
        fingerprint(alg, variants, data, run_keys(secret, seeds, ids, crn))
        for secret in (SECRET, OTHER)
        for seeds in ((0,), (1,))
        for crn in (False, True)
    }
    assert len(digests) == 8


def test_a_checkpoint_folder_is_marked_not_released(tmp_path):
    assert not not_released(tmp_path)
    folder = tmp_path / "new" / "ckpt"
    saved = Checkpoints(folder, "digest", {"common_random_numbers": False})
    saved.close()
    assert not_released(folder) and not not_released(tmp_path)
    text = (folder / NOT_RELEASED).read_text()
    assert "never" in text.lower() or "not" in text.lower()
    assert "cohort" in text and "epsilon" in text
    # an existing folder without the marker (made before it existed) gets it on resume
    (folder / NOT_RELEASED).unlink()
    Checkpoints(folder, "digest", {"common_random_numbers": False}).close()
    assert not_released(folder)
    with pytest.raises(ValueError, match="other settings"):
        Checkpoints(folder, "another digest", {"common_random_numbers": False})
