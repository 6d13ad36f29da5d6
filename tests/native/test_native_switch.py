"""The switch between the compiled kernels and pure Python (tidewire.native, docs/native.md):
the normal test run must run the kernels (a build that silently fell back fails here), the
``TIDEWIRE_PURE=1`` run must run none, and the public names are the chosen functions."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

from click.testing import CliRunner

from tidewire import native, record
from tidewire.cli import main
from tidewire.protocols.rsio import envelopes, runs
from tidewire.protocols.rsio_http import codec as http_codec
from tidewire.protocols.seguro import codec as seguro_codec

CHOSEN = [
    (runs, "envelope_frames", runs.envelope_frames_py),
    (runs, "envelope_frames_batch", runs.envelope_frames_batch_py),
    (record, "max_timestamp", record.max_timestamp_py),
    (record, "id_range", record.id_range_py),
    (seguro_codec, "many_run", seguro_codec.many_run_py),
    (http_codec, "length_prefixed_envelopes", http_codec.length_prefixed_envelopes_py),
    (http_codec, "decode_length_prefixed", http_codec.decode_length_prefixed_py),
    (envelopes, "envelopes_to_batch", envelopes.envelopes_to_batch_py),
]


def test_the_kernels_run_unless_pure_python_was_asked_for() -> None:
    """``./tw test`` runs the suite once with the kernels (built by ``pip install -e .``) and
    once with ``TIDEWIRE_PURE=1``: in the first, pure Python here means the build failed."""
    asked = os.environ.get("TIDEWIRE_PURE", "") not in ("", "0")
    assert native.PURE_REQUESTED is asked
    assert native.COMPILED is not native.PURE_REQUESTED, native.describe()


def test_public_names_are_the_chosen_functions() -> None:
    for module, name, pure in CHOSEN:
        chosen = getattr(module, name)
        if native.COMPILED:
            assert chosen is not pure, name
            assert type(chosen).__name__ == "cython_function_or_method", name
        else:
            assert chosen is pure, name


def describe_in(env: dict[str, str]) -> str:
    """What a fresh interpreter with ``env`` decides."""
    done = subprocess.run(
        [sys.executable, "-c", "import tidewire.native as n; print(n.COMPILED, n.describe())"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return done.stdout.strip()


def test_tidewire_pure_switches_the_kernels_off() -> None:
    assert describe_in({"TIDEWIRE_PURE": "1"}) == (
        "False native kernels: pure Python (TIDEWIRE_PURE is set)"
    )
    assert describe_in({"TIDEWIRE_PURE": "0"}).startswith("True")


def test_version_says_which_implementation_runs() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert native.describe() in result.output


def test_the_allocator_is_tuned_on_glibc() -> None:
    """``tidewire serve`` raises glibc's mmap and trim thresholds (docs/native.md); elsewhere
    nothing changes and it says so."""
    glibc = platform.libc_ver()[0] == "glibc"
    assert native.tune_allocator() is glibc
