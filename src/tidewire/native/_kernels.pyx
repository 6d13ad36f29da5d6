# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""tidewire's compiled kernels: C loops over a batch's buffers (see docs/native.md).

Each function here has a pure-Python twin that is its specification (named in its docstring);
``tidewire.native`` decides at import which of the two the package uses, and
the tests in tests/native feed both the same inputs and compare the results byte for byte. A kernel must never accept what its twin refuses, nor the other way round.

Conventions: ``Batch`` buffers arrive as the model's memoryviews (ids ``Q``, timestamps ``q``,
offsets ``I``, bytes ``B``, C-contiguous, checked by ``Batch``); outputs are new ``bytes``
sized exactly in a first pass, so no buffer grows and none outlives the call but the result.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy

from tidewire.model import (
    Batch,
    InvalidBatch,
    RemoteProtocolError,
    TidewireError,
    check_ids,
    validate_stream_name,
)

cdef uint64_t MAX_ID = (<uint64_t>1 << 63) - 1  # (model.MAX_ID)
cdef uint64_t U64_MAX = ~(<uint64_t>0)

# ---------------------------------------------------------------------------------- varints

cdef inline int vsize(uint64_t v) noexcept nogil:
    cdef int n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline char* vput(char* p, uint64_t v) noexcept nogil:
    while v >= 0x80:
        p[0] = <char>((v & 0x7F) | 0x80)
        p += 1
        v >>= 7
    p[0] = <char>v
    return p + 1


cdef inline Py_ssize_t vget(const uint8_t* b, Py_ssize_t p, Py_ssize_t end,
                            uint64_t* out) noexcept nogil:
    """RS.io's varint at ``b[p:end]`` (``varint.pull_varint``): where it ends, or -1 when it is
    cut short by ``end``, longer than 10 bytes or exceeds 64 bits (the pure code's NeedData,
    RemoteProtocolError and ValueError, which every caller here treats alike)."""
    cdef uint64_t result = 0
    cdef uint8_t byte
    cdef int i
    for i in range(10):
        if p + i >= end:
            return -1
        byte = b[p + i]
        result |= (<uint64_t>(byte & 0x7F)) << (7 * i)
        if not byte & 0x80:
            if i == 9 and byte > 1:
                return -1
            out[0] = result
            return p + i + 1
    return -1


cdef inline uint64_t zigzag(int64_t ts) noexcept nogil:
    # (the arithmetic shift of a negative int64 is what gcc and clang do; see docs/native.md)
    return (<uint64_t>ts << 1) ^ <uint64_t>(ts >> 63)


# -------------------------------------------------------------------- RS.io: envelope frames

cdef struct Columns:
    const uint64_t* ids
    const int64_t* stamps
    const uint32_t* offs
    const uint8_t* vals
    const uint8_t* kflags  # NULL: no keys
    const uint32_t* koffs
    const uint8_t* keys
    Py_ssize_t n


cdef class BatchView:
    """The typed views of one batch's buffers, held while a kernel reads them (the buffers
    stay alive and unmoved as long as this object does)."""
    cdef const uint64_t[::1] ids
    cdef const int64_t[::1] stamps
    cdef const uint32_t[::1] offs
    cdef const uint8_t[::1] vals
    cdef const uint8_t[::1] kflags
    cdef const uint32_t[::1] koffs
    cdef const uint8_t[::1] keys
    cdef Columns c

    def __cinit__(self, batch):
        self.ids = batch.ids
        self.stamps = batch.timestamps
        self.offs = batch.value_offsets
        self.vals = batch.values
        self.c.n = self.ids.shape[0]
        self.c.ids = &self.ids[0]
        self.c.stamps = &self.stamps[0]
        self.c.offs = &self.offs[0]
        self.c.vals = &self.vals[0] if self.vals.shape[0] else NULL
        self.c.kflags = NULL
        self.c.koffs = NULL
        self.c.keys = NULL
        if batch.key_flags is not None:
            self.kflags = batch.key_flags
            self.koffs = batch.key_offsets
            self.keys = batch.keys
            self.c.kflags = &self.kflags[0]
            self.c.koffs = &self.koffs[0]
            self.c.keys = &self.keys[0] if self.keys.shape[0] else NULL


