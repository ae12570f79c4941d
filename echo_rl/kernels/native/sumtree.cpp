// Sum-tree kernels: set/find/sample, priority updates, region sampling and the validity scans
// (numpy reference: sumtree_ref.py). Layout and descent rule: common.h.
#include "common.h"

#include <cfloat>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "pow_batch.h"

namespace echo_native {

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

// Refresh the ancestors of the leaves in nodes[0..k) (overwritten), level by level from the bottom.
// Where a level has more parent nodes than there are paths, each path's parent is recomputed
// (paths that meet recompute the same parent twice, harmlessly: a parent is always the sum of its
// final children). From the first level with at most k parents up to the root, the whole level is
// swept contiguously instead: branch-free, and the same values, since an untouched parent already
// equals the sum of its children (the tree's invariant). Written once as a macro over the group sum
// GS so that an AVX2 copy can be compiled beside the portable one (same additions, same order).
#define ECHO_REFRESH_PATHS(GS)                                                                   \
    double* const t = T.t;                                                                       \
    int l = T.d - 1;                                                                             \
    for (; l >= 0; --l) {                                                                        \
        const int64_t off = T.off[l], child_off = T.off[l + 1];                                  \
        const Py_ssize_t parents = ((l + 1 < T.d ? T.off[l + 2] : T.len) - child_off) / B;       \
        if (parents <= k) break;                                                                 \
        for (Py_ssize_t i = 0; i < k; ++i) {                                                     \
            const int64_t nd = nodes[i] >> 3; /* / B (node ids are non-negative) */              \
            nodes[i] = nd;                                                                       \
            t[off + nd] = GS(t + child_off + nd * B);                                            \
        }                                                                                        \
    }                                                                                            \
    for (; l >= 0; --l) {                                                                        \
        const int64_t off = T.off[l], child_off = T.off[l + 1];                                  \
        const Py_ssize_t parents = ((l + 1 < T.d ? T.off[l + 2] : T.len) - child_off) / B;       \
        const double* c = t + child_off;                                                         \
        for (Py_ssize_t j = 0; j < parents; ++j) t[off + j] = GS(c + j * B);                     \
    }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// group_sum from two 4-wide loads: hadd gives (c0+c1, c4+c5, c2+c3, c6+c7); adding its halves gives
// ((c0+c1)+(c2+c3), (c4+c5)+(c6+c7)), and their sum is group_sum's (addition commutes exactly).
__attribute__((target("avx2"), always_inline)) inline double group_sum_avx2(const double* c) {
    const __m256d h = _mm256_hadd_pd(_mm256_loadu_pd(c), _mm256_loadu_pd(c + 4));
    const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
__attribute__((target("avx2"))) static void refresh_paths_avx2(Tree& T, int64_t* nodes, Py_ssize_t k) {
    ECHO_REFRESH_PATHS(group_sum_avx2)
}
#endif

static void refresh_paths(Tree& T, int64_t* nodes, Py_ssize_t k) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return refresh_paths_avx2(T, nodes, k);
#endif
    ECHO_REFRESH_PATHS(group_sum)
}

static void descend(const Tree& T, double* m, int64_t* node, Py_ssize_t n) {
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
    refresh_paths(T, nodes.data(), k);
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
        refresh_paths(T, nodes.data(), applied);
    }
    Py_END_ALLOW_THREADS;
    return Py_BuildValue("(nn)", bad_i, applied);
}

// The checks of per_update: every priority finite and >= 0, every id in [0, valid_end). One
// branch-free pass with four independent maxima and flags (the common case: all good); only when
// something is bad, a second pass finds the first offending position. Returns false with bad_p or
// bad_i set; mx gets the largest priority.
static bool per_check(const int64_t* ids, const double* p, Py_ssize_t k, int64_t valid_end, Py_ssize_t& bad_p,
                      Py_ssize_t& bad_i, double& mx) {
    double m0 = -HUGE_VAL, m1 = -HUGE_VAL, m2 = -HUGE_VAL, m3 = -HUGE_VAL;
    unsigned bad = 0;
    const uint64_t end = (uint64_t)valid_end;
    Py_ssize_t i = 0;
    for (; i + 4 <= k; i += 4) {
        const double a = p[i], b = p[i + 1], c = p[i + 2], d = p[i + 3];
        bad |= !(a >= 0.0 && a <= DBL_MAX) | !(b >= 0.0 && b <= DBL_MAX) | !(c >= 0.0 && c <= DBL_MAX) |
               !(d >= 0.0 && d <= DBL_MAX);  // NaN fails too
        bad |= ((uint64_t)ids[i] >= end) | ((uint64_t)ids[i + 1] >= end) | ((uint64_t)ids[i + 2] >= end) |
               ((uint64_t)ids[i + 3] >= end);
        m0 = a > m0 ? a : m0;
        m1 = b > m1 ? b : m1;
        m2 = c > m2 ? c : m2;
        m3 = d > m3 ? d : m3;
    }
    for (; i < k; ++i) {
        bad |= !(p[i] >= 0.0 && p[i] <= DBL_MAX) | ((uint64_t)ids[i] >= end);
        m0 = p[i] > m0 ? p[i] : m0;
    }
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    mx = m2 > m0 ? m2 : m0;
    if (!bad) return true;
    for (i = 0; i < k; ++i) {
        if (!(p[i] >= 0.0 && p[i] <= DBL_MAX)) { bad_p = i; return false; }
        if ((uint64_t)ids[i] >= end) { bad_i = i; return false; }
    }
    return true;  // not reached
}

