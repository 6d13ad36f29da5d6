# RS.io over HTTP, the client's side: a length-prefixed body of envelopes straight into a
# batch (issue 22, round 3; included from _kernels.pyx). The HTTP client used to split a body
# into one ``bytes`` per element (``decode_length_prefixed``) and then parse those into a batch
# (``envelopes_to_batch``): two copies of every value and an object per element. These parse
# the body where it lies and copy each value once, into the batch's column.

from cpython.bytearray cimport PyByteArray_FromStringAndSize

cdef Py_ssize_t lp_next(const uint8_t* b, Py_ssize_t pos, Py_ssize_t end,
                        Py_ssize_t* size) except -2:
    """The element after the u32 length at ``b[pos:end]``: its start, its size in ``size``;
    ``RemoteProtocolError`` (``decode_length_prefixed_py``'s) when the body is cut inside
    the length or the element."""
    cdef uint64_t n
    if end - pos < 4:
        raise RemoteProtocolError("a length-prefixed body cut inside a length")
    n = ((<uint64_t>b[pos] << 24) | (<uint64_t>b[pos + 1] << 16)
         | (<uint64_t>b[pos + 2] << 8) | b[pos + 3])
    pos += 4
    if <uint64_t>(end - pos) < n:
        raise RemoteProtocolError(f"a length-prefixed element of {n} bytes cut short")
    size[0] = <Py_ssize_t>n
    return pos


def count_length_prefixed(const uint8_t[::1] body, max_elements=2**32):
    """``protocols.rsio_http.codec.count_length_prefixed_py``: how many elements a
    length-prefixed body holds (``len(decode_length_prefixed(body))`` without the copies), with
    the same ``RemoteProtocolError``s."""
    cdef Py_ssize_t pos = 0, end = body.shape[0], count = 0, size = 0
    cdef Py_ssize_t limit = max_elements if max_elements < 2**62 else 2**62
    cdef const uint8_t* b = &body[0] if end else NULL
    while pos < end:
        pos = lp_next(b, pos, end, &size) + size
        count += 1
        if count > limit:
            raise RemoteProtocolError(f"more than {max_elements} elements in one body")
    return count


def length_prefixed_envelopes_batch(stream, const uint8_t[::1] body, Py_ssize_t skip=0):
    """``protocols.rsio_http.codec.length_prefixed_envelopes_batch_py``: the batch of the
    envelopes in a length-prefixed body, leaving out its first ``skip`` elements (received
    before: a resend). The body's framing is checked whole first (its errors come first, as
    the twin splits the body before it parses an envelope), then the envelopes are parsed in
    place and each value copied once into the batch's values; the errors of
    ``envelopes_to_batch``."""
    cdef Py_ssize_t end = body.shape[0], pos = 0, size = 0, count, n, i, at
    cdef const uint8_t* b = &body[0] if end else NULL
    cdef Frame* frames = NULL
    cdef Py_ssize_t vtotal = 0, ktotal = 0
    cdef int why
    cdef bint keyed = False, mixed = False
    if skip < 0:
        raise ValueError("skip is never negative")
    count = count_length_prefixed(body)
    n = count - skip
    if n <= 0:
        raise ValueError("no envelopes")
    frames = <Frame*>PyMem_Malloc(n * sizeof(Frame))
    if frames == NULL:
        raise MemoryError()
    try:
        for i in range(skip):  # (framing checked above: only hops here)
            pos = lp_next(b, pos, end, &size) + size
        for i in range(n):  # parse each envelope where it lies; offsets made absolute
            at = lp_next(b, pos, end, &size)
            why = parse_envelope(b + at, size, &frames[i])
            if why:
                raise ValueError(_ENVELOPE_ERRORS[why])
            frames[i].vstart += at
            vtotal += frames[i].vlen
            if frames[i].klen >= 0:
                frames[i].kstart += at
                keyed = True
                ktotal += frames[i].klen
            if (frames[i].event_id == 0) != (frames[0].event_id == 0):
                mixed = True
            pos = at + size
        ids = PyBytes_FromStringAndSize(NULL, 8 * n)
        stamps = PyBytes_FromStringAndSize(NULL, 8 * n)
        voffs = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
        values = PyBytes_FromStringAndSize(NULL, vtotal)
        fill_columns(frames, n, b, <uint64_t*>PyBytes_AS_STRING(ids),
                     <int64_t*>PyBytes_AS_STRING(stamps), <uint32_t*>PyBytes_AS_STRING(voffs),
                     PyBytes_AS_STRING(values))
        flags = koffs = keys = None
        if keyed:
            flags = PyBytes_FromStringAndSize(NULL, n)
            koffs = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
            keys = PyBytes_FromStringAndSize(NULL, ktotal)
            fill_keys(frames, n, b, <uint8_t*>PyBytes_AS_STRING(flags),
                      <uint32_t*>PyBytes_AS_STRING(koffs), PyBytes_AS_STRING(keys))
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


def body_buffer(Py_ssize_t size):
    """``protocols.rsio_http.http11.body_buffer_py``: a ``bytearray`` of ``size`` bytes for a
    response's body to be received into, not zeroed first (``bytearray(size)`` writes a
    megabyte of zeros that the receive then overwrites: 5 % of the client's CPU). Every byte
    is written by the receive before anything reads it (the lean path hands a body over only
    once all ``Content-Length`` bytes came)."""
    if size < 0:
        raise ValueError("negative count")
    return PyByteArray_FromStringAndSize(NULL, size)
