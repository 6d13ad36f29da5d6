# Included by _kernels.pyx (same module, same conventions: see its docstring).

# ------------------------------------------------------------------ Tolliver: runs of frames
# The twins are in protocols/tolliver/runs.py (take_run_py, ack_frames_py, message_frames_py).

from cpython.object cimport PyObject_GenericSetAttr
from cpython.unicode cimport PyUnicode_DecodeUTF8

from tidewire.model import LocalProtocolError

cdef Py_ssize_t TOLLIVER_NAMES_CACHED = 256  # (runs.NAMES_CACHED)
cdef uint64_t TOLLIVER_MAX_U32 = 0xFFFFFFFF


cdef inline uint32_t be32(const uint8_t* p) noexcept nogil:
    return ((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8)
            | <uint32_t>p[3])


cdef inline void put32(char* p, uint32_t v) noexcept nogil:
    p[0] = <char>(v >> 24)
    p[1] = <char>(v >> 16)
    p[2] = <char>(v >> 8)
    p[3] = <char>v


cdef object tolliver_name(dict names, bytes raw):
    """``runs.cached_name``: ``raw`` decoded through the cache, ``None`` if not UTF-8."""
    cdef object name = names.get(raw)
    if name is None:
        try:
            name = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), NULL)
        except UnicodeDecodeError:
            return None
        if len(names) >= TOLLIVER_NAMES_CACHED:
            names.clear()
        names[raw] = name
    return name


def tolliver_take_run(const uint8_t[::1] buf, Py_ssize_t pos, Py_ssize_t max_name,
                      Py_ssize_t max_body, dict names, str skip_channel, list messages,
                      list acks, type message_type):
    """``protocols.tolliver.runs.take_run_py``: the whole message and ack frames at
    ``buf[pos:]`` in one C pass; each message a ``message_type`` whose four slots are set
    directly (as the twin's ``message_maker``), its body one new ``bytes``."""
    cdef Py_ssize_t size = buf.shape[0], at, end, count = 0
    cdef const uint8_t* b = &buf[0] if size else NULL
    cdef uint32_t clen, klen, blen, message_id
    cdef bytes last_raw = b"", raw
    cdef object last_name = "", channel, key, message
    cdef object new = object.__new__
    while pos < size:
        if b[pos] == 4:
            if pos + 5 > size:
                break
            acks.append(be32(b + pos + 1))
            pos += 5
            count += 1
            continue
        if b[pos] != 3 or pos + 17 > size:
            break
        clen, klen, blen = be32(b + pos + 1), be32(b + pos + 5), be32(b + pos + 9)
        message_id = be32(b + pos + 13)
        if clen > <uint64_t>max_name or klen > <uint64_t>max_name or blen > <uint64_t>max_body:
            break
        at = pos + 17
        end = at + <Py_ssize_t>clen + <Py_ssize_t>klen + <Py_ssize_t>blen
        if end > size:
            break
        if (clen == <uint32_t>PyBytes_GET_SIZE(last_raw)
                and memcmp(b + at, PyBytes_AS_STRING(last_raw), clen) == 0):
            channel = last_name
        else:
            raw = PyBytes_FromStringAndSize(<const char*>(b + at), clen)
            channel = tolliver_name(names, raw) if clen else ""
            if channel is None:
                break
            last_raw, last_name = raw, channel
        if channel == skip_channel:
            break
        key = ""
        if klen:
            key = tolliver_name(names, PyBytes_FromStringAndSize(<const char*>(b + at + clen),
                                                                 klen))
            if key is None:
                break
        message = new(message_type)
        PyObject_GenericSetAttr(message, "channel", channel)
        PyObject_GenericSetAttr(message, "key", key)
        PyObject_GenericSetAttr(
            message, "body", PyBytes_FromStringAndSize(<const char*>(b + at + clen + klen), blen))
        PyObject_GenericSetAttr(message, "id", message_id)
        messages.append(message)
        pos = end
        count += 1
    return count, pos


cdef inline bint tolliver_u32(object value):
    """Whether ``value`` is an int that fits a u32 (what ``struct.pack(">I")`` takes)."""
    return isinstance(value, int) and 0 <= value <= TOLLIVER_MAX_U32


