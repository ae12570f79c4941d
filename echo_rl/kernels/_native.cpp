// Compiled fast path for the replay kernels: sum-tree set/find/sample, priority updates, row
// gathers and the single-transition add; and for the batch math kernels of bandwidth.py,
// planning.py, sampling.py and sequence.py (see "Batch math kernels" below). Built by setup.py as the optional extension
// ``echo_rl.kernels._native`` with nothing but a C++ compiler: the CPython C API and the buffer
// protocol (no numpy headers). Every function mirrors a numpy reference in sumtree_ref.py or in
// echo_rl/core/replay; the property tests compare them on random inputs.
//
// Tree layout (same as sumtree_ref.py): an 8-ary tree in one float64 array, level by level;
// `offs[l]` is where level l starts (root total at 0); node j of level l has children 8j..8j+7 of
// level l+1, one 64-byte line. Parents are recomputed as the pairwise sum of their 8 children,
// never updated by deltas, so sums do not drift and both backends agree bit for bit.
// Descent: child j = #{i < 7 : m >= S_(i+1)} (S the running prefix sums), stepped back to the
// last positive child if c_j is 0, then m -= S_j.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cmath>
#include <cstdint>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <cstring>
#include <vector>

namespace {

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

char fmt_char(const char* f) {
    if (f == nullptr) return 'B';
    while (*f == '@' || *f == '=' || *f == '<' || *f == '!') ++f;  // native little-endian host
    if (*f == '>') return 0;
    return *f;
}

bool is_int64(const Py_buffer& v) {
    char c = fmt_char(v.format);
    return v.itemsize == 8 && (c == 'q' || c == 'l');
}

bool is_f64(const Py_buffer& v) { return v.itemsize == 8 && fmt_char(v.format) == 'd'; }

// Get a C-contiguous 1-D buffer of the given kind; sets a Python error naming `name` on failure.
bool get_vec(PyObject* obj, Buf& b, bool writable, bool f64, const char* name) {
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
bool get_tree(PyObject* o_tree, PyObject* o_offs, Buf& bt, Buf& bo, Tree& T) {
    if (!get_vec(o_tree, bt, true, true, "tree") || !get_vec(o_offs, bo, false, false, "offs")) return false;
    Py_ssize_t nl = bo.view.shape[0];
    const int64_t* off = static_cast<const int64_t*>(bo.view.buf);
    T.len = bt.view.shape[0];
    if (nl < 2 || nl > MAXD + 1 || off[0] != 0) {
        PyErr_SetString(PyExc_ValueError, "offs must start at 0 and list 2..41 levels");
        return false;
    }
    T.d = int(nl - 1);
    for (Py_ssize_t l = 0; l < nl; ++l) {
        T.off[l] = off[l];
        if (l > 0 && (off[l] <= off[l - 1] || off[l] >= T.len)) {
            PyErr_SetString(PyExc_ValueError, "offs must increase and lie inside the tree");
            return false;
        }
    }
    T.P = T.len - T.off[T.d];
    // level l+1 must hold 8 children per node of level l
    for (int l = 0; l < T.d; ++l) {
        Py_ssize_t nxt = (l + 1 < T.d ? T.off[l + 2] : T.len) - T.off[l + 1];
        if (nxt % B != 0 || nxt / B > T.off[l + 1] - T.off[l]) {
            PyErr_SetString(PyExc_ValueError, "tree/offs do not describe an 8-ary layout");
            return false;
        }
    }
    T.t = static_cast<double*>(bt.view.buf);
    return true;
}

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

// Refresh the ancestors of many leaves level by level, so the cache misses of different paths
// overlap. Near the root the paths merge: there each parent is recomputed once (a small marker
// array per level); lower down, where paths rarely meet, duplicates are recomputed harmlessly.
void refresh_many(Tree& T, std::vector<int64_t>& nodes) {
    constexpr Py_ssize_t SMALL = 4096;
    uint8_t mark[SMALL];
    std::vector<int64_t> uniq;
    double* const t = T.t;
    for (int l = T.d - 1; l >= 0; --l) {
        const int64_t off = T.off[l], child_off = T.off[l + 1];
        const Py_ssize_t count = child_off - off;
        int64_t* nd = nodes.data();
        const Py_ssize_t k = (Py_ssize_t)nodes.size();
        for (Py_ssize_t i = 0; i < k; ++i) {
            nd[i] >>= 3;  // / B (node ids are non-negative)
            __builtin_prefetch(t + off + nd[i], 1);
        }
        if (count <= SMALL && k > 8) {
            std::memset(mark, 0, (size_t)count);
            uniq.clear();
            for (Py_ssize_t i = 0; i < k; ++i)
                if (!mark[nd[i]]) {
                    mark[nd[i]] = 1;
                    uniq.push_back(nd[i]);
                }
            nodes.swap(uniq);
            nd = nodes.data();
        }
        const Py_ssize_t m = (Py_ssize_t)nodes.size();
        for (Py_ssize_t i = 0; i < m; ++i) t[off + nd[i]] = group_sum(t + child_off + nd[i] * B);
    }
}

void descend(const Tree& T, double* m, int64_t* node, Py_ssize_t n) {
    const double* t = T.t;
    for (Py_ssize_t k = 0; k < n; ++k) node[k] = 0;
    for (int l = 0; l < T.d; ++l) {
        const double* base = t + T.off[l + 1];
        const double* nbase = l + 1 < T.d ? t + T.off[l + 2] : nullptr;
        for (Py_ssize_t k = 0; k < n; ++k) {
            const double* c = base + node[k] * B;
            double S[B];
            double s = 0.0;
            for (int i = 0; i < B; ++i) {
                s += c[i];
                S[i] = s;
            }
            double mk = m[k];
            int j = 0;
            for (int i = 0; i < B - 1; ++i) j += (mk >= S[i]);
            while (j > 0 && !(c[j] > 0.0)) --j;  // rounding pushed m to the total: last positive child
            m[k] = mk - (j ? S[j - 1] : 0.0);
            int64_t nx = node[k] * B + j;
            node[k] = nx;
            if (nbase) __builtin_prefetch(nbase + nx * B);
        }
    }
}

// tree_set(tree, offs, leaves int64[k], values float64[k]) -> None
PyObject* tree_set(PyObject*, PyObject* args) {
    PyObject *o_tree, *o_offs, *o_leaves, *o_vals;
    if (!PyArg_ParseTuple(args, "OOOO", &o_tree, &o_offs, &o_leaves, &o_vals)) return nullptr;
    Buf bt, bo, bl, bv;
    Tree T;
    if (!get_tree(o_tree, o_offs, bt, bo, T) || !get_vec(o_leaves, bl, false, false, "leaves") ||
        !get_vec(o_vals, bv, false, true, "values"))
        return nullptr;
    Py_ssize_t k = bl.view.shape[0];
    if (bv.view.shape[0] != k) {
        PyErr_SetString(PyExc_ValueError, "leaves and values must have the same length");
        return nullptr;
    }
    const int64_t* leaves = static_cast<const int64_t*>(bl.view.buf);
    for (Py_ssize_t i = 0; i < k; ++i)
        if (leaves[i] < 0 || leaves[i] >= T.P) {
            PyErr_Format(PyExc_IndexError, "leaves[%zd]=%lld out of range [0, %zd)", i, (long long)leaves[i], T.P);
            return nullptr;
        }
    const double* v = static_cast<const double*>(bv.view.buf);
    Py_BEGIN_ALLOW_THREADS;
    std::vector<int64_t> nodes(leaves, leaves + k);
    for (Py_ssize_t i = 0; i < k; ++i) T.t[T.off[T.d] + leaves[i]] = v[i];
    refresh_many(T, nodes);
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

// tree_set_range(tree, offs, start, values float64[n]) -> None   (contiguous leaves, no wrap)
PyObject* tree_set_range(PyObject*, PyObject* args) {
    PyObject *o_tree, *o_offs, *o_vals;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OOnO", &o_tree, &o_offs, &start, &o_vals)) return nullptr;
    Buf bt, bo, bv;
    Tree T;
    if (!get_tree(o_tree, o_offs, bt, bo, T) || !get_vec(o_vals, bv, false, true, "values")) return nullptr;
    Py_ssize_t n = bv.view.shape[0];
    if (start < 0 || start + n > T.P) {
        PyErr_Format(PyExc_IndexError, "range [%zd, %zd) outside the %zd leaves", start, start + n, T.P);
        return nullptr;
    }
    if (n == 0) Py_RETURN_NONE;
    const double* v = static_cast<const double*>(bv.view.buf);
    Py_BEGIN_ALLOW_THREADS;
    std::memcpy(T.t + T.off[T.d] + start, v, sizeof(double) * n);
    int64_t lo = start, hi = start + n - 1;
    for (int l = T.d - 1; l >= 0; --l) {
        lo /= B;
        hi /= B;
        for (int64_t i = lo; i <= hi; ++i) T.t[T.off[l] + i] = group_sum(T.t + T.off[l + 1] + i * B);
    }
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

// tree_find(tree, offs, masses float64[n], out_leaves int64[n]) -> None
PyObject* tree_find(PyObject*, PyObject* args) {
    PyObject *o_tree, *o_offs, *o_m, *o_out;
    if (!PyArg_ParseTuple(args, "OOOO", &o_tree, &o_offs, &o_m, &o_out)) return nullptr;
    Buf bt, bo, bm, bout;
    Tree T;
    if (!get_tree(o_tree, o_offs, bt, bo, T) || !get_vec(o_m, bm, false, true, "masses") ||
        !get_vec(o_out, bout, true, false, "out_leaves"))
        return nullptr;
    Py_ssize_t n = bm.view.shape[0];
    if (bout.view.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "masses and out_leaves must have the same length");
        return nullptr;
    }
    std::vector<double> m(static_cast<const double*>(bm.view.buf), static_cast<const double*>(bm.view.buf) + n);
    int64_t* out = static_cast<int64_t*>(bout.view.buf);
    Py_BEGIN_ALLOW_THREADS;
    descend(T, m.data(), out, n);
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

// tree_sample(tree, offs, uniforms float64[n], out_leaves int64[n], out_values float64[n]) -> total
// Stratum k draws mass (k + u_k) * total / n; all n walks descend together level by level so
// their cache misses overlap.
PyObject* tree_sample(PyObject*, PyObject* args) {
    PyObject *o_tree, *o_offs, *o_u, *o_out, *o_vals;
    if (!PyArg_ParseTuple(args, "OOOOO", &o_tree, &o_offs, &o_u, &o_out, &o_vals)) return nullptr;
    Buf bt, bo, bu, bout, bv;
    Tree T;
    if (!get_tree(o_tree, o_offs, bt, bo, T) || !get_vec(o_u, bu, false, true, "uniforms") ||
        !get_vec(o_out, bout, true, false, "out_leaves") || !get_vec(o_vals, bv, true, true, "out_values"))
        return nullptr;
    Py_ssize_t n = bu.view.shape[0];
    if (bout.view.shape[0] != n || bv.view.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "uniforms, out_leaves and out_values must have the same length");
        return nullptr;
    }
    double total = T.t[0];
    if (!(total > 0.0)) {
        PyErr_SetString(PyExc_ValueError, "cannot sample: all priorities are zero");
        return nullptr;
    }
    const double* u = static_cast<const double*>(bu.view.buf);
    int64_t* out = static_cast<int64_t*>(bout.view.buf);
    double* vals = static_cast<double*>(bv.view.buf);
    Py_BEGIN_ALLOW_THREADS;
    std::vector<double> m(n);
    double step = total / double(n);
    for (Py_ssize_t k = 0; k < n; ++k) m[k] = (double(k) + u[k]) * step;
    descend(T, m.data(), out, n);
    for (Py_ssize_t k = 0; k < n; ++k) vals[k] = T.t[T.off[T.d] + out[k]];
    Py_END_ALLOW_THREADS;
    return PyFloat_FromDouble(total);
}

// first_invalid(values float64[n]) -> index of the first NaN/inf/negative, or -1
PyObject* first_invalid(PyObject*, PyObject* args) {
    PyObject* o;
    if (!PyArg_ParseTuple(args, "O", &o)) return nullptr;
    Buf b;
    if (!get_vec(o, b, false, true, "values")) return nullptr;
    const double* v = static_cast<const double*>(b.view.buf);
    Py_ssize_t n = b.view.shape[0];
    for (Py_ssize_t i = 0; i < n; ++i)
        if (!(std::isfinite(v[i]) && v[i] >= 0.0)) return PyLong_FromSsize_t(i);
    return PyLong_FromLong(-1);
}

// update_priorities(tree, offs, raw, ids, priorities, leafvals, lo, hi, valid_end, ring_capacity,
//                   leaf_modulus) -> (bad_id_pos, n_applied)
// The caller has checked the priorities and computed the leaf values (p+eps)^alpha or
// exp((s-c)/T) with numpy's vectorised math. Ids must lie in [0, valid_end): otherwise nothing is
// written and the first bad position is returned. Ids outside [lo, hi) (evicted, or held by
// another region) are skipped. raw[id % ring_capacity] = p (raw may be None); leaf id % leaf_modulus = leafval.
PyObject* update_priorities(PyObject*, PyObject* args) {
    PyObject *o_tree, *o_offs, *o_raw, *o_ids, *o_p, *o_v;
    long long lo, hi, valid_end, ring, lmod;
    if (!PyArg_ParseTuple(args, "OOOOOOLLLLL", &o_tree, &o_offs, &o_raw, &o_ids, &o_p, &o_v, &lo, &hi,
                          &valid_end, &ring, &lmod))
        return nullptr;
    Buf bt, bo, br, bi, bp, bv;
    Tree T;
    if (!get_tree(o_tree, o_offs, bt, bo, T) || (o_raw != Py_None && !get_vec(o_raw, br, true, true, "raw")) ||
        !get_vec(o_ids, bi, false, false, "indices") || !get_vec(o_p, bp, false, true, "priorities") ||
        !get_vec(o_v, bv, false, true, "leafvals"))
        return nullptr;
    Py_ssize_t k = bi.view.shape[0];
    if (bp.view.shape[0] != k || bv.view.shape[0] != k) {
        PyErr_SetString(PyExc_ValueError, "indices, priorities and leafvals must have the same length");
        return nullptr;
    }
    if (lmod < 1 || lmod > T.P || ring < lmod || (br.ok && br.view.shape[0] < ring) || lo < 0 || hi - lo > lmod) {
        PyErr_SetString(PyExc_ValueError, "need 1 <= leaf_modulus <= leaves, ring_capacity >= leaf_modulus, "
                                          "0 <= lo and hi - lo <= leaf_modulus");
        return nullptr;
    }
    const int64_t* ids = static_cast<const int64_t*>(bi.view.buf);
    const double* p = static_cast<const double*>(bp.view.buf);
    const double* v = static_cast<const double*>(bv.view.buf);
    double* raw = br.ok ? static_cast<double*>(br.view.buf) : nullptr;
    Py_ssize_t bad_i = -1, applied = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < k; ++i)
        if (ids[i] < 0 || ids[i] >= valid_end) { bad_i = i; break; }
    if (bad_i < 0) {
        std::vector<int64_t> nodes;
        nodes.reserve(k);
        // ids in [lo, hi) are at most lmod <= ring apart: wrap by one subtraction, no division
        const int64_t lo_leaf = lo % lmod, lo_slot = lo % ring;
        double* leaves = T.t + T.off[T.d];
        for (Py_ssize_t i = 0; i < k; ++i) {  // touch the target lines first so the misses overlap
            int64_t d = ids[i] - lo;
            if (d < 0 || d >= hi - lo) continue;
            int64_t slot = lo_slot + d, leaf = lo_leaf + d;
            if (raw) __builtin_prefetch(raw + (slot >= ring ? slot - ring : slot), 1);
            __builtin_prefetch(leaves + (leaf >= lmod ? leaf - lmod : leaf), 1);
        }
        for (Py_ssize_t i = 0; i < k; ++i) {
            int64_t id = ids[i];
            if (id < lo || id >= hi) continue;
            int64_t d = id - lo;
            int64_t slot = lo_slot + d;
            if (slot >= ring) slot -= ring;
            int64_t leaf = lo_leaf + d;
            if (leaf >= lmod) leaf -= lmod;
            if (raw) raw[slot] = p[i];
            leaves[leaf] = v[i];
            nodes.push_back(leaf);
        }
        applied = (Py_ssize_t)nodes.size();
        refresh_many(T, nodes);
    }
    Py_END_ALLOW_THREADS;
    return Py_BuildValue("(nn)", bad_i, applied);
}

// per_update(tree, offs, raw, ids, priorities, lo, hi, valid_end, ring, leaf_mod, alpha, eps)
//   -> None | (bad_priority_pos, bad_id_pos, n_applied, max_priority)
// The whole proportional-PER update in one call: checks every priority (finite, >= 0) and id (in
// [0, valid_end)) first and writes nothing if one fails; then raw[slot] = p (raw may be None) and leaf =
// (p + eps)^alpha for ids in [lo, hi) (others skipped), and refreshes the ancestors. Returns None
// when ids/priorities are not 1-D int64/float64 C-contiguous arrays (the caller converts them).
PyObject* per_update(PyObject*, PyObject* args) {
    PyObject *o_tree, *o_offs, *o_raw, *o_ids, *o_p;
    long long lo, hi, valid_end, ring, lmod;
    double alpha, eps;
    if (!PyArg_ParseTuple(args, "OOOOOLLLLLdd", &o_tree, &o_offs, &o_raw, &o_ids, &o_p, &lo, &hi, &valid_end,
                          &ring, &lmod, &alpha, &eps))
        return nullptr;
    Buf bt, bo, br, bi, bp;
    Tree T;
    if (!get_tree(o_tree, o_offs, bt, bo, T)) return nullptr;
    if (o_raw != Py_None && !get_vec(o_raw, br, true, true, "raw")) return nullptr;
    if (!bi.get(o_ids, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) || !bp.get(o_p, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (bi.view.ndim != 1 || bp.view.ndim != 1 || !is_int64(bi.view) || !is_f64(bp.view)) Py_RETURN_NONE;
    Py_ssize_t k = bi.view.shape[0];
    if (bp.view.shape[0] != k) {
        PyErr_SetString(PyExc_ValueError, "indices and priorities must have the same length");
        return nullptr;
    }
    if (lmod < 1 || lmod > T.P || ring < lmod || (br.ok && br.view.shape[0] < ring) || lo < 0 || hi - lo > lmod) {
        PyErr_SetString(PyExc_ValueError, "need 1 <= leaf_modulus <= leaves, ring_capacity >= leaf_modulus, "
                                          "0 <= lo and hi - lo <= leaf_modulus");
        return nullptr;
    }
    const int64_t* ids = static_cast<const int64_t*>(bi.view.buf);
    const double* p = static_cast<const double*>(bp.view.buf);
    double* raw = br.ok ? static_cast<double*>(br.view.buf) : nullptr;
    Py_ssize_t bad_p = -1, bad_i = -1, applied = 0;
    double mx = -HUGE_VAL;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < k; ++i) {
        if (!(std::isfinite(p[i]) && p[i] >= 0.0)) { bad_p = i; break; }
        if (ids[i] < 0 || ids[i] >= valid_end) { bad_i = i; break; }
        if (p[i] > mx) mx = p[i];
    }
    if (bad_p < 0 && bad_i < 0) {
        std::vector<int64_t> nodes;
        nodes.reserve(k);
        const int64_t lo_leaf = lo % lmod, lo_slot = lo % ring;
        double* leaves = T.t + T.off[T.d];
        // first touch every target line (random over large arrays) so the misses overlap
        for (Py_ssize_t i = 0; i < k; ++i) {
            int64_t d = ids[i] - lo;
            if (d < 0 || d >= hi - lo) continue;
            int64_t slot = lo_slot + d, leaf = lo_leaf + d;
            if (raw) __builtin_prefetch(raw + (slot >= ring ? slot - ring : slot), 1);
            __builtin_prefetch(leaves + (leaf >= lmod ? leaf - lmod : leaf), 1);
        }
        for (Py_ssize_t i = 0; i < k; ++i) {
            int64_t id = ids[i];
            if (id < lo || id >= hi) continue;
            int64_t d = id - lo;
            int64_t slot = lo_slot + d;
            if (slot >= ring) slot -= ring;
            int64_t leaf = lo_leaf + d;
            if (leaf >= lmod) leaf -= lmod;
            if (raw) raw[slot] = p[i];
            leaves[leaf] = alpha == 1.0 ? p[i] + eps : std::pow(p[i] + eps, alpha);
            nodes.push_back(leaf);
        }
        applied = (Py_ssize_t)nodes.size();
        refresh_many(T, nodes);
    }
    Py_END_ALLOW_THREADS;
    return Py_BuildValue("(nnnd)", bad_p, bad_i, applied, mx);
}

// sample_region(tree, offs, uniforms, lo, leaf_modulus, ring_capacity, prob_scale, out_ids, out_slots,
//               out_probs) -> None
// tree_sample plus the id bookkeeping of one region in the same pass: a leaf j of a region whose
// live ids are [lo, lo + leaf_modulus) holds id = lo + (j - lo) mod leaf_modulus, stored in ring
// slot id % ring_capacity, drawn with probability leaf value * prob_scale.
PyObject* sample_region(PyObject*, PyObject* args) {
    PyObject *o_tree, *o_offs, *o_u, *o_ids, *o_slots, *o_probs;
    long long lo, lmod, ring;
    double scale;
    if (!PyArg_ParseTuple(args, "OOOLLLdOOO", &o_tree, &o_offs, &o_u, &lo, &lmod, &ring, &scale, &o_ids,
                          &o_slots, &o_probs))
        return nullptr;
    Buf bt, bo, bu, bi, bs, bp;
    Tree T;
    if (!get_tree(o_tree, o_offs, bt, bo, T) || !get_vec(o_u, bu, false, true, "uniforms") ||
        !get_vec(o_ids, bi, true, false, "out_ids") || !get_vec(o_slots, bs, true, false, "out_slots") ||
        !get_vec(o_probs, bp, true, true, "out_probs"))
        return nullptr;
    Py_ssize_t n = bu.view.shape[0];
    if (bi.view.shape[0] != n || bs.view.shape[0] != n || bp.view.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "uniforms and the outputs must have the same length");
        return nullptr;
    }
    if (lmod < 1 || lmod > T.P || ring < 1) {
        PyErr_SetString(PyExc_ValueError, "leaf_modulus must be in [1, leaves] and ring_capacity >= 1");
        return nullptr;
    }
    double total = T.t[0];
    if (!(total > 0.0)) {
        PyErr_SetString(PyExc_ValueError, "cannot sample: all priorities are zero");
        return nullptr;
    }
    const double* u = static_cast<const double*>(bu.view.buf);
    int64_t* ids = static_cast<int64_t*>(bi.view.buf);
    int64_t* slots = static_cast<int64_t*>(bs.view.buf);
    double* probs = static_cast<double*>(bp.view.buf);
    Py_BEGIN_ALLOW_THREADS;
    std::vector<double> m(n);
    double step = total / double(n);
    for (Py_ssize_t k = 0; k < n; ++k) m[k] = (double(k) + u[k]) * step;
    descend(T, m.data(), ids, n);
    int64_t lo_mod = ((lo % lmod) + lmod) % lmod;
    const double* leaves = T.t + T.off[T.d];
    for (Py_ssize_t k = 0; k < n; ++k) {
        int64_t leaf = ids[k];
        probs[k] = leaves[leaf] * scale;
        int64_t off = leaf - lo_mod;
        if (off < 0) off += lmod;
        int64_t id = lo + off;
        ids[k] = id;
        slots[k] = id % ring;
    }
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

// Row layout of a C-contiguous array with a leading row axis.
struct Rows {
    char* base;
    Py_ssize_t nrows, rowbytes;
};

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

inline void copy_row(char* dst, const char* src, Py_ssize_t rb) {
    switch (rb) {
        case 1: *dst = *src; break;
        case 4: std::memcpy(dst, src, 4); break;
        case 8: std::memcpy(dst, src, 8); break;
        default: std::memcpy(dst, src, rb);
    }
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
void stream_copy(char* dst, const char* src, size_t bytes) {
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

// scan(values float64[n]) -> (index of the first NaN/inf/negative or -1, max of the values)
PyObject* scan(PyObject*, PyObject* args) {
    PyObject* o;
    if (!PyArg_ParseTuple(args, "O", &o)) return nullptr;
    Buf b;
    if (!get_vec(o, b, false, true, "values")) return nullptr;
    const double* v = static_cast<const double*>(b.view.buf);
    Py_ssize_t n = b.view.shape[0], bad = -1;
    double mx = -HUGE_VAL;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!(std::isfinite(v[i]) && v[i] >= 0.0)) { bad = i; break; }
        if (v[i] > mx) mx = v[i];
    }
    return Py_BuildValue("(nd)", bad, mx);
}

// ---- Batch math kernels (bandwidth.py, planning.py, sampling.py, sequence.py) -----------------
// Each one checks its inputs in the same pass as it computes (numpy needs a pass per check plus
// temporaries). On a bad value it returns the first offending index and the Python wrapper re-runs
// the numpy path, which raises the named one-line error, so both paths fail alike. The scalar
// forms (one length, one plan) stay numpy/Python: a C call saves nothing there.

// Any-rank C-contiguous float64 buffer, read flat; n = number of elements.
bool get_flat(PyObject* obj, Buf& b, bool writable, const char* name, Py_ssize_t& n) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (!b.get(obj, flags)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s float64 buffer", name, writable ? " writable" : "");
        return false;
    }
    if (!is_f64(b.view)) {
        PyErr_Format(PyExc_TypeError, "%s must hold float64", name);
        return false;
    }
    n = b.view.len / 8;
    return true;
}

inline bool ok_nonneg(double v) { return std::isfinite(v) && v >= 0.0; }

// attention_cost(t, scale, out) -> -1 or the first t that is not a finite integer >= 0
PyObject* attention_cost(PyObject*, PyObject* args) {
    PyObject *o_t, *o_out;
    double s;
    if (!PyArg_ParseTuple(args, "OdO", &o_t, &s, &o_out)) return nullptr;
    Buf bt, bo;
    Py_ssize_t n, no;
    if (!get_flat(o_t, bt, false, "t", n) || !get_flat(o_out, bo, true, "out", no)) return nullptr;
    if (no != n) return PyErr_Format(PyExc_ValueError, "out must have %zd elements", n);
    const double* t = static_cast<const double*>(bt.view.buf);
    double* out = static_cast<double*>(bo.view.buf);
    for (Py_ssize_t i = 0; i < n; ++i) {
        double v = t[i];
        if (!(ok_nonneg(v) && v == std::floor(v))) return PyLong_FromSsize_t(i);
        out[i] = s * v * (v + 1.0) / 2.0;  // same operation order as the numpy reference
    }
    return PyLong_FromLong(-1);
}

// effective_cost(t, t_prefix, scale, out) -> -1 or the first bad index (same shapes)
PyObject* effective_cost(PyObject*, PyObject* args) {
    PyObject *o_t, *o_p, *o_out;
    double s;
    if (!PyArg_ParseTuple(args, "OOdO", &o_t, &o_p, &s, &o_out)) return nullptr;
    Buf bt, bp, bo;
    Py_ssize_t n, np_, no;
    if (!get_flat(o_t, bt, false, "t", n) || !get_flat(o_p, bp, false, "t_prefix", np_) ||
        !get_flat(o_out, bo, true, "out", no))
        return nullptr;
    if (np_ != n || no != n) return PyErr_Format(PyExc_ValueError, "t, t_prefix and out must have %zd elements", n);
    const double* t = static_cast<const double*>(bt.view.buf);
    const double* p = static_cast<const double*>(bp.view.buf);
    double* out = static_cast<double*>(bo.view.buf);
    for (Py_ssize_t i = 0; i < n; ++i) {
        double a = t[i], c = p[i];
        if (!(ok_nonneg(a) && a == std::floor(a) && ok_nonneg(c) && c == std::floor(c) && c <= a))
            return PyLong_FromSsize_t(i);
        out[i] = s * a * (a + 1.0) / 2.0 - s * c * (c + 1.0) / 2.0;
    }
    return PyLong_FromLong(-1);
}

// bw_priorities(r, b, q, eps, out) -> -1 or the first bad index: out = r / (b + q + eps)
PyObject* bw_priorities(PyObject*, PyObject* args) {
    PyObject *o_r, *o_b, *o_q, *o_out;
    double e;
    if (!PyArg_ParseTuple(args, "OOOdO", &o_r, &o_b, &o_q, &e, &o_out)) return nullptr;
    Buf br, bb, bq, bo;
    Py_ssize_t n, nb, nq, no;
    if (!get_flat(o_r, br, false, "rewards", n) || !get_flat(o_b, bb, false, "b_eff", nb) ||
        !get_flat(o_q, bq, false, "queue", nq) || !get_flat(o_out, bo, true, "out", no))
        return nullptr;
    if (nb != n || nq != n || no != n) return PyErr_Format(PyExc_ValueError, "all arrays must have %zd elements", n);
    const double* r = static_cast<const double*>(br.view.buf);
    const double* b = static_cast<const double*>(bb.view.buf);
    const double* q = static_cast<const double*>(bq.view.buf);
    double* out = static_cast<double*>(bo.view.buf);
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (!(std::isfinite(r[i]) && ok_nonneg(b[i]) && ok_nonneg(q[i]))) return PyLong_FromSsize_t(i);
        out[i] = r[i] / (b[i] + q[i] + e);
    }
    return PyLong_FromLong(-1);
}

// Pairwise sum with numpy's blocking (8 accumulators, blocks of 128): as accurate as np.sum.
double pairwise_sum(const double* a, Py_ssize_t n) {
    if (n < 8) {
        double s = 0.0;
        for (Py_ssize_t i = 0; i < n; ++i) s += a[i];
        return s;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; ++j) r[j] = a[j];
        Py_ssize_t i = 8;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) r[j] += a[i + j];
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) s += a[i];
        return s;
    }
    Py_ssize_t h = n / 2;
    h -= h % 8;
    return pairwise_sum(a, h) + pairwise_sum(a + h, n - h);
}

