"""What every fuzz module shares: the corpus, mutation strategies, splits and the settings.

**Inputs.** Each protocol keeps a corpus under ``tests/fuzz/corpus/<protocol>/``: valid
messages and whole conversations (the golden vectors of docs/protocols/*.md and recorded
exchanges, made by ``make_corpus.py``), and every input a fuzzer found a bug with
(``*-crash-*.bin``). :func:`inputs` starts from those entries and mutates them: bit flips,
bytes inserted, deleted or replaced, splices of two entries, truncation, a span duplicated,
an interesting integer (0, 2^31-1, 2^32-1, 2^63-1, 2^64-1, ...) written in the protocol's own
integer encodings (where its length fields are); or it draws plain random bytes.
:func:`chunked` cuts an input at random points (or one byte at a time, or not at all), which is
how the bytes are fed to a receiver.

**Budget.** The settings are a Hypothesis profile chosen by ``TIDEWIRE_FUZZ``:

* ``ci`` (the default): few examples per test, ``derandomize=True`` (the same examples on
  every run, so CI never flakes on a search that got lucky; the corpus and the mutations give
  the breadth), no example database, no deadline (the machine is shared). The whole of
  tests/fuzz runs in about 30 seconds.
* ``long``: ``TIDEWIRE_FUZZ_EXAMPLES`` examples per test and per round, random (a new search
  every round), failures saved in Hypothesis's database so that they replay first; with
  ``TIDEWIRE_FUZZ_SECONDS=<s>`` every test runs rounds (of 500 examples by default, else one
  round of 20,000) until ``s`` seconds have passed. See docs/fuzzing.md.

The settings are applied per test (:func:`fuzz`), never loaded as the global profile, so that
other test files in the same run keep theirs.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = [
    "CORPUS",
    "INTERESTING",
    "Encoder",
    "chunked",
    "corpus",
    "decimal",
    "entries",
    "fuzz",
    "inputs",
    "leb128",
    "long_decimal",
    "mutants",
    "replays",
    "splits",
    "u8",
    "u32be",
    "u64be",
    "zigzag",
]

CORPUS = Path(__file__).parent / "corpus"

# --------------------------------------------------------------------------- the settings

MODE = os.environ.get("TIDEWIRE_FUZZ", "ci")
if MODE not in ("ci", "long"):
    raise RuntimeError(f"TIDEWIRE_FUZZ={MODE!r}: use 'ci' (the default) or 'long'")
SECONDS = float(os.environ.get("TIDEWIRE_FUZZ_SECONDS", "0")) if MODE == "long" else 0.0
# Examples per round in the long mode: the time budget is checked between rounds, so rounds
# are short when there is one.
ROUND = int(os.environ.get("TIDEWIRE_FUZZ_EXAMPLES", "500" if SECONDS else "20000"))

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile(
    "tidewire-fuzz-ci",
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=_HEALTH,
    print_blob=True,
)
settings.register_profile(
    "tidewire-fuzz-long",
    max_examples=ROUND,
    derandomize=False,
    deadline=None,
    suppress_health_check=_HEALTH,
    print_blob=True,
)
PROFILE = settings.get_profile(f"tidewire-fuzz-{MODE}")

F = TypeVar("F", bound=Callable[..., None])


def fuzz(scale: float = 1.0) -> Callable[[F], F]:
    """Apply the profile to a ``@given`` test, with ``scale`` times its examples (a cheap test
    gets more, a costly one fewer). In the long mode with ``TIDEWIRE_FUZZ_SECONDS``, the test
    runs new rounds of its search until that many seconds have passed."""

    def decorate(test: F) -> F:
        examples = max(1, int(PROFILE.max_examples * scale))
        configured = settings(PROFILE, max_examples=examples)(test)
        if not SECONDS:
            return configured

        def rounds(*args: Any, **kwargs: Any) -> None:
            deadline = time.monotonic() + SECONDS
            configured(*args, **kwargs)
            while time.monotonic() < deadline:  # bounded by the budget
                configured(*args, **kwargs)

        rounds.__name__ = test.__name__
        rounds.__qualname__ = test.__qualname__
        rounds.__doc__ = test.__doc__
        rounds.__module__ = test.__module__
        rounds.__signature__ = inspect.signature(configured)  # type: ignore[attr-defined]
        return rounds  # type: ignore[return-value]

    return decorate


# --------------------------------------------------------------------------- the corpus


@functools.cache
def entries(protocol: str, kind: str) -> tuple[tuple[str, bytes], ...]:
    """``(name, bytes)`` of the entries ``corpus/<protocol>/<kind>-*.bin``, in name order
    (crashers included)."""
    files = sorted((CORPUS / protocol).glob(f"{kind}-*.bin"))
    if not files:
        raise FileNotFoundError(f"no corpus entries {kind}-*.bin in {CORPUS / protocol}")
    return tuple((f.stem, f.read_bytes()) for f in files)


def corpus(protocol: str, kind: str) -> tuple[bytes, ...]:
    """The bytes of :func:`entries`."""
    return tuple(data for _, data in entries(protocol, kind))


def replays(protocol: str, kind: str) -> pytest.MarkDecorator:
    """``pytest.mark.parametrize`` over the entries of a kind, as they are: every crasher
    found is replayed, deterministically, on every run."""
    found = entries(protocol, kind)
    return pytest.mark.parametrize("raw", [data for _, data in found],
                                   ids=[name for name, _ in found])  # fmt: skip


def splits(data: bytes) -> list[list[bytes]]:
    """``data`` whole and one byte at a time (no piece at all when it is empty)."""
    if not data:
        return [[]]
    return [[data], [data[i : i + 1] for i in range(len(data))]]


# --------------------------------------------------------------------------- integers

Encoder = Callable[[int], bytes]

INTERESTING = (
    0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x3FFF, 0x4000, 0x7FFF, 0x8000, 0xFFFF, 0x10000,
    2**24, 2**31 - 2, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**63, 2**64 - 1,
)  # fmt: skip


def u8(n: int) -> bytes:
    return bytes([n & 0xFF])


def u32be(n: int) -> bytes:
    return (n & 0xFFFFFFFF).to_bytes(4, "big")


def u64be(n: int) -> bytes:
    return (n & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")


def leb128(n: int) -> bytes:
    """Unsigned LEB128 (protobuf's varint), for any n >= 0 (past 2^64 too: invalid input)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag(n: int) -> bytes:
    """Avro's zig-zag varint of ``n`` as a 64-bit value (past 32 bits too: invalid input)."""
    return leb128(((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF)


def decimal(n: int) -> bytes:
    return str(n).encode()


def long_decimal(n: int) -> bytes:
    """A run of 4290 to 4319 digits, either side of the 4300 that Python's ``int()`` takes at
    most (a decimal field's own interesting length, as 2^31-1 is a binary one's)."""
    return b"9" * (4290 + n % 30)


# --------------------------------------------------------------------------- mutations


def _position(draw: st.DrawFn, data: bytearray, *, end: bool = False) -> int:
    top = len(data) if end else max(0, len(data) - 1)
    return draw(st.integers(0, top))


@st.composite
def mutants(
    draw: st.DrawFn,
    seeds: Sequence[bytes],
    encoders: Sequence[Encoder],
    *,
    max_mutations: int = 4,
    max_size: int = 1 << 16,
) -> bytes:
    """A corpus entry with up to ``max_mutations`` mutations applied one after the other."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, max_mutations))):
        kind = draw(st.sampled_from(_MUTATIONS))
        kind(draw, data, seeds, encoders)
        if len(data) > max_size:
            del data[max_size:]
    return bytes(data)


def _flip(
    draw: st.DrawFn, data: bytearray, seeds: Sequence[bytes], enc: Sequence[Encoder]
) -> None:
    if data:
        data[_position(draw, data)] ^= 1 << draw(st.integers(0, 7))


def _insert(
    draw: st.DrawFn, data: bytearray, seeds: Sequence[bytes], enc: Sequence[Encoder]
) -> None:
    at = _position(draw, data, end=True)
    data[at:at] = draw(st.binary(min_size=1, max_size=8))


def _delete(
    draw: st.DrawFn, data: bytearray, seeds: Sequence[bytes], enc: Sequence[Encoder]
) -> None:
    if data:
        at = _position(draw, data)
        del data[at : at + draw(st.integers(1, 16))]


def _replace(
    draw: st.DrawFn, data: bytearray, seeds: Sequence[bytes], enc: Sequence[Encoder]
) -> None:
    if data:
        data[_position(draw, data)] = draw(
            st.sampled_from((0x00, 0x01, 0x0A, 0x20, 0x7F, 0x80, 0xFF)) | st.integers(0, 255)
        )


def _splice(
    draw: st.DrawFn, data: bytearray, seeds: Sequence[bytes], enc: Sequence[Encoder]
) -> None:
    other = draw(st.sampled_from(seeds))
    cut = _position(draw, data, end=True)
    start = draw(st.integers(0, len(other)))
    data[cut:] = other[start:]


def _truncate(
    draw: st.DrawFn, data: bytearray, seeds: Sequence[bytes], enc: Sequence[Encoder]
) -> None:
    del data[_position(draw, data, end=True) :]


def _duplicate(
    draw: st.DrawFn, data: bytearray, seeds: Sequence[bytes], enc: Sequence[Encoder]
) -> None:
    if data:
        a = _position(draw, data)
        b = draw(st.integers(a + 1, len(data)))
        data[b:b] = data[a:b] * draw(st.integers(1, 3))


def _integer(
    draw: st.DrawFn, data: bytearray, seeds: Sequence[bytes], enc: Sequence[Encoder]
) -> None:
    """An interesting integer in one of the protocol's encodings, over the bytes at a random
    place (as long as the encoding: a length field replaced) or inserted there."""
    value = draw(st.sampled_from(INTERESTING) | st.integers(0, 2**64 - 1))
    raw = draw(st.sampled_from(enc))(value)
    at = _position(draw, data, end=True)
    if draw(st.booleans()):
        data[at : at + len(raw)] = raw
    else:
        data[at:at] = raw


_MUTATIONS = (_flip, _insert, _delete, _replace, _splice, _truncate, _duplicate, _integer)


def inputs(
    seeds: Sequence[bytes], encoders: Sequence[Encoder], *, random_size: int = 256
) -> st.SearchStrategy[bytes]:
    """A corpus entry as it is, a mutant of one, or random bytes."""
    return st.one_of(
        st.sampled_from(seeds),
        mutants(seeds, encoders),
        mutants(seeds, encoders),  # (twice as likely: the mutants find the most)
        st.binary(max_size=random_size),
    )


@st.composite
def chunked(draw: st.DrawFn, data: bytes, *, max_chunks: int = 64) -> list[bytes]:
    """``data`` cut into pieces: whole, one byte at a time, or at random points. Never an
    empty piece (``b""`` means end of stream to a receiver): no piece for no data."""
    if not data:
        return []
    mode = draw(st.sampled_from(("whole", "bytes", "random", "random")))
    if mode == "whole" or len(data) < 2:
        return [data]
    if mode == "bytes":
        return [data[i : i + 1] for i in range(len(data))]
    cuts = draw(st.lists(st.integers(1, len(data) - 1), max_size=max_chunks, unique=True))
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]