cdef inline Py_ssize_t envelope_size(const Columns* c, Py_ssize_t i) noexcept nogil:
    """The bytes of event ``i``'s envelope: id, zig-zag timestamp, key (or 0), value."""
    cdef Py_ssize_t body = (vsize(c.ids[i]) + vsize(zigzag(c.stamps[i]))
                            + (c.offs[i + 1] - c.offs[i]))
    cdef Py_ssize_t klen
    if c.kflags != NULL and c.kflags[i]:
        klen = c.koffs[i + 1] - c.koffs[i]
        return body + vsize(klen + 1) + klen
    return body + 1


cdef inline char* put_envelope(const Columns* c, Py_ssize_t i, char* p) noexcept nogil:
    """Write event ``i``'s envelope at ``p`` (``envelopes.encode_envelopes``'s bytes)."""
    cdef Py_ssize_t klen, vlen = c.offs[i + 1] - c.offs[i]
    p = vput(vput(p, c.ids[i]), zigzag(c.stamps[i]))
    if c.kflags != NULL and c.kflags[i]:
        klen = c.koffs[i + 1] - c.koffs[i]
        p = vput(p, klen + 1)
        if klen:
            memcpy(p, c.keys + (c.koffs[i] - c.koffs[0]), klen)
        p += klen
    else:
        p[0] = 0
        p += 1
    if vlen:
        memcpy(p, c.vals + (c.offs[i] - c.offs[0]), vlen)
    return p + vlen


def envelope_frames(subscriber, batch):
    """``protocols.rsio.runs.envelope_frames_py``: the ``onNext`` frames carrying ``batch``'s
    envelopes to ``subscriber``. Two C passes: sizes, then varints and memcpy into one
    ``bytes`` (the second without the GIL: the batch's buffers are held by the views)."""
    if not 0 <= subscriber <= U64_MAX:  # (push_varint's refusal, not an OverflowError)
        raise ValueError(f"varint {subscriber} is outside 0..2**64-1")
    cdef uint64_t sub = subscriber
    cdef BatchView view = BatchView(batch)
    cdef const Columns* c = &view.c
    cdef Py_ssize_t i, size, total = 0
    cdef int psize = 1 + vsize(sub)
    for i in range(c.n):  # pass 1: sizes
        size = envelope_size(c, i)
        total += psize + vsize(size) + size
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* p = PyBytes_AS_STRING(out)
    with nogil:
        for i in range(c.n):  # pass 2: bytes
            p[0] = 7  # onNext
            p = put_envelope(c, i, vput(vput(p + 1, sub), envelope_size(c, i)))
    return out


def length_prefixed_envelopes(batch):
    """``protocols.rsio_http.codec.length_prefixed_envelopes_py``: ``batch``'s envelopes,
    each after its length as a big-endian u32 (RS.io over HTTP's length-prefixed body)."""
    cdef BatchView view = BatchView(batch)
    cdef const Columns* c = &view.c
    cdef Py_ssize_t i, size, total = 0
    for i in range(c.n):
        size = envelope_size(c, i)
        if size > 0xFFFFFFFF:
            raise ValueError("an envelope over 4 GiB has no u32 length")
        total += 4 + size
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* p = PyBytes_AS_STRING(out)
    with nogil:
        for i in range(c.n):
            size = envelope_size(c, i)
            p[0] = <char>(size >> 24)
            p[1] = <char>(size >> 16)
            p[2] = <char>(size >> 8)
            p[3] = <char>size
            p = put_envelope(c, i, p + 4)
    return out


# ----------------------------------------------------------------- RS.io: frame runs decoded

cdef struct Frame:
    uint64_t event_id
    int64_t ts
    Py_ssize_t vstart
    Py_ssize_t vlen
    Py_ssize_t kstart
    Py_ssize_t klen  # -1: no key


