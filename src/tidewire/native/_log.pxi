# Included by _kernels.pyx (same module, same conventions: see its docstring).

# ------------------------------------------------------- the log: a commit group's run, encoded

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from cpython.memoryview cimport PyMemoryView_Check, PyMemoryView_GET_BUFFER
from cpython.ref cimport Py_DECREF
from libc.string cimport memset

from crc32c import crc32c as _crc32c

cdef Py_ssize_t RECORD_HEADER = 48  # (record.HEADER_SIZE)
cdef Py_ssize_t RECORD_CRC_SPAN = 44
cdef uint8_t RECORD_MAGIC = 2  # (record.MAGIC: CRC-32C)
cdef uint8_t RECORD_ATTR_KEYS = 1


cdef struct Part:  # one batch of a run: its columns (pointers into buffers its views hold)
    Py_ssize_t n
    uint64_t first  # the first id the log assigns it; its own ids when ``own``
    bint own
    const uint64_t* ids
    const int64_t* stamps
    const uint32_t* offs
    const uint8_t* vals
    Py_ssize_t vlen
    const uint8_t* kflags  # NULL: no keys
    const uint32_t* koffs
    const uint8_t* keys
    Py_ssize_t klen
    bint dropped  # a lone event whose key flag is 0, in a run of lone events: no key bytes


cdef inline const void* column(object view, Py_ssize_t* size) except? NULL:
    """The bytes of one of a batch's buffers (memoryviews, as the model makes them: anything
    else is refused). The batch holds them for as long as the run is encoded."""
    if not PyMemoryView_Check(view):
        raise TypeError(f"a batch's buffers are memoryviews, not {type(view).__name__}")
    cdef Py_buffer* b = PyMemoryView_GET_BUFFER(view)
    size[0] = b.len
    return b.buf


from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    PyObject* PyType_GenericAlloc(PyTypeObject* kind, Py_ssize_t nitems) except NULL

BATCH_FIELDS = ("stream", "ids", "timestamps", "value_offsets", "values", "key_flags",
                "key_offsets", "keys")
cdef Py_ssize_t[8] batch_slots  # where each field's slot sits in a Batch (0: not known)


cdef bint find_batch_slots():
    """Where ``Batch``'s slots are, for :func:`fast_batch`: the offsets its member descriptors
    (``__slots__``) store their values at. False (and :func:`fast_batch` calls ``Batch``
    itself) if its fields are not exactly these, or one is not such a slot."""
    if tuple(getattr(Batch, "__dataclass_fields__", ())) != BATCH_FIELDS:
        return False
    member = type(Batch.__dict__["ids"])
    if (member.__name__ != "member_descriptor" or Batch.__dictoffset__
            or Batch.__new__ is not object.__new__):
        return False
    for i, name in enumerate(BATCH_FIELDS):
        descr = Batch.__dict__.get(name)
        if type(descr) is not member:
            return False
        batch_slots[i] = (<PyMemberDescrObject*>descr).d_member.offset
    return True


cdef bint BATCH_SLOTS = find_batch_slots()


cdef inline void put_slot(object batch, int i, object value) noexcept:
    Py_INCREF(value)
    (<PyObject**>((<char*><PyObject*>batch) + batch_slots[i]))[0] = <PyObject*>value


cdef object fast_batch(str stream, object ids, object stamps, object offs, object vals,
                       object kflags, object koffs, object keys):
    """A :class:`Batch` of views already checked (a record's, as ``decode_body`` builds it, or
    a slice of one), without ``__post_init__``, as ``Batch.slice`` makes one: its slots are set
    where its member descriptors would set them (a new object's slots are empty)."""
    if not BATCH_SLOTS:  # (a Batch this kernel does not know: built and checked as usual)
        return Batch(stream, ids, stamps, offs, vals, kflags, koffs, keys)
    batch = <object>PyType_GenericAlloc(<PyTypeObject*>Batch, 0)  # (Batch's tp_alloc: a heap type's)
    Py_DECREF(batch)  # (tp_alloc's reference: ``batch`` holds one of its own)
    put_slot(batch, 0, stream)
    put_slot(batch, 1, ids)
    put_slot(batch, 2, stamps)
    put_slot(batch, 3, offs)
    put_slot(batch, 4, vals)
    put_slot(batch, 5, kflags)
    put_slot(batch, 6, koffs)
    put_slot(batch, 7, keys)
    return batch


