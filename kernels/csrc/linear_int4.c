/* Linear over quantized weights (quant/int4_format.py's blocked form; kernels/cpu_int4.py packs,
 * calls and tests it): 2- to 8-bit integers with a per-group scale and offset.
 *
 * Layout, per block of 16 output rows (as linear_f32.c's): 4-bit data [NB][K][8] bytes, byte j of
 * (b, k) = row 16 b + j (low nibble) | row 16 b + j + 8 (high nibble); 5-bit data [NB][K][10]: the
 * 4-bit form's 8 bytes, then 2 bytes whose bit j is row 16 b + j's fifth bit, weighing 16 (or -16
 * with signed5: two's complement); 6-bit data [NB][K][12]: then 2 more bytes of sixth bits,
 * weighing 32 (-32 with signed5); 2-bit data [NB][K][4], a little-endian uint32 whose bits 2 j,
 * 2 j + 1 are row 16 b + j's integer; 3-bit data [NB][K][6], a little-endian 48-bit value whose
 * bits 3 j .. 3 j + 2 are row 16 b + j's (two's complement with signed5); 8-bit data int8 [NB][K][16]; a 4-bit weight with a codebook
 * (the IQ4 types) holds indices, its value codebook[q] (a 16-entry table lookup per 16 lanes);
 * scales and offsets [NB][K / group][16], fp16 or fp32, or int8 codes with fp16 super parameters
 * per 256 inputs (the K types' two levels: the parameter is super * code, computed once per group
 * and exact in fp32, so the sums are the one-level form's bits), the codes int8 or, with codes4,
 * 4-bit (Q2_K's: [NB][K / group / 2][16] bytes, group 2 i in byte i's low nibble, 2 i + 1 in its
 * high one); offsets NULL meaning zero.
 *
 * linear_blocks_q: Y[r, n] = sum_k X[r, k] * (s[n, g] q[n, k] + o[n, g]) (+ bias[n]), computed per
 * group as s[n, g] * (sum_k q[n, k] X[r, k]) + o[n, g] * (sum_k X[r, k]): the integers become floats
 * and meet the inputs in one multiply-add each, and the scale and offset are applied once per group
 * instead of once per weight (the same sum in another order: the reference dequantizes first).
 * Every output is summed the same way whatever the number of rows, the blocks a pass and the
 * thread that computes it (fused multiply-adds in k order within a group, groups in order, a
 * group's input sum from one function), so a row's result does not depend on the rows beside it.
 * The bytes read per weight are 0.5 (+ 1 / 8 for fp16 parameters at group 32) instead of fp32's 4:
 * decode reads weights, so that is the decode speed.
 * Paths: AVX-512 (16-lane vectors, 12 rows a pass; 1-2 rows run four blocks a pass and 3-4 rows two,
 * so their add chains do not wait on each other; with VBMI the 4-bit integers become floats by
 * table lookup), AVX2 (two 8-lane halves, 6 rows), and plain C vector extensions that compile
 * anywhere (aarch64: NEON; the same arithmetic).
 *
 * dequant_blocks_q: blocks [b0, b1) as fp32 [b1 - b0][K][16] (linear_f32.c's layout), for prefill
 * chunks that go to BLAS (kernels/cpu_int4.py).
 */
#include <stdint.h>
#include <string.h>

#include "edge_runtime_cpu.h"

#define BN LINEAR_BLOCK_N
#if defined(__AVX512F__)
#define MAX_ROWS 12
#else
#define MAX_ROWS 6
#endif
#define ROW_BLOCK 48
/* software prefetch this many k ahead in a block's stream (16 KiB of 4-bit data, 32 KiB of 8-bit):
 * one row reads a block's line every 8 k (4-bit), faster than the hardware prefetchers ramp up;
 * with four blocks a pass, 2048 beat 1024 and 4096 (docs/cpu-backend.md, "CPU linears") */
#define Q_PREFETCH_K 2048
#define SUPER_K 256 /* inputs per super parameter */
/* Weight forms a kernel is compiled for: bits 2, 3, 4, 5, 6, 8, and BOOK4 (4-bit codebook indices) */
#define BOOK4 40
#define FORM_BYTES(F) ((F) == BOOK4 ? 8 : 2 * (F)) /* bytes per (block, k) */

/* fp16 bits -> float, exact (subnormals included), for targets without a conversion instruction */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: man * 2^-24, exact in fp32 */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

/* The sum of a group's inputs: the offset's factor, once per row and group per call. The compiler
 * may vectorize it (-fassociative-math) as the target's tuning chooses, so builds for different
 * targets agree to rounding; one compiled copy (noinline) gives every call in a build the same
 * bits, whichever thread and rows it serves. */
__attribute__((noinline)) static float group_sum(const float *x, int64_t G) {
    float t = 0;
    for (int64_t k = 0; k < G; k++) t += x[k];
    return t;
}

#if defined(__AVX512F__)
#include <immintrin.h>
typedef float v16f __attribute__((vector_size(64), aligned(4), may_alias));

