// Shared by the compiled kernels' translation units (sumtree.cpp, rows.cpp, batch_math.cpp,
// module.cpp): buffer helpers, the sum-tree layout and the kernel declarations.
//
// Tree layout (same as sumtree_ref.py): an 8-ary tree in one float64 array, level by level;
// `offs[l]` is where level l starts (root total at 0); node j of level l has children 8j..8j+7 of
// level l+1, one 64-byte line. Parents are recomputed as the pairwise sum of their 8 children,
// never updated by deltas, so sums do not drift and both backends agree bit for bit.
// Descent: child j = #{i < 7 : m >= S_(i+1)} (S the running prefix sums), stepped back to the
// last positive child if c_j is 0, then m -= S_j.
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cmath>
#include <cstdint>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <cstring>
#include <vector>

namespace echo_native {

// RAII over Py_buffer.
struct Buf {
    Py_buffer view{};
    bool ok = false;
    ~Buf() {
        if (ok) PyBuffer_Release(&view);
    }
    bool get(PyObject* obj, int flags) {
        ok = PyObject_GetBuffer(obj, &view, flags) == 0;
        return ok;
    }
};

inline char fmt_char(const char* f) {
    if (f == nullptr) return 'B';
    while (*f == '@' || *f == '=' || *f == '<' || *f == '!') ++f;  // native little-endian host
    if (*f == '>') return 0;
    return *f;
}

inline bool is_int64(const Py_buffer& v) {
    char c = fmt_char(v.format);
    return v.itemsize == 8 && (c == 'q' || c == 'l');
}

inline bool is_f64(const Py_buffer& v) { return v.itemsize == 8 && fmt_char(v.format) == 'd'; }

// Get a C-contiguous 1-D buffer of the given kind; sets a Python error naming `name` on failure.
inline bool get_vec(PyObject* obj, Buf& b, bool writable, bool f64, const char* name) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (!b.get(obj, flags)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s buffer", name,
                     writable ? " writable" : "");
        return false;
    }
    if (b.view.ndim != 1 || (f64 ? !is_f64(b.view) : !is_int64(b.view))) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D %s array", name, f64 ? "float64" : "int64");
        return false;
    }
    return true;
}

constexpr int B = 8;  // refresh_many shifts by 3: keep in step
constexpr int MAXD = 40;

struct Tree {
    double* t = nullptr;
    Py_ssize_t len = 0, P = 0;  // P: number of leaf slots (level d)
    int d = 0;
    int64_t off[MAXD + 1];
};

// Parse (tree, offs); sets a Python error on a malformed layout.
bool get_tree(PyObject* o_tree, PyObject* o_offs, Buf& bt, Buf& bo, Tree& T);

// Pairwise, in this exact order (the numpy reference adds the same way): three dependent adds
// instead of seven, and SIMD-friendly.
inline double group_sum(const double* c) {
    return ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
}

inline void refresh_up(Tree& T, int64_t leaf) {
    int64_t node = leaf;
    for (int l = T.d - 1; l >= 0; --l) {
        node /= B;
        T.t[T.off[l] + node] = group_sum(T.t + T.off[l + 1] + node * B);
    }
}

// Row layout of a C-contiguous array with a leading row axis.
struct Rows {
    char* base;
    Py_ssize_t nrows, rowbytes;
};

bool get_rows(PyObject* obj, Buf& b, bool writable, Rows& r, const char* what, Py_ssize_t j);

inline void copy_row(char* dst, const char* src, Py_ssize_t rb) {
    switch (rb) {
        case 1: *dst = *src; break;
        case 4: std::memcpy(dst, src, 4); break;
        case 8: std::memcpy(dst, src, 8); break;
        default: std::memcpy(dst, src, rb);
    }
}

// The kernels (module.cpp lists them with their signatures).
PyObject* tree_set(PyObject*, PyObject* args);
PyObject* tree_set_range(PyObject*, PyObject* args);
PyObject* tree_find(PyObject*, PyObject* args);
PyObject* tree_sample(PyObject*, PyObject* args);
PyObject* first_invalid(PyObject*, PyObject* args);
PyObject* update_priorities(PyObject*, PyObject* args);
PyObject* per_update(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* sample_region(PyObject*, PyObject* args);
PyObject* scan(PyObject*, PyObject* args);
PyObject* gather(PyObject*, PyObject* args);
PyObject* add_one(PyObject*, PyObject* args);
PyObject* write_rows(PyObject*, PyObject* args);
PyObject* attention_cost(PyObject*, PyObject* args);
PyObject* effective_cost(PyObject*, PyObject* args);
PyObject* bw_priorities(PyObject*, PyObject* args);
PyObject* bw_efficiency(PyObject*, PyObject* args);
PyObject* plan_surprise(PyObject*, PyObject* args);
PyObject* ema_update(PyObject*, PyObject* args);
PyObject* prefix_match(PyObject*, PyObject* args);
PyObject* cdf_sample(PyObject*, PyObject* args);

}  // namespace echo_native
