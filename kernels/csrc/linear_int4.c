/* Linear over quantized weights (quant/int4_format.py's blocked form; kernels/cpu_int4.py packs,
 * calls and tests it): 4-bit or 8-bit integers with a per-group scale and offset.
 *
 * Layout, per block of 16 output rows (as linear_f32.c's): 4-bit data [NB][K][8] bytes, byte j of
 * (b, k) = row 16 b + j (low nibble) | row 16 b + j + 8 (high nibble); 8-bit data int8 [NB][K][16];
 * scales and offsets [NB][K / group][16], fp16 or fp32, offsets NULL meaning zero.
 *
 * linear_blocks_q: Y[r, n] = sum_k X[r, k] * (s[n, g] q[n, k] + o[n, g]) (+ bias[n]). The 16 weights
 * of a (block, k) are expanded to floats with one multiply-add (s q is exact in fp32, so this is the
 * reference dequant's value bit for bit) and then used exactly as linear_f32.c uses its fp32 line:
 * acc[r] += w * x[r, k] in k order, R rows a pass. So the outputs equal linear_blocked_f32's over
 * the dequantized weights bit for bit, while the bytes read per weight drop from 4 to 0.5 (+ 1 / 8
 * for fp16 parameters at group 32): decode reads weights, so that is the decode speed.
 * Paths: AVX-512 (16-lane vectors, 12 rows a pass; 1-4 rows run four or two blocks a pass,
 * qkernel{4,8}_x{4,2}_*, so their add chains do not wait on each other; with VBMI the 4-bit
 * integers become floats by table lookup), AVX2 (two 8-lane
 * halves, 6 rows), and plain C vector extensions that compile anywhere (aarch64: NEON; the same
 * arithmetic).
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

#if defined(__AVX512F__)
#include <immintrin.h>
typedef float v16f __attribute__((vector_size(64), aligned(4), may_alias));

#if defined(__AVX512VBMI__)
/* Lane j's nibble moved to the low bits of lane j's first byte (one multishift over the 8 bytes
 * broadcast to every quadword: row j < 8 is byte j's low nibble, row j + 8 its high one), then
 * read through a 16-entry table of the floats 0..15 (vpermps uses an index's low 4 bits only, so
 * the other bits need no masking): two shuffles instead of mask, shift, unpack, widen, convert. */
static inline v16f lanes_int4(const uint8_t *p) {
    int64_t bytes8;
    memcpy(&bytes8, p, 8);
    const __m512i nibble_at = _mm512_set_epi32(60, 52, 44, 36, 28, 20, 12, 4, 56, 48, 40, 32, 24, 16, 8, 0);
    const __m512 values = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i index = _mm512_multishift_epi64_epi8(nibble_at, _mm512_set1_epi64(bytes8));
    return (v16f)_mm512_permutexvar_ps(index, values);
}
#else
static inline v16f lanes_int4(const uint8_t *p) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p), mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    return (v16f)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi)));
}
#endif
static inline v16f lanes_int8(const int8_t *p) {
    return (v16f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline v16f params16(const void *p, int64_t i, int f32) {
    if (f32) return *(const v16f *)((const float *)p + i * BN);
    return (v16f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i * BN)));
}

