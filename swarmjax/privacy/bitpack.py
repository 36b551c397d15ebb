"""Exact packing of ``b``-bit words into bytes: the wire form of secure aggregation's residues.

A masked upload is ``d`` residues modulo ``2^b`` (``8 <= b <= 32`` in a
:class:`~swarmjax.privacy.distributed.DistributedDP` plan), computed as ``(d,)`` uint32
words. On the wire they take ``ceil(d b / 8)`` bytes instead of ``4 d``: the bytes are read
as one little-endian bit stream (bit ``k`` of the stream is bit ``k % 8`` of byte
``k // 8``) and word ``i`` is bits ``[i b, (i + 1) b)`` of it, least significant bit
first. The ``8 ceil(d b / 8) - d b`` bits after the last word (0 to 7, the high bits of the
last byte: the padding) are zero.

:func:`pack_words` and :func:`unpack_words` are exact inverses on words ``< 2^b``; both
refuse anything else in one line (:func:`unpack_words` is what a server runs on an
untrusted upload: exact dtype, shape and length, zero padding). Both are vectorised: when
``b`` is a multiple of 8 each word keeps its low ``b / 8`` little-endian bytes; otherwise
numpy's bit (un)packing, which holds ``32 d`` bytes of bits for a moment.
"""

from __future__ import annotations

import numpy as np

from swarmjax._validation import check_int

__all__ = ["pack_words", "packed_size", "unpack_words"]


def packed_size(d: int, bits: int) -> int:
    """Bytes of ``d`` packed words of ``bits`` bits: ``ceil(d bits / 8)``."""
    d = check_int("d", d, 0, 2**32 - 1)
    bits = check_int("bits", bits, 1, 32)
    return (d * bits + 7) // 8


def pack_words(words: np.ndarray, bits: int) -> np.ndarray:
    """``(ceil(d bits / 8),)`` uint8: the ``(d,)`` uint32 ``words``, each ``< 2^bits``,
    packed ``bits`` bits a word (module docs); one-line ``ValueError`` for another shape or
    dtype or a word ``>= 2^bits``."""
    bits = check_int("bits", bits, 1, 32)
    if not isinstance(words, np.ndarray) or words.dtype != np.uint32 or words.ndim != 1:
        got = f"{words.shape} {words.dtype}" if isinstance(words, np.ndarray) else type(words)
        raise ValueError(f"words must be a (d,) uint32 array; got {got}")
    if bits < 32 and words.size and int(words.max()) >> bits:
        raise ValueError(f"words must be < 2^{bits}; got {int(words.max())}")
    le = words.astype("<u4").view(np.uint8).reshape(-1, 4)  # (d, 4): low byte first
    if bits % 8 == 0:
        return le[:, : bits // 8].copy().reshape(-1)  # a copy even at 32 bits
    planes = np.unpackbits(le, axis=1, bitorder="little")  # (d, 32): low bit first
    return np.packbits(planes[:, :bits].reshape(-1), bitorder="little")  # zero padding


def unpack_words(packed: np.ndarray, d: int, bits: int) -> np.ndarray:
    """``(d,)`` uint32, each ``< 2^bits``: the words :func:`pack_words` packed into
    ``packed``; one-line ``ValueError`` unless ``packed`` is a ``(ceil(d bits / 8),)``
    uint8 array whose padding bits are zero."""
    size = packed_size(d, bits)
    if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8 or packed.shape != (size,):
        got = f"{packed.shape} {packed.dtype}" if isinstance(packed, np.ndarray) else type(packed)
        raise ValueError(
            f"packed words must be ({size},) uint8 for {d} words of {bits} bits; got {got}"
        )
    if bits % 8 == 0:
        le = np.zeros((d, 4), np.uint8)
        le[:, : bits // 8] = packed.reshape(d, bits // 8)
    else:
        stream = np.unpackbits(packed, bitorder="little")
        if stream[d * bits :].any():
            raise ValueError(f"packed words have padding bits set (after bit {d * bits})")
        planes = np.zeros((d, 32), np.uint8)
        planes[:, :bits] = stream[: d * bits].reshape(d, bits)
        le = np.packbits(planes, axis=1, bitorder="little")  # (d, 4)
    return le.view("<u4").reshape(d).astype(np.uint32)