def tolliver_ack_frames(message_ids):
    """``runs.ack_frames_py``: 5 bytes per id (code 4, the id big-endian), in order;
    ``LocalProtocolError`` if one is not a u32."""
    cdef list ids = message_ids if type(message_ids) is list else list(message_ids)
    cdef Py_ssize_t n = len(ids), i
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 5 * n)
    cdef char* p = PyBytes_AS_STRING(out)
    cdef object value
    for i in range(n):
        value = ids[i]
        if not tolliver_u32(value):
            raise LocalProtocolError("an ack's id is a u32")
        p[0] = 4
        put32(p + 1, <uint32_t>value)
        p += 5
    return out


def tolliver_message_frames(bytes channel, items):
    """``runs.message_frames_py``: one message frame per ``(key, body, id)`` (bytes-like key
    and body; ids are ints); the header in C, the names and body copied in with ``memcpy``.
    ``LocalProtocolError`` if an id or a body length is not a u32."""
    cdef list frames = []
    cdef Py_ssize_t clen = PyBytes_GET_SIZE(channel), klen, blen
    cdef bytes frame, kraw, braw
    cdef char* p
    for key, body, message_id in items:
        kraw = key if type(key) is bytes else bytes(memoryview(key))
        braw = body if type(body) is bytes else bytes(memoryview(body))
        klen, blen = PyBytes_GET_SIZE(kraw), PyBytes_GET_SIZE(braw)
        if not tolliver_u32(message_id) or <uint64_t>blen > TOLLIVER_MAX_U32:
            raise LocalProtocolError("a message's id and body length are u32")
        frame = PyBytes_FromStringAndSize(NULL, 17 + clen + klen + blen)
        p = PyBytes_AS_STRING(frame)
        p[0] = 3
        put32(p + 1, <uint32_t>clen)
        put32(p + 5, <uint32_t>klen)
        put32(p + 9, <uint32_t>blen)
        put32(p + 13, <uint32_t>message_id)
        memcpy(p + 17, PyBytes_AS_STRING(channel), clen)
        memcpy(p + 17 + clen, PyBytes_AS_STRING(kraw), klen)
        memcpy(p + 17 + clen + klen, PyBytes_AS_STRING(braw), blen)
        frames.append(frame)
    return frames


def tolliver_value_frames(bytes channel, const uint8_t[::1] values,
                          const uint32_t[::1] offsets, first_id):
    """``runs.value_frames_py``: one message frame per value (no key, ids from ``first_id``),
    each one new ``bytes`` filled with two ``memcpy``; ``LocalProtocolError`` if an id would
    pass a u32."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, i, clen = PyBytes_GET_SIZE(channel)
    cdef uint32_t base, start, end
    cdef uint64_t first
    cdef list frames = []
    cdef bytes frame
    cdef char* p
    if n > 0 and not (0 <= first_id and first_id + n - 1 <= TOLLIVER_MAX_U32):
        raise LocalProtocolError("a message's id and body length are u32")
    if n <= 0:
        return frames
    first = first_id
    base = offsets[0]
    for i in range(n):
        start, end = offsets[i] - base, offsets[i + 1] - base
        frame = PyBytes_FromStringAndSize(NULL, 17 + clen + (end - start))
        p = PyBytes_AS_STRING(frame)
        p[0] = 3
        put32(p + 1, <uint32_t>clen)
        put32(p + 5, 0)
        put32(p + 9, end - start)
        put32(p + 13, <uint32_t>(first + i))
        memcpy(p + 17, PyBytes_AS_STRING(channel), clen)
        if end > start:
            memcpy(p + 17 + clen, &values[start], end - start)
        frames.append(frame)
    return frames


def tolliver_deliveries(type delivery_type, sender, list messages, link):
    """``tolliver.inbox.deliveries_py``: ``(delivery_type(sender, m.channel, m.key, m.body,
    m.id), link)`` for each message of ``messages``, the delivery's five slots set directly
    (as the twin's ``make_delivery``)."""
    cdef list out = []
    cdef object new = object.__new__, delivery
    for message in messages:
        delivery = new(delivery_type)
        PyObject_GenericSetAttr(delivery, "sender", sender)
        PyObject_GenericSetAttr(delivery, "channel", message.channel)
        PyObject_GenericSetAttr(delivery, "key", message.key)
        PyObject_GenericSetAttr(delivery, "body", message.body)
        PyObject_GenericSetAttr(delivery, "id", message.id)
        out.append((delivery, link))
    return out