#define DEFINE_QKERNEL(BITS, RB)                                                                   \
    static void qkernel##BITS##_##RB(const blocked_weight *wt, int64_t b, int64_t K,               \
                                     const float *X, int64_t ldx, float *Y, int64_t ldy,           \
                                     int ncols, const float *bias) {                               \
        const int64_t G = wt->group, KG = K / G, bytes = BITS * BN / 8;                            \
        const uint8_t *data = (const uint8_t *)wt->data + b * K * bytes;                           \
        v16f acc[RB];                                                                              \
        for (int r = 0; r < RB; r++) acc[r] = (v16f){0};                                           \
        for (int64_t g = 0; g < KG; g++) {                                                         \
            const v16f s = params16(wt->scales, b * KG + g, wt->params_f32);                       \
            const v16f o = wt->offsets ? params16(wt->offsets, b * KG + g, wt->params_f32)         \
                                       : (v16f){0};                                                \
            for (int64_t k = g * G; k < (g + 1) * G; k++) {                                        \
                __builtin_prefetch(data + (k + Q_PREFETCH_K) * bytes, 0, 3);                       \
                const v16f w = (BITS == 4 ? lanes_int4(data + k * bytes)                           \
                                          : lanes_int8((const int8_t *)data + k * bytes)) * s + o; \
                for (int r = 0; r < RB; r++) acc[r] += w * X[r * ldx + k];                         \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < RB; r++) {                                                             \
            float out[BN];                                                                         \
            *(v16f *)out = acc[r];                                                                 \
            if (bias)                                                                              \
                for (int j = 0; j < ncols; j++) out[j] += bias[j];                                 \
            memcpy(Y + r * ldy, out, sizeof(float) * ncols);                                       \
        }                                                                                          \
    }

/* The 16 weights of k and of k + 1 (bytes k * 8 .. k * 8 + 15): one 16-byte load without VBMI. */
static inline void lanes_int4_pair(const uint8_t *p, v16f *w0, v16f *w1) {
#if defined(__AVX512VBMI__)
    *w0 = lanes_int4(p);
    *w1 = lanes_int4(p + 8);
#else
    const __m128i b = _mm_loadu_si128((const __m128i *)p), mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    *w0 = (v16f)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi)));
    *w1 = (v16f)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi64(lo, hi)));
#endif
}

/* acc + w x as one fused multiply-add, as the compiler contracts linear_f32.c's `acc += w * x`; an
 * explicit fma is not reassociated under -fassociative-math, which would otherwise merge the two
 * adds of a k pair below into one (another summation order than the one-block kernels'). */
static inline v16f fma16(v16f w, float x, v16f acc) {
    return (v16f)_mm512_fmadd_ps((__m512)w, _mm512_set1_ps(x), (__m512)acc);
}

/* Few rows: NBLK (4, else 2) output blocks a pass. One block's k loop is a chain of dependent
 * multiply-adds per row (acc += w x), so with 1-4 rows the adds' latency, not the loads, sets the
 * pace; blocks side by side make independent chains. Each output still sums its k in order, so the
 * results equal qkernel{4,8}_RB's bit for bit. Groups are even: k steps by two. */
