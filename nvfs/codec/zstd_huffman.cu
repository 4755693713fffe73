// Standard zstd frames whose one block is Huffman-coded literals and no sequences, made on the GPU.
//
// Float exponent planes have no repeats worth matching; all zstd gains on them comes from its
// Huffman stage. nvCOMP's Zstd searches for matches anyway and runs at a few GB/s; these
// kernels only count, build a Huffman table per plane and code each frame's four literal
// streams, many threads per stream. The frames are ordinary zstd frames (RFC 8878): any zstd
// decoder, the CPU engine's and nvCOMP's included, reads them.
//
// One frame per sub-block of a plane, laid out as
//   magic | descriptor 0xA0 (single segment, 4-byte content size) | content size |
//   block header | literals header (4 streams, 18-bit sizes) | tree description |
//   jump table | 4 streams | sequences header (0 sequences)
// or, where coding does not pay, a raw block; a frame of one repeated byte is an RLE block.
// decode_frames reads such frames back (also with one literal stream); frames of any other
// shape, such as the CPU engine's with their few matches, it leaves to nvCOMP.
//
// The functions are host functions too: tests/test_zstd_huffman.py builds them with a C++
// compiler and checks the frames against the reference decoder on machines without a GPU.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define HUF_MAX_BITS 11            // the longest code zstd allows
#define HUF_DIRECT_SYMBOLS 129     // 4-bit weights describe symbols 0..128; FSE-coded ones, all
#define DESCRIPTION_STRIDE 144     // bytes per table in the descriptions array (at most 128 used)
#define FRAME_HEAD 12              // magic, descriptor, content size, block header
#define LITERALS_HEADER 5
#define JUMP_TABLE 6
#define MIN_CODED 256              // smaller frames are stored raw
#define MODE_RAW 0
#define MODE_RLE 1
#define MODE_HUFFMAN 2
#define LANES 64                   // threads per stream in encode_frames
#define DECODE_SLOTS 8             // frames per block (of 32 threads) in decode_frames

__host__ __device__ static void put_le(u8* out, u64 value, int bytes) {
    for (int k = 0; k < bytes; k++) out[k] = (u8)(value >> (8 * k));
}

// Code lengths (0: absent) of an optimal prefix code for `counts`, at most HUF_MAX_BITS long:
// Huffman's two-queue construction on the sorted counts, the counts halved until the longest
// code fits (the tail of rare symbols flattens; the frequent ones keep their lengths). Returns
// the longest length, or 0 when fewer than two symbols occur.
__host__ __device__ static int huffman_lengths(const u32* counts, u8* lengths) {
    u16 symbol[256];
    u32 weight[511];
    u16 parent[511];
    u8 depth[511];
    int n = 0;
    for (int s = 0; s < 256; s++) {
        lengths[s] = 0;
        if (counts[s]) symbol[n++] = (u16)s;
    }
    if (n < 2) return 0;
    // Sort by count, ascending, ties by symbol: a Shell sort of (count, symbol) keys. An
    // insertion sort of 256 symbols, O(n^2) steps on one GPU thread per table, would take most
    // of a batch's table building.
    u64 key[256];
    for (int i = 0; i < n; i++) key[i] = (u64)counts[symbol[i]] << 8 | symbol[i];
    const int gaps[5] = {57, 23, 10, 4, 1};
    for (int g = 0; g < 5; g++) {
        int gap = gaps[g];
        for (int i = gap; i < n; i++) {
            u64 k = key[i];
            int j = i;
            while (j >= gap && key[j - gap] > k) {
                key[j] = key[j - gap];
                j -= gap;
            }
            key[j] = k;
        }
    }
    for (int i = 0; i < n; i++) symbol[i] = (u16)(key[i] & 0xFF);
    for (int shift = 0; shift < 32; shift++) {
        for (int i = 0; i < n; i++) {
            u32 scaled = counts[symbol[i]] >> shift;
            weight[i] = scaled ? scaled : 1;  // monotone: the order stays sorted
        }
        int leaf = 0, inner = n, next = n;
        for (int k = 0; k < n - 1; k++) {
            int pick[2];
            for (int t = 0; t < 2; t++) {
                if (leaf < n && (inner >= next || weight[leaf] <= weight[inner])) pick[t] = leaf++;
                else pick[t] = inner++;
            }
            weight[next] = weight[pick[0]] + weight[pick[1]];
            parent[pick[0]] = parent[pick[1]] = (u16)next;
            next++;
        }
        depth[2 * n - 2] = 0;
        int longest = 0;
        for (int i = 2 * n - 3; i >= 0; i--) {
            depth[i] = depth[parent[i]] + 1;
            if (i < n && depth[i] > longest) longest = depth[i];
        }
        if (longest <= HUF_MAX_BITS) {
            for (int i = 0; i < n; i++) lengths[symbol[i]] = depth[i];
            return longest;
        }
    }
    return 0;  // not reached: equal weights give at most 8 bits
}

// A little-endian bit writer filling bytes from the least significant bit.
struct BitWriter {
    u8* out;
    int bytes;
    u64 bits;
    int used;
};

