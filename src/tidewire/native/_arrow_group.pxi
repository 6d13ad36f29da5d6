# Included by _kernels.pyx (same module, same conventions: see its docstring).

# ------------------------------------------------------------- Spark: batches -> Arrow columns

from libc.stdint cimport int32_t
from libc.string cimport memset

cdef int64_t MS_IN_US_LIMIT = 9223372036854775  # (2**63 - 1) // 1000: ms that fit in µs
cdef uint64_t INT32_END = (<uint64_t>1) << 31


cdef inline uint64_t rebase_offsets(const uint32_t* offs, Py_ssize_t n, uint64_t running,
                                    int32_t* out) noexcept nogil:
    """``out[1..n]`` = ``offs[1..n] - offs[0] + running`` (the int32 offsets of one batch's
    rows in the group); returns the new running end (the caller checks it fits an int32)."""
    cdef uint32_t base = offs[0]
    cdef Py_ssize_t i
    for i in range(1, n + 1):
        out[i] = <int32_t>(offs[i] - base + running)
    return running + (offs[n] - base)


def arrow_group(list batches, uint8_t[::1] ids_out, uint8_t[::1] stamps_out,
                uint8_t[::1] voffs_out, uint8_t[::1] vals_out, uint8_t[::1] valid_out,
                uint8_t[::1] koffs_out, uint8_t[::1] keys_out):
    """``spark.arrow.arrow_group_py``: the Arrow columns of ``batches`` (one stream's, in
    order) written into the caller's buffers, sized for the group (see the twin); returns the
    null count of the key column. ``InvalidBatch`` for a timestamp beyond int64 µs or more
    than 2 GiB of values or keys."""
    cdef BatchView v
    cdef Py_ssize_t n, i, row = 0, vbytes = 0, kbytes = 0, nulls = 0
    cdef uint64_t vend = 0, kend = 0
    cdef bint keyed = koffs_out.shape[0] > 0
    views = [BatchView(batch) for batch in batches]
    for v in views:  # the caller sized the buffers: check, since the loops below trust them
        row += v.c.n
        vbytes += v.vals.shape[0]
        if v.c.kflags != NULL:
            kbytes += v.keys.shape[0]
    if (ids_out.shape[0] != 8 * row or stamps_out.shape[0] != 8 * row
            or voffs_out.shape[0] != 4 * (row + 1) or vals_out.shape[0] != vbytes
            or keys_out.shape[0] != kbytes
            or (keyed and (koffs_out.shape[0] != 4 * (row + 1)
                           or valid_out.shape[0] != (row + 7) // 8))
            or (not keyed and (kbytes or valid_out.shape[0]))):
        raise ValueError("the output buffers do not fit the batches")
    row = vbytes = kbytes = 0
    cdef int64_t t
    cdef int64_t* stamps
    cdef int32_t* voffs = <int32_t*>&voffs_out[0]
    cdef int32_t* koffs = <int32_t*>&koffs_out[0] if keyed else NULL
    cdef uint8_t* valid = &valid_out[0] if keyed else NULL
    voffs[0] = 0
    if keyed:
        koffs[0] = 0
        memset(valid, 0, valid_out.shape[0])
    for batch, v in zip(batches, views):
        n = v.c.n
        stamps = <int64_t*>&stamps_out[8 * row]
        for i in range(n):
            t = v.c.stamps[i]
            if t > MS_IN_US_LIMIT or t < -MS_IN_US_LIMIT:
                raise InvalidBatch(f"stream {batch.stream!r}: a timestamp (ms) is beyond what "
                                   "Spark's microsecond timestamps hold")
            stamps[i] = t * 1000
        memcpy(&ids_out[8 * row], v.c.ids, 8 * n)
        vend = rebase_offsets(v.c.offs, n, vend, voffs + row)
        if vend >= INT32_END:
            raise InvalidBatch("more than 2 GiB of values in one Arrow batch")
        if v.vals.shape[0]:
            memcpy(&vals_out[vbytes], v.c.vals, v.vals.shape[0])
            vbytes += v.vals.shape[0]
        if keyed:
            if v.c.kflags == NULL:
                for i in range(1, n + 1):
                    koffs[row + i] = <int32_t>kend
                nulls += n
            else:
                kend = rebase_offsets(v.c.koffs, n, kend, koffs + row)
                if kend >= INT32_END:
                    raise InvalidBatch("more than 2 GiB of keys in one Arrow batch")
                for i in range(n):
                    if v.c.kflags[i]:
                        valid[(row + i) >> 3] |= <uint8_t>(1 << ((row + i) & 7))
                    else:
                        nulls += 1
                if v.keys.shape[0]:
                    memcpy(&keys_out[kbytes], v.c.keys, v.keys.shape[0])
                    kbytes += v.keys.shape[0]
        row += n
    return nulls
