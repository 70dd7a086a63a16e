/* The keyed fast path's per-request loops in C: the same results as their Python versions (which stay, and are
 * used where this module is not built), with no bytecode per request. Each is a pure function of its arguments
 * except `apply_block`, which calls the operator's function and changes the state dicts it is given, and
 * `unpack_strs`, which fills the table of strings it is given.
 *
 * - apply_block: a stateful operator keyed by the value, once per value, on the dict of the value's key group
 *   (clasp.runtime.batches.apply_block);
 * - gather: the outputs of a pass gathered by the destination of their key groups, runs of record ids kept
 *   (clasp.runtime.batches.gather_outputs: what clasp.core.routing.partition_runs does to them, flattened);
 * - epochs_of_runs: progress counts per stretch of one epoch in runs of record ids (clasp.core.tracking);
 * - key_groups: the key group of each key of a batch (clasp.core.routing.key_group), an ASCII string's here
 *   (clasp.runtime.batches.group_bytes);
 * - digit_run: whether a block of bytes holds a run of digits of some length (the file reader's test for
 *   numbers orjson may read otherwise than json; clasp.connectors.file_source._long_digits);
 * - whole_lines, close_comma, pick_lines: the file reader's cuts of a block of JSON lines (the first lines of a
 *   block, whether it may be read as one JSON array, the lines holding one of some byte strings;
 *   clasp.connectors.file_source._whole_lines, _close_comma, _picked);
 * - pack_strs, unpack_strs: a batch of strings as one msgpack array and back, the strings a worker receives
 *   made once per table slot, not once per occurrence (clasp.core.protocol.packed_values, open_columns);
 * - pack_uints, unpack_uints: a batch's record ids or run lengths as one msgpack array and back (the same);
 * - runs_fault: the check of a received batch's record ids and run lengths (clasp.core.protocol.check_columns);
 * - merge_by_time: the slices of an aligned read merged in event-time order (clasp.core.alignment.merged).
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* memmem, memrchr */
#endif
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { LEFT, RAISED, RETURNED };  /* as clasp.core.kernels */

/* Argument checks: -1 with an error set when `nargs` is not `n`, or an int argument is not in lo..hi. */
static int
arity(Py_ssize_t nargs, Py_ssize_t n, const char *usage)
{
    if (nargs == n)
        return 0;
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
}

static Py_ssize_t
int_in(PyObject *obj, Py_ssize_t lo, Py_ssize_t hi, const char *what)
{
    Py_ssize_t v = PyLong_AsSsize_t(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s out of range %zd..%zd", what, lo, hi);
        return -1;
    }
    return v;
}

/* The key groups of a batch: bytes-like (one byte each) or a list of ints. */
typedef struct {
    Py_buffer view;
    int has_view;
    PyObject *list;
    Py_ssize_t n;
} Groups;

static int
groups_open(PyObject *obj, Groups *g)
{
    g->has_view = 0;
    g->list = NULL;
    if (PyList_CheckExact(obj)) {
        g->list = obj;
        g->n = PyList_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &g->view, PyBUF_SIMPLE) < 0)
        return -1;
    g->has_view = 1;
    g->n = g->view.len;
    return 0;
}

static void
groups_close(Groups *g)
{
    if (g->has_view)
        PyBuffer_Release(&g->view);
}

/* The group of value i; -2 when it is not an int in 0..limit-1 (the caller leaves that value to Python), -1 on
 * an error (set). */
static Py_ssize_t
groups_get(Groups *g, Py_ssize_t i, Py_ssize_t limit)
{
    Py_ssize_t v;
    if (g->list == NULL) {
        v = ((const unsigned char *)g->view.buf)[i];
    }
    else {
        if (i >= PyList_GET_SIZE(g->list))
            return -2;
        PyObject *item = PyList_GET_ITEM(g->list, i);
        if (!PyLong_CheckExact(item))
            return -2;
        v = PyLong_AsSsize_t(item);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -2;
        }
    }
    return (v >= 0 && v < limit) ? v : -2;
}

/* apply_block(fn, values, groups, dicts, start) -> (stop, kind, payload)
 *
 * From `start`, for each value v of group g: old = dicts[g].get(v); new, _ = fn(old, v); then dicts[g][v] = new,
 * or, new being None, the key deleted where old was not None. Stops at the first value it cannot finish alone,
 * `kind` saying why (clasp.core.kernels): RAISED, fn raised an Exception (payload); RETURNED, fn returned
 * something other than a pair tuple (payload: the caller unpacks it as Python would); LEFT, the value's group
 * is not a dict of `dicts` (the caller runs the value itself). (len(values), LEFT, None) when every value ran.
 * Anything else fn raises (a BaseException) propagates, as it would from the loop. */