__host__ __device__ static void put_bits(BitWriter* w, u32 value, int count) {
    w->bits |= (u64)value << w->used;
    w->used += count;
    while (w->used >= 8) {
        w->out[w->bytes++] = (u8)w->bits;
        w->bits >>= 8;
        w->used -= 8;
    }
}

__host__ __device__ static int highest_bit(u32 x) {
    int bit = 0;
    while (x >>= 1) bit++;
    return bit;
}

#define WEIGHT_LOG 6  // accuracy of the FSE table for Huffman weights (zstd allows at most 6)

// The FSE decoding table of normalized counts (RFC 8878, "From normalized distribution to
// decoding tables"): "less than 1" symbols (-1) take the last states, the others are spread
// over the rest; then each state's symbol, bits to read and baseline of the next state.
__host__ __device__ static void fse_decode_table(const int* norm, int last_symbol, int log, u8* symbol,
                                                 u8* nbits, u16* baseline) {
    int size = 1 << log, high = size - 1, position = 0, next[HUF_MAX_BITS + 1];
    for (int s = 0; s <= last_symbol; s++) {
        if (norm[s] == -1) {
            symbol[high--] = (u8)s;
            next[s] = 1;
        } else {
            next[s] = norm[s];
        }
    }
    for (int s = 0; s <= last_symbol; s++) {
        for (int k = 0; k < norm[s]; k++) {
            symbol[position] = (u8)s;
            do position = (position + (size >> 1) + (size >> 3) + 3) & (size - 1);
            while (position > high);
        }
    }
    for (int state = 0; state < size; state++) {
        int x = next[symbol[state]]++;
        nbits[state] = (u8)(log - highest_bit(x));
        baseline[state] = (u16)((x << nbits[state]) - size);
    }
}

// Huffman weights w[0, n) coded with FSE as zstd's tree description allows (RFC 8878, "FSE
// compression of Huffman weights"): the normalized counts, then one bitstream with two
// interleaved states. Written by inverting the decoding table the spec defines, so that the
// decoder's reading, state by state, is what the encoder wrote. Returns the length in
// bytes, or 0 when the weights cannot be coded so. Kept out of line: inlined into
// build_tables by NVRTC (CUDA 13, H200), it read the caller's weights back wrong (weight 0
// came back as a count of this function's), which a host build never showed.
__host__ __device__ __noinline__ static int fse_weights(const u8* w, int n, u8* out) {
    const int size = 1 << WEIGHT_LOG;
    int count[HUF_MAX_BITS + 1] = {0}, norm[HUF_MAX_BITS + 1] = {0};
    for (int i = 0; i < n; i++) count[w[i]]++;
    int last_symbol = 0, present = 0, total = 0;
    for (int s = 0; s <= HUF_MAX_BITS; s++) {
        if (!count[s]) continue;
        norm[s] = count[s] * size / n > 0 ? count[s] * size / n : 1;
        total += norm[s];
        last_symbol = s;
        present++;
    }
    if (present < 2) return 0;
    while (total != size) {  // give the rounding to the largest
        int largest = 0;
        for (int s = 1; s <= last_symbol; s++) if (norm[s] > norm[largest]) largest = s;
        if (total < size) { norm[largest] += size - total; total = size; }
        else if (norm[largest] > 1) { norm[largest]--; total--; }
        else return 0;
    }
    // Normalized counts (FSE_readNCount's format).
    BitWriter bw = {out, 0, 0, 0};
    put_bits(&bw, WEIGHT_LOG - 5, 4);
    int remaining = size + 1, threshold = size, bits = WEIGHT_LOG + 1;
    for (int s = 0; s <= last_symbol && remaining > 1; s++) {
        int value = norm[s] + 1, max = 2 * threshold - 1 - remaining;
        if (value < max) put_bits(&bw, value, bits - 1);
        else if (value < threshold) put_bits(&bw, value, bits);
        else put_bits(&bw, value + max, bits);
        remaining -= norm[s];
        while (remaining < threshold) { bits--; threshold >>= 1; }
        if (norm[s] == 0) {  // a run of zero counts after it: 2-bit repeat flags
            int zeros = 0;
            while (s + 1 + zeros <= last_symbol && norm[s + 1 + zeros] == 0) zeros++;
            s += zeros;
            for (; zeros >= 3; zeros -= 3) put_bits(&bw, 3, 2);
            put_bits(&bw, zeros, 2);
        }
    }
    if (bw.used) put_bits(&bw, 0, 8 - bw.used);
    u8 symbol[1 << WEIGHT_LOG], nbits[1 << WEIGHT_LOG];
    u16 baseline[1 << WEIGHT_LOG];
    fse_decode_table(norm, last_symbol, WEIGHT_LOG, symbol, nbits, baseline);
    // Decoding reads state 0 and state 1 of the weights, then after each weight i < n - 1 the
    // bits that lead to state i + 2; the read after weight n - 2 runs past the stream's start,
    // which ends the decoding with weight n - 1. So states are chosen from the last weight back.
    int state[256];
    for (int i = n - 1; i >= 0; i--) {
        int found = -1;
        for (int x = 0; x < size && found < 0; x++) {
            if (symbol[x] != w[i]) continue;
            if (i >= n - 2) { if (i == n - 1 || nbits[x] > 0) found = x; }
            else if (baseline[x] <= state[i + 2] && state[i + 2] < baseline[x] + (1 << nbits[x])) found = x;
        }
        if (found < 0) return 0;
        state[i] = found;
    }
    BitWriter stream = {out + bw.bytes, 0, 0, 0};
    for (int i = n - 3; i >= 0; i--) put_bits(&stream, state[i + 2] - baseline[state[i]], nbits[state[i]]);
    put_bits(&stream, state[1], WEIGHT_LOG);
    put_bits(&stream, state[0], WEIGHT_LOG);
    put_bits(&stream, 1, 1);  // the end mark
    if (stream.used) put_bits(&stream, 0, 8 - stream.used);
    return bw.bytes + stream.bytes;
}