#if defined(__AVX512VBMI__)
/* Lane j's nibble moved to the low bits of lane j's first byte (one multishift over the 8 bytes
 * broadcast to every quadword: row j < 8 is byte j's low nibble, row j + 8 its high one), then
 * read through a 16-entry table of the floats 0..15 (vpermps uses an index's low 4 bits only, so
 * the other bits need no masking): two shuffles instead of mask, shift, unpack, widen, convert. */
static inline v16f lanes_table(const uint8_t *p, __m512 values) {
    int64_t bytes8;
    memcpy(&bytes8, p, 8);
    const __m512i nibble_at = _mm512_set_epi32(60, 52, 44, 36, 28, 20, 12, 4, 56, 48, 40, 32, 24, 16, 8, 0);
    const __m512i index = _mm512_multishift_epi64_epi8(nibble_at, _mm512_set1_epi64(bytes8));
    return (v16f)_mm512_permutexvar_ps(index, values);
}
static inline v16f lanes_int4(const uint8_t *p) {
    return lanes_table(p, _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
}
/* codebook indices: the same lookup in the codebook's values (free next to the plain one) */
static inline v16f lanes_book(const uint8_t *p, v16f book) { return lanes_table(p, (__m512)book); }
#else
static inline __m512i nibbles16(const uint8_t *p) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p), mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi));
}
static inline v16f lanes_int4(const uint8_t *p) { return (v16f)_mm512_cvtepi32_ps(nibbles16(p)); }
static inline v16f lanes_book(const uint8_t *p, v16f book) {
    return (v16f)_mm512_permutexvar_ps(nibbles16(p), (__m512)book);
}
#endif
static inline v16f lanes_int8(const int8_t *p) {
    return (v16f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* the nibbles as floats, then +-16 in the lanes whose fifth bit is set (one masked add, exact) */
static inline v16f lanes_int5(const uint8_t *p, float fifth) {
    uint16_t bits;
    memcpy(&bits, p + 8, 2);
    const __m512 w = (__m512)lanes_int4(p);
    return (v16f)_mm512_mask_add_ps(w, (__mmask16)bits, w, _mm512_set1_ps(fifth));
}
/* 6-bit: +16 where the fifth bit is set, then +-32 where the sixth is (two masked adds, exact) */
static inline v16f lanes_int6(const uint8_t *p, float sixth) {
    uint16_t bits6;
    memcpy(&bits6, p + 10, 2);
    const __m512 w = (__m512)lanes_int5(p, 16.0f);
    return (v16f)_mm512_mask_add_ps(w, (__mmask16)bits6, w, _mm512_set1_ps(sixth));
}
/* 2-bit: lane j's pair shifted down from the uint32 (one variable shift, a mask, a conversion) */
static inline v16f lanes_int2(const uint8_t *p) {
    int32_t word;
    memcpy(&word, p, 4);
    const __m512i at = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i q = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(word), at), _mm512_set1_epi32(3));
    return (v16f)_mm512_cvtepi32_ps(q);
}
/* 3-bit: lanes 0-7 from the uint32 at p, 8-15 from the one at p + 2 (bits 16-47), each lane's
 * field shifted up to the top and arithmetic-shifted down (sign-extended), masked to 0..7 when
 * unsigned: as many instructions as the nibbles take */
static inline v16f lanes_int3(const uint8_t *p, int signed3) {
    int32_t w0, w1;
    memcpy(&w0, p, 4);
    memcpy(&w1, p + 2, 4);
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(w0)), _mm256_set1_epi32(w1), 1);
    const __m512i up = _mm512_set_epi32(0, 3, 6, 9, 12, 15, 18, 21, 8, 11, 14, 17, 20, 23, 26, 29);
    const __m512i q = _mm512_srai_epi32(_mm512_sllv_epi32(both, up), 29);
    return (v16f)_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(signed3 ? -1 : 7)));
}
/* the lanes of weight form F at p; fifth: the 5-bit top bit's weight (+-16), 6-bit's is twice it,
 * and its sign says whether 3-bit ones are signed */
static inline v16f lanes_of(int F, const uint8_t *p, float fifth, v16f book) {
    return F == 4 ? lanes_int4(p) : F == BOOK4 ? lanes_book(p, book) : F == 5 ? lanes_int5(p, fifth)
         : F == 6 ? lanes_int6(p, 2 * fifth) : F == 2 ? lanes_int2(p) : F == 3 ? lanes_int3(p, fifth < 0)
         : lanes_int8((const int8_t *)p);
}
static inline v16f codebook16(const blocked_weight *wt) {
    if (!wt->codebook) return (v16f){0};
    return (v16f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)wt->codebook)));
}
static inline v16f half16(const uint16_t *p) {
    return (v16f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
/* group i's 16 two-level codes: int8, or 4-bit (byte i / 2's low nibble for even i, high for odd) */
static inline v16f codes16(const blocked_weight *wt, const void *p, int64_t i) {
    if (!wt->codes4)
        return (v16f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)p + i * BN))));
    __m128i c = _mm_loadu_si128((const __m128i *)((const uint8_t *)p + (i >> 1) * BN));
    if (i & 1) c = _mm_srli_epi16(c, 4);
    return (v16f)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(c, _mm_set1_epi8(0x0F))));
}
/* group i's 16 parameters of p (scales or offsets); sp: their super parameters or NULL */
static inline v16f params16(const blocked_weight *wt, const void *p, const void *sp, int64_t i) {
    if (sp) /* code x fp16 super: exact in fp32 */
        return half16((const uint16_t *)sp + i * wt->group / SUPER_K * BN) * codes16(wt, p, i);
    if (wt->params_f32) return *(const v16f *)((const float *)p + i * BN);
    return half16((const uint16_t *)p + i * BN);
}

