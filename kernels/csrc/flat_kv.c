/* CPU kernels over the flat int8 KV rows (kernels/flat_kv_cpu.py has the addressing and the torch
 * references these are tested against; kernels/cpu_native.py compiles and loads this file).
 *
 * decode_attention_int8: one query token per row r (a decode token or a token of a prefill chunk),
 * heads grouped over Hkv kv heads; the row's keys are the concatenation of its index lists over
 * the stores ("parts": pool, arena, window, a step's fresh exact keys), in position order. A key's
 * score and its place in the sums do not depend on how the row's keys are split over the parts,
 * so a query reads bit for bit the same whatever its sequence's storage layout. Per (row, kv head): scores for the G query heads in one pass over the keys,
 * softmax, then one pass over the values. fp32 math; int8 K/V with fp16 per-(token, head) scales.
 * A part without scales (ks == NULL) holds fp16 K/V: a sequence's recent-key window
 * (kv/recent_window.py), whose positions the int8 parts then leave out.
 * Row numbers are layer-0 rows; `layer_offset` of each part moves them to the layer at hand.
 *
 * write_kv_int8: quantize new K/V rows (symmetric absmax per token and head, kernels/quantize.py)
 * and store them with their fp16 scales at flat rows; bit-exact with quantize_int8 + index_copy_.
 * write_kv_f16: store new K/V rows as fp16 (round to nearest even, as torch's .to(float16)).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edge_runtime_cpu.h"

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        float f = (float)man * (1.0f / 16777216.0f); /* subnormal (or zero): man * 2^-24 */
        return (h & 0x8000u) ? -f : f;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float -> fp16 bits, round to nearest even (torch's .to(float16)); F. Giesen's branchy variant,
 * portable C (no _Float16, which older compilers lack on x86). */
static inline uint16_t float_to_half(float f) {
    const uint32_t f32_infinity = 255u << 23, f16_max = (127u + 16u) << 23;
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    uint16_t o;
    if (x >= f16_max) {
        o = x > f32_infinity ? 0x7e00 : 0x7c00; /* NaN stays NaN, overflow -> inf */
    } else if (x < (113u << 23)) { /* result is subnormal or zero: let the FPU round */
        float xf, magic;
        memcpy(&xf, &x, sizeof xf);
        memcpy(&magic, &denorm_magic, sizeof magic);
        volatile float sum = xf + magic; /* one rounding, never re-associated */
        float sf = sum;
        uint32_t bits;
        memcpy(&bits, &sf, sizeof bits);
        o = (uint16_t)(bits - denorm_magic);
    } else {
        uint32_t mant_odd = (x >> 13) & 1u;
        x += ((uint32_t)(15 - 127) << 23) + 0xfffu;
        x += mant_odd;
        o = (uint16_t)(x >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

/* 8 fp16 values -> an 8-lane fp32 vector (F16C's vcvtph2ps where the target has it) */
#if defined(__F16C__)
#include <immintrin.h>
static inline v8f h8_to_v8(const uint16_t *p) {
    return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#else
static inline v8f h8_to_v8(const uint16_t *p) {
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = half_to_float(p[i]);
    return load_v8(f);
}
#endif

static inline float absmax(const float *x, int d) {
    float amax = 0.0f;
    for (int i = 0; i < d; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* x's absmax already known (amax) */
static inline void quantize_row_amax(const float *x, int d, float amax, int8_t *q, uint16_t *scale_bits) {
    uint16_t h = float_to_half(amax > 0.0f ? amax / 127.0f : 1.0f);
    float s = half_to_float(h);
    for (int i = 0; i < d; i++) {
        float r = rintf(x[i] / s); /* true division, as torch; rint: half to even */
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        q[i] = (int8_t)r;
    }
    *scale_bits = h;
}

static inline void quantize_row(const float *x, int d, int8_t *q, uint16_t *scale_bits) {
    quantize_row_amax(x, d, absmax(x, d), q, scale_bits);
}

#define MAX_HEAD_DIM 256

/* a key row: centred (x - m, the scale's sign bit set) when that lowers its absmax, as
 * quantize_int8_keys; m NULL: quantize_row. With m, d <= MAX_HEAD_DIM (the callers check). */
static inline void quantize_key_row(const float *x, const float *m, int d, int8_t *q, uint16_t *scale_bits) {
    const float x_amax = absmax(x, d);
    if (m) {
        float c[MAX_HEAD_DIM];
        for (int i = 0; i < d; i++) c[i] = x[i] - m[i];
        const float c_amax = absmax(c, d);
        if (c_amax < x_amax) {
            quantize_row_amax(c, d, c_amax, q, scale_bits);
            *scale_bits |= 0x8000;
            return;
        }
    }
    quantize_row_amax(x, d, x_amax, q, scale_bits);
}

/* k, v: [T, Hkv, D] fp32, heads contiguous, tokens k_stride_t / v_stride_t floats apart;
 * rows: [T, Hkv] layer-0 row numbers (+ layer_offset). Writes q rows and scales. */
void write_kv_int8(const float *k, const float *v, int64_t k_stride_t, int64_t v_stride_t, int T,
                   int Hkv, int D, const int64_t *rows, int64_t layer_offset, int8_t *k_store,
                   int8_t *v_store, uint16_t *k_scales, uint16_t *v_scales, const float *kmean) {
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hkv; h++) {
            int64_t row = rows[(int64_t)t * Hkv + h] + layer_offset;
            quantize_key_row(k + t * k_stride_t + (int64_t)h * D, kmean ? kmean + (int64_t)h * D : NULL,
                             D, k_store + row * D, k_scales + row);
            quantize_row(v + t * v_stride_t + (int64_t)h * D, D, v_store + row * D, v_scales + row);
        }
    }
}

void write_kv_f16(const float *k, const float *v, int64_t k_stride_t, int64_t v_stride_t, int T,
                  int Hkv, int D, const int64_t *rows, int64_t layer_offset, uint16_t *k_store,
                  uint16_t *v_store) {
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hkv; h++) {
            const int64_t row = rows[(int64_t)t * Hkv + h] + layer_offset;
            const float *kr = k + t * k_stride_t + (int64_t)h * D, *vr = v + t * v_stride_t + (int64_t)h * D;
            int i = 0;
#if defined(__F16C__) /* vcvtps2ph with round-to-nearest-even: the same bits as float_to_half */
            for (; i + 8 <= D; i += 8) {
                _mm_storeu_si128((__m128i *)(k_store + row * D + i),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(kr + i), _MM_FROUND_TO_NEAREST_INT));
                _mm_storeu_si128((__m128i *)(v_store + row * D + i),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(vr + i), _MM_FROUND_TO_NEAREST_INT));
            }
#endif
            for (; i < D; i++) {
                k_store[row * D + i] = float_to_half(kr[i]);
                v_store[row * D + i] = float_to_half(vr[i]);
            }
        }
    }
}

/* Keys ahead that the passes prefetch. 40 rather than 16: with the VM's two vCPUs on two chiplets
 * (the high-bandwidth mode, tools/vcpu_probe.c) the rows come from farther away, and in an
 * alternated `bench engine` A/B the batch-5/batch-1 ratio's steady high-mode pairs had median
 * 3.57 with 40 against 3.48 with 16 (docs/cpu-backend.md, "CPU decode attention"); the low mode is unchanged. */
#ifndef KV_PREFETCH
#define KV_PREFETCH 40
#endif

static inline void to_float(float *dst, const int8_t *src, int d) {
#pragma omp simd
    for (int i = 0; i < d; i++) dst[i] = (float)src[i];
}

/* one K or V row of a part -> fp32: int8 rows (scaled by the caller), fp16 rows of a scale-less part */
static inline void row_to_float(float *dst, const flat_part *pt, const int8_t *base, int64_t row, int d) {
    if (pt->ks) {
        to_float(dst, base + row * d, d);
    } else {
        const uint16_t *h = (const uint16_t *)(const void *)base + row * d;
        for (int i = 0; i < d; i++) dst[i] = half_to_float(h[i]);
    }
}

static inline float dot_f(const float *q, const float *k, int d) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < d; i++) acc += q[i] * k[i];
    return acc;
}

