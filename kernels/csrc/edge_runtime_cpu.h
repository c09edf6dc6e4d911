/* Declarations shared by the CPU kernels in kernels/csrc (built into one library by
 * kernels/cpu_native.py). */
#ifndef EDGE_RUNTIME_CPU_H
#define EDGE_RUNTIME_CPU_H

#include <stdint.h>
#include <string.h>

typedef struct {
    const int8_t *k, *v;        /* flat rows [*, D]: int8, or fp16 bits when ks == NULL */
    const uint16_t *ks, *vs;    /* fp16 scales [*] (same row numbers); NULL: an fp16 part (the
                                   recent-key window, kv/recent_window.py), read unscaled */
    const int64_t *index;       /* [R, Hkv, width] layer-0 row numbers */
    const int32_t *lens;        /* [R] valid entries of each row's list */
    int64_t width;
    int64_t layer_offset;
    const float *kmean;         /* [Hkv, D] the current layer's mean key of an int8 part whose
                                   keys may be centred (a negative scale: key = |s| q + mean,
                                   kernels/quantize.py), or NULL; callers advance it per layer */
} flat_part;

/* kmean: [Hkv, D] this layer's mean key, or NULL: keys whose absmax falls when centred are
 * stored centred with a negative scale (kernels/quantize.py, quantize_int8_keys) */
void write_kv_int8(const float *k, const float *v, int64_t k_stride_t, int64_t v_stride_t, int T,
                   int Hkv, int D, const int64_t *rows, int64_t layer_offset, int8_t *k_store,
                   int8_t *v_store, uint16_t *k_scales, uint16_t *v_scales, const float *kmean);

void write_kv_f16(const float *k, const float *v, int64_t k_stride_t, int64_t v_stride_t, int T,
                  int Hkv, int D, const int64_t *rows, int64_t layer_offset, uint16_t *k_store,
                  uint16_t *v_store);

/* What decode_attention_int8 refuses, checked before any work: 0, -1 when a row has no key,
 * -2 when D > the kernels' largest head_dim. */
int decode_attention_check(const flat_part *parts, int num_parts, int R, int D);

/* Thread t of a team of `team`: its span [*a0, *a1) of the R * Hkv (row, kv head) tasks,
 * contiguous and balanced by the tasks' key counts (within one task). */
void decode_attention_span(const flat_part *parts, int num_parts, int R, int Hkv, int t, int team,
                           int64_t *a0, int64_t *a1);

/* Memory a thread will read after the phase it is in (the next linears' weight blocks), asked for
 * a few cache lines at a time while that phase computes: decode attention reads its K/V at a few
 * GB/s and leaves the memory bus idle, so the lines arrive in the caches for free and the linears
 * after it stream less from DRAM (kernels/csrc/decoder.c, read_ahead_plan). Up to `left` lines
 * from the ranges in order, `per_step` per read_ahead_step. A prefetch changes no result. */
#define READ_AHEAD_RANGES 4
typedef struct {
    const char *begin[READ_AHEAD_RANGES], *end[READ_AHEAD_RANGES];
    int n, i;        /* ranges, the current one */
    const char *cur; /* the next line to ask for */
    int per_step;    /* lines per read_ahead_step */
    int64_t left;    /* lines still to ask for */
} read_ahead;

/* Ask for the next per_step lines (into L2: prefetcht1; into L1 it slowed the attention that
 * shares it). Returns how many it asked for. */
static inline int read_ahead_step(read_ahead *a) {
    int k = 0;
    for (; k < a->per_step && a->left > 0; k++, a->left--) {
        while (a->cur >= a->end[a->i]) {
            if (a->i + 1 >= a->n) return k;
            a->cur = a->begin[++a->i];
        }
        __builtin_prefetch(a->cur, 0, 2);
        a->cur += 64;
    }
    return k;
}

/* Tasks [a0, a1) of decode_attention_int8, with one scratch region. No OpenMP inside: callers run
 * it in their own region. ahead: NULL, or memory to ask for along the way (a step per key and
 * pass). */
void decode_attention_share(const float *q, const flat_part *parts, int num_parts, int H, int Hkv,
                            int D, int64_t q_stride_r, float sm_scale, float *out, float *scratch,
                            int64_t a0, int64_t a1, read_ahead *ahead);

/* The keys of tasks [a0, a1): each pass of decode attention visits them once. */
int64_t decode_attention_keys(const flat_part *parts, int num_parts, int Hkv, int64_t a0, int64_t a1);

int decode_attention_int8(const float *q, const flat_part *parts, int num_parts, int R, int H,
                          int Hkv, int D, int64_t q_stride_r, float sm_scale, float *out,
                          float *scratch, int64_t scratch_stride, int nthreads);

void argmax_rows(const float *x, int64_t rows, int64_t n, int64_t row_stride, int64_t *out);

/* Output blocks [b0, b1) of linear_blocked_f32 (blocks of LINEAR_BLOCK_N outputs) for all R rows:
 * one thread's share; arguments as linear_blocked_f32's, checked by the caller. */