cdef Py_ssize_t parse_frames(const uint8_t* b, Py_ssize_t pos, Py_ssize_t end_buf,
                             const uint8_t* prefix, Py_ssize_t plen, Py_ssize_t max_count,
                             uint64_t limit, bint offer, Frame** frames_out,
                             Py_ssize_t* end_out) except -1:
    """The frames of ``runs._envelope_frames_to_batch`` (its loop, without its fast paths,
    which give what the full parse gives): stored in ``frames_out[0]`` (PyMem, grown by
    doubling; the caller frees it), their count returned and where they end in ``end_out``."""
    cdef Frame* frames = NULL
    cdef Frame* grown
    cdef Py_ssize_t cap = 0, count = 0, p, q, end
    cdef uint64_t size, event_id, raw, key_len
    cdef bint ids_given = True
    while count < max_count:
        if plen > end_buf - pos or memcmp(b + pos, prefix, plen) != 0:
            break
        p = pos + plen
        if p + 2 > end_buf:
            break
        p = vget(b, p, end_buf, &size)
        if p < 0 or size > limit or size > <uint64_t>(end_buf - p):
            break
        end = p + <Py_ssize_t>size
        q = vget(b, p, end, &event_id)  # (a varint running past the element breaks, as
        if q < 0:                        # the pure code's "q >= end" check does)
            break
        q = vget(b, q, end, &raw)
        if q < 0 or q >= end:
            break
        if event_id == 0 and not offer:
            break
        if count and (event_id == 0) != (not ids_given):  # ids given, then not, or back
            break
        if count == 0:
            ids_given = event_id != 0
        if count == cap:
            cap = cap * 2 if cap else 64
            grown = <Frame*>PyMem_Realloc(frames, cap * sizeof(Frame))
            if grown == NULL:
                PyMem_Free(frames)
                raise MemoryError()
            frames = grown
        frames[count].klen = -1
        if b[q] == 0:
            q += 1
        else:
            q = vget(b, q, end, &key_len)
            if q < 0:
                break
            if key_len:  # (a padded varint 0 is "no key" too)
                if key_len - 1 > <uint64_t>(end - q):
                    break
                frames[count].kstart = q
                frames[count].klen = <Py_ssize_t>(key_len - 1)
                q += <Py_ssize_t>(key_len - 1)
        frames[count].event_id = event_id
        frames[count].ts = <int64_t>((raw >> 1) ^ (0 - (raw & 1)))
        frames[count].vstart = q
        frames[count].vlen = end - q
        count += 1
        pos = end
    frames_out[0] = frames
    end_out[0] = pos
    return count