// The coding table (code | length << 16 per symbol, 0 for absent ones) and the zstd tree
// description for `counts`. Returns the description's length, or 0 when there is none (one
// symbol only, or weights whose FSE coding would not fit: frames are then stored raw).
__host__ __device__ static int huffman_table(const u32* counts, u32* table, u8* description) {
    u8 lengths[256];
    int max_bits = huffman_lengths(counts, lengths);
    for (int s = 0; s < 256; s++) table[s] = 0;
    if (max_bits == 0) return 0;
    int last = 255;
    while (!lengths[last]) last--;
    // Canonical codes: by weight (longest codes first), then by symbol value.
    u32 slot = 0;
    for (int bits = max_bits; bits >= 1; bits--) {
        for (int s = 0; s <= last; s++) {
            if (lengths[s] != bits) continue;
            table[s] = (slot >> (max_bits - bits)) | ((u32)bits << 16);
            slot += 1u << (max_bits - bits);
        }
    }
    // The weights of symbols 0..last-1 (the last one's is implied by the others): 4 bits each
    // up to symbol 128, FSE-coded beyond.
    u8 weights[256];
    for (int s = 0; s < last; s++) weights[s] = lengths[s] ? (u8)(max_bits + 1 - lengths[s]) : 0;
    if (last < HUF_DIRECT_SYMBOLS) {
        description[0] = (u8)(127 + last);
        for (int s = 0; s < last; s += 2)
            description[1 + s / 2] = (u8)(weights[s] << 4 | (s + 1 < last ? weights[s + 1] : 0));
        return 1 + (last + 1) / 2;
    }
    int coded = fse_weights(weights, last, description + 1);
    if (coded == 0 || coded >= 128) return 0;
    description[0] = (u8)coded;
    return 1 + coded;
}

// Ors a word in: the first and last words of a lane's bits are shared with its neighbours'.
__host__ __device__ static inline void or_word(u32* word, u32 value) {
#ifdef __CUDA_ARCH__
    atomicOr(word, value);
#else
    *word |= value;
#endif
}

// Bits that the codes of in[0, count) take.
__host__ __device__ static u32 coded_bits(const u8* in, long long count, const u32* table) {
    u32 total = 0;
    for (long long i = 0; i < count; i++) total += table[in[i]] >> 16;
    return total;
}

// Writes the codes of in[0, count) from bit `position` of `out` on, as zstd fills a literal
// stream: the last symbol first, each code from the least significant free bit up. Whole
// words in between are the caller's alone and stored; the first and last ones are or-ed in.
__host__ __device__ static void put_codes(const u8* in, long long count, const u32* table, u32* out,
                                          u64 position) {
    u64 word = position / 32;
    int used = (int)(position % 32);
    u64 bits = 0;
    bool first = true;
    for (long long i = count - 1; i >= 0; i--) {
        u32 entry = table[in[i]];
        bits |= (u64)(entry & 0xFFFF) << used;
        used += entry >> 16;
        if (used >= 32) {
            if (first) or_word(out + word, (u32)bits);
            else out[word] = (u32)bits;
            first = false;
            word++;
            bits >>= 32;
            used -= 32;
        }
    }
    if (bits) or_word(out + word, (u32)bits);
}

// Where stream `s` (0-3) of a frame of `size` bytes starts and how long it is (RFC 8878).
__host__ __device__ static void stream_span(long long size, int s, long long* start, long long* count) {
    long long segment = (size + 3) / 4;
    long long first = s * segment, end = first + segment < size ? first + segment : size;
    *start = first;
    *count = end > first ? end - first : 0;
}

// How a frame is stored: its mode, where its streams (or raw bytes) start, and its length.
// `streams` holds each stream's length in bytes (its bits and the end mark, rounded up).
__host__ __device__ static int frame_layout(u32 size, int symbol, int description_length, const u32* streams,
                                            u32* head, u32* length) {
    u32 literals = description_length + JUMP_TABLE + streams[0] + streams[1] + streams[2] + streams[3];
    u32 block = LITERALS_HEADER + literals + 1;
    if (symbol >= 0) {
        *head = *length = FRAME_HEAD + 1;
        return MODE_RLE;
    }
    if (description_length == 0 || size < MIN_CODED || block >= size) {
        *head = FRAME_HEAD;
        *length = FRAME_HEAD + size;
        return MODE_RAW;
    }
    *head = FRAME_HEAD + LITERALS_HEADER + description_length + JUMP_TABLE;
    *length = FRAME_HEAD + block;
    return MODE_HUFFMAN;
}

