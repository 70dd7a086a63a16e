/* The keyed fast path's per-request loops in C: the same results as their Python versions (which stay, and are
 * used where this module is not built), with no bytecode per request. Each is a pure function of its arguments
 * except `apply_block`, which calls the operator's function and changes the state dicts it is given.
 *
 * - apply_block: a stateful operator keyed by the value, once per value, on the dict of the value's key group
 *   (clasp.runtime.batches.apply_block);
 * - partition: a batch of values split by the destination of their key groups, runs of record ids kept
 *   (clasp.core.routing.partition_runs);
 * - epochs_of_runs: progress counts per stretch of one epoch in runs of record ids (clasp.core.tracking);
 * - key_groups: the key group of each key of a batch (clasp.core.routing.key_group), an ASCII string's here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

/* partition(values, rids, counts, groups, dest_of, nd) -> [[values, rids, counts, groups] per destination]
 *
 * `values` in runs (rids[r] for counts[r] consecutive values), the key group of each (bytes-like), `dest_of` a
 * bytes-like of 256 destination indexes below nd (the destination of each key group): each destination's
 * values in order, its runs without empty ones, its groups as bytes. */
static PyObject *
partition(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (arity(nargs, 6, "partition(values, rids, counts, groups, dest_of, nd)") < 0)
        return NULL;
    PyObject *values = args[0], *rids = args[1], *counts = args[2];
    if (!PyList_CheckExact(values) || !PyList_CheckExact(rids) || !PyList_CheckExact(counts)) {
        PyErr_SetString(PyExc_TypeError, "partition: values, rids and counts must be lists");
        return NULL;
    }
    Py_ssize_t nd = int_in(args[5], 1, 256, "partition: destinations");
    if (nd < 0)
        return NULL;
    Py_buffer gv, dv;
    if (PyObject_GetBuffer(args[3], &gv, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[4], &dv, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&gv);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), nr = PyList_GET_SIZE(rids);
    const unsigned char *gs = gv.buf, *dest_of = dv.buf;
    Py_ssize_t total[256] = {0}, filled[256] = {0}, in_run[256];
    unsigned char touched[256];
    if (gv.len != n || dv.len != 256 || PyList_GET_SIZE(counts) != nr) {
        PyErr_SetString(PyExc_ValueError, "partition: one group per value, one count per rid, 256 destinations");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (dest_of[gs[i]] >= nd) {
            PyErr_SetString(PyExc_ValueError, "partition: a destination index out of range");
            goto fail;
        }
        total[dest_of[gs[i]]]++;
    }
    out = PyList_New(nd);
    if (out == NULL)
        goto fail;
    PyObject *vs[256], *rs[256], *cs[256];
    char *bs[256];
    for (Py_ssize_t d = 0; d < nd; d++) {
        PyObject *part = PyList_New(4);
        if (part == NULL)
            goto fail;
        PyList_SET_ITEM(out, d, part);
        vs[d] = PyList_New(total[d]);
        rs[d] = PyList_New(0);
        cs[d] = PyList_New(0);
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
    Py_ssize_t pos = 0;
    for (Py_ssize_t r = 0; r < nr; r++) {
        Py_ssize_t c = PyLong_AsSsize_t(PyList_GET_ITEM(counts, r));
        if (c == -1 && PyErr_Occurred())
            goto fail;
        if (c < 0 || c > n - pos) {
            PyErr_SetString(PyExc_ValueError, "partition: run lengths must sum to the values");
            goto fail;
        }
        int nt = 0;
        for (Py_ssize_t end = pos + c; pos < end; pos++) {
            unsigned char d = dest_of[gs[pos]];
            if (in_run[d]++ == 0)
                touched[nt++] = d;
            PyObject *v = PyList_GET_ITEM(values, pos);
            Py_INCREF(v);
            PyList_SET_ITEM(vs[d], filled[d], v);
            bs[d][filled[d]++] = (char)gs[pos];
        }
        for (int t = 0; t < nt; t++) {
            unsigned char d = touched[t];
            PyObject *k = PyLong_FromSsize_t(in_run[d]);
            in_run[d] = 0;
            if (k == NULL || PyList_Append(rs[d], PyList_GET_ITEM(rids, r)) < 0 || PyList_Append(cs[d], k) < 0) {
                Py_XDECREF(k);
                goto fail;
            }
            Py_DECREF(k);
        }
    }
    if (pos != n) {
        PyErr_SetString(PyExc_ValueError, "partition: run lengths must sum to the values");
        goto fail;
    }
    PyBuffer_Release(&gv);
    PyBuffer_Release(&dv);
    return out;
fail:
    /* A values list not yet filled holds NULLs, which list deallocation skips. */
    Py_XDECREF(out);
    PyBuffer_Release(&gv);
    PyBuffer_Release(&dv);
    return NULL;
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

/* key_groups(keys, group_of, num_groups) -> bytes
 *
 * The key group of each key, one byte each: an ASCII str's as clasp.core.routing.key_group computes it
 * (crc32 of its UTF-8 bytes, which are its characters, modulo num_groups), any other key's by calling
 * `group_of(key)` (the operator's key cache), whose errors propagate. */
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
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(keys); i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        if (PyUnicode_CheckExact(k) && PyUnicode_IS_ASCII(k)) {
            o[i] = (unsigned char)(crc32_of(PyUnicode_1BYTE_DATA(k), PyUnicode_GET_LENGTH(k)) % (uint32_t)ng);
            continue;
        }
        Py_INCREF(k);
        PyObject *g = PyObject_CallOneArg(group_of, k);
        Py_DECREF(k);
        if (g == NULL)
            goto fail;
        long v = PyLong_AsLong(g);
        Py_DECREF(g);
        if (v == -1 && PyErr_Occurred())
            goto fail;
        if (v < 0 || v > 255) {
            PyErr_SetString(PyExc_ValueError, "bytes must be in range(0, 256)");
            goto fail;
        }
        o[i] = (unsigned char)v;
    }
    if (PyList_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_RuntimeError, "key_groups: the keys changed size");
        goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"apply_block", (PyCFunction)(void (*)(void))apply_block, METH_FASTCALL,
     "apply_block(fn, values, groups, dicts, start) -> (stop, exc, result, old)"},
    {"partition", (PyCFunction)(void (*)(void))partition, METH_FASTCALL,
     "partition(values, rids, counts, groups, dest_of, nd) -> [[values, rids, counts, groups] per destination]"},
    {"epochs_of_runs", (PyCFunction)(void (*)(void))epochs_of_runs, METH_FASTCALL,
     "epochs_of_runs(rids, counts, made, bits) -> [(epoch, requests, children)]"},
    {"key_groups", (PyCFunction)(void (*)(void))key_groups, METH_FASTCALL,
     "key_groups(keys, group_of, num_groups) -> bytes: the key group of each key"},
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
