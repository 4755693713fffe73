/* Byte-plane loops of nvfs.codec.planes in C: one pass each, with the GIL released.
 *
 * numpy needs several passes per plane (a shift into a temporary, a narrowing cast, an or
 * for the sign plane) and takes the GIL back between them; merging planes back into values
 * took a strided pass per plane and three over the values. Here a plane is cut in one pass
 * (each value loaded, rotated and shifted in registers) and all planes are merged in one (each
 * value assembled and rotated back). The layout is exactly the
 * one docs/FORMAT.md describes and planes.py implements in numpy: plane p of a value of
 * SIZE bytes is byte SIZE - 1 - p of the value rotated left by one bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_PLANES 8

// Where the compiler can, each cut is built twice, for AVX2 and for any x86-64, and the one
// the CPU runs best is picked when the module loads: AVX2 cuts more values per instruction.
// Not the merges: their AVX2 build runs slower than the generic one.
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define BEST_OF_ISA __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef BEST_OF_ISA
#define BEST_OF_ISA
#endif

// One function per plane: with the shift a constant the compiler vectorizes the loop (a shift
// given at run time leaves the 16-bit loop scalar).
#define CUT(T, SIZE, INDEX)                                                                       \
    BEST_OF_ISA static void cut_##SIZE##_##INDEX(const uint8_t *src, Py_ssize_t n, uint8_t *out) { \
        for (Py_ssize_t i = 0; i < n; i++) {                                                      \
            T v;                                                                                  \
            memcpy(&v, src + i * SIZE, SIZE);                                                     \
            T rotated = (T)((v << 1) | (v >> (8 * SIZE - 1)));                                    \
            out[i] = (uint8_t)(rotated >> (8 * (SIZE - 1 - INDEX)));                              \
        }                                                                                         \
    }

// Planes FIRST to SIZE - 1 in one pass, back to back in out: each value is read once, where a
// pass per plane would read the values once per plane.
#define CUT_FROM(T, SIZE, FIRST)                                                                 \
    BEST_OF_ISA static void cut_from_##SIZE##_##FIRST(const uint8_t *restrict src, Py_ssize_t n, \
                                                       uint8_t *restrict out) {                  \
        for (Py_ssize_t i = 0; i < n; i++) {                                                     \
            T v;                                                                                 \
            memcpy(&v, src + i * SIZE, SIZE);                                                    \
            T rotated = (T)((v << 1) | (v >> (8 * SIZE - 1)));                                   \
            for (int p = FIRST; p < SIZE; p++)                                                   \
                out[(p - FIRST) * n + i] = (uint8_t)(rotated >> (8 * (SIZE - 1 - p)));           \
        }                                                                                        \
    }

#define MERGE(T, SIZE)                                                                      \
    static void merge_##SIZE(const uint8_t *const *planes, Py_ssize_t n, uint8_t *dst) {    \
        for (Py_ssize_t i = 0; i < n; i++) {                                                \
            T rotated = 0;                                                                  \
            for (int p = 0; p < SIZE; p++)                                                  \
                rotated |= (T)((T)planes[p][i] << (8 * (SIZE - 1 - p)));                    \
            T v = (T)((rotated >> 1) | (rotated << (8 * SIZE - 1)));                        \
            memcpy(dst + i * SIZE, &v, SIZE);                                               \
        }                                                                                   \
    }

CUT(uint16_t, 2, 0) CUT(uint16_t, 2, 1)
CUT(uint32_t, 4, 0) CUT(uint32_t, 4, 1) CUT(uint32_t, 4, 2) CUT(uint32_t, 4, 3)
CUT(uint64_t, 8, 0) CUT(uint64_t, 8, 1) CUT(uint64_t, 8, 2) CUT(uint64_t, 8, 3)
CUT(uint64_t, 8, 4) CUT(uint64_t, 8, 5) CUT(uint64_t, 8, 6) CUT(uint64_t, 8, 7)
// All planes (to_planes) and all but the exponent plane (encode_regions): the runs asked for.
CUT_FROM(uint16_t, 2, 0)
CUT_FROM(uint32_t, 4, 0) CUT_FROM(uint32_t, 4, 1)
CUT_FROM(uint64_t, 8, 0) CUT_FROM(uint64_t, 8, 1)

typedef void (*cut_fn)(const uint8_t *, Py_ssize_t, uint8_t *);
static const cut_fn CUT_2[] = {cut_2_0, cut_2_1};
static const cut_fn CUT_4[] = {cut_4_0, cut_4_1, cut_4_2, cut_4_3};
static const cut_fn CUT_8[] = {cut_8_0, cut_8_1, cut_8_2, cut_8_3, cut_8_4, cut_8_5, cut_8_6, cut_8_7};
// Indexed by the first plane (0 or 1); any other run is cut a plane at a time.
static const cut_fn CUT_FROM_2[] = {cut_from_2_0};  // planes 1-1 are one plane
static const cut_fn CUT_FROM_4[] = {cut_from_4_0, cut_from_4_1};
static const cut_fn CUT_FROM_8[] = {cut_from_8_0, cut_from_8_1};
MERGE(uint16_t, 2)
MERGE(uint32_t, 4)
MERGE(uint64_t, 8)

static int check_size(int size) {
    if (size == 2 || size == 4 || size == 8)
        return 0;
    PyErr_Format(PyExc_ValueError, "values of %d bytes have no byte planes here", size);
    return -1;
}

PyDoc_STRVAR(cut_planes_doc,
             "cut_planes(values, size, first, last, out)\n\n"
             "Write planes ``first`` to ``last`` of the ``size``-byte values in ``values`` into ``out``,\n"
             "back to back, one byte per value each.");

static void cut_range(const uint8_t *src, Py_ssize_t n, int size, int first, int last, uint8_t *out) {
    const cut_fn *one = size == 2 ? CUT_2 : size == 4 ? CUT_4 : CUT_8;
    const cut_fn *from = size == 2 ? CUT_FROM_2 : size == 4 ? CUT_FROM_4 : CUT_FROM_8;
    if (first == last)
        one[first](src, n, out);
    else if (last == size - 1 && first <= 1)
        from[first](src, n, out);
    else
        for (int p = first; p <= last; p++)
            one[p](src, n, out + (Py_ssize_t)(p - first) * n);
}

static PyObject *cut_planes(PyObject *self, PyObject *args) {
    Py_buffer values, out;
    int size, first, last;
    if (!PyArg_ParseTuple(args, "y*iiiw*", &values, &size, &first, &last, &out))
        return NULL;
    PyObject *result = NULL;
    if (check_size(size) < 0)
        goto done;
    if (first < 0 || last < first || last >= size) {
        PyErr_Format(PyExc_ValueError, "planes %d to %d of %d-byte values", first, last, size);
        goto done;
    }
    Py_ssize_t n = values.len / size;
    if (values.len % size || out.len != n * (last - first + 1)) {
        PyErr_Format(PyExc_ValueError, "%zd bytes of values for %d planes in %zd bytes", values.len,
                     last - first + 1, out.len);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    cut_range(values.buf, n, size, first, last, out.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&values);
    PyBuffer_Release(&out);
    return result;
}

PyDoc_STRVAR(merge_planes_doc,
             "merge_planes(planes, size, out)\n\n"
             "Write the ``size``-byte values whose byte planes are ``planes`` into ``out``.");

static PyObject *merge_planes(PyObject *self, PyObject *args) {
    PyObject *sequence;
    Py_buffer out;
    int size;
    if (!PyArg_ParseTuple(args, "Oiw*", &sequence, &size, &out))
        return NULL;
    Py_buffer views[MAX_PLANES];
    const uint8_t *planes[MAX_PLANES];
    int held = 0;
    PyObject *result = NULL;
    PyObject *items = PySequence_Fast(sequence, "planes must be a sequence");
    if (items == NULL || check_size(size) < 0)
        goto done;
    if (PySequence_Fast_GET_SIZE(items) != size) {
        PyErr_Format(PyExc_ValueError, "%zd planes for %d-byte values", PySequence_Fast_GET_SIZE(items), size);
        goto done;
    }
    Py_ssize_t n = out.len / size;
    if (out.len % size) {
        PyErr_Format(PyExc_ValueError, "an output of %zd bytes is not whole %d-byte values", out.len, size);
        goto done;
    }
    for (; held < size; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(items, held), &views[held], PyBUF_SIMPLE) < 0)
            goto done;
        if (views[held].len != n) {
            PyErr_Format(PyExc_ValueError, "plane %d holds %zd bytes, expected %zd", held, views[held].len, n);
            held++;
            goto done;
        }
        planes[held] = views[held].buf;
    }
    Py_BEGIN_ALLOW_THREADS
    if (size == 2)
        merge_2(planes, n, out.buf);
    else if (size == 4)
        merge_4(planes, n, out.buf);
    else
        merge_8(planes, n, out.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    while (held > 0)
        PyBuffer_Release(&views[--held]);
    Py_XDECREF(items);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"cut_planes", cut_planes, METH_VARARGS, cut_planes_doc},
    {"merge_planes", merge_planes, METH_VARARGS, merge_planes_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_planes", "Byte-plane loops of nvfs.codec.planes in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__planes(void) { return PyModule_Create(&module); }
