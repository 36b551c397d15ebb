"""Pytree <-> Flower record conversion: bit-exact round trips, rejection of mismatches."""

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from swarmjax.fl.runtime.flower.records import RecordError, from_record, payload_bytes, to_record

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int8, np.uint32, np.bool_]


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.atleast_1d(np.asarray(a))
    return a.view(np.uint8) if a.dtype != np.bool_ else a


@settings(max_examples=20, deadline=None)
@given(
    leaves=st.lists(
        st.sampled_from(DTYPES).flatmap(
            lambda d: hnp.arrays(d, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4))
        ),
        min_size=1,
        max_size=4,
    )
)
def test_round_trip_is_bit_exact(leaves):
    # NaN payloads, infinities and signed zeros included (hypothesis draws them for floats)
    tree = {"params": {f"w{i}": a for i, a in enumerate(leaves)}, "count": np.int32(3)}
    back = from_record(to_record(tree), tree)
    for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(back), strict=True):
        assert np.asarray(b).dtype == np.asarray(a).dtype
        chex.assert_shape(b, np.shape(a))
        np.testing.assert_array_equal(_bits(b), _bits(a))


def test_keys_bfloat16_and_templates_from_eval_shape():
    tree = {
        "key": jax.random.key(7),
        "keys": jax.random.split(jax.random.key(1), 3),
        "half": jnp.array([1.5, -0.0, jnp.nan], jnp.bfloat16),
        "f8": np.array([0.5, -2.0], ml_dtypes.float8_e4m3fn),
        "flag": jnp.array([True, False]),
    }
    record = to_record(tree)
    back = from_record(record, jax.eval_shape(lambda: tree))
    assert back["key"].dtype == tree["key"].dtype
    np.testing.assert_array_equal(
        jax.random.key_data(back["keys"]), jax.random.key_data(tree["keys"])
    )
    np.testing.assert_array_equal(
        np.asarray(back["half"]).view(np.uint16), np.asarray(tree["half"]).view(np.uint16)
    )
    assert back["f8"].dtype == ml_dtypes.float8_e4m3fn
    # the same draw from the decoded key
    assert jax.random.uniform(back["key"]) == jax.random.uniform(tree["key"])
    # payload bytes: key data (2 x uint32 each) + 3 x 2 + 2 x 1 + 2 x 1
    assert payload_bytes(tree) == 8 + 24 + 6 + 2 + 2


def test_secret_chacha20_keys_round_trip_with_their_implementation():
    """Run keys are 256-bit ChaCha20 keys (8 words): they cross the wire as their key data
    and come back as keys of the same implementation, drawing the same numbers."""
    from tests.reproducible import SECRET

    tree = {"key": SECRET.key(), "keys": jax.random.split(SECRET.key(), 3)}
    back = from_record(to_record(tree), jax.eval_shape(lambda: tree))
    assert jax.random.key_impl(back["key"]) == jax.random.key_impl(tree["key"])
    np.testing.assert_array_equal(
        jax.random.key_data(back["keys"]), jax.random.key_data(tree["keys"])
    )
    assert jax.random.uniform(back["key"]) == jax.random.uniform(tree["key"])
    assert payload_bytes(tree) == 32 + 3 * 32


def test_mismatches_are_rejected_naming_the_field():
    tree = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    good = to_record(tree)
    with pytest.raises(RecordError, match=r"\['w'\].*shape \(3, 2\).*expected \(2, 3\)"):
        from_record(to_record({"w": np.zeros((3, 2), np.float32), "b": tree["b"]}), tree)
    with pytest.raises(RecordError, match=r"\['b'\].*float64.*expected"):
        from_record(to_record({"w": tree["w"], "b": np.zeros(3)}), tree)
    with pytest.raises(RecordError, match=r"missing: \[\"\['b'\]\"\]"):
        from_record(to_record({"w": tree["w"]}), tree)
    with pytest.raises(RecordError, match="unexpected fields"):
        from_record(to_record({**tree, "z": np.zeros(1)}), tree)
    corrupt = to_record(tree)
    corrupt["['w']"].data = b"garbage"
    with pytest.raises(RecordError, match=r"\['w'\].*does not decode"):
        from_record(corrupt, tree)
    assert jax.tree.all(jax.tree.map(np.array_equal, from_record(good, tree), tree))