static PyObject *
apply_block(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (arity(nargs, 5, "apply_block(fn, values, groups, dicts, start)") < 0)
        return NULL;
    PyObject *fn = args[0], *values = args[1], *dicts = args[3];
    if (!PyList_CheckExact(values) || !PyList_CheckExact(dicts)) {
        PyErr_SetString(PyExc_TypeError, "apply_block: values and dicts must be lists");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[4]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    Groups groups;
    if (groups_open(args[2], &groups) < 0)
        return NULL;
    if (groups.n != PyList_GET_SIZE(values)) {
        groups_close(&groups);
        PyErr_SetString(PyExc_ValueError, "apply_block: one key group per value");
        return NULL;
    }
    PyObject *ret = NULL;
    for (; i < PyList_GET_SIZE(values) && i < groups.n; i++) {
        Py_ssize_t g = groups_get(&groups, i, PyList_GET_SIZE(dicts));
        if (g == -2)
            goto leave_to_python;
        PyObject *state = PyList_GET_ITEM(dicts, g);
        if (!PyDict_CheckExact(state))
            goto leave_to_python;
        PyObject *key = PyList_GET_ITEM(values, i);
        Py_INCREF(key);
        Py_INCREF(state);
        PyObject *old = PyDict_GetItemWithError(state, key);
        if (old == NULL && PyErr_Occurred()) {
            Py_DECREF(key);
            Py_DECREF(state);
            goto done;
        }
        Py_XINCREF(old);
        PyObject *argv[2] = {old != NULL ? old : Py_None, key};
        PyObject *res = PyObject_Vectorcall(fn, argv, 2, NULL);
        if (res == NULL) {
            Py_XDECREF(old);
            Py_DECREF(key);
            Py_DECREF(state);
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                goto done;
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL) {
                PyException_SetTraceback(value, tb);
                Py_DECREF(tb);
            }
            Py_DECREF(type);
            ret = Py_BuildValue("(niN)", i, RAISED, value);
            goto done;
        }
        if (!PyTuple_CheckExact(res) || PyTuple_GET_SIZE(res) != 2) {
            ret = Py_BuildValue("(niN)", i, RETURNED, res);
            Py_XDECREF(old);
            Py_DECREF(key);
            Py_DECREF(state);
            goto done;
        }
        PyObject *new = PyTuple_GET_ITEM(res, 0);
        int rc = 0;
        if (new != Py_None)
            rc = PyDict_SetItem(state, key, new);
        else if (old != NULL && old != Py_None)
            rc = PyDict_DelItem(state, key);
        Py_DECREF(res);
        Py_XDECREF(old);
        Py_DECREF(key);
        Py_DECREF(state);
        if (rc < 0)
            goto done;
    }
leave_to_python:
    ret = Py_BuildValue("(niO)", i, LEFT, Py_None);
done:
    groups_close(&groups);
    return ret;
}

static int
append_stretch(PyObject *out, long long epoch, long long used, long long kids)
{
    PyObject *t = Py_BuildValue("(LLL)", epoch, used, kids);
    if (t == NULL)
        return -1;
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    return rc;
}

/* epochs_of_runs(rids, counts, made, bits) -> [(epoch, requests, children)] per stretch of one epoch
 * (epoch = rid >> bits); `counts` and `made` are lists as long as `rids`, or None for 1 and 0 each. */
static PyObject *
epochs_of_runs(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (arity(nargs, 4, "epochs_of_runs(rids, counts, made, bits)") < 0)
        return NULL;
    PyObject *rids = args[0], *counts = args[1], *made = args[2];
    if (!PyList_CheckExact(rids) || !(counts == Py_None || PyList_CheckExact(counts))
        || !(made == Py_None || PyList_CheckExact(made))) {
        PyErr_SetString(PyExc_TypeError, "epochs_of_runs: lists (or None for counts and made)");
        return NULL;
    }
    Py_ssize_t bits = int_in(args[3], 0, 62, "epochs_of_runs: bits");
    if (bits < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rids);
    if ((counts != Py_None && PyList_GET_SIZE(counts) < n) || (made != Py_None && PyList_GET_SIZE(made) < n)) {
        PyErr_SetString(PyExc_ValueError, "epochs_of_runs: counts and made as long as rids");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    long long cur = -1, used = 0, kids = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long rid = PyLong_AsLongLong(PyList_GET_ITEM(rids, i));
        long long c = counts == Py_None ? 1 : PyLong_AsLongLong(PyList_GET_ITEM(counts, i));
        long long m = made == Py_None ? 0 : PyLong_AsLongLong(PyList_GET_ITEM(made, i));
        if (PyErr_Occurred())
            goto fail;
        long long e = rid >> bits;
        if (e != cur) {
            if (used && append_stretch(out, cur, used, kids) < 0)
                goto fail;
            cur = e;
            used = kids = 0;
        }
        used += c;
        kids += m;
    }
    if (used && append_stretch(out, cur, used, kids) < 0)
        goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* CRC-32 (IEEE 802.3, reflected, as zlib.crc32), a table lookup per byte: a key is a few bytes. */
static uint32_t crc_table[256];

static void
crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static uint32_t
crc32_of(const unsigned char *p, Py_ssize_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* The key group of `k`: an ASCII str's as clasp.core.routing.key_group computes it (crc32 of its UTF-8 bytes,
 * which are its characters, modulo ng), any other key's by calling `group_of(k)` (the operator's key cache);
 * -1 with an error set when that raises or answers something that is not a byte. */
static int
group_of_key(PyObject *k, PyObject *group_of, uint32_t ng)
{
    if (PyUnicode_CheckExact(k) && PyUnicode_IS_ASCII(k)) {
        uint32_t crc = crc32_of(PyUnicode_1BYTE_DATA(k), PyUnicode_GET_LENGTH(k));
        return (int)((ng & (ng - 1)) == 0 ? crc & (ng - 1) : crc % ng);  /* a mask, not a division, for 128 */
    }
    Py_INCREF(k);
    PyObject *g = PyObject_CallOneArg(group_of, k);
    Py_DECREF(k);
    if (g == NULL)
        return -1;
    long v = PyLong_AsLong(g);
    Py_DECREF(g);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v > 255) {
        PyErr_SetString(PyExc_ValueError, "bytes must be in range(0, 256)");
        return -1;
    }
    return (int)v;
}

/* key_groups(keys, group_of, num_groups) -> bytes: the key group of each key (`group_of_key`). */
static PyObject *
key_groups(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (arity(nargs, 3, "key_groups(keys, group_of, num_groups)") < 0)
        return NULL;
    PyObject *keys = args[0], *group_of = args[1];
    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "key_groups: keys must be a list");
        return NULL;
    }
    Py_ssize_t ng = int_in(args[2], 1, 256, "key_groups: key groups");
    if (ng < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= PyList_GET_SIZE(keys)) {
            PyErr_SetString(PyExc_RuntimeError, "key_groups: the keys changed size");
            goto fail;
        }
        int g = group_of_key(PyList_GET_ITEM(keys, i), group_of, (uint32_t)ng);
        if (g < 0)
            goto fail;
        o[i] = (unsigned char)g;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* gather(results, rids, group_of, num_groups, dest_of, nd) -> (parts, groups)
 *
 * The outputs of a pass, `results[i]` (a list or tuple) those of the request with record id rids[i], in order,
 * split by the destination of their key groups (`group_of_key`; `dest_of`, bytes-like of 256, the destination
 * index below nd of each group): per destination index [values, rids, counts, groups], its values in order,
 * their record ids as runs (rids[r] for counts[r] consecutive values, none empty), their groups as bytes; and
 * the groups of all the outputs in order, as bytes. One pass to find the groups and one to place the values:
 * no flattened list of the outputs, and the Python loop of none of it. */