def envelope_frames_batch(stream, const uint8_t[::1] buf, Py_ssize_t pos, bytes prefix,
                          Py_ssize_t max_count, limit, bint offer):
    """``protocols.rsio.runs.envelope_frames_batch_py``: up to ``max_count`` complete frames
    ``prefix | length | envelope`` at ``buf[pos:]`` as ``(batch, end, count)``, or
    ``(None, pos, 0)``. One C pass finds the frames (stopping where the pure loop stops), a
    second copies their columns into the batch's buffers; the ids are checked and the batch
    built as ``columns_to_batch`` does."""
    cdef Py_ssize_t end_buf = buf.shape[0]
    cdef Frame* frames = NULL
    cdef Py_ssize_t count, end, i, vtotal = 0, ktotal = 0
    cdef bint keyed = False
    cdef const uint8_t* b = &buf[0] if end_buf else NULL
    cdef uint64_t lim = limit if limit > 0 else 0
    if pos < 0 or pos > end_buf:
        raise ValueError("pos is outside the buffer")
    count = parse_frames(b, pos, end_buf, <const uint8_t*>PyBytes_AS_STRING(prefix),
                         len(prefix), max_count, lim, offer, &frames, &end)
    try:
        for i in range(count):
            vtotal += frames[i].vlen
            if frames[i].klen >= 0:
                keyed = True
                ktotal += frames[i].klen
        if not count or vtotal >= 2**32 or ktotal >= 2**32:  # ("I" offsets would overflow)
            return None, pos, 0
        ids = PyBytes_FromStringAndSize(NULL, 8 * count)
        stamps = PyBytes_FromStringAndSize(NULL, 8 * count)
        voffs = PyBytes_FromStringAndSize(NULL, 4 * (count + 1))
        values = PyBytes_FromStringAndSize(NULL, vtotal)
        fill_columns(frames, count, b, <uint64_t*>PyBytes_AS_STRING(ids),
                     <int64_t*>PyBytes_AS_STRING(stamps), <uint32_t*>PyBytes_AS_STRING(voffs),
                     PyBytes_AS_STRING(values))
        flags = koffs = keys = None
        if keyed:
            flags = PyBytes_FromStringAndSize(NULL, count)
            koffs = PyBytes_FromStringAndSize(NULL, 4 * (count + 1))
            keys = PyBytes_FromStringAndSize(NULL, ktotal)
            fill_keys(frames, count, b, <uint8_t*>PyBytes_AS_STRING(flags),
                      <uint32_t*>PyBytes_AS_STRING(koffs), PyBytes_AS_STRING(keys))
    finally:
        PyMem_Free(frames)
    if frames_ids_bad(<const uint64_t*>PyBytes_AS_STRING(ids), count):
        return None, pos, 0  # (check_ids's InvalidBatch: decoded frame by frame instead)
    try:
        batch = Batch(
            validate_stream_name(stream),
            memoryview(ids).cast("Q"),
            memoryview(stamps).cast("q"),
            memoryview(voffs).cast("I"),
            memoryview(values),
            memoryview(flags) if keyed else None,
            memoryview(koffs).cast("I") if keyed else None,
            memoryview(keys) if keyed else None,
        )
    except (ValueError, TidewireError):
        return None, pos, 0  # decoded frame by frame instead, where it is reported
    return batch, end, count


cdef bint frames_ids_bad(const uint64_t* ids, Py_ssize_t count) noexcept nogil:
    """What ``model.check_ids`` refuses (ids outside 1..2**63-1, or not strictly increasing),
    for a run whose first id is not 0 (ids 0: an offer's "the hub assigns them", all or none,
    which the parse already made sure of)."""
    cdef Py_ssize_t i
    if ids[0] == 0:
        return False
    if ids[count - 1] > MAX_ID:
        return True
    for i in range(1, count):
        if ids[i] <= ids[i - 1]:
            return True
    return False


cdef void fill_columns(const Frame* frames, Py_ssize_t count, const uint8_t* b, uint64_t* ids,
                       int64_t* stamps, uint32_t* voffs, char* values) noexcept nogil:
    cdef Py_ssize_t i, at = 0
    voffs[0] = 0
    for i in range(count):
        ids[i] = frames[i].event_id
        stamps[i] = frames[i].ts
        if frames[i].vlen:
            memcpy(values + at, b + frames[i].vstart, frames[i].vlen)
        at += frames[i].vlen
        voffs[i + 1] = <uint32_t>at


cdef void fill_keys(const Frame* frames, Py_ssize_t count, const uint8_t* b, uint8_t* flags,
                    uint32_t* koffs, char* keys) noexcept nogil:
    cdef Py_ssize_t i, at = 0
    koffs[0] = 0
    for i in range(count):
        flags[i] = frames[i].klen >= 0
        if frames[i].klen > 0:
            memcpy(keys + at, b + frames[i].kstart, frames[i].klen)
            at += frames[i].klen
        koffs[i + 1] = <uint32_t>at


# ------------------------------------------------------------------------------- the record

def max_timestamp(const int64_t[::1] stamps):
    """``max(stamps)`` (``record.max_timestamp_py``); ``ValueError`` when empty."""
    cdef Py_ssize_t i, n = stamps.shape[0]
    if not n:
        raise ValueError("max() of no timestamps")
    cdef int64_t best = stamps[0]
    for i in range(1, n):
        if stamps[i] > best:
            best = stamps[i]
    return best