static inline void axpy_f(float *acc, float w, const float *v, int d) {
#pragma omp simd
    for (int i = 0; i < d; i++) acc[i] += w * v[i];
}

/* scores [G][total] -> each head's softmax, in place */
static inline void softmax_rows(float *scratch, int G, int64_t total) {
    for (int g = 0; g < G; g++) {
        float *sh = scratch + g * total;
        float m = sh[0];
#pragma omp simd reduction(max : m)
        for (int64_t j = 1; j < total; j++) m = sh[j] > m ? sh[j] : m;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < total; j++) {
            sh[j] = exp_nonpositive(sh[j] - m);
            sum += sh[j];
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t j = 0; j < total; j++) sh[j] *= inv;
    }
}

/* One (row r, kv head kh) task: the G query heads of kh attend to the row's keys.
 * q: [R, H, D] fp32, heads contiguous, rows q_stride_r floats apart; out: [R, H, D] contiguous;
 * scratch: G * (total keys of the row) floats of this task's own. */
static inline __attribute__((always_inline)) void
decode_task(const float *q, const flat_part *parts, int num_parts, int r, int kh, int H, int Hkv,
            const int D, int64_t q_stride_r, float sm_scale, float *out, float *scratch,
            int64_t total) {
    /* token-major store: a token's kv heads are adjacent rows */
    const int G = H / Hkv;
    const float *qr = q + (int64_t)r * q_stride_r + (int64_t)kh * G * D;
    float *o = out + (int64_t)r * H * D + (int64_t)kh * G * D;
    int64_t pos = 0;
    for (int p = 0; p < num_parts; p++) { /* scores: scratch[g * total + pos] */
        const flat_part *pt = &parts[p];
        const int64_t *idx = pt->index + ((int64_t)r * Hkv + kh) * pt->width;
        const int64_t n = pt->lens[r];
        const float *mean = pt->kmean ? pt->kmean + (int64_t)kh * D : NULL;
        for (int64_t j = 0; j < n; j++, pos++) {
            int64_t row = idx[j] + pt->layer_offset;
            if (j + KV_PREFETCH < n) /* rows come from DRAM: keep several in flight */
                __builtin_prefetch(pt->k + (idx[j + KV_PREFETCH] + pt->layer_offset) * D, 0, 0);
            float kf[MAX_HEAD_DIM];
            row_to_float(kf, pt, pt->k, row, D);
            const float s = pt->ks ? half_to_float(pt->ks[row]) : 1.0f;
            const float sc = fabsf(s) * sm_scale;
            for (int g = 0; g < G; g++) /* a centred key: + q.m (this path is not the fast one) */
                scratch[g * total + pos] = dot_f(qr + g * D, kf, D) * sc
                    + (s < 0.0f && mean ? dot_f(qr + g * D, mean, D) * sm_scale : 0.0f);
        }
    }
    softmax_rows(scratch, G, total);
    memset(o, 0, sizeof(float) * G * D);
    pos = 0;
    for (int p = 0; p < num_parts; p++) { /* out[g] = sum_j prob[g][j] * v_j * vscale_j */
        const flat_part *pt = &parts[p];
        const int64_t *idx = pt->index + ((int64_t)r * Hkv + kh) * pt->width;
        const int64_t n = pt->lens[r];
        for (int64_t j = 0; j < n; j++, pos++) {
            int64_t row = idx[j] + pt->layer_offset;
            if (j + KV_PREFETCH < n)
                __builtin_prefetch(pt->v + (idx[j + KV_PREFETCH] + pt->layer_offset) * D, 0, 0);
            float vf[MAX_HEAD_DIM];
            row_to_float(vf, pt, pt->v, row, D);
            float vsc = pt->vs ? half_to_float(pt->vs[row]) : 1.0f;
            for (int g = 0; g < G; g++) axpy_f(o + g * D, scratch[g * total + pos] * vsc, vf, D);
        }
    }
}