static PyObject *
gather(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (arity(nargs, 6, "gather(results, rids, group_of, num_groups, dest_of, nd)") < 0)
        return NULL;
    PyObject *results = args[0], *rids = args[1], *group_of = args[2];
    if (!PyList_CheckExact(results) || !PyList_CheckExact(rids)) {
        PyErr_SetString(PyExc_TypeError, "gather: results and rids must be lists");
        return NULL;
    }
    Py_ssize_t ng = int_in(args[3], 1, 256, "gather: key groups");
    Py_ssize_t nd = ng < 0 ? -1 : int_in(args[5], 1, 256, "gather: destinations");
    if (nd < 0)
        return NULL;
    Py_ssize_t nr = PyList_GET_SIZE(results);
    if (PyList_GET_SIZE(rids) != nr) {
        PyErr_SetString(PyExc_ValueError, "gather: one record id per result");
        return NULL;
    }
    Py_buffer dv;
    if (PyObject_GetBuffer(args[4], &dv, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *all = NULL, *parts = NULL;
    if (dv.len != 256) {
        PyErr_SetString(PyExc_ValueError, "gather: 256 destinations, one per key group");
        goto fail;
    }
    const unsigned char *dest_of = dv.buf;
    /* Pass 1: the sizes, then every output's group (group_of may run Python, which may change the results:
     * their items are held while it runs, and the sizes are checked again below). */
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < nr; i++) {
        PyObject *outs = PyList_GET_ITEM(results, i);
        if (!PyList_Check(outs) && !PyTuple_Check(outs)) {
            PyErr_SetString(PyExc_TypeError, "gather: each result must be a list or a tuple");
            goto fail;
        }
        n += Py_SIZE(outs);
    }
    all = PyBytes_FromStringAndSize(NULL, n);
    if (all == NULL)
        goto fail;
    unsigned char *gs = (unsigned char *)PyBytes_AS_STRING(all);
    Py_ssize_t per_group[256] = {0}, total[256] = {0}, filled[256] = {0}, in_run[256], runs[256] = {0};
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < nr && i < PyList_GET_SIZE(results); i++) {
        PyObject *outs = PyList_GET_ITEM(results, i);
        Py_INCREF(outs);
        Py_ssize_t k = Py_SIZE(outs);
        for (Py_ssize_t j = 0; j < k; j++) {
            if (pos >= n || Py_SIZE(outs) != k) {
                Py_DECREF(outs);
                goto changed;
            }
            int g = group_of_key(PySequence_Fast_ITEMS(outs)[j], group_of, (uint32_t)ng);
            if (g < 0) {
                Py_DECREF(outs);
                goto fail;
            }
            if (dest_of[g] >= nd) {
                Py_DECREF(outs);
                PyErr_SetString(PyExc_ValueError, "gather: a destination out of range");
                goto fail;
            }
            gs[pos++] = (unsigned char)g;
            per_group[g]++;  /* not per destination: consecutive outputs rarely wait on one counter */
        }
        Py_DECREF(outs);
    }
    if (pos != n || PyList_GET_SIZE(results) != nr)
        goto changed;
    for (int g = 0; g < 256; g++)
        total[dest_of[g]] += per_group[g];
    parts = PyList_New(nd);
    if (parts == NULL)
        goto fail;
    PyObject *vs[256], *rs[256], *cs[256];
    char *bs[256];
    for (Py_ssize_t d = 0; d < nd; d++) {
        PyObject *part = PyList_New(4);
        if (part == NULL)
            goto fail;
        PyList_SET_ITEM(parts, d, part);
        vs[d] = PyList_New(total[d]);
        rs[d] = PyList_New(nr);  /* at most a run a result: cut to size at the end */
        cs[d] = PyList_New(nr);
        PyObject *b = PyBytes_FromStringAndSize(NULL, total[d]);
        if (vs[d] == NULL || rs[d] == NULL || cs[d] == NULL || b == NULL) {
            Py_XDECREF(vs[d]);
            Py_XDECREF(rs[d]);
            Py_XDECREF(cs[d]);
            Py_XDECREF(b);
            goto fail;
        }
        PyList_SET_ITEM(part, 0, vs[d]);
        PyList_SET_ITEM(part, 1, rs[d]);
        PyList_SET_ITEM(part, 2, cs[d]);
        PyList_SET_ITEM(part, 3, b);
        bs[d] = PyBytes_AS_STRING(b);
        in_run[d] = 0;
    }
    /* Pass 2: no Python runs here; what the key cache ran in pass 1 is checked not to have changed the sizes. */
    unsigned char touched[256];
    pos = 0;
    for (Py_ssize_t i = 0; i < nr; i++) {
        PyObject *outs = PyList_GET_ITEM(results, i);
        if (!PyList_Check(outs) && !PyTuple_Check(outs))
            goto changed;
        PyObject **items = PySequence_Fast_ITEMS(outs);
        Py_ssize_t k = Py_SIZE(outs);
        int nt = 0;
        for (Py_ssize_t j = 0; j < k; j++, pos++) {
            if (pos >= n)
                goto changed;
            unsigned char g = gs[pos], d = dest_of[g];
            if (filled[d] >= total[d])
                goto changed;
            if (in_run[d]++ == 0)
                touched[nt++] = d;
            Py_INCREF(items[j]);
            PyList_SET_ITEM(vs[d], filled[d], items[j]);
            bs[d][filled[d]++] = (char)g;
        }
        for (int t = 0; t < nt; t++) {
            unsigned char d = touched[t];
            PyObject *c = PyLong_FromSsize_t(in_run[d]);
            if (c == NULL)
                goto fail;
            in_run[d] = 0;
            PyObject *rid = PyList_GET_ITEM(rids, i);
            Py_INCREF(rid);
            PyList_SET_ITEM(rs[d], runs[d], rid);
            PyList_SET_ITEM(cs[d], runs[d], c);
            runs[d]++;
        }
    }
    if (pos != n)
        goto changed;
    for (Py_ssize_t d = 0; d < nd; d++)
        if (PyList_SetSlice(rs[d], runs[d], nr, NULL) < 0 || PyList_SetSlice(cs[d], runs[d], nr, NULL) < 0)
            goto fail;
    PyBuffer_Release(&dv);
    return Py_BuildValue("(NN)", parts, all);
changed:
    PyErr_SetString(PyExc_RuntimeError, "gather: the results changed while the key cache ran");
fail:
    /* A values list not yet filled holds NULLs, which list deallocation skips. */
    Py_XDECREF(parts);
    Py_XDECREF(all);
    PyBuffer_Release(&dv);
    return NULL;
}