// Writes a frame's headers (an RLE frame's byte included) for `frame_layout`'s mode.
__host__ __device__ static void write_head(u8* frame, int mode, u32 size, int symbol, const u8* description,
                                           int description_length, const u32* streams, u32 length) {
    put_le(frame, 0xFD2FB528u, 4);
    frame[4] = 0xA0;  // content size in 4 bytes, single segment, no checksum, no dictionary
    put_le(frame + 5, size, 4);
    if (mode == MODE_RLE) {
        put_le(frame + 9, 1u | (1u << 1) | (size << 3), 3);
        frame[FRAME_HEAD] = (u8)symbol;
        return;
    }
    if (mode == MODE_RAW) {
        put_le(frame + 9, 1u | (size << 3), 3);
        return;
    }
    u32 block = length - FRAME_HEAD;
    u32 literals = block - LITERALS_HEADER - 1;
    put_le(frame + 9, 1u | (2u << 1) | (block << 3), 3);
    u8* section = frame + FRAME_HEAD;
    put_le(section, 2u | (3u << 2) | ((u64)size << 4) | ((u64)literals << 22), LITERALS_HEADER);
    for (int k = 0; k < description_length; k++) section[LITERALS_HEADER + k] = description[k];
    u8* jump = section + LITERALS_HEADER + description_length;
    for (int k = 0; k < 3; k++) put_le(jump + 2 * k, streams[k], 2);
    frame[length - 1] = 0;  // no sequences: the block is its literals
}

// ---- Decoding: the frames above, and any zstd frame of the same shape (the CPU engine's) ----

#define FRAME_UNSUPPORTED 1  // a valid frame of another shape (sequences, several blocks): nvCOMP's
#define FRAME_DAMAGED 2
#define CONTENT_RAW 0
#define CONTENT_RLE 1
#define CONTENT_HUFFMAN 2

// What decoding a frame takes: its content's kind and where it lies.
struct FrameContent {
    int kind;
    u32 offset;            // raw bytes, the RLE byte, or the first stream
    int streams;           // 1 or 4 Huffman-coded streams
    u32 stream_length[4];
    int max_bits;
    int symbols;
};

__host__ __device__ static u32 get_le(const u8* in, int bytes) {
    u32 value = 0;
    for (int k = 0; k < bytes; k++) value |= (u32)in[k] << (8 * k);
    return value;
}

// The n bits (n <= 32) just below bit `position` of a stream read backwards; bits below the
// stream's start read as 0. Reads the aligned words that hold them: never a word of which
// no byte belongs to the stream.
__host__ __device__ static u32 bits_below(const u8* in, long long position, int n) {
    long long low = position - n;
    int missing = 0;
    if (low < 0) {
        missing = (int)-low;
        low = 0;
        n -= missing;
        if (n <= 0) return 0;
    }
    const u8* at = in + low / 8;
    const u32* word = (const u32*)((u64)at & ~(u64)3);
    int shift = (int)(((u64)at & 3) * 8 + low % 8);
    u64 both = (u64)word[0] | (shift + n > 32 ? (u64)word[1] << 32 : 0);
    return (u32)((both >> shift) & ((1ull << n) - 1)) << missing;
}