/* acc + w x and acc + s a as single fused multiply-adds: explicit, so the compiler neither splits
 * nor reassociates them (-fassociative-math) and every kernel rounds the same way. */
static inline v16f fma16(v16f w, float x, v16f acc) {
    return (v16f)_mm512_fmadd_ps((__m512)w, _mm512_set1_ps(x), (__m512)acc);
}
static inline v16f fmav16(v16f s, v16f a, v16f acc) {
    return (v16f)_mm512_fmadd_ps((__m512)s, (__m512)a, (__m512)acc);
}

/* NBLK output blocks, RB rows a pass. Few rows: one block's k loop is a chain of dependent
 * multiply-adds per row, so blocks side by side make independent chains (4 blocks for 1-2 rows, 2
 * for 3-4: what the 32 vector registers hold with each output's group sum and total). */
#define DEFINE_QKERNEL(BITS, NBLK, RB)                                                             \
    static void qkernel##BITS##_x##NBLK##_##RB(const blocked_weight *wt, int64_t b, int64_t K,     \
                                               const float *X, int64_t ldx, const float *xs,       \
                                               float *Y, int64_t ldy, const int *ncols,            \
                                               const float *bias) {                                \
        const int64_t G = wt->group, KG = K / G, bytes = FORM_BYTES(BITS);                         \
        const float fifth = wt->signed5 ? -16.0f : 16.0f;                                          \
        const v16f book = codebook16(wt);                                                          \
        const uint8_t *data[NBLK];                                                                 \
        v16f y[NBLK][RB];                                                                          \
        for (int j = 0; j < NBLK; j++) {                                                           \
            data[j] = (const uint8_t *)wt->data + (b + j) * K * bytes;                             \
            for (int r = 0; r < RB; r++) y[j][r] = (v16f){0};                                      \
        }                                                                                          \
        for (int64_t g = 0; g < KG; g++) {                                                         \
            v16f a[NBLK][RB];                                                                      \
            for (int j = 0; j < NBLK; j++)                                                         \
                for (int r = 0; r < RB; r++) a[j][r] = (v16f){0};                                  \
            for (int64_t k = g * G; k < (g + 1) * G; k++)                                          \
                for (int j = 0; j < NBLK; j++) {                                                   \
                    __builtin_prefetch(data[j] + (k + Q_PREFETCH_K) * bytes, 0, 3);                \
                    const v16f w = lanes_of(BITS, data[j] + k * bytes, fifth, book);               \
                    for (int r = 0; r < RB; r++) a[j][r] = fma16(w, X[r * ldx + k], a[j][r]);      \
                }                                                                                  \
            for (int j = 0; j < NBLK; j++) {                                                       \
                const v16f s = params16(wt, wt->scales, wt->super_scales, (b + j) * KG + g);       \
                for (int r = 0; r < RB; r++) y[j][r] = fmav16(s, a[j][r], y[j][r]);                \
            }                                                                                      \
            if (wt->offsets) {                                                                     \
                for (int j = 0; j < NBLK; j++) {                                                   \
                    const v16f o = params16(wt, wt->offsets, wt->super_offsets, (b + j) * KG + g); \
                    for (int r = 0; r < RB; r++) y[j][r] = fma16(o, xs[r * KG + g], y[j][r]);      \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int j = 0; j < NBLK; j++)                                                             \
            for (int r = 0; r < RB; r++) {                                                         \
                float out[BN];                                                                     \
                *(v16f *)out = y[j][r];                                                            \
                if (bias)                                                                          \
                    for (int c = 0; c < ncols[j]; c++) out[c] += bias[j * BN + c];                 \
                memcpy(Y + r * ldy + j * BN, out, sizeof(float) * ncols[j]);                       \
            }                                                                                      \
    }
#define MULTI_BLOCKS 4
#define DEFINE_BOTH(NBLK, RB)                                                                      \
    DEFINE_QKERNEL(4, NBLK, RB) DEFINE_QKERNEL(5, NBLK, RB) DEFINE_QKERNEL(6, NBLK, RB)            \
    DEFINE_QKERNEL(8, NBLK, RB) DEFINE_QKERNEL(40, NBLK, RB) DEFINE_QKERNEL(2, NBLK, RB)           \
    DEFINE_QKERNEL(3, NBLK, RB)
DEFINE_BOTH(4, 1)
DEFINE_BOTH(4, 2)
DEFINE_BOTH(2, 1)
DEFINE_BOTH(2, 2)
DEFINE_BOTH(2, 3)
DEFINE_BOTH(2, 4)

static void dequant_line(const blocked_weight *wt, int64_t b, int64_t K, float *out) {
    const int64_t G = wt->group, KG = K / G, bytes = FORM_BYTES(wt->bits);
    const int form = wt->codebook ? BOOK4 : wt->bits;
    const v16f book = codebook16(wt);
    const uint8_t *data = (const uint8_t *)wt->data + b * K * bytes;
    for (int64_t g = 0; g < KG; g++) {
        const v16f s = params16(wt, wt->scales, wt->super_scales, b * KG + g);
        const v16f o = wt->offsets ? params16(wt, wt->offsets, wt->super_offsets, b * KG + g) : (v16f){0};
        for (int64_t k = g * G; k < (g + 1) * G; k++)
            *(v16f *)(out + k * BN) = lanes_of(form, data + k * bytes, wt->signed5 ? -16.0f : 16.0f, book) * s + o;
    }
}
#else /* two 8-lane halves (v8f): AVX2, NEON, or whatever the compiler makes of vector types */
#if defined(__AVX2__)
#include <immintrin.h>
static inline void lanes_int4(const uint8_t *p, v8f *lo, v8f *hi) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p), mask = _mm_set1_epi8(0x0F);
    *lo = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(b, mask)));
    *hi = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask)));
}
#else
static inline void lanes_int4(const uint8_t *p, v8f *lo, v8f *hi) {
    float a[8], c[8];
    for (int j = 0; j < 8; j++) a[j] = (float)(p[j] & 0x0F), c[j] = (float)(p[j] >> 4);
    *lo = load_v8(a);
    *hi = load_v8(c);
}
#endif
#if defined(__AVX2__)
/* 2-bit: the uint32 broadcast, each lane's pair shifted down (one variable shift per half) */
static inline void lanes_int2(const uint8_t *p, v8f *lo, v8f *hi) {
    int32_t word;
    memcpy(&word, p, 4);
    const __m256i all = _mm256_set1_epi32(word), three = _mm256_set1_epi32(3);
    const __m256i at = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    *lo = (v8f)_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(all, at), three));
    *hi = (v8f)_mm256_cvtepi32_ps(_mm256_and_si256(
        _mm256_srlv_epi32(all, _mm256_add_epi32(at, _mm256_set1_epi32(16))), three));
}
/* 3-bit: lanes 0-7 from the uint32 at p, 8-15 from the one at p + 2 (bits 16-47); each field
 * shifted to the top, arithmetic-shifted down (sign-extended), masked to 0..7 when unsigned */