/* groups_in(groups) -> [int]: the distinct bytes of a bytes-like, ascending (a block's key groups: what
 * set(groups) gives, without an int object per value). */
static PyObject *
groups_in(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0)
        return NULL;
    unsigned char seen[256] = {0};
    const unsigned char *p = v.buf;
    for (Py_ssize_t i = 0; i < v.len; i++)
        seen[p[i]] = 1;
    PyBuffer_Release(&v);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (int g = 0; g < 256; g++) {
        if (!seen[g])
            continue;
        PyObject *x = PyLong_FromLong(g);
        if (x == NULL || PyList_Append(out, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(x);
    }
    return out;
}

/* A block kernel's arguments, `n` of them as `usage` says: the first a bytes-like, into `v`, the second an int, into
 * `*out`, in 0..the buffer's length when `within` (a count of its bytes), else 0..PY_SSIZE_T_MAX: -1 with an error
 * set, and no buffer held, when one is wrong. */
static int
block_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t n, const char *usage, int within, Py_buffer *v,
           Py_ssize_t *out)
{
    if (arity(nargs, n, usage) < 0 || PyObject_GetBuffer(args[0], v, PyBUF_SIMPLE) < 0)
        return -1;
    *out = int_in(args[1], 0, within ? v->len : PY_SSIZE_T_MAX, within ? "used" : "n");
    if (*out < 0) {
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* digit_run(block, used, run) -> bool: whether the first `used` bytes of a bytes-like hold `run` (> 0) ASCII
 * digits in a row. Every `run`-th byte is looked at: a run that long holds one of them, and only around a
 * digit found there is the run measured, so a block with few long numbers is passed at a fraction of a
 * byte's cost. */
static PyObject *
digit_run(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer v;
    Py_ssize_t used;
    if (block_args(args, nargs, 3, "digit_run(block, used, run)", 1, &v, &used) < 0)
        return NULL;
    Py_ssize_t run = int_in(args[2], 1, PY_SSIZE_T_MAX, "run");
    if (run < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    const unsigned char *p = v.buf;
    int found = 0;
    Py_ssize_t checked = 0;  /* bytes below it are known to end no run long enough */
    for (Py_ssize_t i = run - 1; i < used && !found; i += run) {
        if ((unsigned char)(p[i] - '0') > 9)
            continue;
        Py_ssize_t a = i, b = i + 1;
        while (a > checked && (unsigned char)(p[a - 1] - '0') <= 9)
            a--;
        while (b < used && (unsigned char)(p[b] - '0') <= 9)
            b++;
        found = b - a >= run;
        checked = b;
    }
    PyBuffer_Release(&v);
    return PyBool_FromLong(found);
}

/* A msgpack array's header: put_array_head writes the smallest for `n` items (< 2**32) and returns the byte after
 * it; array_head reads one at *p (moving *p past it) and returns its count, -1 when *p holds no array header. */
static unsigned char *
put_array_head(unsigned char *o, Py_ssize_t n)
{
    if (n < 16)
        *o++ = 0x90 | (unsigned char)n;
    else if (n < 0x10000) {
        *o++ = 0xdc; *o++ = (unsigned char)(n >> 8); *o++ = (unsigned char)n;
    }
    else {
        *o++ = 0xdd; *o++ = (unsigned char)(n >> 24); *o++ = (unsigned char)(n >> 16);
        *o++ = (unsigned char)(n >> 8); *o++ = (unsigned char)n;
    }
    return o;
}

static Py_ssize_t
array_head(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    Py_ssize_t n;
    if (p == end)
        return -1;
    if ((*p & 0xf0) == 0x90) {
        n = *p & 0x0f;
        p += 1;
    }
    else if (*p == 0xdc && end - p >= 3) {
        n = (Py_ssize_t)p[1] << 8 | p[2];
        p += 3;
    }
    else if (*p == 0xdd && end - p >= 5) {
        n = (Py_ssize_t)((uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4]);
        p += 5;
    }
    else
        return -1;
    *pp = p;
    return n;
}

/* whole_lines(block, n) -> (bytes, lines): the bytes and the count of the first `n` whole lines of a bytes-like
 * (all of them when it holds fewer; never the unfinished line after its last newline), a memchr a line. */
static PyObject *
whole_lines(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer v;
    Py_ssize_t n;
    if (block_args(args, nargs, 2, "whole_lines(block, n)", 0, &v, &n) < 0)
        return NULL;
    const char *p = v.buf, *end = p + v.len, *at = p;
    Py_ssize_t k = 0;
    while (k < n && at < end) {
        const char *nl = memchr(at, '\n', end - at);
        if (nl == NULL)
            break;
        at = nl + 1;
        k++;
    }
    PyBuffer_Release(&v);
    return Py_BuildValue("(nn)", (Py_ssize_t)(at - p), k);
}

/* close_comma(block, used) -> bool: whether the first `used` bytes of a bytes-like hold a closing brace followed
 * by a comma, with only spaces, tabs and carriage returns between (the regular expression `\}[ \t\r]*,`). */
static PyObject *
close_comma(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer v;
    Py_ssize_t used;
    if (block_args(args, nargs, 2, "close_comma(block, used)", 1, &v, &used) < 0)
        return NULL;
    const char *at = v.buf, *end = at + used;
    int found = 0;
    while (!found && at < end) {
        const char *b = memchr(at, '}', end - at);
        if (b == NULL)
            break;
        at = b + 1;
        while (at < end && (*at == ' ' || *at == '\t' || *at == '\r'))
            at++;
        found = at < end && *at == ',';
    }
    PyBuffer_Release(&v);
    return PyBool_FromLong(found);
}

typedef struct { Py_ssize_t start, stop; } span;

static int
by_start(const void *a, const void *b)
{
    Py_ssize_t x = ((const span *)a)->start, y = ((const span *)b)->start;
    return (x > y) - (x < y);
}

/* pick_lines(block, used, marks) -> (bytes, lines): the lines (each with its newline) of the first `used` bytes
 * of a bytes-like that hold one of the byte strings of the list `marks`, in order, and how many. Only whole
 * lines count: bytes after the last newline are no line. Each mark is searched for over the whole block
 * (memmem), not line by line, so a block with few such lines costs about a scan a mark. */
static PyObject *
pick_lines(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer v;
    Py_ssize_t used;
    if (block_args(args, nargs, 3, "pick_lines(block, used, marks)", 1, &v, &used) < 0)
        return NULL;
    if (!PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "pick_lines: marks must be a list of bytes");
        PyBuffer_Release(&v);
        return NULL;
    }
    const char *p = v.buf;
    const char *last = used ? memrchr(p, '\n', used) : NULL;
    Py_ssize_t whole = last == NULL ? 0 : last - p + 1;
    span *spans = NULL;
    Py_ssize_t count = 0, cap = 0;
    PyObject *marks = args[2], *out = NULL;
    for (Py_ssize_t m = 0; m < PyList_GET_SIZE(marks); m++) {
        PyObject *mark = PyList_GET_ITEM(marks, m);
        if (!PyBytes_Check(mark)) {
            PyErr_SetString(PyExc_TypeError, "pick_lines: marks must be a list of bytes");
            goto done;
        }
        const char *s = PyBytes_AS_STRING(mark);
        Py_ssize_t len = PyBytes_GET_SIZE(mark);
        if (memchr(s, '\n', len) != NULL)
            continue;  /* in no line */
        Py_ssize_t at = 0;
        while (at < whole) {
            const char *hit = memmem(p + at, whole - at, s, len);
            if (hit == NULL)
                break;
            const char *nl = memrchr(p + at, '\n', hit - (p + at));
            Py_ssize_t start = nl == NULL ? at : nl - p + 1;
            Py_ssize_t stop = (const char *)memchr(hit, '\n', p + whole - hit) - p + 1;
            if (count == cap) {
                cap = cap ? 2 * cap : 64;
                span *grown = PyMem_Realloc(spans, cap * sizeof(span));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                spans = grown;
            }
            spans[count++] = (span){start, stop};
            at = stop;
        }
    }
    if (PyList_GET_SIZE(marks) > 1 && count > 1)
        qsort(spans, count, sizeof(span), by_start);
    Py_ssize_t size = 0, lines = 0;
    for (Py_ssize_t i = 0; i < count; i++)
        if (i == 0 || spans[i].start != spans[i - 1].start) {
            size += spans[i].stop - spans[i].start;
            lines++;
        }
    PyObject *picked = PyBytes_FromStringAndSize(NULL, size);
    if (picked == NULL)
        goto done;
    char *w = PyBytes_AS_STRING(picked);
    for (Py_ssize_t i = 0; i < count; i++)
        if (i == 0 || spans[i].start != spans[i - 1].start) {
            memcpy(w, p + spans[i].start, spans[i].stop - spans[i].start);
            w += spans[i].stop - spans[i].start;
        }
    out = Py_BuildValue("(Nn)", picked, lines);
done:
    PyMem_Free(spans);
    PyBuffer_Release(&v);
    return out;
}

/* pack_strs(values) -> bytes | None: the msgpack array of `values` when every one is an exact str, byte for byte
 * what msgpack.packb(values) gives (fixstr, str 8, 16 or 32 by length; the array's header by count); None when
 * one is anything else, or a str with no UTF-8 form (a lone surrogate), for the caller's general encoding. */
static PyObject *
pack_strs(PyObject *Py_UNUSED(module), PyObject *values)
{
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "pack_strs: values must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    if ((unsigned long long)n > 0xFFFFFFFFull)
        Py_RETURN_NONE;
    Py_ssize_t size = n < 16 ? 1 : n < 0x10000 ? 3 : 5;
    for (Py_ssize_t i = 0; i < n; i++) {  /* the size first: one allocation, no resize */
        PyObject *v = PyList_GET_ITEM(values, i);
        Py_ssize_t len;
        if (!PyUnicode_CheckExact(v))
            Py_RETURN_NONE;
        if (PyUnicode_IS_ASCII(v))
            len = PyUnicode_GET_LENGTH(v);
        else if (PyUnicode_AsUTF8AndSize(v, &len) == NULL) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        if ((unsigned long long)len > 0xFFFFFFFFull)
            Py_RETURN_NONE;
        size += len + (len < 32 ? 1 : len < 0x100 ? 2 : len < 0x10000 ? 3 : 5);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out), *end = o + size;
    o = put_array_head(o, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        Py_ssize_t len;
        const char *p;
        if (PyUnicode_IS_ASCII(v)) {
            p = (const char *)PyUnicode_1BYTE_DATA(v);
            len = PyUnicode_GET_LENGTH(v);
        }
        else
            p = PyUnicode_AsUTF8AndSize(v, &len);  /* cached by the first pass */
        if (p == NULL) {  /* the first pass made the UTF-8 form: cannot happen */
            Py_DECREF(out);
            return NULL;
        }
        if (len < 32)
            *o++ = 0xa0 | (unsigned char)len;
        else if (len < 0x100) {
            *o++ = 0xd9; *o++ = (unsigned char)len;
        }
        else if (len < 0x10000) {
            *o++ = 0xda; *o++ = (unsigned char)(len >> 8); *o++ = (unsigned char)len;
        }
        else {
            *o++ = 0xdb; *o++ = (unsigned char)(len >> 24); *o++ = (unsigned char)(len >> 16);
            *o++ = (unsigned char)(len >> 8); *o++ = (unsigned char)len;
        }
        memcpy(o, p, len);
        o += len;
    }
    if (o != end) {  /* nothing runs between the passes, which sized the same strings */
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "pack_strs: the values changed");
        return NULL;
    }
    return out;
}

/* An item of a msgpack array at *p (before `end`), made into a new reference and *p moved past it; NULL with no
 * error set when *p holds an item of another kind (the caller leaves the whole array to msgpack), NULL with an
 * error set on a failure. */
typedef PyObject *(*ItemFn)(const unsigned char **p, const unsigned char *end, PyObject *table);

/* The list a msgpack array in `data` (bytes-like) holds, each item made by `item`, when it is one such array and
 * nothing after it; None for anything else. */
static PyObject *
unpack_array(PyObject *data, ItemFn item, PyObject *table)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf, *end = p + view.len;
    PyObject *out = NULL;
    Py_ssize_t n = array_head(&p, end);
    if (n < 0 || n > end - p)  /* each item takes a byte at least */
        goto other;
    out = PyList_New(n);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p >= end)
            goto other;
        PyObject *v = item(&p, end, table);
        if (v == NULL) {
            if (PyErr_Occurred())
                goto fail;
            goto other;
        }
        PyList_SET_ITEM(out, i, v);
    }
    if (p != end)
        goto other;
    PyBuffer_Release(&view);
    return out;
other:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

/* Strings no longer than this are kept in the table of `unpack_strs`: a word, not a document. */
#define TABLE_MAX_LEN 64

/* A msgpack str, through `table` (see unpack_strs); NULL, no error, for invalid UTF-8 or another kind. */
static PyObject *
str_item(const unsigned char **pp, const unsigned char *end, PyObject *table)
{
    const unsigned char *p = *pp;
    Py_ssize_t len;
    unsigned char c = *p;
    if ((c & 0xe0) == 0xa0) {
        len = c & 0x1f;
        p += 1;
    }
    else if (c == 0xd9 && end - p >= 2) {
        len = p[1];
        p += 2;
    }
    else if (c == 0xda && end - p >= 3) {
        len = (Py_ssize_t)p[1] << 8 | p[2];
        p += 3;
    }
    else if (c == 0xdb && end - p >= 5) {
        len = (Py_ssize_t)((uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4]);
        p += 5;
    }
    else
        return NULL;
    if (len > end - p)
        return NULL;
    *pp = p + len;
    if (len <= TABLE_MAX_LEN) {
        uint64_t h = 0xcbf29ce484222325ull;  /* FNV-1a, and whether every byte is ASCII */
        unsigned char high = 0;
        for (Py_ssize_t k = 0; k < len; k++) {
            h = (h ^ p[k]) * 0x100000001b3ull;
            high |= p[k];
        }
        if (high < 0x80) {
            Py_ssize_t slot = (Py_ssize_t)((h ^ (h >> 29)) & (uint64_t)(PyList_GET_SIZE(table) - 1));
            PyObject *old = PyList_GET_ITEM(table, slot);
            if (PyUnicode_CheckExact(old) && PyUnicode_IS_ASCII(old) && PyUnicode_GET_LENGTH(old) == len
                && memcmp(PyUnicode_1BYTE_DATA(old), p, len) == 0) {
                Py_INCREF(old);
                return old;
            }
            PyObject *s = PyUnicode_New(len, 127);
            if (s == NULL)
                return NULL;
            memcpy(PyUnicode_1BYTE_DATA(s), p, len);
            Py_INCREF(s);
            PyList_SET_ITEM(table, slot, s);
            Py_DECREF(old);
            return s;
        }
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, len, NULL);
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return s;
}