// Reads a Huffman tree description (direct or FSE-coded weights) into weights (one per
// symbol, the implied last one included); returns the bytes it took, or -1.
__host__ __device__ static int read_weights(const u8* in, u32 available, u8* weights, int* symbols, int* max_bits) {
    if (available < 1) return -1;
    int header = in[0], n = 0, used;
    if (header >= 128) {
        n = header - 127;
        used = 1 + (n + 1) / 2;
        if ((u32)used > available) return -1;
        for (int s = 0; s < n; s++) weights[s] = (u8)(s % 2 ? in[1 + s / 2] & 15 : in[1 + s / 2] >> 4);
    } else {
        used = 1 + header;
        if ((u32)used > available || header < 2) return -1;
        // Normalized counts, read forward (FSE_readNCount's format).
        const u8* ncount = in + 1;
        u32 bit = 0, limit = 8 * (u32)header;
        int norm[HUF_MAX_BITS + 1];
        #define TAKE(count, into) do { if (bit + (count) > limit) return -1; \
            into = (int)((get_le(ncount + bit / 8, (bit % 8 + (count) + 7) / 8) >> (bit % 8)) & ((1u << (count)) - 1)); \
            bit += (count); } while (0)
        int log;
        TAKE(4, log);
        log += 5;
        if (log > WEIGHT_LOG) return -1;
        int remaining = (1 << log) + 1, threshold = 1 << log, nb = log + 1, s = 0;
        bool previous0 = false;
        while (remaining > 1) {
            if (previous0) {
                int repeat;
                do {
                    TAKE(2, repeat);
                    for (int k = 0; k < repeat; k++) {
                        if (s > HUF_MAX_BITS) return -1;
                        norm[s++] = 0;
                    }
                } while (repeat == 3);
            }
            if (s > HUF_MAX_BITS) return -1;
            int max = 2 * threshold - 1 - remaining, low, count;
            if (bit + nb - 1 > limit) return -1;
            low = (int)((get_le(ncount + bit / 8, (bit % 8 + nb - 1 + 7) / 8) >> (bit % 8)) & (threshold - 1));
            if (low < max) {
                count = low;
                bit += nb - 1;
            } else {
                TAKE(nb, count);
                if (count >= threshold) count -= max;
            }
            count--;
            remaining -= count < 0 ? -count : count;
            norm[s++] = count;
            previous0 = count == 0;
            while (remaining < threshold) { nb--; threshold >>= 1; }
        }
        #undef TAKE
        if (remaining != 1) return -1;
        int last_symbol = s - 1;
        u8 symbol[1 << WEIGHT_LOG], nbits[1 << WEIGHT_LOG];
        u16 baseline[1 << WEIGHT_LOG];
        fse_decode_table(norm, last_symbol, log, symbol, nbits, baseline);
        // Two interleaved states, read backwards; the read that runs past the start ends it.
        const u8* stream = ncount + (bit + 7) / 8;
        long long length = in + used - stream;
        if (length < 1 || stream[length - 1] == 0) return -1;
        long long position = 8 * (length - 1) + highest_bit(stream[length - 1]);
        int state[2];
        for (int k = 0; k < 2; k++) {
            state[k] = (int)bits_below(stream, position, log);
            position -= log;
        }
        if (position < 0) return -1;
        for (int k = 0;; k ^= 1) {
            if (n >= 255) return -1;
            int current = state[k];
            weights[n++] = symbol[current];
            state[k] = baseline[current] + (int)bits_below(stream, position, nbits[current]);
            position -= nbits[current];
            if (position < 0) {  // past the start: the other state holds the last weight
                if (n >= 255) return -1;
                weights[n++] = symbol[state[k ^ 1]];
                break;
            }
        }
    }
    u32 total = 0;  // the last symbol's weight completes the others' to a power of 2
    for (int s = 0; s < n; s++) {
        if (weights[s] > HUF_MAX_BITS) return -1;
        if (weights[s]) total += 1u << (weights[s] - 1);
    }
    if (total == 0) return -1;
    int bits = highest_bit(total) + 1;
    u32 rest = (1u << bits) - total;
    if (bits > HUF_MAX_BITS || (rest & (rest - 1))) return -1;
    weights[n] = (u8)(highest_bit(rest) + 1);
    *symbols = n + 1;
    *max_bits = bits;
    return used;
}

// Where each symbol's entries start in the decoding table: canonical order, as in huffman_table.
__host__ __device__ static void huffman_starts(const u8* weights, int symbols, int max_bits, u16* start) {
    u32 slot = 0;
    for (int weight = 1; weight <= max_bits; weight++) {
        for (int s = 0; s < symbols; s++) {
            if (weights[s] != weight) continue;
            start[s] = (u16)slot;
            slot += 1u << (weight - 1);
        }
    }
}

// A symbol's entries in the decoding table (indexed by the next max_bits bits): symbol | length << 8.
__host__ __device__ static void fill_symbol(u16* table, u16 start, int weight, int max_bits, int symbol) {
    if (!weight) return;
    u16 entry = (u16)(symbol | (max_bits + 1 - weight) << 8);
    for (u32 k = 0; k < 1u << (weight - 1); k++) table[start + k] = entry;
}

// A stream decoder's state: the next bits of the stream (read backwards) from the container's
// highest bit down, and the aligned word below them, loaded one refill ahead so that the
// load's latency is not on the chain of dependent steps that decoding is. Bit positions count
// from the first aligned word that holds a byte of the stream.
struct Reader {
    const u32* words;
    long long start;     // the stream's first bit (its first byte's offset in that word, in bits)
    long long position;  // bits below it are not yet in the container
    u64 container;
    int filled;          // bits in the container
    u32 next;            // the word holding bit position - 1
};

// Tops up the container with the rest of the word below `position` when it holds 32 bits or
// fewer: from the second refill on, a whole word, and the container then holds at least two
// codes. Only threads that need bits load them (one aligned word each), so a warp's loads
// stay few although its threads read as many streams.
__host__ __device__ static void refill(Reader* r) {
    if (r->filled > 32) return;
    long long low = (r->position - 1) & ~31LL;  // the first bit of the word holding bit position - 1
    int count = (int)(r->position - low);       // its bits below position: 1..32
    u32 bits = count < 32 ? r->next & ((1u << count) - 1) : r->next;
    if (low < r->start)  // the stream's first word: bits below the stream read as 0
        bits = low + 32 <= r->start ? 0 : bits & ~((1u << (r->start - low)) - 1);
    r->container |= (u64)(bits << (32 - count)) << (32 - r->filled);
    r->filled += count;
    r->position = low;
    r->next = low > r->start ? r->words[(low - 1) >> 5] : 0;
}