/* ---- The vectorized task: head_dim 64 or 128, G <= MAX_FAST_GROUP (the common shapes) ----
 * Same math as decode_task, arranged so that no step ends in a horizontal sum per key:
 * - scores: per key, G dot products accumulate in 8-lane vectors (int8 -> fp32 once per key for
 *   all G heads); every 8 keys, the 8 vectors of a head are reduced together by a tree of pairwise
 *   adds (7 shuffle + add steps for 8 scores instead of a 3-level reduction for each);
 * - values: the G x D output accumulates in registers, a slice of CW vectors per head at a time
 *   (G * CW accumulators + a value + G weights within the compiler's vector registers: all of a
 *   64-wide head with AVX-512VL's 32 for G <= 3, half with AVX2's 16); the rows are read once per
 *   slice (from cache after the first).
 * Measured (`edge-runtime bench attention`, docs/perf.md "bench attention"): ~2x faster
 * than decode_task at 560 keys, 1 and 5 rows. */
#define MAX_FAST_GROUP 8
#if defined(__AVX512F__)
#define VECTOR_REGISTERS 32 /* 8-lane vectors the compiler has: 32 ymm with AVX-512VL */
#else /* 16 ymm with AVX2; 32 128-bit NEON registers hold 16 */
#define VECTOR_REGISTERS 16
#endif
/* lanes [a01 a23 b01 b23 | a45 a67 b45 b67] (AVX's hadd: one shufps pair and an add) */
static inline v8f pair_sums(v8f a, v8f b) {
    return SHUFFLE8(a, b, 0, 2, 8, 10, 4, 6, 12, 14) + SHUFFLE8(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}

/* lane i = the sum of a[i]'s 8 lanes */
static inline v8f sums_of_8(const v8f *a) {
    v8f lo = pair_sums(pair_sums(a[0], a[1]), pair_sums(a[2], a[3]));
    v8f hi = pair_sums(pair_sums(a[4], a[5]), pair_sums(a[6], a[7]));
    return SHUFFLE8(lo, hi, 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE8(lo, hi, 4, 5, 6, 7, 12, 13, 14, 15);
}

static inline float sum_v8(v8f a) {
    float s = 0.0f;
    for (int i = 0; i < 8; i++) s += a[i];
    return s;
}

/* G dot products of one fp16 key row (a window part) with the G query heads, 8-lane partial sums */
static inline __attribute__((always_inline)) void
key_dots_f16(const float *qr, const uint16_t *kp, const int G, const int D, v8f *acc) {
    for (int g = 0; g < G; g++) acc[g] = (v8f){0};
    for (int c = 0; c < D / 8; c++) {
        const v8f kf = h8_to_v8(kp + 8 * c);
        for (int g = 0; g < G; g++) acc[g] += load_v8(qr + g * D + 8 * c) * kf;
    }
}

/* G dot products of one int8 key row with the G query heads, as 8-lane partial sums */
static inline __attribute__((always_inline)) void
key_dots(const float *qr, const int8_t *kp, const int G, const int D, v8f *acc) {
    for (int g = 0; g < G; g++) acc[g] = (v8f){0};
    for (int c = 0; c < D / 8; c++) {
        const v8f kf = i8_to_v8(kp + 8 * c);
        for (int g = 0; g < G; g++) acc[g] += load_v8(qr + g * D + 8 * c) * kf;
    }
}

static inline __attribute__((always_inline)) void
decode_task_v8(const float *q, const flat_part *parts, int num_parts, int r, int kh, int Hkv,
               const int G, const int D, int64_t q_stride_r, float sm_scale, float *out,
               float *scratch, int64_t total, read_ahead *ahead) {
    /* vectors per head per value slice: G * CW accumulators + a value + G weights in registers */
    const int CW = G * 8 + G + 1 <= VECTOR_REGISTERS ? 8 : G * 4 + G + 1 <= VECTOR_REGISTERS ? 4
                 : G * 2 + G + 1 <= VECTOR_REGISTERS ? 2 : 1;
    const float *qr = q + (int64_t)r * q_stride_r + (int64_t)kh * G * D;
    float *o = out + (int64_t)r * Hkv * G * D + (int64_t)kh * G * D;
    int64_t pos = 0;
    for (int p = 0; p < num_parts; p++) { /* scores: scratch[g * total + pos] */
        const flat_part *pt = &parts[p];
        const int64_t *idx = pt->index + ((int64_t)r * Hkv + kh) * pt->width;
        const int64_t n = pt->lens[r], off = pt->layer_offset;
        if (!pt->ks) { /* fp16 window part: a few keys, one at a time */
            const uint16_t *k16 = (const uint16_t *)(const void *)pt->k;
            for (int64_t j = 0; j < n; j++, pos++) {
                v8f acc[MAX_FAST_GROUP];
                key_dots_f16(qr, k16 + (idx[j] + off) * D, G, D, acc);
                for (int g = 0; g < G; g++) scratch[g * total + pos] = sum_v8(acc[g]) * sm_scale;
            }
            continue;
        }
        /* The rows come from DRAM (a layer's weights passed through the caches since they were
         * last read): ask for the first KV_PREFETCH keys' K and V rows at once, then each pass
         * keeps KV_PREFETCH rows ahead; V is fetched into L2 here, a pass before the values read
         * it. Measured in the step: attention 2.73 -> 2.48 ms per batch-5 step in the VM's
         * low-bandwidth mode (docs/cpu-backend.md, "CPU decode attention"). */
        for (int64_t b = 0; b < KV_PREFETCH && b < n; b++) {
            __builtin_prefetch(pt->k + (idx[b] + off) * D, 0, 0);
            __builtin_prefetch(pt->v + (idx[b] + off) * D, 0, 2);
        }
        float qm[MAX_FAST_GROUP]; /* q.m * sm_scale, added to a centred key's score */
        for (int g = 0; g < G; g++) {
            v8f a = (v8f){0};
            if (pt->kmean)
                for (int c = 0; c < D / 8; c++)
                    a += load_v8(qr + g * D + 8 * c) * load_v8(pt->kmean + (int64_t)kh * D + 8 * c);
            qm[g] = sum_v8(a) * sm_scale;
        }
        int64_t j = 0;
        for (; j + 8 <= n; j += 8, pos += 8) {
            v8f dots[MAX_FAST_GROUP][8], acc[MAX_FAST_GROUP];
            float scale[8], centred[8];
            for (int i = 0; i < 8; i++) {
                const int64_t row = idx[j + i] + off;
                if (j + i + KV_PREFETCH < n) {
                    __builtin_prefetch(pt->k + (idx[j + i + KV_PREFETCH] + off) * D, 0, 0);
                    __builtin_prefetch(pt->v + (idx[j + i + KV_PREFETCH] + off) * D, 0, 2);
                }
                key_dots(qr, pt->k + row * D, G, D, acc);
                if (ahead) read_ahead_step(ahead);
                for (int g = 0; g < G; g++) dots[g][i] = acc[g];
                const float s = half_to_float(pt->ks[row]);
                scale[i] = fabsf(s) * sm_scale;
                centred[i] = s < 0.0f ? 1.0f : 0.0f;
            }
            const v8f sv = load_v8(scale), cv = load_v8(centred);
            for (int g = 0; g < G; g++)
                store_v8(scratch + g * total + pos, sums_of_8(dots[g]) * sv + cv * splat_v8(qm[g]));
        }
        if (j < n) { /* the last n % 8 keys, as a group of 8 padded with zeros: a key's score
                      * is the same sums_of_8 arithmetic wherever it falls in its part, so it
                      * does not depend on how a sequence's keys are split over the stores */
            const int64_t left = n - j;
            v8f dots[MAX_FAST_GROUP][8], acc[MAX_FAST_GROUP];
            float scale[8] = {0}, centred[8] = {0};
            for (int i = 0; i < 8; i++) {
                if (i >= left) {
                    for (int g = 0; g < G; g++) dots[g][i] = (v8f){0};
                    continue;
                }
                const int64_t row = idx[j + i] + off;
                key_dots(qr, pt->k + row * D, G, D, acc);
                for (int g = 0; g < G; g++) dots[g][i] = acc[g];
                const float s = half_to_float(pt->ks[row]);
                scale[i] = fabsf(s) * sm_scale;
                centred[i] = s < 0.0f ? 1.0f : 0.0f;
            }
            const v8f sv = load_v8(scale), cv = load_v8(centred);
            for (int g = 0; g < G; g++) {
                float tail[8];
                store_v8(tail, sums_of_8(dots[g]) * sv + cv * splat_v8(qm[g]));
                memcpy(scratch + g * total + pos, tail, sizeof(float) * (size_t)left);
            }
            pos += left;
        }
    }
    softmax_rows(scratch, G, total);
    for (int c0 = 0; c0 < D / 8; c0 += CW) { /* out[g] = sum_j prob[g][j] * v_j * vscale_j */
        v8f acc[MAX_FAST_GROUP][8];
        for (int g = 0; g < G; g++)
            for (int c = 0; c < CW; c++) acc[g][c] = (v8f){0};
        pos = 0;
        for (int p = 0; p < num_parts; p++) {
            const flat_part *pt = &parts[p];
            const int64_t *idx = pt->index + ((int64_t)r * Hkv + kh) * pt->width;
            const int64_t n = pt->lens[r], off = pt->layer_offset;
            if (!pt->vs) { /* fp16 window part */
                const uint16_t *v16 = (const uint16_t *)(const void *)pt->v;
                for (int64_t j = 0; j < n; j++, pos++) {
                    const uint16_t *vp = v16 + (idx[j] + off) * D + 8 * c0;
                    v8f w[MAX_FAST_GROUP];
                    for (int g = 0; g < G; g++) w[g] = splat_v8(scratch[g * total + pos]);
                    for (int c = 0; c < CW; c++) {
                        const v8f vf = h8_to_v8(vp + 8 * c);
                        for (int g = 0; g < G; g++) acc[g][c] += w[g] * vf;
                    }
                }
                continue;
            }
            for (int64_t j = 0; j < n; j++, pos++) {
                const int64_t row = idx[j] + off;
                if (c0 == 0 && j + KV_PREFETCH < n) /* later slices find the rows in cache */
                    __builtin_prefetch(pt->v + (idx[j + KV_PREFETCH] + off) * D, 0, 3);
                const int8_t *vp = pt->v + row * D + 8 * c0;
                const float vsc = half_to_float(pt->vs[row]);
                if (ahead) read_ahead_step(ahead);
                v8f w[MAX_FAST_GROUP];
                for (int g = 0; g < G; g++) w[g] = splat_v8(scratch[g * total + pos] * vsc);
                for (int c = 0; c < CW; c++) {
                    const v8f vf = i8_to_v8(vp + 8 * c);
                    for (int g = 0; g < G; g++) acc[g][c] += w[g] * vf;
                }
            }
        }
        for (int g = 0; g < G; g++)
            for (int c = 0; c < CW; c++) store_v8(o + g * D + 8 * (c0 + c), acc[g][c]);
    }
}

/* one (row, kv head) task; a function per shape, so that head_dim and the group size are
 * compile-time constants in its body (the OpenMP loop below is outlined once, with them as data) */
typedef void (*task_fn)(const float *q, const flat_part *parts, int num_parts, int r, int kh, int H,
                        int Hkv, int D, int64_t q_stride_r, float sm_scale, float *out,
                        float *scratch, int64_t total, read_ahead *ahead);

static void task_any_shape(const float *q, const flat_part *parts, int num_parts, int r, int kh,
                           int H, int Hkv, int D, int64_t q_stride_r, float sm_scale, float *out,
                           float *scratch, int64_t total, read_ahead *ahead) {
    (void)ahead;
    decode_task(q, parts, num_parts, r, kh, H, Hkv, D, q_stride_r, sm_scale, out, scratch, total);
}

#define DEFINE_FAST_TASK(DIM, GROUP)                                                               \
    static void task_##DIM##_##GROUP(const float *q, const flat_part *parts, int num_parts, int r, \
                                     int kh, int H, int Hkv, int D, int64_t q_stride_r,            \
                                     float sm_scale, float *out, float *scratch, int64_t total,    \
                                     read_ahead *ahead) {                                          \
        (void)H;                                                                                   \
        (void)D;                                                                                   \
        decode_task_v8(q, parts, num_parts, r, kh, Hkv, GROUP, DIM, q_stride_r, sm_scale, out,     \
                       scratch, total, ahead);                                                     \
    }
#define DEFINE_FAST_TASKS(DIM)                                                                     \
    DEFINE_FAST_TASK(DIM, 1) DEFINE_FAST_TASK(DIM, 2) DEFINE_FAST_TASK(DIM, 3)                     \
    DEFINE_FAST_TASK(DIM, 4) DEFINE_FAST_TASK(DIM, 5) DEFINE_FAST_TASK(DIM, 6)                     \
    DEFINE_FAST_TASK(DIM, 7) DEFINE_FAST_TASK(DIM, 8)
DEFINE_FAST_TASKS(64)
DEFINE_FAST_TASKS(128)

static const task_fn FAST_TASKS[2][MAX_FAST_GROUP + 1] = {
    {0, task_64_1, task_64_2, task_64_3, task_64_4, task_64_5, task_64_6, task_64_7, task_64_8},
    {0, task_128_1, task_128_2, task_128_3, task_128_4, task_128_5, task_128_6, task_128_7,
     task_128_8}};

static task_fn task_for(int H, int Hkv, int D) {
    const int group = H / Hkv;
    if ((D == 64 || D == 128) && group >= 1 && group <= MAX_FAST_GROUP)
        return FAST_TASKS[D == 128][group];
    return task_any_shape;
}

/* the keys of row r over all parts */
static inline int64_t row_keys(const flat_part *parts, int num_parts, int64_t r) {
    int64_t n = 0;
    for (int p = 0; p < num_parts; p++) n += parts[p].lens[r];
    return n;
}

int decode_attention_check(const flat_part *parts, int num_parts, int R, int D) {
    if (D > MAX_HEAD_DIM) return -2;
    for (int r = 0; r < R; r++)
        if (row_keys(parts, num_parts, r) == 0) return -1;
    return 0;
}

static inline void run_task(task_fn task, const float *q, const flat_part *parts, int num_parts,
                            int t, int H, int Hkv, int D, int64_t q_stride_r, float sm_scale,
                            float *out, float *scratch, read_ahead *ahead) {
    const int r = t / Hkv, kh = t % Hkv;
    task(q, parts, num_parts, r, kh, H, Hkv, D, q_stride_r, sm_scale, out, scratch,
         row_keys(parts, num_parts, r), ahead);
}

void decode_attention_span(const flat_part *parts, int num_parts, int R, int Hkv, int t, int team,
                           int64_t *a0, int64_t *a1) {
    int64_t all = 0;
    for (int r = 0; r < R; r++) all += row_keys(parts, num_parts, r);
    *a0 = *a1 = (int64_t)R * Hkv;
    int64_t before = 0; /* keys of the tasks before task i, per kv head */
    for (int64_t i = 0; i < (int64_t)R * Hkv; i++) {
        const int64_t n = row_keys(parts, num_parts, i / Hkv);
        /* the thread whose share of the keys (all * Hkv of them) holds the task's middle key */
        const int64_t owner = (int64_t)team * (2 * before + n) / (2 * all * Hkv);
        if (owner >= t && *a0 > i) *a0 = i;
        if (owner >= t + 1) {
            *a1 = i;
            break;
        }
        before += n;
    }
}

void decode_attention_share(const float *q, const flat_part *parts, int num_parts, int H, int Hkv,
                            int D, int64_t q_stride_r, float sm_scale, float *out, float *scratch,
                            int64_t a0, int64_t a1, read_ahead *ahead) {
    const task_fn task = task_for(H, Hkv, D);
    for (int64_t i = a0; i < a1; i++)
        run_task(task, q, parts, num_parts, (int)i, H, Hkv, D, q_stride_r, sm_scale, out, scratch,
                 ahead);
}

int64_t decode_attention_keys(const flat_part *parts, int num_parts, int Hkv, int64_t a0, int64_t a1) {
    int64_t keys = 0;
    for (int64_t i = a0; i < a1; i++) keys += row_keys(parts, num_parts, i / Hkv);
    return keys;
}

/* q: [R, H, D]; out: [R, H, D]; scratch: min(nthreads, R * Hkv) x scratch_stride floats (callers
 * may pass R * Hkv regions), scratch_stride >= (H / Hkv) * (the most keys of a row), a region per
 * thread. The (row, kv head) tasks are split over up to `nthreads` OpenMP threads in contiguous
 * spans balanced by keys (decode_attention_span): a row's kv heads stay together on one thread
 * except where a span ends, a thread takes the same tasks every call (their K/V rows stay in its
 * cache), and it reuses one scratch region. In an
 * alternated `bench engine` A/B this beat handing tasks out one at a time (dynamic): batch-5 decode
 * at 512-token prompts, median of steady pairs, 288 vs 282 tok/s in the VM's high-bandwidth mode,
 * 245 vs 239 in the low one (docs/cpu-backend.md, "CPU decode attention").
 * head_dim 64 or 128 with 1-8 query heads per kv head: decode_task_v8, head_dim and group size
 * compile-time constants; any other shape: decode_task.
 * Returns 0; -1 when a row has no key (the caller guarantees one), -2 when D > MAX_HEAD_DIM. */
int decode_attention_int8(const float *q, const flat_part *parts, int num_parts, int R, int H,
                          int Hkv, int D, int64_t q_stride_r, float sm_scale, float *out,
                          float *scratch, int64_t scratch_stride, int nthreads) {
    const int rc = decode_attention_check(parts, num_parts, R, D);
    if (rc || R == 0) return rc;
    const int tasks = R * Hkv, team = nthreads < 1 ? 1 : nthreads < tasks ? nthreads : tasks;
#pragma omp parallel num_threads(team) if (team > 1)
    {
        const int t = team_thread();
        int64_t a0, a1;
        decode_attention_span(parts, num_parts, R, Hkv, t, team_size(), &a0, &a1);
        decode_attention_share(q, parts, num_parts, H, Hkv, D, q_stride_r, sm_scale, out,
                               scratch + (int64_t)t * scratch_stride, a0, a1, NULL);
    }
    return 0;
}