/* unpack_strs(data, table) -> list | None: msgpack.unpackb(data) when `data` (bytes-like) is one msgpack array
 * of strings and nothing after it; None for anything else (another type, invalid UTF-8, a short or long
 * buffer), which the caller decodes the general way (and which fails there as it fails there).
 *
 * `table` is a list of a power-of-two length, a direct-mapped cache from an ASCII string's bytes to a str made
 * before (slot: a hash of the bytes): a string found there is that str again, no allocation, its hash already
 * computed once a dict has looked it up; one not found is made and takes the slot. Equal strings are equal
 * whichever object stands for them, so the result is the same list of values as msgpack's. */
static PyObject *
unpack_strs(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (arity(nargs, 2, "unpack_strs(data, table)") < 0)
        return NULL;
    PyObject *table = args[1];
    Py_ssize_t slots = PyList_CheckExact(table) ? PyList_GET_SIZE(table) : 0;
    if (slots < 1 || (slots & (slots - 1)) != 0) {
        PyErr_SetString(PyExc_TypeError, "unpack_strs: table must be a list of a power-of-two length");
        return NULL;
    }
    return unpack_array(args[0], str_item, table);
}

/* pack_uints(values) -> bytes | None: the msgpack array of `values` when every one is an exact int in 0..2**64-1,
 * byte for byte what msgpack.packb(values) gives (positive fixint, uint 8, 16, 32 or 64 by size; the array's header
 * by count); None for anything else, for the caller's general encoding. */
