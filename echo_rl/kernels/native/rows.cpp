// Replay ring row kernels: gather, the single-transition add and batch row writes.
#include "common.h"

namespace echo_native {

bool get_rows(PyObject* obj, Buf& b, bool writable, Rows& r, const char* what, Py_ssize_t j) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (!b.get(obj, flags)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s[%zd] must be a C-contiguous%s array", what, j,
                     writable ? " writable" : "");
        return false;
    }
    if (b.view.ndim < 1) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] must have a leading row axis", what, j);
        return false;
    }
    r.base = static_cast<char*>(b.view.buf);
    r.nrows = b.view.shape[0];
    r.rowbytes = r.nrows ? b.view.len / r.nrows : 0;
    return true;
}

// gather(srcs tuple, rows int64[n], outs tuple) -> None:  outs[j][k] = srcs[j][rows[k]]
PyObject* gather(PyObject*, PyObject* args) {
    PyObject *o_srcs, *o_rows, *o_outs;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyTuple_Type, &o_srcs, &o_rows, &PyTuple_Type, &o_outs))
        return nullptr;
    Py_ssize_t L = PyTuple_GET_SIZE(o_srcs);
    if (PyTuple_GET_SIZE(o_outs) != L) {
        PyErr_SetString(PyExc_ValueError, "srcs and outs must have the same number of leaves");
        return nullptr;
    }
    Buf bi;
    if (!get_vec(o_rows, bi, false, false, "rows")) return nullptr;
    Py_ssize_t n = bi.view.shape[0];
    const int64_t* rows = static_cast<const int64_t*>(bi.view.buf);
    std::vector<Buf> bs(L), bo(L);
    std::vector<Rows> rs(L), ro(L);
    Py_ssize_t nsrc = -1;
    for (Py_ssize_t j = 0; j < L; ++j) {
        if (!get_rows(PyTuple_GET_ITEM(o_srcs, j), bs[j], false, rs[j], "srcs", j) ||
            !get_rows(PyTuple_GET_ITEM(o_outs, j), bo[j], true, ro[j], "outs", j))
            return nullptr;
        if (ro[j].nrows != n || (n && ro[j].rowbytes != rs[j].rowbytes)) {
            PyErr_Format(PyExc_ValueError, "outs[%zd] must hold %zd rows shaped like srcs[%zd]", j, n, j);
            return nullptr;
        }
        nsrc = nsrc < 0 ? rs[j].nrows : (rs[j].nrows < nsrc ? rs[j].nrows : nsrc);
    }
    for (Py_ssize_t k = 0; k < n; ++k)
        if (rows[k] < 0 || rows[k] >= nsrc) {
            PyErr_Format(PyExc_IndexError, "rows[%zd]=%lld out of range [0, %zd)", k, (long long)rows[k], nsrc);
            return nullptr;
        }
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t j = 0; j < L; ++j) {
        const Rows& s = rs[j];
        char* out = ro[j].base;
        Py_ssize_t rb = s.rowbytes;
        const Py_ssize_t ahead = 8;
        for (Py_ssize_t k = 0; k < n && k < ahead; ++k) __builtin_prefetch(s.base + rows[k] * rb);
        for (Py_ssize_t k = 0; k < n; ++k) {
            if (k + ahead < n) __builtin_prefetch(s.base + rows[k + ahead] * rb);
            copy_row(out + k * rb, s.base + rows[k] * rb, rb);
        }
    }
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