// bw_efficiency(r, b, losses|None, weights|None, weight) -> eta_bw, or None when an input is bad or
// the denominator is zero (the numpy path then raises the error). weights: one per loss, or None
// to use the scalar weight.
PyObject* bw_efficiency(PyObject*, PyObject* args) {
    PyObject *o_r, *o_b, *o_l, *o_w;
    double w0;
    if (!PyArg_ParseTuple(args, "OOOOd", &o_r, &o_b, &o_l, &o_w, &w0)) return nullptr;
    Buf br, bb, bl, bw;
    Py_ssize_t nr, nb, nl = 0, nw = 0;
    if (!get_flat(o_r, br, false, "episode_rewards", nr) || !get_flat(o_b, bb, false, "episode_bandwidth", nb))
        return nullptr;
    if (o_l != Py_None && !get_flat(o_l, bl, false, "pg_losses", nl)) return nullptr;
    if (o_w != Py_None && !get_flat(o_w, bw, false, "pg_weights", nw)) return nullptr;
    if (nr == 0 || nb == 0 || (o_w != Py_None && nw != nl)) Py_RETURN_NONE;
    const double* r = static_cast<const double*>(br.view.buf);
    const double* b = static_cast<const double*>(bb.view.buf);
    for (Py_ssize_t i = 0; i < nr; ++i)
        if (!std::isfinite(r[i])) Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < nb; ++i)
        if (!ok_nonneg(b[i])) Py_RETURN_NONE;
    double denom = pairwise_sum(b, nb) / double(nb);
    if (nl) {
        const double* l = static_cast<const double*>(bl.view.buf);
        const double* w = o_w != Py_None ? static_cast<const double*>(bw.view.buf) : nullptr;
        if (!ok_nonneg(w0)) Py_RETURN_NONE;
        std::vector<double> t(nl);
        for (Py_ssize_t i = 0; i < nl; ++i) {
            double wi = w ? w[i] : w0;
            if (!std::isfinite(l[i]) || !ok_nonneg(wi)) Py_RETURN_NONE;
            t[i] = wi * std::fabs(l[i]);
        }
        denom += pairwise_sum(t.data(), nl) / double(nl);
    }
    if (denom == 0.0) Py_RETURN_NONE;
    return PyFloat_FromDouble(pairwise_sum(r, nr) / double(nr) / denom);
}