static PyObject *
pack_uints(PyObject *Py_UNUSED(module), PyObject *values)
{
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "pack_uints: values must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    if ((unsigned long long)n > 0xFFFFFFFFull)
        Py_RETURN_NONE;
    /* at most 9 bytes a value: sized once, cut to what was written */
    PyObject *out = PyBytes_FromStringAndSize(NULL, 5 + 9 * n);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out), *start = o;
    o = put_array_head(o, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (!PyLong_CheckExact(v))
            goto other;
        unsigned long long x = PyLong_AsUnsignedLongLong(v);
        if (x == (unsigned long long)-1 && PyErr_Occurred()) {  /* negative, or beyond 64 bits */
            PyErr_Clear();
            goto other;
        }
        if (x < 0x80)
            *o++ = (unsigned char)x;
        else if (x < 0x100) {
            *o++ = 0xcc; *o++ = (unsigned char)x;
        }
        else if (x < 0x10000) {
            *o++ = 0xcd; *o++ = (unsigned char)(x >> 8); *o++ = (unsigned char)x;
        }
        else if (x < 0x100000000ull) {
            *o++ = 0xce;
            for (int k = 24; k >= 0; k -= 8)
                *o++ = (unsigned char)(x >> k);
        }
        else {
            *o++ = 0xcf;
            for (int k = 56; k >= 0; k -= 8)
                *o++ = (unsigned char)(x >> k);
        }
    }
    if (_PyBytes_Resize(&out, o - start) < 0)
        return NULL;
    return out;
other:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* A msgpack non-negative int (positive fixint, uint 8, 16, 32 or 64); NULL, no error, for another kind. */
static PyObject *
uint_item(const unsigned char **pp, const unsigned char *end, PyObject *Py_UNUSED(table))
{
    const unsigned char *p = *pp;
    unsigned char c = *p;
    int size = c < 0x80 ? 0 : c == 0xcc ? 1 : c == 0xcd ? 2 : c == 0xce ? 4 : c == 0xcf ? 8 : -1;
    if (size < 0 || end - p < 1 + size)
        return NULL;
    unsigned long long x = size ? 0 : c;
    for (int k = 1; k <= size; k++)
        x = x << 8 | p[k];
    *pp = p + 1 + size;
    return PyLong_FromUnsignedLongLong(x);
}

/* unpack_uints(data) -> list | None: msgpack.unpackb(data) when `data` (bytes-like) is one msgpack array of
 * non-negative ints and nothing after it; None for anything else, which the caller decodes the general way. */
static PyObject *
unpack_uints(PyObject *Py_UNUSED(module), PyObject *arg)
{
    return unpack_array(arg, uint_item, NULL);
}

/* runs_fault(rids, counts, n) -> int: 0 when the lists `rids` and `counts` (or None) describe n values as record ids
 * of runs: every rid an exact int, none negative; counts None and one rid per value, or as many counts as rids,
 * each an exact int of at least 1, summing to n. Else the first of the checks that fails, in this order: 1 a rid
 * is not an int, 2 a rid is negative, 3 counts None and not one rid per value, 4 the counts are not such run
 * lengths (clasp.core.protocol.runs_fault, the Python version). n is a count of values, a C ssize_t: an OverflowError
 * beyond. */
static PyObject *
runs_fault(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (arity(nargs, 3, "runs_fault(rids, counts, n)") < 0)
        return NULL;
    PyObject *rids = args[0], *counts = args[1];
    if (!PyList_CheckExact(rids) || !(counts == Py_None || PyList_CheckExact(counts))) {
        PyErr_SetString(PyExc_TypeError, "runs_fault: rids a list, counts a list or None");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t m = PyList_GET_SIZE(rids);
    int negative = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *r = PyList_GET_ITEM(rids, i);
        if (!PyLong_CheckExact(r))
            return PyLong_FromLong(1);
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(r, &overflow);
        negative |= overflow < 0 || (overflow == 0 && x < 0);
    }
    if (negative)
        return PyLong_FromLong(2);
    if (counts == Py_None)
        return PyLong_FromLong(m == n ? 0 : 3);
    if (PyList_GET_SIZE(counts) != m)
        return PyLong_FromLong(4);
    unsigned long long sum = 0;  /* at most n before each count of at most n is added: below 2^64 */
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *c = PyList_GET_ITEM(counts, i);
        if (!PyLong_CheckExact(c))
            return PyLong_FromLong(4);
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(c, &overflow);
        if (overflow || x < 1 || x > n)
            return PyLong_FromLong(4);
        sum += (unsigned long long)x;
        if (sum > (unsigned long long)n)
            return PyLong_FromLong(4);
    }
    return PyLong_FromLong(sum == (unsigned long long)n ? 0 : 4);
}

/* A time as a double that compares as the time does: an exact float that is no NaN, or an exact int of at most
 * 53 bits (a double holds it exactly); 0 when it is anything else. */
static int
exact_time(PyObject *t, double *out)
{
    if (PyFloat_CheckExact(t)) {
        *out = PyFloat_AS_DOUBLE(t);
        return *out == *out;
    }
    if (PyLong_CheckExact(t)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(t, &overflow);
        if (overflow || v > (1LL << 53) || v < -(1LL << 53))
            return 0;
        *out = (double)v;
        return 1;
    }
    return 0;
}

/* Whether slice a's next record goes before slice b's: the lower place, a tie to the earlier slice. */
static inline int
place_before(const double *head, Py_ssize_t a, Py_ssize_t b)
{
    return head[a] < head[b] || (head[a] == head[b] && a < b);
}

static void
sift_down(Py_ssize_t *heap, Py_ssize_t size, const double *head)
{
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t least = i, l = 2 * i + 1, r = l + 1;
        if (l < size && place_before(head, heap[l], heap[least]))
            least = l;
        if (r < size && place_before(head, heap[r], heap[least]))
            least = r;
        if (least == i)
            return;
        Py_ssize_t x = heap[i];
        heap[i] = heap[least];
        heap[least] = x;
        i = least;
    }
}

/* merge_by_time(slices, timestamp) -> list | None
 *
 * clasp.core.alignment.merged over a list of lists: their records in the order of their places (each its slice's
 * running maximum of `timestamp(record)`), a tie to the earlier slice, no slice reordered; a merge of the slices
 * by a heap of their next records. None, and the Python version decides, when `slices` or one of them is not a
 * list, a time is not one `exact_time` takes, or `timestamp` raised an Exception (anything else it raises
 * propagates, as it would from the Python version). */