def id_range(uint64_t first, Py_ssize_t n):
    """The u64 ids ``first .. first + n - 1`` as ``bytes`` (``record.id_range_py``)."""
    if n < 0:
        raise ValueError("a negative count of ids")
    out = PyBytes_FromStringAndSize(NULL, 8 * n)
    cdef uint64_t* p = <uint64_t*>PyBytes_AS_STRING(out)
    cdef Py_ssize_t i
    for i in range(n):
        p[i] = first + <uint64_t>i
    return out


include "_seguro.pxi"  # Seguro's SAVE MANY events (a file of its own: this one stays short)
include "_tube.pxi"  # Tube: a message of several fragments put together in one buffer
include "_tolliver.pxi"  # Tolliver's runs of message and ack frames (protocols/tolliver/runs.py)
include "_log.pxi"  # the log's commit groups: a run of small batches into one record
include "_arrow_group.pxi"  # Spark: a group of batches as Arrow columns (spark.arrow)


# ------------------------------------------------------- RS.io: envelope elements, decoded

cdef int parse_envelope(const uint8_t* e, Py_ssize_t size, Frame* f) noexcept nogil:
    """Envelope ``e[:size]`` into ``f`` (``envelopes.envelopes_to_batch``'s full parse, offsets
    relative to ``e``): 0, or why not: 1 cut short, 2 a varint cut short or too long, 3 the
    key runs past the element (the pure code's three messages)."""
    cdef Py_ssize_t pos
    cdef uint64_t raw, key_len
    if size < 1:
        return 1
    pos = vget(e, 0, size, &f.event_id)
    if pos < 0:
        return 2
    pos = vget(e, pos, size, &raw)
    if pos < 0:
        return 2
    f.ts = <int64_t>((raw >> 1) ^ (0 - (raw & 1)))
    if pos >= size:
        return 1
    f.klen = -1
    if e[pos] == 0:
        pos += 1
    else:
        pos = vget(e, pos, size, &key_len)
        if pos < 0:
            return 2
        if key_len:  # (a padded varint 0 is "no key" too)
            if key_len - 1 > <uint64_t>(size - pos):
                return 3
            f.kstart = pos
            f.klen = <Py_ssize_t>(key_len - 1)
            pos += f.klen
    f.vstart = pos
    f.vlen = size - pos
    return 0


_ENVELOPE_ERRORS = (None, "bad envelope: cut short",
                    "bad envelope: a varint is cut short or too long",
                    "bad envelope: the key runs past the element")