// plan_surprise(plans [N*D], d, mean [D], rewards [N]|None, sw, rw, out [N]) -> -1 or the first
// flat index of a non-finite plan value (N*D + i for rewards[i])
PyObject* plan_surprise(PyObject*, PyObject* args) {
    PyObject *o_p, *o_m, *o_r, *o_out;
    Py_ssize_t d;
    double sw, rw;
    if (!PyArg_ParseTuple(args, "OnOOddO", &o_p, &d, &o_m, &o_r, &sw, &rw, &o_out)) return nullptr;
    Buf bp, bm, br, bo;
    Py_ssize_t np_, nm, nr = 0, n;
    if (!get_flat(o_p, bp, false, "plans", np_) || !get_flat(o_m, bm, false, "ema_plan", nm) ||
        !get_flat(o_out, bo, true, "out", n))
        return nullptr;
    if (o_r != Py_None && !get_flat(o_r, br, false, "rewards", nr)) return nullptr;
    if (d < 1 || nm != d || np_ != n * d || (o_r != Py_None && nr != n))
        return PyErr_Format(PyExc_ValueError, "need plans [N, D], ema_plan [D], rewards [N], out [N]");
    const double* p = static_cast<const double*>(bp.view.buf);
    const double* m = static_cast<const double*>(bm.view.buf);
    const double* r = o_r != Py_None ? static_cast<const double*>(br.view.buf) : nullptr;
    double* out = static_cast<double*>(bo.view.buf);
    for (Py_ssize_t i = 0; i < n; ++i) {
        const double* row = p + i * d;
        double a[4] = {0.0, 0.0, 0.0, 0.0};
        Py_ssize_t j = 0;
        for (; j + 4 <= d; j += 4)
            for (int k = 0; k < 4; ++k) {
                double x = row[j + k] - m[j + k];
                a[k] += x * x;
            }
        double s = (a[0] + a[1]) + (a[2] + a[3]);
        for (; j < d; ++j) {
            double x = row[j] - m[j];
            s += x * x;
        }
        if (!std::isfinite(s))  // a NaN/inf plan value (or overflow): find it for the error
            for (Py_ssize_t k = 0; k < d; ++k)
                if (!std::isfinite(row[k])) return PyLong_FromSsize_t(i * d + k);
        double v = sw * s;
        if (r) {
            if (!std::isfinite(r[i])) return PyLong_FromSsize_t(n * d + i);
            v += rw * std::fabs(r[i]);
        }
        out[i] = v;
    }
    return PyLong_FromLong(-1);
}