// Decodes `count` symbols of one Huffman-coded stream; 0, or FRAME_DAMAGED when the stream
// does not end exactly where its last symbol does. A symbol is a chain of dependent steps (the
// next code's position depends on this one's length), so the chain is kept short: a table
// lookup on the container's top bits and one shift. Decoded bytes are stored a word at a time
// where the output is aligned.
__host__ __device__ static int decode_stream(const u8* in, u32 length, const u16* table, int max_bits, u8* out,
                                             u32 count) {
    if (length == 0 || in[length - 1] == 0) return FRAME_DAMAGED;
    Reader r;
    r.words = (const u32*)((u64)in & ~(u64)3);
    r.start = 8 * ((u64)in & 3);
    r.position = r.start + 8LL * (length - 1) + highest_bit(in[length - 1]);  // from below the end mark
    r.container = 0;
    r.filled = 0;
    r.next = r.position > r.start ? r.words[(r.position - 1) >> 5] : 0;
    refill(&r);  // the rest of the last word, then a whole one: two codes' worth at least
    refill(&r);
    int drop = 64 - max_bits;
    u32 i = 0;
    if (((u64)out & 3) == 0) {
        for (; i + 4 <= count; i += 4) {
            u32 word = 0;
            for (int half = 0; half < 2; half++) {
                refill(&r);
                u16 first = table[r.container >> drop];
                r.container <<= first >> 8;
                u16 second = table[r.container >> drop];
                r.container <<= second >> 8;
                r.filled -= (first >> 8) + (second >> 8);
                word |= (u32)((first & 0xFF) | (second & 0xFF) << 8) << (16 * half);
            }
            *(u32*)(out + i) = word;
        }
    }
    for (; i < count; i++) {
        refill(&r);
        u16 entry = table[r.container >> drop];
        r.container <<= entry >> 8;
        r.filled -= entry >> 8;
        out[i] = (u8)entry;
    }
    return r.position - r.start + r.filled == 0 ? 0 : FRAME_DAMAGED;
}

// Where a frame of `size` decoded bytes keeps its content; 0, or FRAME_UNSUPPORTED for valid
// frames of other shapes (several blocks, sequences, dictionaries), or FRAME_DAMAGED.
__host__ __device__ static int parse_frame(const u8* frame, u32 length, u32 size, u8* weights,
                                           FrameContent* content) {
    if (length < 9 || get_le(frame, 4) != 0xFD2FB528u || (frame[4] & 0x08)) return FRAME_DAMAGED;
    if (frame[4] & 0x03) return FRAME_UNSUPPORTED;  // a dictionary
    int single = (frame[4] >> 5) & 1, flag = frame[4] >> 6;
    int content_bytes = flag == 0 ? single : (flag == 1 ? 2 : (flag == 2 ? 4 : 8));
    u32 at = 5 + (single ? 0 : 1);
    if (at + content_bytes + 3 > length) return FRAME_DAMAGED;
    if (content_bytes == 8 && get_le(frame + at + 4, 4) != 0) return FRAME_DAMAGED;
    if (content_bytes && get_le(frame + at, content_bytes < 8 ? content_bytes : 4) + (flag == 1 ? 256 : 0) != size)
        return FRAME_DAMAGED;
    at += content_bytes;
    u32 block = get_le(frame + at, 3), block_size = block >> 3;
    int type = (block >> 1) & 3;
    at += 3;
    if (!(block & 1)) return FRAME_UNSUPPORTED;  // more than one block
    content->offset = at;
    if (type == 0 || type == 1) {
        content->kind = type == 0 ? CONTENT_RAW : CONTENT_RLE;
        return block_size == size && at + (type == 0 ? size : 1) <= length ? 0 : FRAME_DAMAGED;
    }
    if (type == 3 || at + block_size > length || block_size < 2) return FRAME_DAMAGED;
    const u8* section = frame + at;
    int literals = section[0] & 3, format = (section[0] >> 2) & 3;
    u32 header, regenerated, stored;
    content->streams = 1;
    if (literals <= 1) {  // raw or RLE literals
        header = format == 1 ? 2 : (format == 3 ? 3 : 1);
        regenerated = format == 1 ? get_le(section, 2) >> 4 : (format == 3 ? get_le(section, 3) >> 4 : section[0] >> 3);
        stored = literals == 0 ? regenerated : 1;
    } else if (literals == 2) {
        header = format <= 1 ? 3 : (format == 2 ? 4 : 5);
        int width = format <= 1 ? 10 : (format == 2 ? 14 : 18);
        u64 fields = (u64)get_le(section, 4) | ((u64)(header == 5 ? section[4] : 0) << 32);
        regenerated = (u32)((fields >> 4) & ((1u << width) - 1));
        stored = (u32)((fields >> (4 + width)) & ((1u << width) - 1));
        content->streams = format == 0 ? 1 : 4;
    } else {
        return FRAME_UNSUPPORTED;  // literals coded with an earlier block's table
    }
    if (header + stored + 1 > block_size) return FRAME_DAMAGED;
    if (regenerated != size || section[header + stored] != 0) return FRAME_UNSUPPORTED;  // sequences
    if (header + stored + 1 != block_size) return FRAME_DAMAGED;
    content->offset = at + header;
    if (literals <= 1) {
        content->kind = literals == 0 ? CONTENT_RAW : CONTENT_RLE;
        return 0;
    }
    int symbols, used = read_weights(section + header, stored, weights, &symbols, &content->max_bits);
    if (used < 0) return FRAME_DAMAGED;
    content->kind = CONTENT_HUFFMAN;
    content->symbols = symbols;
    content->offset += used;
    u32 streams = stored - used;
    if (content->streams == 1) {
        content->stream_length[0] = streams;
        return 0;
    }
    if (streams < 10) return FRAME_DAMAGED;
    const u8* jump = section + header + used;
    u32 sum = 0;
    for (int k = 0; k < 3; k++) sum += content->stream_length[k] = get_le(jump + 2 * k, 2);
    if (sum + 6 + 1 > streams) return FRAME_DAMAGED;
    content->stream_length[3] = streams - 6 - sum;
    content->offset += JUMP_TABLE;
    return 0;
}