#define MULTI_BLOCKS 4
#define MULTI_MAX_ROWS 4
#define DEFINE_QKERNEL_MULTI(BITS, NBLK, RB)                                                       \
    static void qkernel##BITS##_x##NBLK##_##RB(const blocked_weight *wt, int64_t b, int64_t K,     \
                                               const float *X, int64_t ldx, float *Y, int64_t ldy, \
                                               const int *ncols, const float *bias) {              \
        const int64_t G = wt->group, KG = K / G, bytes = BITS * BN / 8;                            \
        const uint8_t *data[NBLK];                                                                 \
        v16f acc[NBLK][RB];                                                                        \
        for (int j = 0; j < NBLK; j++) {                                                           \
            data[j] = (const uint8_t *)wt->data + (b + j) * K * bytes;                             \
            for (int r = 0; r < RB; r++) acc[j][r] = (v16f){0};                                    \
        }                                                                                          \
        for (int64_t g = 0; g < KG; g++) {                                                         \
            v16f s[NBLK], o[NBLK];                                                                 \
            for (int j = 0; j < NBLK; j++) {                                                       \
                s[j] = params16(wt->scales, (b + j) * KG + g, wt->params_f32);                     \
                o[j] = wt->offsets ? params16(wt->offsets, (b + j) * KG + g, wt->params_f32)       \
                                   : (v16f){0};                                                    \
            }                                                                                      \
            for (int64_t k = g * G; k < (g + 1) * G; k += 2) {                                     \
                for (int j = 0; j < NBLK; j++) {                                                   \
                    __builtin_prefetch(data[j] + (k + Q_PREFETCH_K) * bytes, 0, 3);                \
                    v16f w0, w1;                                                                   \
                    if (BITS == 4) {                                                               \
                        lanes_int4_pair(data[j] + k * bytes, &w0, &w1);                            \
                    } else {                                                                       \
                        w0 = lanes_int8((const int8_t *)data[j] + k * bytes);                      \
                        w1 = lanes_int8((const int8_t *)data[j] + (k + 1) * bytes);                \
                    }                                                                              \
                    w0 = w0 * s[j] + o[j];                                                         \
                    w1 = w1 * s[j] + o[j];                                                         \
                    for (int r = 0; r < RB; r++) acc[j][r] = fma16(w0, X[r * ldx + k], acc[j][r]); \
                    for (int r = 0; r < RB; r++)                                                   \
                        acc[j][r] = fma16(w1, X[r * ldx + k + 1], acc[j][r]);                      \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int j = 0; j < NBLK; j++)                                                             \
            for (int r = 0; r < RB; r++) {                                                         \
                float out[BN];                                                                     \
                *(v16f *)out = acc[j][r];                                                          \
                if (bias)                                                                          \
                    for (int c = 0; c < ncols[j]; c++) out[c] += bias[j * BN + c];                 \
                memcpy(Y + r * ldy + j * BN, out, sizeof(float) * ncols[j]);                       \
            }                                                                                      \
    }
#define DEFINE_MULTI(NBLK, RB) DEFINE_QKERNEL_MULTI(4, NBLK, RB) DEFINE_QKERNEL_MULTI(8, NBLK, RB)
#define DEFINE_MULTI_ROWS(NBLK)                                                                    \
    DEFINE_MULTI(NBLK, 1) DEFINE_MULTI(NBLK, 2) DEFINE_MULTI(NBLK, 3) DEFINE_MULTI(NBLK, 4)
DEFINE_MULTI_ROWS(4)
DEFINE_MULTI_ROWS(2)
typedef void (*qkernel_multi_fn)(const blocked_weight *, int64_t, int64_t, const float *, int64_t,
                                 float *, int64_t, const int *, const float *);
#define MULTI_TABLE(BITS, NBLK)                                                                    \
    {0, qkernel##BITS##_x##NBLK##_1, qkernel##BITS##_x##NBLK##_2, qkernel##BITS##_x##NBLK##_3,     \
     qkernel##BITS##_x##NBLK##_4}
/* [bits == 8][blocks == 2][rows] */
static const qkernel_multi_fn QKERNELS_MULTI[2][2][MULTI_MAX_ROWS + 1] = {
    {MULTI_TABLE(4, 4), MULTI_TABLE(4, 2)}, {MULTI_TABLE(8, 4), MULTI_TABLE(8, 2)}};

static void dequant_line(const blocked_weight *wt, int64_t b, int64_t K, float *out) {
    const int64_t G = wt->group, KG = K / G, bytes = wt->bits * BN / 8;
    const uint8_t *data = (const uint8_t *)wt->data + b * K * bytes;
    for (int64_t g = 0; g < KG; g++) {
        const v16f s = params16(wt->scales, b * KG + g, wt->params_f32);
        const v16f o = wt->offsets ? params16(wt->offsets, b * KG + g, wt->params_f32) : (v16f){0};
        for (int64_t k = g * G; k < (g + 1) * G; k++)
            *(v16f *)(out + k * BN) = (wt->bits == 4 ? lanes_int4(data + k * bytes)
                                                     : lanes_int8((const int8_t *)data + k * bytes)) * s + o;
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
static inline void lanes_int8(const int8_t *p, v8f *lo, v8f *hi) {
    *lo = i8_to_v8(p);
    *hi = i8_to_v8(p + 8);
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
static inline void params16(const void *p, int64_t i, int f32, v8f *lo, v8f *hi) {
    if (p == 0) {
        *lo = *hi = (v8f){0};
    } else if (f32) {
        *lo = load_v8((const float *)p + i * BN);
        *hi = load_v8((const float *)p + i * BN + 8);
    } else {
        *lo = half8((const uint16_t *)p + i * BN);
        *hi = half8((const uint16_t *)p + i * BN + 8);
    }
}
static inline void lanes(const blocked_weight *wt, const uint8_t *p, v8f *lo, v8f *hi) {
    if (wt->bits == 4)
        lanes_int4(p, lo, hi);
    else
        lanes_int8((const int8_t *)p, lo, hi);
}

#define DEFINE_QKERNEL(BITS, RB)                                                                   \
    static void qkernel##BITS##_##RB(const blocked_weight *wt, int64_t b, int64_t K,               \
                                     const float *X, int64_t ldx, float *Y, int64_t ldy,           \
                                     int ncols, const float *bias) {                               \
        const int64_t G = wt->group, KG = K / G, bytes = BITS * BN / 8;                            \
        const uint8_t *data = (const uint8_t *)wt->data + b * K * bytes;                           \
        v8f acc[RB][2];                                                                            \
        for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = (v8f){0};                             \
        for (int64_t g = 0; g < KG; g++) {                                                         \
            v8f s0, s1, o0, o1;                                                                    \
            params16(wt->scales, b * KG + g, wt->params_f32, &s0, &s1);                            \
            params16(wt->offsets, b * KG + g, wt->params_f32, &o0, &o1);                           \
            for (int64_t k = g * G; k < (g + 1) * G; k++) {                                        \
                __builtin_prefetch(data + (k + Q_PREFETCH_K) * bytes, 0, 3);                       \
                v8f w0, w1;                                                                        \
                if (BITS == 4)                                                                     \
                    lanes_int4(data + k * bytes, &w0, &w1);                                        \
                else                                                                               \
                    lanes_int8((const int8_t *)data + k * bytes, &w0, &w1);                        \
                w0 = w0 * s0 + o0;                                                                 \
                w1 = w1 * s1 + o1;                                                                 \
                for (int r = 0; r < RB; r++) {                                                     \
                    const v8f xb = splat_v8(X[r * ldx + k]);                                       \
                    acc[r][0] += w0 * xb;                                                          \
                    acc[r][1] += w1 * xb;                                                          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < RB; r++) {                                                             \
            float out[BN];                                                                         \
            store_v8(out, acc[r][0]);                                                              \
            store_v8(out + 8, acc[r][1]);                                                          \
            if (bias)                                                                              \
                for (int j = 0; j < ncols; j++) out[j] += bias[j];                                 \
            memcpy(Y + r * ldy, out, sizeof(float) * ncols);                                       \
        }                                                                                          \
    }

static void dequant_line(const blocked_weight *wt, int64_t b, int64_t K, float *out) {
    const int64_t G = wt->group, KG = K / G, bytes = wt->bits * BN / 8;
    const uint8_t *data = (const uint8_t *)wt->data + b * K * bytes;
    for (int64_t g = 0; g < KG; g++) {
        v8f s0, s1, o0, o1, w0, w1;
        params16(wt->scales, b * KG + g, wt->params_f32, &s0, &s1);
        params16(wt->offsets, b * KG + g, wt->params_f32, &o0, &o1);
        for (int64_t k = g * G; k < (g + 1) * G; k++) {
            lanes(wt, data + k * bytes, &w0, &w1);
            store_v8(out + k * BN, w0 * s0 + o0);
            store_v8(out + k * BN + 8, w1 * s1 + o1);
        }
    }
}
#endif

#define DEFINE_BOTH(RB) DEFINE_QKERNEL(4, RB) DEFINE_QKERNEL(8, RB)
DEFINE_BOTH(1)
DEFINE_BOTH(2)
DEFINE_BOTH(3)
DEFINE_BOTH(4)
DEFINE_BOTH(5)
DEFINE_BOTH(6)
#if MAX_ROWS == 12
DEFINE_BOTH(7)
DEFINE_BOTH(8)
DEFINE_BOTH(9)
DEFINE_BOTH(10)
DEFINE_BOTH(11)
DEFINE_BOTH(12)
#endif

typedef void (*qkernel_fn)(const blocked_weight *, int64_t, int64_t, const float *, int64_t,
                           float *, int64_t, int, const float *);
#if MAX_ROWS == 12
#define KERNEL_TABLE(BITS)                                                                         \
    {0, qkernel##BITS##_1, qkernel##BITS##_2, qkernel##BITS##_3, qkernel##BITS##_4,                \
     qkernel##BITS##_5, qkernel##BITS##_6, qkernel##BITS##_7, qkernel##BITS##_8,                   \
     qkernel##BITS##_9, qkernel##BITS##_10, qkernel##BITS##_11, qkernel##BITS##_12}
#else
#define KERNEL_TABLE(BITS)                                                                         \
    {0, qkernel##BITS##_1, qkernel##BITS##_2, qkernel##BITS##_3, qkernel##BITS##_4,                \
     qkernel##BITS##_5, qkernel##BITS##_6}
#endif
static const qkernel_fn QKERNELS4[MAX_ROWS + 1] = KERNEL_TABLE(4);
static const qkernel_fn QKERNELS8[MAX_ROWS + 1] = KERNEL_TABLE(8);

/* Ask for the scales and offsets of blocks [b0, b1) (the next pass's): a block's are only
 * K / group * 16 values, a short stream of their own that the hardware prefetchers do not catch
 * in time, so without this every pass begins with two misses to memory (one thread's one-row
 * stream ran at ~2/3 of its speed with the parameters in cache). */
static void prefetch_params(const blocked_weight *wt, int64_t K, int64_t b0, int64_t b1) {
    const int64_t line = 64, bytes = K / wt->group * BN * (wt->params_f32 ? 4 : 2);
    for (int64_t i = 0; i < (b1 - b0) * bytes; i += line) {
        __builtin_prefetch((const char *)wt->scales + b0 * bytes + i, 0, 3);
        if (wt->offsets) __builtin_prefetch((const char *)wt->offsets + b0 * bytes + i, 0, 3);
        __asm__ volatile("" : : "r"(i)); /* gcc's dead-code pass drops a loop of only prefetches */
    }
}

void linear_blocks_q(const blocked_weight *wt, const float *bias, const float *X, int64_t ldx,
                     float *Y, int64_t ldy, int64_t N, int64_t K, int64_t R, int64_t b0,
                     int64_t b1) {
    const qkernel_fn *kernels = wt->bits == 4 ? QKERNELS4 : QKERNELS8;
#if defined(MULTI_BLOCKS)
    if (R >= 1 && R <= MULTI_MAX_ROWS && wt->group % 2 == 0) {
        int64_t b = b0;
        for (int nblk = MULTI_BLOCKS; nblk >= 2; nblk /= 2) {
            const qkernel_multi_fn kernel = QKERNELS_MULTI[wt->bits == 8][nblk == 2][R];
            for (; b + nblk <= b1; b += nblk) {
                int ncols[MULTI_BLOCKS];
                for (int j = 0; j < nblk; j++)
                    ncols[j] = (int)(N - (b + j) * BN < BN ? N - (b + j) * BN : BN);
                prefetch_params(wt, K, b + nblk, b + 2 * nblk < b1 ? b + 2 * nblk : b1);
                kernel(wt, b, K, X, ldx, Y + b * BN, ldy, ncols, bias ? bias + b * BN : 0);
            }
        }
        b0 = b; /* an odd block left: the one-block kernel below */
    }
#endif
    for (int64_t r0 = 0; r0 < R; r0 += ROW_BLOCK) {
        const int64_t r1 = r0 + ROW_BLOCK < R ? r0 + ROW_BLOCK : R;
        for (int64_t b = b0; b < b1; b++) {
            const int ncols = (int)(N - b * BN < BN ? N - b * BN : BN);
            const float *bb = bias ? bias + b * BN : 0;
            if (b + 1 < b1) prefetch_params(wt, K, b + 1, b + 2);
            for (int64_t r = r0; r < r1; r += MAX_ROWS) {
                const int rb = (int)(r1 - r < MAX_ROWS ? r1 - r : MAX_ROWS);
                kernels[rb](wt, b, K, X + r * ldx, ldx, Y + r * ldy + b * BN, ldy, ncols, bb);
            }
        }
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
    const int64_t line = (int64_t)wt->bits * BN / 8; /* bytes per (block, k) */
    *begin = (const char *)wt->data + b0 * K * line;
    *end = (const char *)wt->data + b1 * K * line;
}

static int check_weight(const blocked_weight *wt, int64_t K) {
    if (wt->bits != 4 && wt->bits != 8) return -1;
    if (wt->group <= 0 || K % wt->group != 0) return -1;
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
