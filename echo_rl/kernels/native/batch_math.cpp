// Batch math kernels of bandwidth.py, planning.py, sampling.py and sequence.py.
#include "common.h"

namespace echo_native {

// ---- Batch math kernels (bandwidth.py, planning.py, sampling.py, sequence.py) -----------------
// Each one checks its inputs in the same pass as it computes (numpy needs a pass per check plus
// temporaries). On a bad value it returns the first offending index and the Python wrapper re-runs
// the numpy path, which raises the named one-line error, so both paths fail alike. The scalar
// forms (one length, one plan) stay numpy/Python: a C call saves nothing there.

// Any-rank C-contiguous float64 buffer, read flat; n = number of elements.
static bool get_flat(PyObject* obj, Buf& b, bool writable, const char* name, Py_ssize_t& n) {
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
static double pairwise_sum(const double* a, Py_ssize_t n) {
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

}  // namespace echo_native
