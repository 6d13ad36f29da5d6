# Included by _kernels.pyx (same module, same conventions: see its docstring).

# ------------------------------------------------------------------ Seguro: SAVE MANY's events

cdef inline int decimal(const uint8_t* b, Py_ssize_t start, Py_ssize_t stop,
                        uint64_t* out) noexcept nogil:
    """The decimal ``b[start:stop]`` as the pure parse takes it (1 to 20 ASCII digits): 0, 1
    when it is one but above 2**64-1 (the pure code's ``> MAX_U64``), -1 when it is not one."""
    cdef uint64_t v = 0, d
    cdef bint over = False
    cdef Py_ssize_t i
    if stop - start < 1 or stop - start > 20:
        return -1
    for i in range(start, stop):
        if b[i] < 48 or b[i] > 57:
            return -1
        d = b[i] - 48
        if v > (U64_MAX - d) // 10:
            over = True
        else:
            v = v * 10 + d
    out[0] = v
    return 1 if over else 0


def seguro_many_run(const uint8_t[::1] buf, Py_ssize_t pos, Py_ssize_t max_line,
                    max_event, seen, last, many):
    """``protocols.seguro.codec.many_run_py``: the complete ``EVENT`` frames of a ``SAVE MANY``
    at ``buf[pos:]`` that the frame by frame parse would accept, up to 65536:
    ``(ids, datas, pos, seen, last)``. The header lines are parsed in C; each event's data is
    still one ``bytes`` (the session's ``ManyEvents`` holds a list of them)."""
    cdef Py_ssize_t end_buf = buf.shape[0], nl, sp, stop, end, i, nfields
    cdef const uint8_t* b = &buf[0] if end_buf else NULL
    cdef const uint8_t* found
    cdef uint64_t event_id, size, c_seen = seen, c_last = last
    cdef uint64_t start_id = many.start, end_id = many.end, count = many.count
    cdef uint64_t max_ev = max_event if max_event > 0 else 0
    cdef list ids = [], datas = []
    while (pos + 6 <= end_buf and memcmp(b + pos, b"EVENT ", 6) == 0
           and len(ids) < 65536):
        stop = min(pos + max_line + 1, end_buf)
        found = <const uint8_t*>memchr(b + pos, 10, stop - pos) if stop > pos else NULL
        if found == NULL:
            break
        nl = found - b
        sp = -1  # exactly one space between the two fields
        nfields = 1
        for i in range(pos + 6, nl):
            if b[i] == 32:
                nfields += 1
                sp = i
        if nfields != 2:
            break
        if decimal(b, pos + 6, sp, &event_id) != 0:  # (above 2**64-1 too: break)
            break
        i = decimal(b, sp + 1, nl, &size)
        if i < 0 or i == 1 or size > max_ev:
            break
        if size > <uint64_t>(end_buf - nl - 1):
            break
        end = nl + 1 + <Py_ssize_t>size
        if end + 2 > end_buf:
            break
        if ((c_seen == 0 and event_id != start_id) or (c_seen and event_id <= c_last)
                or event_id > end_id or c_seen + 1 > count):
            break
        if b[end] != 10 or b[end + 1] != 10:
            break
        ids.append(event_id)
        datas.append(PyBytes_FromStringAndSize(<const char*>(b + nl + 1), <Py_ssize_t>size))
        c_seen += 1
        c_last = event_id
        pos = end + 2
    return ids, datas, pos, c_seen, c_last