// ema_update(mean [D] (written), plans [N*D], decay) -> -1 or the first non-finite flat index.
// mean <- decay*mean + (1-decay)*x row by row: bit for bit what N single updates give.
PyObject* ema_update(PyObject*, PyObject* args) {
    PyObject *o_m, *o_p;
    double dec;
    if (!PyArg_ParseTuple(args, "OOd", &o_m, &o_p, &dec)) return nullptr;
    Buf bm, bp;
    Py_ssize_t d, np_;
    if (!get_flat(o_m, bm, true, "mean", d) || !get_flat(o_p, bp, false, "plans", np_)) return nullptr;
    if (d < 1 || np_ % d) return PyErr_Format(PyExc_ValueError, "plans must hold whole rows of %zd", d);
    const double* p = static_cast<const double*>(bp.view.buf);
    for (Py_ssize_t i = 0; i < np_; ++i)
        if (!std::isfinite(p[i])) return PyLong_FromSsize_t(i);
    double* m = static_cast<double*>(bm.view.buf);
    const double c = 1.0 - dec;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < np_; i += d)
        for (Py_ssize_t j = 0; j < d; ++j) m[j] = dec * m[j] + c * p[i + j];
    Py_END_ALLOW_THREADS;
    return PyLong_FromLong(-1);
}

