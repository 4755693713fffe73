// The byte-plane transform and the segment copy of the GPU engine (nvfs.codec.gpu_steps).
// GROUP, the values one thread moves, is defined by the loader (gpu_steps.plane_kernel_source).

// Regions of a batch are described by tables indexed by region: its first value's index in
// the batch (ascending), its byte offset in the data, where its planes start in the plane
// buffer and their stride (plane p at plane_offset + p * stride: aligned for nvCOMP), and its
// value size.
__device__ int find_region(const long long* first_value, int regions, long long v) {
    int lo = 0, hi = regions - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (first_value[mid] <= v) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// A value of `size` bytes at `in`, little-endian; one load where the address allows it.
__device__ unsigned long long load_value(const unsigned char* in, int size) {
    unsigned long long address = (unsigned long long)in;
    if (size == 2 && address % 2 == 0) return *(const unsigned short*)in;
    if (size == 4 && address % 4 == 0) return *(const unsigned int*)in;
    if (size == 8 && address % 8 == 0) return *(const unsigned long long*)in;
    unsigned long long x = 0;
    for (int b = 0; b < size; b++) x |= (unsigned long long)in[b] << (8 * b);
    return x;
}

__device__ void store_value(unsigned char* out, int size, unsigned long long x) {
    unsigned long long address = (unsigned long long)out;
    if (size == 2 && address % 2 == 0) { *(unsigned short*)out = (unsigned short)x; return; }
    if (size == 4 && address % 4 == 0) { *(unsigned int*)out = (unsigned int)x; return; }
    if (size == 8 && address % 8 == 0) { *(unsigned long long*)out = x; return; }
    for (int b = 0; b < size; b++) out[b] = (unsigned char)(x >> (8 * b));
}

__device__ unsigned long long rotate_left(unsigned long long x, int size) {
    int bits = 8 * size;
    unsigned long long mask = bits == 64 ? ~0ULL : ((1ULL << bits) - 1);
    return ((x << 1) | (x >> (bits - 1))) & mask;
}

__device__ unsigned long long rotate_right(unsigned long long x, int size) {
    return (x >> 1) | ((x & 1ULL) << (8 * size - 1));
}

// Where value v lies: its region r, index i in the region, value size, plane stride n, and the
// addresses of the value (data) and of its byte in the first plane.
struct Place { int r; long long i; int size; long long n; long long data; long long plane; };

__device__ Place place_of(const long long* first_value, const long long* offset,
                          const long long* plane_offset, const long long* stride, const long long* item_size,
                          int regions, long long v) {
    Place at;
    at.r = find_region(first_value, regions, v);
    at.i = v - first_value[at.r];
    at.size = (int)item_size[at.r];
    at.n = stride[at.r];
    at.data = offset[at.r] + at.i * at.size;
    at.plane = plane_offset[at.r] + at.i;
    return at;
}

// Whether the GROUP values from v lie in one region, 16-byte aligned in the data (at `base`)
// and in the planes (plane starts are aligned), so that they move as whole 16-byte words.
__device__ bool whole_group(const long long* first_value, int regions, long long values, long long v,
                            Place at, const unsigned char* base) {
    long long end = at.r + 1 < regions ? first_value[at.r + 1] : values;
    return at.size > 1 && v + GROUP <= end && at.i % GROUP == 0
        && ((unsigned long long)(base + at.data)) % 16 == 0;
}

// Value k of a group held in 32-bit words (little-endian).
template <int SIZE> __device__ unsigned long long value_at(const unsigned int* words, int k) {
    if (SIZE == 2) return (words[k / 2] >> (16 * (k & 1))) & 0xFFFF;
    if (SIZE == 4) return words[k];
    return words[2 * k] | ((unsigned long long)words[2 * k + 1] << 32);
}

// A whole group of SIZE-byte values (see whole_group): loaded, rotated and scattered to the
// planes in registers, with 16-byte loads and one 16-byte store per plane.
template <int SIZE> __device__ void split_group(const unsigned char* in, unsigned char* plane, long long n) {
    unsigned int words[GROUP * SIZE / 4];
    for (int w = 0; w < GROUP * SIZE / 16; w++) ((uint4*)words)[w] = ((const uint4*)in)[w];
    unsigned int packed[SIZE][GROUP / 4] = {};
    for (int k = 0; k < GROUP; k++) {
        unsigned long long x = rotate_left(value_at<SIZE>(words, k), SIZE);
        for (int p = 0; p < SIZE; p++)
            packed[p][k / 4] |= (unsigned int)((x >> (8 * (SIZE - 1 - p))) & 0xFF) << (8 * (k % 4));
    }
    for (int p = 0; p < SIZE; p++)
        *(uint4*)(plane + p * n) = make_uint4(packed[p][0], packed[p][1], packed[p][2], packed[p][3]);
}

// Inverse of split_group.
template <int SIZE> __device__ void merge_group(const unsigned char* plane, long long n, unsigned char* out) {
    unsigned int packed[SIZE][GROUP / 4];
    for (int p = 0; p < SIZE; p++) {
        uint4 word = *(const uint4*)(plane + p * n);
        packed[p][0] = word.x; packed[p][1] = word.y; packed[p][2] = word.z; packed[p][3] = word.w;
    }
    unsigned int words[GROUP * SIZE / 4] = {};
    for (int k = 0; k < GROUP; k++) {
        unsigned long long x = 0;
        for (int p = 0; p < SIZE; p++)
            x |= (unsigned long long)((packed[p][k / 4] >> (8 * (k % 4))) & 0xFF) << (8 * (SIZE - 1 - p));
        x = rotate_right(x, SIZE);
        if (SIZE == 2) words[k / 2] |= (unsigned int)x << (16 * (k & 1));
        if (SIZE == 4) words[k] = (unsigned int)x;
        if (SIZE == 8) { words[2 * k] = (unsigned int)x; words[2 * k + 1] = (unsigned int)(x >> 32); }
    }
    for (int w = 0; w < GROUP * SIZE / 16; w++) ((uint4*)out)[w] = ((const uint4*)words)[w];
}

// One thread per GROUP values: rotate each left one bit and scatter its bytes to the planes
// (MSB first); whole groups move in 16-byte words, the others value by value.
extern "C" __global__ void split_planes(const unsigned char* src, unsigned char* dst,
                                        const long long* first_value, const long long* offset,
                                        const long long* plane_offset, const long long* stride,
                                        const long long* item_size, int regions, long long values) {
    long long v0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * GROUP;
    if (v0 >= values) return;
    Place at = place_of(first_value, offset, plane_offset, stride, item_size, regions, v0);
    if (whole_group(first_value, regions, values, v0, at, src)) {
        if (at.size == 2) split_group<2>(src + at.data, dst + at.plane, at.n);
        else if (at.size == 4) split_group<4>(src + at.data, dst + at.plane, at.n);
        else split_group<8>(src + at.data, dst + at.plane, at.n);
        return;
    }
    for (long long v = v0; v < v0 + GROUP && v < values; v++) {
        Place one = place_of(first_value, offset, plane_offset, stride, item_size, regions, v);
        if (one.size == 1) { dst[one.plane] = src[one.data]; continue; }
        unsigned long long x = rotate_left(load_value(src + one.data, one.size), one.size);
        for (int p = 0; p < one.size; p++)
            dst[one.plane + p * one.n] = (unsigned char)(x >> (8 * (one.size - 1 - p)));
    }
}

// Inverse of split_planes.
extern "C" __global__ void merge_planes(const unsigned char* src, unsigned char* dst,
                                        const long long* first_value, const long long* offset,
                                        const long long* plane_offset, const long long* stride,
                                        const long long* item_size, int regions, long long values) {
    long long v0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * GROUP;
    if (v0 >= values) return;
    Place at = place_of(first_value, offset, plane_offset, stride, item_size, regions, v0);
    if (whole_group(first_value, regions, values, v0, at, dst)) {
        if (at.size == 2) merge_group<2>(src + at.plane, at.n, dst + at.data);
        else if (at.size == 4) merge_group<4>(src + at.plane, at.n, dst + at.data);
        else merge_group<8>(src + at.plane, at.n, dst + at.data);
        return;
    }
    for (long long v = v0; v < v0 + GROUP && v < values; v++) {
        Place one = place_of(first_value, offset, plane_offset, stride, item_size, regions, v);
        if (one.size == 1) { dst[one.data] = src[one.plane]; continue; }
        unsigned long long x = 0;
        for (int p = 0; p < one.size; p++)
            x |= (unsigned long long)src[one.plane + p * one.n] << (8 * (one.size - 1 - p));
        store_value(dst + one.data, one.size, rotate_right(x, one.size));
    }
}

// One block per segment s (table: source addresses, then target addresses, then lengths,
// `segments` each): copy its bytes; 16 bytes at a time where both ends are 16-byte aligned.
// The host cuts segments into pieces of at most COPY_PIECE bytes, so that a long one keeps
// many blocks busy. Addresses, not offsets: one launch copies between any buffers.
extern "C" __global__ void copy_segments(const long long* table, int segments) {
    int s = blockIdx.x;
    const unsigned char* in = (const unsigned char*)table[s];
    unsigned char* out = (unsigned char*)table[segments + s];
    long long n = table[2 * segments + s];
    if ((((unsigned long long)in | (unsigned long long)out) & 15) == 0) {
        long long words = n / 16;
        for (long long k = threadIdx.x; k < words; k += blockDim.x)
            ((uint4*)out)[k] = ((const uint4*)in)[k];
        for (long long k = words * 16 + threadIdx.x; k < n; k += blockDim.x) out[k] = in[k];
        return;
    }
    // Otherwise whole 4-byte words are stored from where `out` is aligned, each made of the two
    // aligned source words it straddles (a byte loop moved a quarter as much per thread).
    long long head = (4 - ((unsigned long long)out & 3)) & 3;
    head = head < n ? head : n;
    for (long long k = threadIdx.x; k < head; k += blockDim.x) out[k] = in[k];
    const unsigned char* from_in = in + head;
    int misaligned = (int)((unsigned long long)from_in & 3);
    const unsigned int* words_in = (const unsigned int*)(from_in - misaligned);
    unsigned int* words_out = (unsigned int*)(out + head);
    long long words = (n - head) / 4;
    for (long long k = threadIdx.x; k < words; k += blockDim.x) {
        unsigned int low = words_in[k];
        words_out[k] = misaligned ? __funnelshift_r(low, words_in[k + 1], 8 * misaligned) : low;
    }
    for (long long k = head + words * 4 + threadIdx.x; k < n; k += blockDim.x) out[k] = in[k];
}