#ifndef NVFS_HOST_BUILD  // a host build (the tests) takes the functions above only
extern "C" {

// One block of 256 threads per frame: its byte histogram (a sub-histogram per warp in shared
// memory, as a skewed plane makes every thread of a warp hit the same few counters).
__global__ void frame_histograms(const u8* planes, const long long* frame_start, const int* frame_size,
                                 u32* counts) {
    __shared__ u32 local[8][256];
    for (int k = threadIdx.x; k < 8 * 256; k += blockDim.x) local[k / 256][k % 256] = 0;
    __syncthreads();
    u32* mine = local[threadIdx.x / 32];
    const u8* in = planes + frame_start[blockIdx.x];
    long long n = frame_size[blockIdx.x];
    long long words = ((u64)in & 3) == 0 ? n / 4 : 0;
    for (long long k = threadIdx.x; k < words; k += blockDim.x) {
        u32 word = ((const u32*)in)[k];
        atomicAdd(&mine[word & 0xFF], 1u);
        atomicAdd(&mine[(word >> 8) & 0xFF], 1u);
        atomicAdd(&mine[(word >> 16) & 0xFF], 1u);
        atomicAdd(&mine[word >> 24], 1u);
    }
    for (long long k = words * 4 + threadIdx.x; k < n; k += blockDim.x) atomicAdd(&mine[in[k]], 1u);
    __syncthreads();
    for (int s = threadIdx.x; s < 256; s += blockDim.x) {
        u32 sum = 0;
        for (int w = 0; w < 8; w++) sum += local[w][s];
        counts[(long long)blockIdx.x * 256 + s] = sum;
    }
}

// One block of 256 threads per plane: its counts (the sum of its frames') and its order-0
// entropy in bits per byte, by which the host leaves near-random planes raw.
__global__ void plane_counts(const u32* frame_counts, const long long* bounds, u32* counts, float* entropy) {
    __shared__ float terms[256];
    __shared__ u32 total;
    int p = blockIdx.x, s = threadIdx.x;
    if (s == 0) total = 0;
    __syncthreads();
    u32 count = 0;
    for (long long f = bounds[p]; f < bounds[p + 1]; f++) count += frame_counts[f * 256 + s];
    counts[256LL * p + s] = count;
    if (count) atomicAdd(&total, count);
    __syncthreads();
    float share = total ? (float)count / (float)total : 0.0f;
    terms[s] = share > 0.0f ? -share * log2f(share) : 0.0f;
    __syncthreads();
    for (int half = 128; half > 0; half /= 2) {
        if (s < half) terms[s] += terms[s + half];
        __syncthreads();
    }
    if (s == 0) entropy[p] = terms[0];
}

// One thread per table: coding table and tree description from the counts of plane plane[t].
__global__ void build_tables(const u32* counts, const int* plane, int tables, u32* table, u8* descriptions,
                             int* description_length) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tables) return;
    description_length[t] = huffman_table(counts + 256LL * plane[t], table + 256LL * t,
                                          descriptions + (long long)DESCRIPTION_STRIDE * t);
}