static PyObject *
merge_by_time(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (arity(nargs, 2, "merge_by_time(slices, timestamp)") < 0)
        return NULL;
    PyObject *slices = args[0], *timestamp = args[1];
    if (!PyList_CheckExact(slices))
        Py_RETURN_NONE;
    Py_ssize_t k = PyList_GET_SIZE(slices), n = 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *s = PyList_GET_ITEM(slices, j);
        if (!PyList_CheckExact(s))
            Py_RETURN_NONE;
        n += PyList_GET_SIZE(s);
    }
    /* The slices held (a copy of the list of them): the timestamp function, the user's code, may change a list. */
    PyObject *held = PyList_GetSlice(slices, 0, k);
    if (held == NULL)
        return NULL;
    PyObject *result = NULL, *out = NULL;
    double *places = PyMem_Malloc((n + k + 1) * sizeof(double));  /* each record's place, then each slice's next */
    Py_ssize_t *first = PyMem_Malloc((4 * k + 1) * sizeof(Py_ssize_t));  /* each slice's start, next, end; heap */
    if (places == NULL || first == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    double *head = places + n;
    Py_ssize_t *next = first + k, *end = first + 2 * k, *heap = first + 3 * k, size = 0, i = 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *s = PyList_GET_ITEM(held, j);
        first[j] = i;
        double top = 0;
        for (Py_ssize_t p = 0; p < PyList_GET_SIZE(s); p++, i++) {
            if (i >= n)
                goto none;  /* a slice grew while its times were read */
            PyObject *t = PyObject_CallOneArg(timestamp, PyList_GET_ITEM(s, p));
            if (t == NULL) {
                if (PyErr_ExceptionMatches(PyExc_Exception)) {
                    PyErr_Clear();
                    goto none;
                }
                goto done;
            }
            double d;
            int ok = exact_time(t, &d);
            Py_DECREF(t);
            if (!ok)
                goto none;
            if (p == 0 || d > top)
                top = d;
            places[i] = top;
        }
        next[j] = first[j];
        end[j] = i;
    }
    if (i != n)
        goto none;
    /* Made before the check below: from there on nothing allocates, so no collection runs a finalizer that could
     * change a slice. */
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < k; j++) {
        if (PyList_GET_SIZE(PyList_GET_ITEM(held, j)) != end[j] - first[j])
            goto none;  /* a slice changed while the times were read */
        if (first[j] == end[j])
            continue;
        head[j] = places[first[j]];
        Py_ssize_t c = size++;
        heap[c] = j;
        for (; c > 0 && place_before(head, heap[c], heap[(c - 1) / 2]); c = (c - 1) / 2) {  /* sift up */
            Py_ssize_t x = heap[c];
            heap[c] = heap[(c - 1) / 2];
            heap[(c - 1) / 2] = x;
        }
    }
    for (Py_ssize_t o = 0; o < n; o++) {
        Py_ssize_t j = heap[0];
        PyObject *v = PyList_GET_ITEM(PyList_GET_ITEM(held, j), next[j] - first[j]);
        PyList_SET_ITEM(out, o, Py_NewRef(v));
        if (++next[j] < end[j])
            head[j] = places[next[j]];
        else
            heap[0] = heap[--size];
        sift_down(heap, size, head);
    }
    result = out;
    out = NULL;
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(out);
    Py_DECREF(held);
    PyMem_Free(places);
    PyMem_Free(first);
    return result;
}

static PyMethodDef methods[] = {
    {"apply_block", (PyCFunction)(void (*)(void))apply_block, METH_FASTCALL,
     "apply_block(fn, values, groups, dicts, start) -> (stop, exc, result, old)"},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(results, rids, group_of, num_groups, dest_of, nd) -> ([[values, rids, counts, groups]...], groups)"},
    {"epochs_of_runs", (PyCFunction)(void (*)(void))epochs_of_runs, METH_FASTCALL,
     "epochs_of_runs(rids, counts, made, bits) -> [(epoch, requests, children)]"},
    {"groups_in", groups_in, METH_O, "groups_in(groups) -> the distinct bytes of a bytes-like, ascending"},
    {"key_groups", (PyCFunction)(void (*)(void))key_groups, METH_FASTCALL,
     "key_groups(keys, group_of, num_groups) -> bytes: the key group of each key"},
    {"digit_run", (PyCFunction)(void (*)(void))digit_run, METH_FASTCALL,
     "digit_run(block, used, run) -> whether the first `used` bytes hold `run` digits in a row"},
    {"whole_lines", (PyCFunction)(void (*)(void))whole_lines, METH_FASTCALL,
     "whole_lines(block, n) -> (bytes, lines) of the first n whole lines"},
    {"close_comma", (PyCFunction)(void (*)(void))close_comma, METH_FASTCALL,
     "close_comma(block, used) -> whether the first `used` bytes hold a closing brace, blanks, then a comma"},
    {"pick_lines", (PyCFunction)(void (*)(void))pick_lines, METH_FASTCALL,
     "pick_lines(block, used, marks) -> (bytes, lines) of the whole lines holding one of marks"},
    {"pack_strs", pack_strs, METH_O, "pack_strs(values) -> the msgpack array of a list of str, or None"},
    {"unpack_strs", (PyCFunction)(void (*)(void))unpack_strs, METH_FASTCALL,
     "unpack_strs(data, table) -> the list a msgpack array of strings holds, or None"},
    {"pack_uints", pack_uints, METH_O, "pack_uints(values) -> the msgpack array of a list of non-negative ints, or None"},
    {"unpack_uints", unpack_uints, METH_O, "unpack_uints(data) -> the list a msgpack array of such ints holds, or None"},
    {"runs_fault", (PyCFunction)(void (*)(void))runs_fault, METH_FASTCALL,
     "runs_fault(rids, counts, n) -> 0, or which check of a batch's record ids and run lengths fails"},
    {"merge_by_time", (PyCFunction)(void (*)(void))merge_by_time, METH_FASTCALL,
     "merge_by_time(slices, timestamp) -> the records of a list of lists merged by their running maximum times, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "clasp.core._kernels",
    "The keyed fast path's per-request loops in C (optional: the Python versions stay).", -1, methods,
};

PyMODINIT_FUNC
PyInit__kernels(void)
{
    crc_init();
    return PyModule_Create(&module);
}
