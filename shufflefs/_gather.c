/* The one compiled piece of shufflefs: copying variable-length records into their shuffled
   positions, a memcpy per record with the GIL released.  numpy has no variable-length gather;
   its fallback in layout.py moves equal-length records together (about 2x slower). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdint.h>

/* gather(out, src, out_pos, src_pos, lengths): out[out_pos[i]:+lengths[i]] = src[src_pos[i]:+lengths[i]].
   All positions are int64 buffers; every range is bounds-checked before any byte is copied. */
static PyObject *gather(PyObject *self, PyObject *args) {
    Py_buffer out, src, opos, spos, lens;
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*", &out, &src, &opos, &spos, &lens)) return NULL;
    PyObject *ret = NULL;
    Py_ssize_t n = lens.len / 8;
    if (opos.len != lens.len || spos.len != lens.len || lens.len % 8) {
        PyErr_SetString(PyExc_ValueError, "position and length arrays must be int64 of equal size");
        goto done;
    }
    const int64_t *o = opos.buf, *s = spos.buf, *l = lens.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (l[i] < 0 || o[i] < 0 || s[i] < 0 || o[i] > out.len - l[i] || s[i] > src.len - l[i]) {
            PyErr_Format(PyExc_IndexError, "range %zd out of bounds", i);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    char *ob = out.buf; const char *sb = src.buf;
    for (Py_ssize_t i = 0; i < n; i++) memcpy(ob + o[i], sb + s[i], (size_t)l[i]);
    Py_END_ALLOW_THREADS
    ret = Py_None; Py_INCREF(ret);
done:
    PyBuffer_Release(&out); PyBuffer_Release(&src); PyBuffer_Release(&opos); PyBuffer_Release(&spos); PyBuffer_Release(&lens);
    return ret;
}
static PyMethodDef methods[] = {{"gather", gather, METH_VARARGS, "Copy byte ranges between buffers."}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_gather", NULL, -1, methods};
PyMODINIT_FUNC PyInit__gather(void) { return PyModule_Create(&mod); }