// One block of 4 * LANES threads per frame, LANES per stream. Each lane counts the bits of its
// share of the stream; sums over the lanes place every lane's codes (a stream is written from
// its last symbol on, so a lane's bits follow those of the lanes after it); then each lane
// writes its codes straight into the frame, and thread 0 the headers around them.
__global__ void encode_frames(const u8* planes, const long long* frame_start, const int* frame_size,
                              const long long* frame_index, const u32* frame_counts, const int* frame_table,
                              const u32* table, const u8* descriptions, const int* description_length, u8* out,
                              long long frame_capacity, u32* frame_length) {
    __shared__ u32 bits[4][LANES];
    __shared__ u32 stream_bytes[4];
    __shared__ int mode, symbol;
    __shared__ u32 head, length;
    int f = blockIdx.x, s = threadIdx.x / LANES, lane = threadIdx.x % LANES, t = frame_table[f];
    u32 size = (u32)frame_size[f];
    bool present = frame_counts[frame_index[f] * 256 + threadIdx.x] > 0;  // blockDim is 256
    if (__syncthreads_count(present) != 1) symbol = -1;
    else if (present) symbol = threadIdx.x;  // one byte value: an RLE frame
    __syncthreads();
    int described = symbol < 0 && size >= MIN_CODED ? description_length[t] : 0;
    const u32* codes = table + 256LL * t;
    long long start, count;
    stream_span(size, s, &start, &count);
    long long share = (count + LANES - 1) / LANES;
    long long first = lane * share < count ? lane * share : count;
    long long last = first + share < count ? first + share : count;
    const u8* in = planes + frame_start[f] + start + first;
    bits[s][lane] = described ? coded_bits(in, last - first, codes) : 0;
    __syncthreads();
    if (threadIdx.x < 4) {
        u32 total = 0;
        for (int k = 0; k < LANES; k++) total += bits[threadIdx.x][k];
        stream_bytes[threadIdx.x] = total / 8 + 1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mode = frame_layout(size, symbol, described, stream_bytes, &head, &length);
        frame_length[f] = length;
    }
    __syncthreads();
    u8* frame = out + (long long)f * frame_capacity;
    if (mode == MODE_RAW) {
        const u8* raw = planes + frame_start[f];
        for (u32 k = threadIdx.x; k < size; k += blockDim.x) frame[head + k] = raw[k];
    } else if (mode == MODE_HUFFMAN) {
        u32* words = (u32*)frame;
        for (u32 w = head / 4 + threadIdx.x; w < (length + 3) / 4; w += blockDim.x) words[w] = 0;
        __syncthreads();
        u64 at = head;
        for (int k = 0; k < s; k++) at += stream_bytes[k];
        at *= 8;
        for (int k = lane + 1; k < LANES; k++) at += bits[s][k];
        put_codes(in, last - first, codes, words, at);
        if (lane == 0) or_word(words + (at + bits[s][0]) / 32, 1u << ((at + bits[s][0]) % 32));  // end mark
    }
    __syncthreads();
    if (threadIdx.x == 0)
        write_head(frame, mode, size, symbol, descriptions + (long long)DESCRIPTION_STRIDE * t, described,
                   stream_bytes, length);
}

// One warp per block, four threads per frame (DECODE_SLOTS frames): the first of each four
// reads its frame's headers and tree; the four fill the frame's decoding table, then each
// decodes one stream. A stream's symbols are a chain of dependent steps, so throughput comes
// from many streams at once: a block per frame left 28 of each warp's 32 threads idle.
// `status`: 0, FRAME_UNSUPPORTED (left for nvCOMP) or FRAME_DAMAGED.
__global__ void decode_frames(const u8* frames, const long long* frame_start, const int* frame_length, u8* out,
                              const long long* out_start, const int* out_size, int* status, int count) {
    __shared__ u16 table[DECODE_SLOTS][1 << HUF_MAX_BITS];
    __shared__ u16 start[DECODE_SLOTS][256];
    __shared__ u8 weights[DECODE_SLOTS][256];
    __shared__ FrameContent contents[DECODE_SLOTS];
    __shared__ int result[DECODE_SLOTS];
    int slot = threadIdx.x / 4, lane = threadIdx.x % 4;
    unsigned slot_mask = 0xFu << (4 * slot);
    int f = blockIdx.x * DECODE_SLOTS + slot;
    bool live = f < count;
    FrameContent* content = &contents[slot];
    const u8* frame = frames + (live ? frame_start[f] : 0);
    u8* target = out + (live ? out_start[f] : 0);
    u32 size = live ? (u32)out_size[f] : 0;
    if (live && lane == 0) {
        result[slot] = parse_frame(frame, (u32)frame_length[f], size, weights[slot], content);
        if (result[slot] == 0 && content->kind == CONTENT_HUFFMAN)
            huffman_starts(weights[slot], content->symbols, content->max_bits, start[slot]);
    }
    __syncwarp();
    if (live && result[slot] == 0) {  // the same for the four threads of a frame
        if (content->kind == CONTENT_RAW) {
            for (u32 k = lane; k < size; k += 4) target[k] = frame[content->offset + k];
        } else if (content->kind == CONTENT_RLE) {
            u8 value = frame[content->offset];
            u32 k = lane;
            if (((u64)target & 3) == 0) {
                for (; 4 * k + 4 <= size; k += 4) ((u32*)target)[k] = value * 0x01010101u;
                k = size / 4 * 4 + lane;
            }
            for (; k < size; k += 4) target[k] = value;
        } else {
            for (int s = lane; s < content->symbols; s += 4)
                fill_symbol(table[slot], start[slot][s], weights[slot][s], content->max_bits, s);
            __syncwarp(slot_mask);
            if (lane < content->streams) {
                u32 offset = content->offset;
                for (int k = 0; k < lane; k++) offset += content->stream_length[k];
                long long first = 0, symbols = size;
                if (content->streams == 4) stream_span(size, lane, &first, &symbols);
                int damaged = decode_stream(frame + offset, content->stream_length[lane], table[slot],
                                            content->max_bits, target + first, (u32)symbols);
                if (damaged) atomicMax(&result[slot], damaged);
            }
        }
    }
    __syncwarp();
    if (live && lane == 0) status[f] = result[slot];
}

}
#endif