// prefix_match(query int64[n], candidates sequence, out int64[k]) -> None. out[i] = common prefix
// length for 1-D int64/int32 buffers; -1 for any other candidate (Python handles it and its error).
PyObject* prefix_match(PyObject*, PyObject* args) {
    PyObject *o_q, *o_c, *o_out;
    if (!PyArg_ParseTuple(args, "OOO", &o_q, &o_c, &o_out)) return nullptr;
    Buf bq, bo;
    if (!get_vec(o_q, bq, false, false, "query") || !get_vec(o_out, bo, true, false, "out")) return nullptr;
    PyObject* seq = PySequence_Fast(o_c, "candidates must be a sequence");
    if (!seq) return nullptr;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (bo.view.shape[0] != k) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "out must have %zd entries", k);
    }
    const int64_t* q = static_cast<const int64_t*>(bq.view.buf);
    const Py_ssize_t nq = bq.view.shape[0];
    int64_t* out = static_cast<int64_t*>(bo.view.buf);
    for (Py_ssize_t i = 0; i < k; ++i) {
        out[i] = -1;
        PyObject* c = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyObject_CheckBuffer(c)) continue;
        Buf bc;
        if (!bc.get(c, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)) {
            PyErr_Clear();
            continue;
        }
        const Py_buffer& v = bc.view;
        if (v.ndim != 1) continue;
        char f = fmt_char(v.format);
        Py_ssize_t n = v.shape[0] < nq ? v.shape[0] : nq, j = 0;
        if (v.itemsize == 8 && (f == 'q' || f == 'l')) {
            const int64_t* x = static_cast<const int64_t*>(v.buf);
            while (j < n && x[j] == q[j]) ++j;
        } else if (v.itemsize == 4 && (f == 'i' || f == 'l')) {
            const int32_t* x = static_cast<const int32_t*>(v.buf);
            while (j < n && int64_t(x[j]) == q[j]) ++j;
        } else {
            continue;
        }
        out[i] = j;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