def envelopes_to_batch(stream, list elements):
    """``protocols.rsio.envelopes.envelopes_to_batch_py``: the batch of the envelope
    ``elements`` (``bytes`` each, or any buffer), parsed in C into the batch's columns; the
    same errors (``ValueError`` for a malformed envelope or none at all, ``InvalidBatch`` for
    ids out of order or given by some and not others, ``InvalidStreamName``)."""
    cdef Py_ssize_t n = len(elements), i, size, vtotal = 0, ktotal = 0, at = 0, kat = 0
    cdef Frame* frames = NULL
    cdef const uint8_t* e
    cdef const uint8_t[::1] view
    cdef int why
    cdef bint keyed = False, mixed = False
    if not n:
        raise ValueError("no envelopes")
    frames = <Frame*>PyMem_Malloc(n * sizeof(Frame))
    if frames == NULL:
        raise MemoryError()
    try:
        for i in range(n):  # pass 1: parse, sizes
            element = elements[i]
            if type(element) is bytes:
                e = <const uint8_t*>PyBytes_AS_STRING(element)
                size = PyBytes_GET_SIZE(element)
            else:
                view = element
                e = &view[0] if view.shape[0] else NULL
                size = view.shape[0]
            why = parse_envelope(e, size, &frames[i])
            if why:
                raise ValueError(_ENVELOPE_ERRORS[why])
            vtotal += frames[i].vlen
            if frames[i].klen >= 0:
                keyed = True
                ktotal += frames[i].klen
        ids = PyBytes_FromStringAndSize(NULL, 8 * n)
        stamps = PyBytes_FromStringAndSize(NULL, 8 * n)
        voffs = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
        values = PyBytes_FromStringAndSize(NULL, vtotal)
        flags = koffs = keys = None
        if keyed:
            flags = PyBytes_FromStringAndSize(NULL, n)
            koffs = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
            keys = PyBytes_FromStringAndSize(NULL, ktotal)
        (<uint32_t*>PyBytes_AS_STRING(voffs))[0] = 0
        if keyed:
            (<uint32_t*>PyBytes_AS_STRING(koffs))[0] = 0
        for i in range(n):  # pass 2: columns (the elements are still held by the list)
            element = elements[i]
            if type(element) is bytes:
                e = <const uint8_t*>PyBytes_AS_STRING(element)
            else:
                view = element
                e = &view[0] if view.shape[0] else NULL
            (<uint64_t*>PyBytes_AS_STRING(ids))[i] = frames[i].event_id
            (<int64_t*>PyBytes_AS_STRING(stamps))[i] = frames[i].ts
            if frames[i].vlen:
                memcpy(PyBytes_AS_STRING(values) + at, e + frames[i].vstart, frames[i].vlen)
            at += frames[i].vlen
            (<uint32_t*>PyBytes_AS_STRING(voffs))[i + 1] = <uint32_t>at
            if keyed:
                (<uint8_t*>PyBytes_AS_STRING(flags))[i] = frames[i].klen >= 0
                if frames[i].klen > 0:
                    memcpy(PyBytes_AS_STRING(keys) + kat, e + frames[i].kstart, frames[i].klen)
                    kat += frames[i].klen
                (<uint32_t*>PyBytes_AS_STRING(koffs))[i + 1] = <uint32_t>kat
            if (frames[i].event_id == 0) != (frames[0].event_id == 0):
                mixed = True
    finally:
        PyMem_Free(frames)
    id_view = memoryview(ids).cast("Q")
    if frames_ids_bad(<const uint64_t*>PyBytes_AS_STRING(ids), n):
        check_ids(id_view)  # (raises the model's own InvalidBatch, with its message)
    elif mixed:
        raise InvalidBatch("envelopes either all carry ids or all leave them to the hub")
    return Batch(
        validate_stream_name(stream),
        id_view,
        memoryview(stamps).cast("q"),
        memoryview(voffs).cast("I"),
        memoryview(values),
        memoryview(flags) if keyed else None,
        memoryview(koffs).cast("I") if keyed else None,
        memoryview(keys) if keyed else None,
    )


# ------------------------------------------------------- RS.io over HTTP: length-prefixed body

def decode_length_prefixed(const uint8_t[::1] body, max_elements=2**32):
    """``protocols.rsio_http.codec.decode_length_prefixed_py``: the elements of a
    length-prefixed body (each after its big-endian u32 length), one ``bytes`` each; the same
    ``RemoteProtocolError``s for a body cut inside a length or an element, or with more than
    ``max_elements``."""
    cdef Py_ssize_t pos = 0, end = body.shape[0], count = 0
    cdef Py_ssize_t limit = max_elements if max_elements < 2**62 else 2**62
    cdef const uint8_t* b = &body[0] if end else NULL
    cdef uint64_t size
    cdef list out = []
    while pos < end:
        if end - pos < 4:
            raise RemoteProtocolError("a length-prefixed body cut inside a length")
        size = ((<uint64_t>b[pos] << 24) | (<uint64_t>b[pos + 1] << 16)
                | (<uint64_t>b[pos + 2] << 8) | b[pos + 3])
        pos += 4
        if <uint64_t>(end - pos) < size:
            raise RemoteProtocolError(f"a length-prefixed element of {size} bytes cut short")
        out.append(PyBytes_FromStringAndSize(<const char*>(b + pos), <Py_ssize_t>size))
        pos += <Py_ssize_t>size
        count += 1
        if count > limit:
            raise RemoteProtocolError(f"more than {max_elements} elements in one body")
    return out
include "_http.pxi"  # RS.io over HTTP: a length-prefixed body of envelopes into a batch