def encode_run(list items):
    """``log.grouping.encode_run_py``: the record of a run of small batches of one stream
    (``(batch, first_id)`` pairs, ``first_id`` ``None`` for the batch's own ids) and the batch
    stored for each, views of the record. One C pass sizes the run, a second copies its
    columns into the record's bytes (no merged batch in between); the views are made without
    ``Batch``'s checks, as ``decode_body`` and ``Batch.slice`` would make them."""
    cdef Py_ssize_t count = len(items)
    if count == 0:
        raise ValueError("a run holds at least one batch")
    cdef Part* parts = <Part*>PyMem_Malloc(count * sizeof(Part))
    if parts == NULL:
        raise MemoryError()
    try:
        load_parts(items, parts, count)
        stored = []
        data, record, n, first, last, max_ts = encode_parts(items[0][0].stream, parts, count,
                                                            stored)
        return data, record, stored, n, first, last, max_ts
    finally:
        PyMem_Free(parts)


def encode_group_runs(list items, Py_ssize_t limit, Py_ssize_t max_events):
    """``log.grouping.encode_group_runs_py``: a commit group cut into runs (consecutive
    batches of at most ``max_events`` events and ``limit`` bytes each, up to ``limit``
    together; a larger batch a run of its own), each encoded as :func:`encode_run` would, and
    the batch stored for each item, in order. The cut is made in C from the columns that the
    encode reads anyway (``Batch.nbytes`` is what counts)."""
    cdef Py_ssize_t count = len(items)
    cdef Py_ssize_t i, lo = 0, run_bytes = 0, size
    cdef list runs = [], stored = []
    if count == 0:
        return runs, stored
    cdef Part* parts = <Part*>PyMem_Malloc(count * sizeof(Part))
    if parts == NULL:
        raise MemoryError()
    try:
        load_parts(items, parts, count)
        stream = items[0][0].stream
        for i in range(count):
            size = 20 * parts[i].n + 4 + parts[i].vlen
            if parts[i].kflags != NULL:
                size += 5 * parts[i].n + 4 + parts[i].klen
            if parts[i].n <= max_events and size <= limit:
                if run_bytes + size > limit:
                    runs.append(encode_parts(stream, parts + lo, i - lo, stored))
                    lo, run_bytes = i, 0
                run_bytes += size
            else:
                if lo < i:
                    runs.append(encode_parts(stream, parts + lo, i - lo, stored))
                runs.append(encode_parts(stream, parts + i, 1, stored))
                lo, run_bytes = i + 1, 0
        if lo < count:
            runs.append(encode_parts(stream, parts + lo, count - lo, stored))
        return runs, stored
    finally:
        PyMem_Free(parts)


cdef int load_parts(list items, Part* parts, Py_ssize_t count) except -1:
    """Pass 1: each item's columns, and the ids it asks for (refused as ``encode_run_py``
    refuses them)."""
    cdef Py_ssize_t i, size
    cdef Part* q
    cdef object batch, first_id
    for i in range(count):
        batch, first_id = items[i]
        q = &parts[i]
        q.ids = <const uint64_t*>column(batch.ids, &size)
        q.n = size // 8
        q.stamps = <const int64_t*>column(batch.timestamps, &size)
        q.offs = <const uint32_t*>column(batch.value_offsets, &size)
        q.vals = <const uint8_t*>column(batch.values, &q.vlen)
        q.own = first_id is None
        if q.own:
            q.first = q.ids[0]
        else:
            if not 1 <= first_id <= <object>MAX_ID - q.n + 1:
                raise InvalidBatch(f"ids {first_id}..{first_id + q.n - 1} are outside "
                                   "1..2**63-1")
            q.first = first_id
        q.kflags = NULL
        q.koffs = NULL
        q.keys = NULL
        q.klen = 0
        q.dropped = False
        if batch.key_flags is not None:
            q.kflags = <const uint8_t*>column(batch.key_flags, &size)
            q.koffs = <const uint32_t*>column(batch.key_offsets, &size)
            q.keys = <const uint8_t*>column(batch.keys, &q.klen)
    return 0


