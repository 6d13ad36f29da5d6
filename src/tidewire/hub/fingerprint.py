"""A transaction's content fingerprint (:mod:`.txn`), computed a batch at a time.

:func:`fingerprint` is the CRC-32C of what makes a transaction's content, as the ledger's
intents record it: the values' lengths (u32 each), the values, and, when some event has a key,
the key flags (u8 each), the keys' lengths (u32 each) and the keys; timestamps are left out (a
replay may stamp them anew), and so are the ids (the log assigns them). That is the CRC of one
concatenation, ``lengths || values [|| flags || key lengths || keys]``, over *all* the events.

:class:`Fingerprint` computes the same a batch at a time, whatever the split: each of the five
columns keeps a running CRC (CRC-32C continues over a concatenation: ``crc(b, crc(a)) ==
crc(a + b)``), and :meth:`Fingerprint.value` joins the five with :func:`crc32c_combine`. A
transaction too big to hold (a staged commit of many records, :mod:`.staging`) is fingerprinted
as it streams past, and so is what the log holds when an intent is settled, with nothing but
one read's batches in memory.

:func:`crc32c_combine` is zlib's ``crc32_combine`` (the "multiply by x^(8n) mod P" form of
zlib 1.2.12) for the CRC-32C polynomial: the ``crc32c`` package has no combine. Hand-written:
about thirty lines of arithmetic, run five times per transaction; a test checks it against
the package on random splits.
"""

from __future__ import annotations

from array import array

from crc32c import crc32c

from ..model import Batch

__all__ = ["Fingerprint", "crc32c_combine", "fingerprint"]

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_X0 = 1 << 31  # the polynomial 1, reflected


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo the CRC's polynomial (reflected bit order)."""
    m, p = _X0, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> list[int]:
    out, p = [], _X0 >> 1  # x^1
    for _ in range(32):
        out.append(p)
        p = _multmodp(p, p)
    return out


_X2N = _powers()  # x^(2^k) mod P


def _x8nmodp(n: int) -> int:
    """x^(8n) mod P: the shift that appending ``n`` bytes applies to a CRC."""
    p, k = _X0, 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32C of ``a + b`` from ``crc1 = crc32c(a)``, ``crc2 = crc32c(b)`` and ``len(b)``."""
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2


def _lengths(offsets: array[int] | memoryview, n: int) -> bytes:
    return array("I", [offsets[i + 1] - offsets[i] for i in range(n)]).tobytes()


def fingerprint(batch: Batch) -> int:
    """CRC-32C of what makes a transaction's content: values and their lengths, keys."""
    offsets = batch.value_offsets
    fp = crc32c(_lengths(offsets, len(batch)))
    fp = crc32c(batch.values, fp)
    flags = batch.key_flags
    # (key columns whose flags are all 0 mean "no key" as much as no key columns do: a batch
    # read back from a record shared with keyed events has them)
    if flags is not None and flags.tobytes().strip(b"\0") and batch.keys is not None and (
        batch.key_offsets is not None
    ):
        fp = crc32c(flags, fp)
        fp = crc32c(_lengths(batch.key_offsets, len(batch)), fp)
        fp = crc32c(batch.keys, fp)
    return fp


class Fingerprint:
    """:func:`fingerprint` of the events of the batches :meth:`add`-ed, in order, as if they
    were one batch (see the module docstring); :attr:`count` events so far."""

    def __init__(self) -> None:
        self.count = 0
        self._crc = [0, 0, 0, 0, 0]  # lengths, values, flags, key lengths, keys
        self._size = [0, 0, 0, 0, 0]
        self._keyed = False

    def add(self, batch: Batch) -> None:
        n = len(batch)
        if not n:
            return
        crc, size = self._crc, self._size
        lengths = _lengths(batch.value_offsets, n)
        values = batch.values
        crc[0], size[0] = crc32c(lengths, crc[0]), size[0] + len(lengths)
        crc[1], size[1] = crc32c(values, crc[1]), size[1] + memoryview(values).nbytes
        flags, keys, key_offsets = batch.key_flags, batch.keys, batch.key_offsets
        if flags is not None and keys is not None and key_offsets is not None:
            flag_bytes = flags.tobytes()
            self._keyed = self._keyed or bool(flag_bytes.strip(b"\0"))
            key_lengths = _lengths(key_offsets, n)
            key_bytes = memoryview(keys).cast("B")
        else:  # (no key columns: "no key" each, as a merged batch would have them)
            flag_bytes, key_lengths, key_bytes = bytes(n), bytes(4 * n), memoryview(b"")
        crc[2], size[2] = crc32c(flag_bytes, crc[2]), size[2] + len(flag_bytes)
        crc[3], size[3] = crc32c(key_lengths, crc[3]), size[3] + len(key_lengths)
        crc[4], size[4] = crc32c(key_bytes, crc[4]), size[4] + key_bytes.nbytes
        self.count += n

    def value(self) -> int:
        """The fingerprint of everything added (that of no event: ``crc32c(b"")``, 0)."""
        crc, size = self._crc, self._size
        fp = crc32c_combine(crc[0], crc[1], size[1])
        if self._keyed:
            for i in (2, 3, 4):
                fp = crc32c_combine(fp, crc[i], size[i])
        return fp