#define LINEAR_BLOCK_N 16
void linear_blocks_f32(const float *Wb, const float *bias, const float *X, int64_t ldx, float *Y,
                       int64_t ldy, int64_t N, int64_t K, int64_t R, int64_t b0, int64_t b1);

int linear_blocked_f32(const float *Wb, const float *bias, const float *X, int64_t ldx, float *Y,
                       int64_t ldy, int64_t N, int64_t K, int64_t R, int nthreads);

/* A blocked linear weight of any kind (linear_int4.c): bits 32: fp32 [NB][K][16] (linear_f32.c);
 * 4: uint8 [NB][K][8], byte j of (b, k) = row 16 b + j (low nibble) | row 16 b + j + 8 (high);
 * 5 / 6: those 8 bytes then one / two 2-byte planes of the fifth / sixth bits; 2: uint8 [NB][K][4],
 * row 16 b + j at bits 2 j of a little-endian uint32; 3: uint8 [NB][K][6], row 16 b + j at bits
 * 3 j of a little-endian 48-bit value (two's complement with signed5); 8: int8 [NB][K][16].
 * W = scale * q + offset per group of `group` inputs, scales and offsets [NB][K / group][16] in
 * fp16 (params_f32 0) or fp32, or (super_scales set) int8 codes (codes4: 4-bit ones, two groups a
 * byte, [NB][K / group / 2][16]) times fp16 super_scales / super_offsets [NB][K / 256][16];
 * offsets NULL: zero. codebook (4-bit only): int8 [16], the value of each 4-bit index (the IQ4
 * types), NULL: the integers themselves. */
typedef struct {
    const void *data;
    const void *scales, *offsets;
    int32_t bits, group, params_f32, signed5; /* signed5: 3- / 5- / 6-bit, the top bit weighs -4 / -16 / -32 */
    const void *super_scales, *super_offsets; /* fp16, or NULL: one-level parameters */
    const int8_t *codebook;
    int32_t codes4; /* two-level codes are 4-bit (uint8, two groups a byte), not int8 */
} blocked_weight;

/* Output blocks [b0, b1) of any blocked weight for all R rows (one thread's share). */
void linear_blocks(const blocked_weight *wt, const float *bias, const float *X, int64_t ldx,
                   float *Y, int64_t ldy, int64_t N, int64_t K, int64_t R, int64_t b0, int64_t b1);

/* [*begin, *end): the integer bytes of output blocks [b0, b1) of a weight with K inputs. */
void weight_block_bytes(const blocked_weight *wt, int64_t K, int64_t b0, int64_t b1,
                        const char **begin, const char **end);

/* The calling thread's number in its OpenMP team, and the team's size (0 and 1 without OpenMP). */
#ifdef _OPENMP
#include <omp.h>
static inline int team_thread(void) { return omp_get_thread_num(); }
static inline int team_size(void) { return omp_get_num_threads(); }
#else
static inline int team_thread(void) { return 0; }
static inline int team_size(void) { return 1; }
#endif

/* [*a, *b): thread t's share of n units over a team of T, contiguous and balanced. Every phase of
 * a split computation uses it, so a thread handles the same rows / columns in each of them and the
 * data one phase writes is in that thread's cache when the next reads it. */
static inline void span_of(int64_t n, int t, int T, int64_t *a, int64_t *b) {
    *a = n * t / T;
    *b = n * (t + 1) / T;
}

/* exp(x) for x <= 0 (Cephes expf: Cody-Waite reduction + degree-6 polynomial, ~1 ulp), written
 * without branches or libm calls so loops over it vectorize (libm's expf does not here). */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* 8-lane fp32 vectors (one AVX2 register on x86; two NEON registers on Arm) and helpers */
typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* Unaligned loads and stores through a may_alias vector type, not memcpy: for AVX2-only targets
 * (-march=haswell, skylake, znver2/3, x86-64-v3) gcc 12 lowers a 32-byte memcpy into two 16-byte
 * moves bounced through the stack, and every vector load then waits on a failed store-to-load
 * forward: the linears and the attention ran ~10x slower there than on AVX-512 targets
 * (docs/cpu-backend.md, "AVX2 builds"). A dereference is one vmovups (or its two halves) everywhere. */
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(4), may_alias));

static inline v8f load_v8(const float *p) { return *(const v8f_unaligned *)p; }

static inline void store_v8(float *p, v8f v) { *(v8f_unaligned *)p = v; }

static inline v8f splat_v8(float x) { return (v8f){x, x, x, x, x, x, x, x}; }

#if defined(__AVX2__)
#include <immintrin.h>
static inline v8f i8_to_v8(const int8_t *p) { /* vpmovsxbd + vcvtdq2ps */
    return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#else /* gcc's generic int8x8 -> float conversion extracts lanes one by one; a plain loop vectorizes */
static inline v8f i8_to_v8(const int8_t *p) {
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = (float)p[i];
    return load_v8(f);
}
#endif

#if defined(__clang__)
#define SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7)                                          \
    __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#else
#define SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7)                                          \
    __builtin_shuffle(a, b, (v8i){i0, i1, i2, i3, i4, i5, i6, i7})
#endif

#endif
