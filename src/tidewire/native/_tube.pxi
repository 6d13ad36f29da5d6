# Included by _kernels.pyx (same module, same conventions: see its docstring).

# ------------------------------------------------------------------ Tube: a message put together

from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.object cimport PyObject


cdef extern from "Python.h":
    int _PyBytes_Resize(PyObject** pv, Py_ssize_t newsize) except -1

cdef extern from *:
    """
    /* A bytes object not yet shared, cut to its first n bytes where it lies (no realloc). */
    static void tw_bytes_cut(PyObject *b, Py_ssize_t n) {
        Py_SET_SIZE((PyVarObject *)b, n);
        PyBytes_AS_STRING(b)[n] = '\\0';
    }
    """
    void tw_bytes_cut(object b, Py_ssize_t n)


cdef class Reassembly:
    """``protocols.tube.pieces.ReassemblyPy``, with one buffer: a ``bytes`` of ``capacity``
    bytes allocated here, each :meth:`put` copied into it at once, and :meth:`finish` cutting
    it to what was put (no second copy; a slack over an eighth is given back by a realloc). The ``bytes`` is never seen outside until
    :meth:`finish` hands it over (its only reference), so filling it is no mutation anyone can
    observe. :attr:`held` is the whole buffer: ``capacity`` from the start."""

    cdef object _buf  # None once finished
    cdef readonly Py_ssize_t capacity
    cdef readonly Py_ssize_t size

    def __cinit__(self, Py_ssize_t capacity):
        if capacity < 0:
            raise ValueError("a reassembly's capacity is at least 0")
        self._buf = PyBytes_FromStringAndSize(NULL, capacity)
        self.capacity = capacity
        self.size = 0

    @property
    def held(self):
        return self.capacity if self._buf is not None else 0

    def put(self, const uint8_t[::1] data):
        if self._buf is None:
            raise ValueError("the reassembly is finished")
        cdef Py_ssize_t n = data.shape[0]
        if n > self.capacity - self.size:
            raise ValueError(f"{self.size + n} bytes, past the reassembly's {self.capacity}")
        if n:
            memcpy(PyBytes_AS_STRING(self._buf) + self.size, &data[0], n)
        self.size += n

    def finish(self):
        if self._buf is None:
            raise ValueError("the reassembly is finished")
        if self.size == 0:  # (capacity 0 is CPython's shared empty bytes: never cut that)
            self._buf = None
            return b""
        if self.capacity - self.size <= self.capacity // 8:
            # Cut where it lies, the slack (at most an eighth: the last fragment's unused part)
            # left allocated: a shrinking realloc would hand malloc back a block smaller than
            # the next message's, and glibc's threshold for mapping a block anew adapts only
            # to blocks freed whole; same-sized blocks then come from its heap, unmapped never.
            out = self._buf
            self._buf = None
            tw_bytes_cut(out, self.size)
            return out
        # Hand the one reference to _PyBytes_Resize (it needs a refcount of 1: realloc in
        # place, or a new object and the old freed), then take the result back as an object.
        cdef PyObject* raw = <PyObject*>self._buf
        Py_INCREF(self._buf)
        self._buf = None  # (raw now holds the only reference)
        _PyBytes_Resize(&raw, self.size)  # (on failure raw is NULL and MemoryError is raised)
        result = <object>raw  # (a new reference: drop raw's)
        Py_DECREF(result)
        return result