cdef tuple encode_parts(str stream, Part* parts, Py_ssize_t count, list stored):
    """One run's record (``parts[:count]``, loaded): ``(data, batch, count, first, last,
    max_ts)``; the batch stored for each part is appended to ``stored``."""
    cdef Py_ssize_t i, n = 0, vtotal = 0, ktotal = 0
    cdef bint keyed = False, singles = True
    cdef Part* q
    for i in range(count):
        q = &parts[i]
        if q.kflags != NULL:
            keyed = True
        if q.n != 1:
            singles = False
        n += q.n
        vtotal += q.vlen
    if count > 1 and singles:  # (merge's one-event path keeps no bytes of a key flagged 0)
        for i in range(count):
            if parts[i].kflags != NULL and not parts[i].kflags[0]:
                parts[i].klen = 0
                parts[i].dropped = True
    for i in range(count):
        ktotal += parts[i].klen
    cdef Py_ssize_t body = 20 * n + 4 + vtotal + ((5 * n + 4 + ktotal) if keyed else 0)
    cdef Py_ssize_t length = RECORD_HEADER + body
    length = (length + 7) & ~7  # (C division here: no Python modulo)
    if length >= <Py_ssize_t>1 << 32:
        raise ValueError("a record must be smaller than 4 GiB")
    data = PyByteArray_FromStringAndSize(NULL, length)
    cdef uint8_t* out = <uint8_t*>PyByteArray_AS_STRING(data)
    cdef int64_t max_ts = fill(parts, count, n, keyed, out, length)
    cdef uint64_t first = parts[0].first, last
    q = &parts[count - 1]
    last = q.ids[q.n - 1] if q.own else q.first + <uint64_t>(q.n - 1)
    cdef uint32_t u32
    cdef uint8_t attrs = RECORD_ATTR_KEYS if keyed else 0
    u32 = <uint32_t>length
    memcpy(out, &u32, 4)
    out[4] = RECORD_MAGIC
    out[5] = attrs
    u32 = <uint32_t>n
    memcpy(out + 8, &u32, 4)
    u32 = <uint32_t>body
    memcpy(out + 12, &u32, 4)
    memcpy(out + 16, &first, 8)
    memcpy(out + 24, &last, 8)
    memcpy(out + 32, &max_ts, 8)
    view = memoryview(data).toreadonly()
    u32 = _crc32c(view[RECORD_HEADER:RECORD_HEADER + body])
    memcpy(out + 40, &u32, 4)
    u32 = _crc32c(view[:RECORD_CRC_SPAN])
    memcpy(out + RECORD_CRC_SPAN, &u32, 4)
    record = record_batch(stream, view[RECORD_HEADER:RECORD_HEADER + body], n, keyed, vtotal,
                          ktotal)
    if count == 1:
        stored.append(record)
    else:
        slices(record, parts, count, keyed, stored)
    return data, record, n, first, last, max_ts


cdef int64_t fill(const Part* parts, Py_ssize_t count, Py_ssize_t n, bint keyed, uint8_t* out,
                  Py_ssize_t length) noexcept:
    """Copy the run's columns into the record's body (``merge`` then ``encode``'s layout: a
    lone batch keeps its offsets, a run's start at 0); zero the header and the padding.
    Returns the largest timestamp."""
    cdef Py_ssize_t i, j, at = 0
    cdef uint64_t* ids = <uint64_t*>(out + RECORD_HEADER)
    cdef int64_t* stamps = <int64_t*>(ids + n)
    cdef uint32_t* offs = <uint32_t*>(stamps + n)
    cdef uint32_t* koffs = offs + n + 1
    cdef uint8_t* kflags = <uint8_t*>(koffs + n + 1) if keyed else NULL
    cdef uint8_t* p = kflags + n if keyed else <uint8_t*>koffs
    cdef uint32_t vbase = 0, kbase = 0, shift
    cdef int64_t best = parts[0].stamps[0]
    cdef const Part* q
    memset(out, 0, RECORD_HEADER)
    with nogil:
        if count == 1:  # (encode of the batch itself: its offsets as they are)
            vbase = parts[0].offs[0]
            if keyed:
                kbase = parts[0].koffs[0]
        offs[0] = vbase
        if keyed:
            koffs[0] = kbase
        for i in range(count):
            q = &parts[i]
            for j in range(q.n):
                ids[at + j] = q.ids[j] if q.own else q.first + <uint64_t>j
                stamps[at + j] = q.stamps[j]
                if q.stamps[j] > best:
                    best = q.stamps[j]
            shift = offs[at] - q.offs[0]
            for j in range(q.n):
                offs[at + j + 1] = q.offs[j + 1] + shift
            if keyed:
                if q.kflags == NULL:
                    memset(kflags + at, 0, q.n)
                    for j in range(q.n):
                        koffs[at + j + 1] = koffs[at]
                elif q.dropped:
                    kflags[at] = q.kflags[0]
                    koffs[at + 1] = koffs[at]
                else:
                    memcpy(kflags + at, q.kflags, q.n)
                    shift = koffs[at] - q.koffs[0]
                    for j in range(q.n):
                        koffs[at + j + 1] = q.koffs[j + 1] + shift
            at += q.n
        for i in range(count):
            if parts[i].vlen:
                memcpy(p, parts[i].vals, parts[i].vlen)
                p += parts[i].vlen
        if keyed:
            for i in range(count):
                if parts[i].klen:
                    memcpy(p, parts[i].keys, parts[i].klen)
                    p += parts[i].klen
        memset(p, 0, length - (p - out))
    return best