// add_one(dsts tuple, keys tuple|None, sample, slot, tree|None, offs, leaf, value) -> -1 or a leaf index
// Writes one transition into row `slot` of every leaf array in one call. With keys, `sample` is a
// dict read by those keys; without, a tuple/list of leaves in schema order. Each value must be an
// array (or numpy scalar) with exactly the leaf's dtype and row shape. If any leaf does not
// qualify, nothing is written and its index is returned so Python can convert or raise an error
// naming it. On success the tree leaf `leaf` is set to `value` (when a tree is given).
PyObject* add_one(PyObject*, PyObject* args) {
    PyObject *o_dsts, *o_keys, *o_sample, *o_tree, *o_offs;
    Py_ssize_t slot, leaf;
    double value;
    if (!PyArg_ParseTuple(args, "O!OOnOOnd", &PyTuple_Type, &o_dsts, &o_keys, &o_sample, &slot, &o_tree,
                          &o_offs, &leaf, &value))
        return nullptr;
    Py_ssize_t L = PyTuple_GET_SIZE(o_dsts);
    PyObject* items[64];
    if (L > 64) return PyLong_FromLong(0);  // many leaves: let Python do it
    if (o_keys != Py_None) {
        if (!PyDict_Check(o_sample) || !PyTuple_Check(o_keys) || PyTuple_GET_SIZE(o_keys) != L ||
            PyDict_GET_SIZE(o_sample) != L)
            return PyLong_FromLong(0);
        for (Py_ssize_t j = 0; j < L; ++j) {
            items[j] = PyDict_GetItemWithError(o_sample, PyTuple_GET_ITEM(o_keys, j));
            if (items[j] == nullptr) {
                PyErr_Clear();
                return PyLong_FromSsize_t(j);
            }
        }
    } else {
        if (!PyTuple_Check(o_sample) && !PyList_Check(o_sample)) return PyLong_FromLong(0);
        if (PySequence_Fast_GET_SIZE(o_sample) != L) return PyLong_FromLong(0);
        for (Py_ssize_t j = 0; j < L; ++j) items[j] = PySequence_Fast_GET_ITEM(o_sample, j);
    }
    Buf bd[64], bs[64];
    for (Py_ssize_t j = 0; j < L; ++j) {
        if (!bd[j].get(PyTuple_GET_ITEM(o_dsts, j), PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "dsts[%zd] must be a writable C-contiguous array", j);
            return nullptr;
        }
        const Py_buffer& d = bd[j].view;
        if (d.ndim < 1 || slot < 0 || slot >= d.shape[0]) {
            PyErr_Format(PyExc_IndexError, "slot %zd out of range for dsts[%zd]", slot, j);
            return nullptr;
        }
        if (!bs[j].get(items[j], PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)) {
            PyErr_Clear();
            return PyLong_FromSsize_t(j);
        }
        const Py_buffer& s = bs[j].view;
        if (s.ndim != d.ndim - 1 || s.itemsize != d.itemsize || fmt_char(s.format) != fmt_char(d.format) ||
            fmt_char(s.format) == 0)
            return PyLong_FromSsize_t(j);
        for (int a = 0; a < s.ndim; ++a)
            if (s.shape[a] != d.shape[a + 1]) return PyLong_FromSsize_t(j);
    }
    Buf bt, bo;
    Tree T;
    if (o_tree != Py_None) {
        if (!get_tree(o_tree, o_offs, bt, bo, T)) return nullptr;
        if (leaf < 0 || leaf >= T.P) {
            PyErr_Format(PyExc_IndexError, "leaf %zd out of range [0, %zd)", leaf, T.P);
            return nullptr;
        }
    }
    for (Py_ssize_t j = 0; j < L; ++j) {
        const Py_buffer& d = bd[j].view;
        Py_ssize_t rb = d.len / d.shape[0];
        copy_row(static_cast<char*>(d.buf) + slot * rb, static_cast<const char*>(bs[j].view.buf), rb);
    }
    if (o_tree != Py_None) {
        T.t[T.off[T.d] + leaf] = value;
        refresh_up(T, leaf);
    }
    return PyLong_FromLong(-1);
}

// Copy `bytes` into a destination that will not be read again soon (a replay ring row range).
// Large copies use non-temporal stores where the CPU has them: they skip reading the (cold)
// destination lines into the cache first, which a plain memcpy of this size would do.
static void stream_copy(char* dst, const char* src, size_t bytes) {
#if defined(__SSE2__)
    if (bytes >= (64u << 10)) {
        size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
        std::memcpy(dst, src, head);
        dst += head;
        src += head;
        bytes -= head;
        size_t blocks = bytes / 64;
        for (size_t i = 0; i < blocks; ++i, dst += 64, src += 64) {
            __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
            __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
            __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
            __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
        }
        _mm_sfence();
        std::memcpy(dst, src, bytes % 64);
        return;
    }
#endif
    std::memcpy(dst, src, bytes);
}

// write_rows(dsts tuple, start, srcs tuple) -> None: dsts[j][start:start+n] = srcs[j] for every
// leaf (no wrap; n = len(srcs[j]), the same for all). Shapes/dtypes must already match the
// schema (the caller checked them); this checks only sizes and bounds. GIL released.
PyObject* write_rows(PyObject*, PyObject* args) {
    PyObject *o_dsts, *o_srcs;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!nO!", &PyTuple_Type, &o_dsts, &start, &PyTuple_Type, &o_srcs)) return nullptr;
    Py_ssize_t L = PyTuple_GET_SIZE(o_dsts);
    if (PyTuple_GET_SIZE(o_srcs) != L || L > 64) {
        PyErr_SetString(PyExc_ValueError, "dsts and srcs must hold the same number (<= 64) of leaves");
        return nullptr;
    }
    Buf bd[64], bs[64];
    Rows rd[64], rs[64];
    for (Py_ssize_t j = 0; j < L; ++j) {
        if (!get_rows(PyTuple_GET_ITEM(o_dsts, j), bd[j], true, rd[j], "dsts", j) ||
            !get_rows(PyTuple_GET_ITEM(o_srcs, j), bs[j], false, rs[j], "srcs", j))
            return nullptr;
        if (rs[j].nrows != rs[0].nrows || (rs[j].nrows && rs[j].rowbytes != rd[j].rowbytes) || start < 0 ||
            start + rs[j].nrows > rd[j].nrows) {
            PyErr_Format(PyExc_ValueError, "srcs[%zd] does not fit dsts[%zd] at row %zd", j, j, start);
            return nullptr;
        }
    }
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t j = 0; j < L; ++j)
        stream_copy(rd[j].base + start * rd[j].rowbytes, rs[j].base, (size_t)(rs[j].nrows * rs[j].rowbytes));
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

}  // namespace echo_native