static inline void lanes_int3(const uint8_t *p, int signed3, v8f *lo, v8f *hi) {
    int32_t w0, w1;
    memcpy(&w0, p, 4);
    memcpy(&w1, p + 2, 4);
    const __m256i mask = _mm256_set1_epi32(signed3 ? -1 : 7);
    const __m256i up = _mm256_setr_epi32(29, 26, 23, 20, 17, 14, 11, 8);
    const __m256i l = _mm256_srai_epi32(_mm256_sllv_epi32(_mm256_set1_epi32(w0), up), 29);
    const __m256i h = _mm256_srai_epi32(
        _mm256_sllv_epi32(_mm256_set1_epi32(w1), _mm256_sub_epi32(up, _mm256_set1_epi32(8))), 29);
    *lo = (v8f)_mm256_cvtepi32_ps(_mm256_and_si256(l, mask));
    *hi = (v8f)_mm256_cvtepi32_ps(_mm256_and_si256(h, mask));
}
/* 4-bit codes: byte j's low (shift 0) or high (shift 4) nibble, 8 lanes */
static inline v8f u4_to_v8(const uint8_t *p, int shift) {
    const __m128i b = _mm_srl_epi16(_mm_loadl_epi64((const __m128i *)p), _mm_cvtsi32_si128(shift));
    return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(b, _mm_set1_epi8(0x0F))));
}
#else
static inline void lanes_int2(const uint8_t *p, v8f *lo, v8f *hi) {
    uint32_t word;
    memcpy(&word, p, 4);
    float a[8], c[8];
    for (int j = 0; j < 8; j++) a[j] = (float)((word >> (2 * j)) & 3), c[j] = (float)((word >> (16 + 2 * j)) & 3);
    *lo = load_v8(a);
    *hi = load_v8(c);
}
static inline void lanes_int3(const uint8_t *p, int signed3, v8f *lo, v8f *hi) {
    uint64_t bits = 0;
    memcpy(&bits, p, 6); /* little-endian: row j at bits 3 j */
    float a[8], c[8];
    for (int j = 0; j < 8; j++) {
        const int q0 = (int)((bits >> (3 * j)) & 7), q1 = (int)((bits >> (3 * j + 24)) & 7);
        a[j] = (float)(signed3 && q0 > 3 ? q0 - 8 : q0), c[j] = (float)(signed3 && q1 > 3 ? q1 - 8 : q1);
    }
    *lo = load_v8(a);
    *hi = load_v8(c);
}
static inline v8f u4_to_v8(const uint8_t *p, int shift) {
    float f[8];
    for (int j = 0; j < 8; j++) f[j] = (float)((p[j] >> shift) & 0x0F);
    return load_v8(f);
}
#endif
#if defined(__AVX2__)
/* codebook indices: one byte shuffle looks 16 lanes up in the int8 codebook, then widen */
static inline void lanes_book(const uint8_t *p, const int8_t *book, v8f *lo, v8f *hi) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p), mask = _mm_set1_epi8(0x0F);
    const __m128i table = _mm_loadu_si128((const __m128i *)book);
    const __m128i l = _mm_shuffle_epi8(table, _mm_and_si128(b, mask));
    const __m128i h = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
    *lo = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(l));
    *hi = (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h));
}
#else
static inline void lanes_book(const uint8_t *p, const int8_t *book, v8f *lo, v8f *hi) {
    float a[8], c[8];
    for (int j = 0; j < 8; j++) a[j] = (float)book[p[j] & 0x0F], c[j] = (float)book[p[j] >> 4];
    *lo = load_v8(a);
    *hi = load_v8(c);
}
#endif
static inline void lanes_int8(const int8_t *p, v8f *lo, v8f *hi) {
    *lo = i8_to_v8(p);
    *hi = i8_to_v8(p + 8);
}
/* +-16 in the lanes whose fifth bit is set, from a table: FIFTH[signed][byte] holds the 8 lanes'
 * addends of one byte of fifth bits (a load and an exact add per 8 lanes, where expanding the
 * bits took five instructions: 5-bit weights ran at ~0.55x the 4-bit ones' speed on AVX2);
 * FIFTH[2 + signed] the sixth bits' +-32 */