cdef object record_batch(str stream, object body, Py_ssize_t n, bint keyed, Py_ssize_t vtotal,
                         Py_ssize_t ktotal):
    """The record's batch: views of its body, as ``record.decode_body`` makes them."""
    cdef Py_ssize_t p = 16 * n + 4 * (n + 1)
    ids = body[:8 * n].cast("Q")
    stamps = body[8 * n:16 * n].cast("q")
    offs = body[16 * n:p].cast("I")
    kflags = koffs = keys = None
    if keyed:
        koffs = body[p:p + 4 * (n + 1)].cast("I")
        p += 4 * (n + 1)
        kflags = body[p:p + n]
        p += n
    vals = body[p:p + vtotal]
    if keyed:
        keys = body[p + vtotal:p + vtotal + ktotal]
    return fast_batch(stream, ids, stamps, offs, vals, kflags, koffs, keys)


cdef void slices(object record, const Part* parts, Py_ssize_t count, bint keyed,
                 list out) except *:
    """The batch stored for each part, appended to ``out``: ``record.slice(start, stop)`` of
    its events (the record's offsets start at 0 in a run)."""
    cdef Py_ssize_t i, start = 0, stop
    cdef Py_buffer* vo = PyMemoryView_GET_BUFFER(record.value_offsets)
    cdef const uint32_t* offs = <const uint32_t*>vo.buf
    cdef const uint32_t* koffs = NULL
    stream, ids, stamps, offsets, values = (record.stream, record.ids, record.timestamps,
                                            record.value_offsets, record.values)
    kflags, koffsets, keys = record.key_flags, record.key_offsets, record.keys
    if keyed:
        koffs = <const uint32_t*>PyMemoryView_GET_BUFFER(koffsets).buf
    for i in range(count):
        stop = start + parts[i].n
        out.append(fast_batch(
            stream, ids[start:stop], stamps[start:stop], offsets[start:stop + 1],
            values[offs[start]:offs[stop]],
            kflags[start:stop] if keyed else None,
            koffsets[start:stop + 1] if keyed else None,
            keys[koffs[start]:koffs[stop]] if keyed else None,
        ))
        start = stop


# ------------------------------------------------------------ the log: an append's own checks

cdef inline bint of_bytes(object view) noexcept:
    """A view of an immutable ``bytes`` (what ``Batch.owned`` keeps as it is)."""
    return PyMemoryView_Check(view) and type((<Py_buffer*>PyMemoryView_GET_BUFFER(view)).obj) is bytes


cdef inline bint monotone(object view) noexcept:
    cdef Py_buffer* b = PyMemoryView_GET_BUFFER(view)
    cdef const uint32_t* offs = <const uint32_t*>b.buf
    cdef Py_ssize_t i, n = b.len // 4
    for i in range(1, n):
        if offs[i] < offs[i - 1]:
            return False
    return True


def owned_valid(batch):
    """``batch.owned().validate()`` (``model.Batch``), what ``Log.append`` checks of every
    batch before it waits: the batch itself when every buffer is a view of ``bytes``, its ids
    strictly increasing within 1..2**63-1 and its offsets monotone, all checked here in C;
    anything else (a buffer to copy, a batch to refuse) goes to those two methods, which make
    the copy or raise their own error."""
    cdef Py_buffer* b
    cdef const uint64_t* ids
    cdef Py_ssize_t i, n
    keys = batch.keys
    if not (of_bytes(batch.ids) and of_bytes(batch.timestamps)
            and of_bytes(batch.value_offsets) and of_bytes(batch.values)
            and (keys is None or (of_bytes(keys) and of_bytes(batch.key_flags)
                                  and of_bytes(batch.key_offsets)))):
        return batch.owned().validate()
    b = PyMemoryView_GET_BUFFER(batch.ids)
    ids = <const uint64_t*>b.buf
    n = b.len // 8
    if n < 1 or ids[0] < 1 or ids[n - 1] > MAX_ID:
        return batch.validate()  # (which raises)
    for i in range(1, n):
        if ids[i] <= ids[i - 1]:
            return batch.validate()
    if not monotone(batch.value_offsets) or (keys is not None
                                             and not monotone(batch.key_offsets)):
        return batch.validate()
    return batch