// cdf_sample(probs [N], uniforms [n], stratified, out_idx int64[n], out_p [n]) -> None.
// The draw rule of sampling.priority_sample on the flat array: cumsum (sequential, like
// np.cumsum), target u * cdf[-1], first index with cdf > target, clamped, stepped back past
// zero-probability entries.
PyObject* cdf_sample(PyObject*, PyObject* args) {
    PyObject *o_p, *o_u, *o_i, *o_v;
    int strat;
    if (!PyArg_ParseTuple(args, "OOpOO", &o_p, &o_u, &strat, &o_i, &o_v)) return nullptr;
    Buf bp, bu, bi, bv;
    if (!get_vec(o_p, bp, false, true, "probs") || !get_vec(o_u, bu, false, true, "uniforms") ||
        !get_vec(o_i, bi, true, false, "out_idx") || !get_vec(o_v, bv, true, true, "out_p"))
        return nullptr;
    const Py_ssize_t N = bp.view.shape[0], n = bu.view.shape[0];
    if (N < 1 || bi.view.shape[0] != n || bv.view.shape[0] != n)
        return PyErr_Format(PyExc_ValueError, "need probs non-empty and uniforms/out_idx/out_p of one length");
    const double* p = static_cast<const double*>(bp.view.buf);
    const double* u = static_cast<const double*>(bu.view.buf);
    int64_t* idx = static_cast<int64_t*>(bi.view.buf);
    double* pv = static_cast<double*>(bv.view.buf);
    Py_BEGIN_ALLOW_THREADS;
    std::vector<double> cdf(N);
    double s = 0.0;
    for (Py_ssize_t i = 0; i < N; ++i) cdf[i] = s += p[i];
    const double total = cdf[N - 1];
    for (Py_ssize_t k = 0; k < n; ++k) {
        double uk = strat ? (double(k) + u[k]) / double(n) : u[k];
        double target = uk * total;
        Py_ssize_t lo = 0, hi = N;  // first i with cdf[i] > target (searchsorted side="right")
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (cdf[mid] <= target) lo = mid + 1; else hi = mid;
        }
        Py_ssize_t j = lo < N ? lo : N - 1;
        while (j > 0 && p[j] == 0.0) --j;
        idx[k] = j;
        pv[k] = p[j];
    }
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"attention_cost", attention_cost, METH_VARARGS, "attention_cost(t, scale, out) -> -1 or first bad index"},
    {"effective_cost", effective_cost, METH_VARARGS, "effective_cost(t, t_prefix, scale, out) -> -1 or first bad"},
    {"bw_priorities", bw_priorities, METH_VARARGS, "bw_priorities(r, b, q, eps, out) -> -1 or first bad index"},
    {"bw_efficiency", bw_efficiency, METH_VARARGS, "bw_efficiency(r, b, losses, weights, weight) -> eta or None"},
    {"plan_surprise", plan_surprise, METH_VARARGS, "plan_surprise(plans, d, mean, rewards, sw, rw, out) -> -1 or bad"},
    {"ema_update", ema_update, METH_VARARGS, "ema_update(mean, plans, decay) -> -1 or first bad index"},
    {"prefix_match", prefix_match, METH_VARARGS, "prefix_match(query, candidates, out): -1 = not handled"},
    {"cdf_sample", cdf_sample, METH_VARARGS, "cdf_sample(probs, uniforms, stratified, out_idx, out_p)"},
    {"scan", scan, METH_VARARGS, "scan(values) -> (first NaN/inf/negative index or -1, max)"},
    {"tree_set", tree_set, METH_VARARGS, "tree_set(tree, offs, leaves, values): set leaves, refresh ancestors"},
    {"tree_set_range", tree_set_range, METH_VARARGS, "tree_set_range(tree, offs, start, values)"},
    {"tree_find", tree_find, METH_VARARGS, "tree_find(tree, offs, masses, out_leaves)"},
    {"tree_sample", tree_sample, METH_VARARGS,
     "tree_sample(tree, offs, uniforms, out_leaves, out_values) -> total; stratified, level-synchronous"},
    {"first_invalid", first_invalid, METH_VARARGS, "first_invalid(values) -> first NaN/inf/negative or -1"},
    {"update_priorities", update_priorities, METH_VARARGS,
     "update_priorities(tree, offs, raw, ids, priorities, leafvals, lo, hi, valid_end, ring, leaf_mod) -> (bad, n)"},
    {"per_update", per_update, METH_VARARGS,
     "per_update(tree, offs, raw, ids, priorities, lo, hi, valid_end, ring, leaf_mod, alpha, eps)"},
    {"sample_region", sample_region, METH_VARARGS,
     "sample_region(tree, offs, uniforms, lo, leaf_mod, ring, prob_scale, out_ids, out_slots, out_probs)"},
    {"write_rows", write_rows, METH_VARARGS, "write_rows(dsts, start, srcs): ring rows from a batch"},
    {"gather", gather, METH_VARARGS, "gather(srcs, rows, outs): outs[j][k] = srcs[j][rows[k]]"},
    {"add_one", add_one, METH_VARARGS,
     "add_one(dsts, keys, sample, slot, tree, offs, leaf, value) -> -1 or the first leaf needing Python"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_native",
                         "EchoRL compiled kernels (numpy references: sumtree_ref.py, bandwidth/planning/sampling/sequence.py).", -1,
                         methods};

}  // namespace

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&moduledef); }
