// The Python module ``echo_rl.kernels._native``: the method table over the kernels of sumtree.cpp,
// rows.cpp and batch_math.cpp. Built by setup.py with nothing but a C++ compiler (CPython C API
// and the buffer protocol, no numpy headers). Every kernel mirrors a numpy reference in
// sumtree_ref.py or echo_rl/replay; the property tests compare them on random inputs.
#include "common.h"

namespace echo_native {
namespace {

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
    {"per_update", (PyCFunction)(void (*)(void))per_update, METH_FASTCALL,
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
}  // namespace echo_native

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&echo_native::moduledef); }