// The writes of per_update (checks passed): raw[slot] = p, leaf = (p + eps)^alpha for the ids in
// [lo, hi), then the ancestors. Returns how many were applied.
static Py_ssize_t per_apply(Tree& T, double* raw, const int64_t* ids, const double* p, Py_ssize_t k, int64_t lo,
                            int64_t hi, int64_t ring, int64_t lmod, double alpha, double eps) {
    std::vector<int64_t> work(2 * (size_t)k);
    std::vector<double> vals((size_t)k);
    int64_t* nodes = work.data();  // the leaf of each applied update, in order
    int64_t* src = nodes + k;      // its position in ids/priorities
    const int64_t lo_leaf = lo % lmod, lo_slot = lo % ring, span = hi - lo;
    double* const leaves = T.t + T.off[T.d];
    const double* up1 = T.t + T.off[T.d - 1];
    Py_ssize_t n = 0;
    // The target lines are random over large arrays: request them all (and the parents' lines, which
    // the refresh reads and writes first) before any is needed, so the misses overlap each other and
    // the (p + eps)^alpha below.
    for (Py_ssize_t i = 0; i < k; ++i) {
        const int64_t d = ids[i] - lo;
        if ((uint64_t)d >= (uint64_t)span) continue;  // evicted or not in this region
        int64_t leaf = lo_leaf + d;
        if (leaf >= lmod) leaf -= lmod;
        if (raw) {
            const int64_t slot = lo_slot + d;
            __builtin_prefetch(raw + (slot >= ring ? slot - ring : slot), 1);
        }
        __builtin_prefetch(leaves + leaf, 1);
        __builtin_prefetch(up1 + (leaf >> 3), 1);
        nodes[n] = leaf;
        src[n] = i;
        vals[n] = p[i] + eps;
        ++n;
    }
    if (alpha != 1.0) pow_batch(vals.data(), alpha, vals.data(), n);  // == std::pow per element
    for (Py_ssize_t j = 0; j < n; ++j) {
        if (raw) {
            const Py_ssize_t i = src[j];
            const int64_t slot = lo_slot + (ids[i] - lo);
            raw[slot >= ring ? slot - ring : slot] = p[i];
        }
        leaves[nodes[j]] = vals[j];
    }
    refresh_paths(T, nodes, n);
    return n;
}

// per_update(tree, offs, raw, ids, priorities, lo, hi, valid_end, ring, leaf_mod, alpha, eps)
//   -> None | (bad_priority_pos, bad_id_pos, n_applied, max_priority)
// The whole proportional-PER update in one call: checks every priority (finite, >= 0) and id (in
// [0, valid_end)) first and writes nothing if one fails; then raw[slot] = p (raw may be None) and leaf =
// (p + eps)^alpha for ids in [lo, hi) (others skipped), and refreshes the ancestors. Returns None
// when ids/priorities are not 1-D int64/float64 C-contiguous arrays (the caller converts them).
// METH_FASTCALL: it is called once per learner step, and the argument tuple would cost more than the checks.
PyObject* per_update(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "per_update takes 12 arguments (%zd given)", nargs);
        return nullptr;
    }
    PyObject *o_tree = args[0], *o_offs = args[1], *o_raw = args[2], *o_ids = args[3], *o_p = args[4];
    long long iv[5];
    for (int j = 0; j < 5; ++j) {
        iv[j] = PyLong_AsLongLong(args[5 + j]);
        if (iv[j] == -1 && PyErr_Occurred()) return nullptr;
    }
    const long long lo = iv[0], hi = iv[1], valid_end = iv[2], ring = iv[3], lmod = iv[4];
    const double alpha = PyFloat_AsDouble(args[10]), eps = PyFloat_AsDouble(args[11]);
    if ((alpha == -1.0 || eps == -1.0) && PyErr_Occurred()) return nullptr;
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
    if (per_check(ids, p, k, valid_end, bad_p, bad_i, mx))
        applied = per_apply(T, raw, ids, p, k, lo, hi, ring, lmod, alpha, eps);
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

}  // namespace echo_native
