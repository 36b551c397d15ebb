"""The wire form of secure aggregation's residues (swarmjax.privacy.bitpack): ``d`` words of
``b`` bits packed into ``ceil(d b / 8)`` bytes, exactly, and an untrusted packed upload
refused unless it is exactly that (length, dtype, zero padding)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmjax.privacy.bitpack import pack_words, packed_size, unpack_words


def _words(seed: int, d: int, bits: int) -> np.ndarray:
    """``(d,)`` uint32 uniform below ``2^bits``, with the extremes 0 and ``2^bits - 1``."""
    x = np.random.default_rng(seed).integers(0, 2**bits, d, dtype=np.uint64).astype(np.uint32)
    x[: min(d, 2)] = [0, 2**bits - 1][: min(d, 2)]
    return x


def _reference(words: np.ndarray, bits: int) -> bytes:
    """The layout by its definition: word ``i`` at bit ``i bits`` of one little-endian
    integer (Python's arbitrary precision, one word at a time: a slow independent check)."""
    total = 0
    for i, w in enumerate(words.tolist()):
        total |= w << (i * bits)
    return total.to_bytes(packed_size(len(words), bits), "little")


@settings(max_examples=300, deadline=None)
@given(bits=st.integers(1, 32), d=st.integers(0, 97), seed=st.integers(0, 2**32 - 1))
def test_unpack_inverts_pack_and_the_layout_is_the_documented_bit_stream(bits, d, seed):
    x = _words(seed, d, bits)
    packed = pack_words(x, bits)
    assert packed.dtype == np.uint8 and packed.shape == (-(-d * bits // 8),)
    assert packed.tobytes() == _reference(x, bits) and not np.shares_memory(packed, x)
    back = unpack_words(packed, d, bits)
    assert back.dtype == np.uint32 and back.shape == (d,)
    np.testing.assert_array_equal(back, x)


@pytest.mark.parametrize("bits", range(8, 33))  # every bits a DistributedDP plan accepts
@pytest.mark.parametrize("d", [1, 7, 610])
def test_every_plan_bits_round_trips_with_the_documented_layout(bits, d):
    x = _words(bits * d, d, bits)
    packed = pack_words(x, bits)
    assert packed.tobytes() == _reference(x, bits) and packed.size == packed_size(d, bits)
    np.testing.assert_array_equal(unpack_words(packed, d, bits), x)


@pytest.mark.parametrize("bits", [8, 13, 16, 31, 32])
def test_a_model_sized_upload_round_trips_at_the_plans_bits(bits):
    d = 817_872  # the Shakespeare LSTM's parameters
    x = _words(bits, d, bits)
    packed = pack_words(x, bits)
    assert packed.nbytes == packed_size(d, bits) == -(-d * bits // 8)
    np.testing.assert_array_equal(unpack_words(packed, d, bits), x)


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(1, 31), d=st.integers(1, 50), data=st.data())
def test_pack_refuses_a_word_of_b_bits_or_more(bits, d, data):
    x = _words(d, d, bits)
    i = data.draw(st.integers(0, d - 1))
    x[i] = data.draw(st.integers(2**bits, 2**32 - 1))
    with pytest.raises(ValueError, match=rf"words must be < 2\^{bits}; got") as err:
        pack_words(x, bits)
    assert "\n" not in str(err.value)


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(1, 32), d=st.integers(1, 50), data=st.data())
def test_unpack_refuses_every_packed_upload_that_is_not_exactly_d_words(bits, d, data):
    packed = pack_words(_words(d, d, bits), bits)
    size = packed.size
    bad = [
        np.append(packed, np.uint8(0)),  # one byte too many
        packed[:-1],  # one byte short
        packed.view(np.int8),  # the right bytes, another dtype
        packed.reshape(1, size),  # another shape
    ]
    pad = 8 * size - d * bits
    if pad:  # a padding bit set: the bits after the last word must be zero
        forged = packed.copy()
        forged[-1] |= np.uint8(1 << data.draw(st.integers(8 - pad, 7)))
        bad.append(forged)
    for value in bad:
        with pytest.raises(ValueError, match="packed words") as err:
            unpack_words(value, d, bits)
        assert "\n" not in str(err.value)
    np.testing.assert_array_equal(pack_words(unpack_words(packed, d, bits), bits), packed)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: pack_words(np.arange(4, dtype=np.int64), 16), r"\(d,\) uint32 array; got \(4,\)"),
        (lambda: pack_words([1, 2, 3], 16), r"\(d,\) uint32 array"),
        (lambda: pack_words(np.zeros((2, 2), np.uint32), 16), r"\(d,\) uint32 array"),
        (lambda: pack_words(np.zeros(4, np.uint32), 33), r"bits must be an integer in \[1, 32\]"),
        (lambda: pack_words(np.zeros(4, np.uint32), 0), "bits must be"),
        (lambda: unpack_words(bytes(8), 4, 16), r"packed words must be \(8,\) uint8"),
        (lambda: unpack_words(np.zeros(8, np.uint8), -1, 16), r"d must be an integer"),
        (lambda: packed_size(4, True), "bits must be"),
    ],
)
def test_bad_input_is_refused_in_one_line(call, match):
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)