static float FIFTH[4][256][8];
__attribute__((constructor)) static void fifth_table(void) {
    static const float weight[4] = {16.0f, -16.0f, 32.0f, -32.0f};
    for (int s = 0; s < 4; s++)
        for (int byte = 0; byte < 256; byte++)
            for (int j = 0; j < 8; j++) FIFTH[s][byte][j] = (byte >> j) & 1 ? weight[s] : 0.0f;
}
static inline void lanes_int5(const uint8_t *p, int signed5, v8f *lo, v8f *hi) {
    lanes_int4(p, lo, hi);
    *lo += load_v8(FIFTH[signed5][p[8]]);
    *hi += load_v8(FIFTH[signed5][p[9]]);
}
static inline void lanes_int6(const uint8_t *p, int signed6, v8f *lo, v8f *hi) {
    lanes_int5(p, 0, lo, hi);
    *lo += load_v8(FIFTH[2 + signed6][p[10]]);
    *hi += load_v8(FIFTH[2 + signed6][p[11]]);
}

#if defined(__F16C__)
static inline v8f half8(const uint16_t *p) {
    return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#else
static inline v8f half8(const uint16_t *p) {
    float f[8];
    for (int j = 0; j < 8; j++) f[j] = half_to_float(p[j]);
    return load_v8(f);
}
#endif
/* group i's 16 parameters of p (scales or offsets; NULL: zero); sp: their super parameters or
 * NULL: int8 code x fp16 super, exact in fp32 */
static inline void params16(const blocked_weight *wt, const void *p, const void *sp, int64_t i,
                            v8f *lo, v8f *hi) {
    const int f32 = wt->params_f32;
    if (p == 0) {
        *lo = *hi = (v8f){0};
    } else if (sp && wt->codes4) { /* 4-bit codes: byte i / 2's low nibble for even i, high for odd */
        const uint16_t *super = (const uint16_t *)sp + i * wt->group / SUPER_K * BN;
        const uint8_t *codes = (const uint8_t *)p + (i >> 1) * BN;
        *lo = half8(super) * u4_to_v8(codes, (int)(i & 1) * 4);
        *hi = half8(super + 8) * u4_to_v8(codes + 8, (int)(i & 1) * 4);
    } else if (sp) {
        const uint16_t *super = (const uint16_t *)sp + i * wt->group / SUPER_K * BN;
        const int8_t *codes = (const int8_t *)p + i * BN;
        *lo = half8(super) * i8_to_v8(codes);
        *hi = half8(super + 8) * i8_to_v8(codes + 8);
    } else if (f32) {
        *lo = load_v8((const float *)p + i * BN);
        *hi = load_v8((const float *)p + i * BN + 8);
    } else {
        *lo = half8((const uint16_t *)p + i * BN);
        *hi = half8((const uint16_t *)p + i * BN + 8);
    }
}
/* the lanes of weight form F at p */
static inline void lanes_of(int F, const uint8_t *p, int signed5, const int8_t *book, v8f *lo,
                            v8f *hi) {
    if (F == 4)
        lanes_int4(p, lo, hi);
    else if (F == BOOK4)
        lanes_book(p, book, lo, hi);
    else if (F == 5)
        lanes_int5(p, signed5, lo, hi);
    else if (F == 6)
        lanes_int6(p, signed5, lo, hi);
    else if (F == 2)
        lanes_int2(p, lo, hi);
    else if (F == 3)
        lanes_int3(p, signed5, lo, hi);
    else
        lanes_int8((const int8_t *)p, lo, hi);
}

/* One output block, RB rows a pass, as the AVX-512 kernels compute it (two 8-lane halves). */
#define DEFINE_QKERNEL(BITS, NBLK, RB)                                                             \
    static void qkernel##BITS##_x##NBLK##_##RB(const blocked_weight *wt, int64_t b, int64_t K,     \
                                               const float *X, int64_t ldx, const float *xs,       \
                                               float *Y, int64_t ldy, const int *ncols,            \
                                               const float *bias) {                                \
        _Static_assert(NBLK == 1, "the two-half path runs one block a pass");                   \
        const int64_t G = wt->group, KG = K / G, bytes = FORM_BYTES(BITS);                         \
        const int signed5 = wt->signed5 != 0;                                                      \
        const int8_t *book = wt->codebook;                                                         \
        const uint8_t *data = (const uint8_t *)wt->data + b * K * bytes;                           \
        v8f y[RB][2];                                                                              \
        for (int r = 0; r < RB; r++) y[r][0] = y[r][1] = (v8f){0};                                 \
        for (int64_t g = 0; g < KG; g++) {                                                         \
            v8f a[RB][2], s0, s1;                                                                  \
            for (int r = 0; r < RB; r++) a[r][0] = a[r][1] = (v8f){0};                             \
            for (int64_t k = g * G; k < (g + 1) * G; k++) {                                        \
                __builtin_prefetch(data + (k + Q_PREFETCH_K) * bytes, 0, 3);                       \
                v8f w0, w1;                                                                        \
                lanes_of(BITS, data + k * bytes, signed5, book, &w0, &w1);                         \
                for (int r = 0; r < RB; r++) {                                                     \
                    const v8f xb = splat_v8(X[r * ldx + k]);                                       \
                    a[r][0] += w0 * xb;                                                            \
                    a[r][1] += w1 * xb;                                                            \
                }                                                                                  \
            }                                                                                      \
            params16(wt, wt->scales, wt->super_scales, b * KG + g, &s0, &s1);                      \
            for (int r = 0; r < RB; r++) {                                                         \
                y[r][0] += s0 * a[r][0];                                                           \
                y[r][1] += s1 * a[r][1];                                                           \
            }                                                                                      \
            if (wt->offsets) {                                                                     \
                v8f o0, o1;                                                                        \
                params16(wt, wt->offsets, wt->super_offsets, b * KG + g, &o0, &o1);                \
                for (int r = 0; r < RB; r++) {                                                     \
                    const v8f xsum = splat_v8(xs[r * KG + g]);                                     \
                    y[r][0] += o0 * xsum;                                                          \
                    y[r][1] += o1 * xsum;                                                          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < RB; r++) {                                                             \
            float out[BN];                                                                         \
            store_v8(out, y[r][0]);                                                                \
            store_v8(out + 8, y[r][1]);                                                            \
            if (bias)                                                                              \
                for (int c = 0; c < ncols[0]; c++) out[c] += bias[c];                              \
            memcpy(Y + r * ldy, out, sizeof(float) * ncols[0]);                                    \
        }                                                                                          \
    }
#define DEFINE_BOTH(NBLK, RB)                                                                      \
    DEFINE_QKERNEL(4, NBLK, RB) DEFINE_QKERNEL(5, NBLK, RB) DEFINE_QKERNEL(6, NBLK, RB)            \
    DEFINE_QKERNEL(8, NBLK, RB) DEFINE_QKERNEL(40, NBLK, RB) DEFINE_QKERNEL(2, NBLK, RB)           \
    DEFINE_QKERNEL(3, NBLK, RB)

static void dequant_line(const blocked_weight *wt, int64_t b, int64_t K, float *out) {
    const int64_t G = wt->group, KG = K / G, bytes = FORM_BYTES(wt->bits);
    const int form = wt->codebook ? BOOK4 : wt->bits;
    const uint8_t *data = (const uint8_t *)wt->data + b * K * bytes;
    for (int64_t g = 0; g < KG; g++) {
        v8f s0, s1, o0, o1, w0, w1;
        params16(wt, wt->scales, wt->super_scales, b * KG + g, &s0, &s1);
        params16(wt, wt->offsets, wt->super_offsets, b * KG + g, &o0, &o1);
        for (int64_t k = g * G; k < (g + 1) * G; k++) {
            lanes_of(form, data + k * bytes, wt->signed5 != 0, wt->codebook, &w0, &w1);
            store_v8(out + k * BN, w0 * s0 + o0);
            store_v8(out + k * BN + 8, w1 * s1 + o1);
        }
    }
}
#endif

/* Ask for the scales and offsets of blocks [b0, b1) (the next pass's): a block's are only
 * K / group * 16 values, a short stream of their own that the hardware prefetchers do not catch
 * in time, so without this every pass begins with two misses to memory (one thread's one-row
 * stream ran at ~2/3 of its speed with the parameters in cache). */
static void prefetch_params(const blocked_weight *wt, int64_t K, int64_t b0, int64_t b1) {
    const int64_t line = 64, bytes = K / wt->group * BN * (wt->super_scales ? 1 : wt->params_f32 ? 4 : 2)
                                     / (wt->codes4 ? 2 : 1);
    for (int64_t i = 0; i < (b1 - b0) * bytes; i += line) {
        __builtin_prefetch((const char *)wt->scales + b0 * bytes + i, 0, 3);
        if (wt->offsets) __builtin_prefetch((const char *)wt->offsets + b0 * bytes + i, 0, 3);
        __asm__ volatile("" : : "r"(i)); /* gcc's dead-code pass drops a loop of only prefetches */
    }
}

DEFINE_BOTH(1, 1)
DEFINE_BOTH(1, 2)
DEFINE_BOTH(1, 3)
DEFINE_BOTH(1, 4)
DEFINE_BOTH(1, 5)
DEFINE_BOTH(1, 6)
#if MAX_ROWS == 12
DEFINE_BOTH(1, 7)
DEFINE_BOTH(1, 8)
DEFINE_BOTH(1, 9)
DEFINE_BOTH(1, 10)
DEFINE_BOTH(1, 11)
DEFINE_BOTH(1, 12)
#endif

typedef void (*qkernel_fn)(const blocked_weight *, int64_t, int64_t, const float *, int64_t,
                           const float *, float *, int64_t, const int *, const float *);
#if MAX_ROWS == 12
#define ONE_BLOCK_TABLE(BITS)                                                                      \
    {0, qkernel##BITS##_x1_1, qkernel##BITS##_x1_2, qkernel##BITS##_x1_3, qkernel##BITS##_x1_4,    \
     qkernel##BITS##_x1_5, qkernel##BITS##_x1_6, qkernel##BITS##_x1_7, qkernel##BITS##_x1_8,       \
     qkernel##BITS##_x1_9, qkernel##BITS##_x1_10, qkernel##BITS##_x1_11, qkernel##BITS##_x1_12}
#else
#define ONE_BLOCK_TABLE(BITS)                                                                      \
    {0, qkernel##BITS##_x1_1, qkernel##BITS##_x1_2, qkernel##BITS##_x1_3, qkernel##BITS##_x1_4,    \
     qkernel##BITS##_x1_5, qkernel##BITS##_x1_6}
#endif
/* [form(wt)][rows] */
#define FORMS 7
static const qkernel_fn ONE_BLOCK[FORMS][MAX_ROWS + 1] = {
    ONE_BLOCK_TABLE(4), ONE_BLOCK_TABLE(5), ONE_BLOCK_TABLE(6), ONE_BLOCK_TABLE(8), ONE_BLOCK_TABLE(40),
    ONE_BLOCK_TABLE(2), ONE_BLOCK_TABLE(3)};
static inline int form_of(const blocked_weight *wt) {
    return wt->codebook ? 4 : wt->bits == 4 ? 0 : wt->bits == 5 ? 1 : wt->bits == 6 ? 2 : wt->bits == 8 ? 3
         : wt->bits == 2 ? 5 : 6;
}

#if defined(MULTI_BLOCKS)
/* [form(wt)][rows]: the widest pass for 1-4 rows (four blocks only up to 2 rows), then two
 * blocks for what is left */
#define FOUR_ROW(F) {0, qkernel##F##_x4_1, qkernel##F##_x4_2, 0, 0}
#define TWO_ROW(F) {0, qkernel##F##_x2_1, qkernel##F##_x2_2, qkernel##F##_x2_3, qkernel##F##_x2_4}
static const qkernel_fn FOUR_BLOCKS[FORMS][5] = {FOUR_ROW(4), FOUR_ROW(5), FOUR_ROW(6), FOUR_ROW(8),
                                                 FOUR_ROW(40), FOUR_ROW(2), FOUR_ROW(3)};
static const qkernel_fn TWO_BLOCKS[FORMS][5] = {TWO_ROW(4), TWO_ROW(5), TWO_ROW(6), TWO_ROW(8),
                                                TWO_ROW(40), TWO_ROW(2), TWO_ROW(3)};

/* Blocks from *b on in passes of four, then two blocks, for 1-4 rows; *b: the first block left. */
static void multi_block_passes(const blocked_weight *wt, const float *bias, const float *X,
                               int64_t ldx, const float *xs, float *Y, int64_t ldy, int64_t N,
                               int64_t K, int64_t R, int64_t *b, int64_t b1) {
    const int w = form_of(wt);
    for (int nblk = MULTI_BLOCKS; nblk >= 2; nblk /= 2) {
        const qkernel_fn kernel = (nblk == 4 ? FOUR_BLOCKS : TWO_BLOCKS)[w][R];
        if (!kernel) continue;
        for (; *b + nblk <= b1; *b += nblk) {
            int ncols[MULTI_BLOCKS];
            for (int j = 0; j < nblk; j++)
                ncols[j] = (int)(N - (*b + j) * BN < BN ? N - (*b + j) * BN : BN);
            prefetch_params(wt, K, *b + nblk, *b + 2 * nblk < b1 ? *b + 2 * nblk : b1);
            kernel(wt, *b, K, X, ldx, xs, Y + *b * BN, ldy, ncols, bias ? bias + *b * BN : 0);
        }
    }
}
#endif

/* Rows [0, R) of blocks [b0, b1), the rows' group sums in xs [R][K / group] (unread without
 * offsets). */
static void rows_of_blocks(const blocked_weight *wt, const float *bias, const float *X, int64_t ldx,
                           const float *xs, float *Y, int64_t ldy, int64_t N, int64_t K, int64_t R,
                           int64_t b0, int64_t b1) {
    const qkernel_fn *kernels = ONE_BLOCK[form_of(wt)];
    const int64_t KG = K / wt->group;
#if defined(MULTI_BLOCKS)
    if (R >= 1 && R <= 4) multi_block_passes(wt, bias, X, ldx, xs, Y, ldy, N, K, R, &b0, b1);
#endif
    for (int64_t r0 = 0; r0 < R; r0 += ROW_BLOCK) {
        const int64_t r1 = r0 + ROW_BLOCK < R ? r0 + ROW_BLOCK : R;
        for (int64_t b = b0; b < b1; b++) {
            const int ncols = (int)(N - b * BN < BN ? N - b * BN : BN);
            const float *bb = bias ? bias + b * BN : 0;
            if (b + 1 < b1) prefetch_params(wt, K, b + 1, b + 2);
            for (int64_t r = r0; r < r1; r += MAX_ROWS) {
                const int rb = (int)(r1 - r < MAX_ROWS ? r1 - r : MAX_ROWS);
                kernels[rb](wt, b, K, X + r * ldx, ldx, xs + r * KG, Y + r * ldy + b * BN, ldy,
                            &ncols, bb);
            }
        }
    }
}

/* The group sums one call keeps on the stack: rows go in chunks of GROUP_SUMS / (K / group).
 * K / group <= GROUP_SUMS: check_weight, and kernels/cpu_int4.py's QuantLinear (MAX_GROUPS). */
#define GROUP_SUMS 8192

void linear_blocks_q(const blocked_weight *wt, const float *bias, const float *X, int64_t ldx,
                     float *Y, int64_t ldy, int64_t N, int64_t K, int64_t R, int64_t b0,
                     int64_t b1) {
    const int64_t G = wt->group, KG = K / G, chunk = wt->offsets ? GROUP_SUMS / KG : R;
    float xs[GROUP_SUMS];
    for (int64_t c0 = 0; c0 < R; c0 += chunk) {
        const int64_t c1 = c0 + chunk < R ? c0 + chunk : R;
        if (wt->offsets)
            for (int64_t r = c0; r < c1; r++)
                for (int64_t g = 0; g < KG; g++)
                    xs[(r - c0) * KG + g] = group_sum(X + r * ldx + g * G, G);
        rows_of_blocks(wt, bias, X + c0 * ldx, ldx, xs, Y + c0 * ldy, ldy, N, K, c1 - c0, b0, b1);
    }
}

/* One thread's output blocks [b0, b1) of any blocked weight (fp32 or quantized): what decoder.c
 * calls for every linear. */
void linear_blocks(const blocked_weight *wt, const float *bias, const float *X, int64_t ldx,
                   float *Y, int64_t ldy, int64_t N, int64_t K, int64_t R, int64_t b0, int64_t b1) {
    if (wt->bits == 32)
        linear_blocks_f32((const float *)wt->data, bias, X, ldx, Y, ldy, N, K, R, b0, b1);
    else
        linear_blocks_q(wt, bias, X, ldx, Y, ldy, N, K, R, b0, b1);
}

/* The bytes of blocks [b0, b1)' integers (what a read-ahead asks for). */
void weight_block_bytes(const blocked_weight *wt, int64_t K, int64_t b0, int64_t b1,
                        const char **begin, const char **end) {
    const int64_t line = FORM_BYTES(wt->bits); /* bytes per (block, k) */
    *begin = (const char *)wt->data + b0 * K * line;
    *end = (const char *)wt->data + b1 * K * line;
}

static int check_weight(const blocked_weight *wt, int64_t K) {
    if (wt->bits < 2 || wt->bits > 8 || wt->bits == 7) return -1;
    if (wt->group <= 0 || K % wt->group != 0 || K / wt->group > GROUP_SUMS) return -1;
    if (wt->codebook && wt->bits != 4) return -1;
    if (wt->codes4 && (!wt->super_scales || (K / wt->group) % 2)) return -1;
    if (wt->super_scales && (K % SUPER_K || SUPER_K % wt->group || (wt->offsets && !wt->super_offsets)))
        return -1;
    return 0;
}

/* Wt: blocked quantized weight; X: [R, K] rows ldx floats apart; Y: [R, N] rows ldy apart; bias
 * [N] or NULL. Output blocks split over `nthreads` OpenMP threads as linear_blocked_f32. Returns 0,
 * or -1 on a bad argument. */
int linear_blocked_q(const blocked_weight *wt, const float *bias, const float *X, int64_t ldx,
                     float *Y, int64_t ldy, int64_t N, int64_t K, int64_t R, int nthreads) {
    if (N <= 0 || K <= 0 || R < 0 || ldx < K || ldy < N || check_weight(wt, K)) return -1;
    const int64_t nb = (N + BN - 1) / BN;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int64_t b0, b1;
        span_of(nb, team_thread(), team_size(), &b0, &b1);
        linear_blocks_q(wt, bias, X, ldx, Y, ldy, N, K, R, b0, b1);
    }
    return 0;
}

/* out: fp32 [b1 - b0][K][16], the dequantized blocks [b0, b1) (linear_f32.c's layout). */
int dequant_blocks_q(const blocked_weight *wt, int64_t K, int64_t b0, int64_t b1, float *out,
                     int nthreads) {
    if (K <= 0 || b1 < b0 || check_weight(wt, K)) return -1;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int64_t c0, c1;
        span_of(b1 - b0, team_thread(), team_size(), &c0, &c1);
        for (int64_t c = c0; c < c1; c++) dequant_line(wt, b0 + c, K, out + c * K * BN);
    }
    return 0;
}
