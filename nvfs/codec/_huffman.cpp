/* Huffman-only zstd frames on the CPU: the GPU engine's frame code (zstd_huffman.cu), built for the host.
 *
 * A float's exponent plane has no repeats worth matching: all that zstd gains on it comes from
 * its Huffman stage, yet zstd still hashes every position looking for matches and builds a
 * table per 128 KiB block. Here the plane is counted once, one table is built for it, and each
 * frame's four literal streams are coded with that table: ordinary zstd frames (RFC 8878) that
 * any zstd decoder reads, and the ones the GPU engine's decoder takes its fast path on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstring>

#define __host__
#define __device__
#define __global__
#define __noinline__
#define NVFS_HOST_BUILD
#pragma GCC diagnostic ignored "-Wunused-function"  // its decoding half is the GPU's
#include "zstd_huffman.cu"

// The byte counts of `n` bytes, in four interleaved tables (one table stalls on repeated bytes).
static void count_bytes(const u8* data, Py_ssize_t n, u32* counts) {
    u32 partial[4][256] = {{0}};
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        partial[0][data[i]]++;
        partial[1][data[i + 1]]++;
        partial[2][data[i + 2]]++;
        partial[3][data[i + 3]]++;
    }
    for (; i < n; i++) partial[0][data[i]]++;
    for (int s = 0; s < 256; s++) counts[s] = partial[0][s] + partial[1][s] + partial[2][s] + partial[3][s];
}

static bool one_symbol(const u8* data, u32 size) {
    for (u32 i = 1; i < size; i++)
        if (data[i] != data[0]) return false;
    return true;
}

// A zstd literal stream as a bit writer fills it: bits from the least significant up, whole
// bytes stored as they fill (8 at a time, so `out` needs 8 bytes of slack past the stream).
struct StreamWriter {
    u8* out;
    u8* next;
    u64 bits;
    u32 used;

    explicit StreamWriter(u8* start) : out(start), next(start), bits(0), used(0) {}

    inline void put(u32 entry) {  // code | length << 16, as huffman_table makes them
        bits |= (u64)(entry & 0xFFFF) << used;
        used += entry >> 16;
    }
    inline void flush() {  // at most 56 bits pending, so that four codes of 11 bits fit again
        memcpy(next, &bits, 8);
        next += used >> 3;
        bits >>= used & ~7u;
        used &= 7;
    }
    u32 finish() {  // the end mark after the last code; the stream's length in bytes
        put(1u | 1u << 16);
        flush();
        return (u32)(next - out) + (used ? 1 : 0);
    }
};

// Built for x86-64 with BMI2 (shifts by a register that need not be cl) and for any x86-64, the
// one the CPU runs picked at load: the bit writer's variable shifts are its inner loop.
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define BEST_OF_ISA __attribute__((target_clones("bmi2", "default")))
#endif
#endif
#ifndef BEST_OF_ISA
#define BEST_OF_ISA
#endif

// The four streams of a frame, coded together from their last symbol to their first (as zstd
// reads them, backwards): four independent bit writers keep the core busy where one writer's
// shift-and-add chain would make every code wait for the one before. Stream 3 may be shorter.
BEST_OF_ISA static void code_streams(const u8* data, u32 size, const u32* table, u8* const* out, u32* lengths) {
    long long start[4], count[4];
    for (int s = 0; s < 4; s++) stream_span(size, s, &start[s], &count[s]);
    StreamWriter w[4] = {StreamWriter(out[0]), StreamWriter(out[1]), StreamWriter(out[2]),
                         StreamWriter(out[3])};
    const u8* in[4] = {data + start[0], data + start[1], data + start[2], data + start[3]};
    long long j = count[0] - 1;
    for (; j >= count[3]; j--) {  // the tail stream 3 lacks
        for (int s = 0; s < 3; s++) {
            w[s].put(table[in[s][j]]);
            w[s].flush();
        }
    }
    for (; j >= 3; j -= 4) {
        for (int s = 0; s < 4; s++) {
            w[s].put(table[in[s][j]]);
            w[s].put(table[in[s][j - 1]]);
            w[s].put(table[in[s][j - 2]]);
            w[s].put(table[in[s][j - 3]]);
            w[s].flush();
        }
    }
    for (; j >= 0; j--) {
        for (int s = 0; s < 4; s++) {
            w[s].put(table[in[s][j]]);
            w[s].flush();
        }
    }
    for (int s = 0; s < 4; s++) lengths[s] = count[s] ? w[s].finish() : 1;
}

// One frame of `size` bytes coded with `table` into `out` (room for size + 16 bytes); returns
// its length. `scratch` holds four streams of a frame, each with 8 bytes of slack.
static u32 encode_frame(const u8* data, u32 size, const u32* table, const u8* description, int described,
                        u8* scratch, u32 stream_room, u8* out) {
    int symbol = size && one_symbol(data, size) ? data[0] : -1;
    if (symbol >= 0 || size < MIN_CODED) described = 0;
    u32 stream_bytes[4] = {1, 1, 1, 1};
    u8* streams[4] = {scratch, scratch + stream_room, scratch + 2 * stream_room, scratch + 3 * stream_room};
    if (described) code_streams(data, size, table, streams, stream_bytes);
    u32 head, length;
    int mode = frame_layout(size, symbol, described, stream_bytes, &head, &length);
    if (mode == MODE_RAW) memcpy(out + head, data, size);
    if (mode == MODE_HUFFMAN) {
        u8* at = out + head;
        for (int s = 0; s < 4; s++) {
            memcpy(at, streams[s], stream_bytes[s]);
            at += stream_bytes[s];
        }
    }
    write_head(out, mode, size, symbol, description, described, stream_bytes, length);
    return length;
}

PyDoc_STRVAR(encode_frames_doc,
             "encode_frames(plane, frame_size, out) -> list of frame lengths, or None\n\n"
             "Code ``plane`` as zstd frames of ``frame_size`` bytes (the last may be shorter), back to\n"
             "back in ``out``, all with one Huffman table of the whole plane. ``out`` needs room for the\n"
             "plane plus 16 bytes per frame. None: the plane has no table (one byte value only, or\n"
             "weights zstd cannot describe).");

// Codes the frames of `n` bytes (a table for them given) back to back into `dst`; their lengths.
static void encode_plane(const u8* data, Py_ssize_t n, Py_ssize_t frame_size, const u32* table,
                         const u8* description, int described, u8* scratch, u32 stream_room, u8* dst,
                         u32* lengths) {
    Py_ssize_t written = 0;
    for (Py_ssize_t f = 0, first = 0; first < n; f++, first += frame_size) {
        u32 size = (u32)(first + frame_size <= n ? frame_size : n - first);
        lengths[f] = encode_frame(data + first, size, table, description, described, scratch, stream_room,
                                  dst + written);
        written += lengths[f];
    }
}

static PyObject* encode_frames(PyObject*, PyObject* args) {
    Py_buffer plane, out;
    Py_ssize_t frame_size;
    if (!PyArg_ParseTuple(args, "y*nw*", &plane, &frame_size, &out)) return NULL;
    PyObject* result = NULL;
    const Py_ssize_t n = plane.len;
    const Py_ssize_t frames = frame_size > 0 ? (n + frame_size - 1) / frame_size : 0;
    // A stream codes each of its bytes in at most HUF_MAX_BITS, plus the end mark and slack.
    const u32 stream_room = (u32)((frame_size / 4 + 2) * HUF_MAX_BITS / 8 + 16);
    u32* lengths = NULL;
    u8* scratch = NULL;
    if (frame_size <= 0 || frame_size > (1 << 17)) {
        PyErr_SetString(PyExc_ValueError, "frame_size must be 1 to 128 KiB (one zstd block)");
    } else if (out.len < n + 16 * frames) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes; %zd frames of a %zd-byte plane need %zd", out.len,
                     frames, n, n + 16 * frames);
    } else if (!(lengths = (u32*)PyMem_Malloc(sizeof(u32) * (size_t)(frames + 1))) ||
               !(scratch = (u8*)PyMem_Malloc(4 * (size_t)stream_room))) {
        PyErr_NoMemory();
    } else {
        const u8* data = (const u8*)plane.buf;
        int described = 0;
        Py_BEGIN_ALLOW_THREADS;
        u32 counts[256], table[256];
        u8 description[DESCRIPTION_STRIDE];
        count_bytes(data, n, counts);
        described = huffman_table(counts, table, description);
        if (described)
            encode_plane(data, n, frame_size, table, description, described, scratch, stream_room, (u8*)out.buf,
                         lengths);
        Py_END_ALLOW_THREADS;
        if (!described) {
            result = Py_None;
            Py_INCREF(result);
        } else if ((result = PyList_New(frames)) != NULL) {
            for (Py_ssize_t f = 0; f < frames; f++) {
                PyObject* length = PyLong_FromUnsignedLong(lengths[f]);
                if (length == NULL) {
                    Py_CLEAR(result);
                    break;
                }
                PyList_SET_ITEM(result, f, length);
            }
        }
    }
    PyMem_Free(lengths);
    PyMem_Free(scratch);
    PyBuffer_Release(&plane);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"encode_frames", encode_frames, METH_VARARGS, encode_frames_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_huffman", "Huffman-only zstd frames of nvfs.codec.planes in C++.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__huffman(void) { return PyModule_Create(&module); }
