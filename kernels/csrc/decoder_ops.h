/* The per-row math of the C decode step (decoder.c): RMSNorm, rope, the Hadamard rotation of
 * heads, residual adds and silu * up, over [rows, n] blocks or column ranges of them. fp32, the
 * same formulas as the torch path (rms_norm: x * rsqrt(mean(x^2) + eps) * w; rope in the
 * rotate-half form; silu(g) = g * sigmoid(g)). Included by decoder.c only. */
#ifndef EDGE_RUNTIME_DECODER_OPS_H
#define EDGE_RUNTIME_DECODER_OPS_H

#include <math.h>
#include <stdint.h>

#include "edge_runtime_cpu.h"

static void rms_norm(const float *x, const float *w, float *y, int64_t R, int64_t H, float eps) {
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * H;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < H; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)H + eps);
        float *yr = y + r * H;
#pragma omp simd
        for (int64_t i = 0; i < H; i++) yr[i] = xr[i] * inv * w[i];
    }
}

/* x: [heads, D] in place; cos, sin: [D] (rotate-half: pairs i, i + D/2) */
static void rope(float *x, int64_t heads, int64_t D, const float *cos, const float *sin) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *a = x + h * D, *b = a + half;
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
            const float lo = a[i], hi = b[i];
            a[i] = lo * cos[i] - hi * sin[i];
            b[i] = hi * cos[i + half] + lo * sin[i + half];
        }
    }
}

/* one butterfly level h (1, 2 or 4) inside an 8-lane vector: lanes i and i + h of each 2h block
 * become lo + hi and lo - hi (the exact operations of the scalar butterfly) */
static inline v8f butterfly_in_vector(v8f x, int h) {
    v8f lo, hi, sign;
    if (h == 1) {
        lo = SHUFFLE8(x, x, 0, 0, 2, 2, 4, 4, 6, 6);
        hi = SHUFFLE8(x, x, 1, 1, 3, 3, 5, 5, 7, 7);
        sign = (v8f){1, -1, 1, -1, 1, -1, 1, -1};
    } else if (h == 2) {
        lo = SHUFFLE8(x, x, 0, 1, 0, 1, 4, 5, 4, 5);
        hi = SHUFFLE8(x, x, 2, 3, 2, 3, 6, 7, 6, 7);
        sign = (v8f){1, 1, -1, -1, 1, 1, -1, -1};
    } else {
        lo = SHUFFLE8(x, x, 0, 1, 2, 3, 0, 1, 2, 3);
        hi = SHUFFLE8(x, x, 4, 5, 6, 7, 4, 5, 6, 7);
        sign = (v8f){1, 1, 1, 1, -1, -1, -1, -1};
    }
    return lo + hi * sign;
}

/* one head, D a multiple of 8: levels 1, 2, 4 inside each vector, then across vectors */
static void hadamard_head_v8(float *a, int64_t D, float s) {
    for (int64_t c = 0; c < D; c += 8)
        store_v8(a + c, butterfly_in_vector(butterfly_in_vector(butterfly_in_vector(
                                                load_v8(a + c), 1), 2), 4));
    for (int64_t h = 8; h < D; h *= 2)
        for (int64_t j = 0; j < D; j += 2 * h)
            for (int64_t i = 0; i < h; i += 8) {
                const v8f lo = load_v8(a + j + i), hi = load_v8(a + j + h + i);
                store_v8(a + j + i, lo + hi);
                store_v8(a + j + h + i, lo - hi);
            }
    for (int64_t c = 0; c < D; c += 8) store_v8(a + c, load_v8(a + c) * splat_v8(s));
}

/* one head, any power of two D */
static void hadamard_head_scalar(float *a, int64_t D, float s) {
    for (int64_t h = 1; h < D; h *= 2)
        for (int64_t j = 0; j < D; j += 2 * h)
#pragma omp simd
            for (int64_t i = 0; i < h; i++) {
                const float lo = a[j + i], hi = a[j + h + i];
                a[j + i] = lo + hi;
                a[j + h + i] = lo - hi;
            }
#pragma omp simd
    for (int64_t i = 0; i < D; i++) a[i] *= s;
}

/* x: [heads, D] in place: each head times the normalized Hadamard matrix (D a power of two), by
 * butterflies (kernels/hadamard.py's rotate multiplies by the matrix: equal to rounding). For D a
 * multiple of 8 the levels below 8 run inside vectors (the scalar loops over 1-4 lanes cost ~4 us
 * per token for 15 heads of 64, as much as the rest of a layer's small ops together). */
static void hadamard_rotate(float *x, int64_t heads, int64_t D) {
    const float s = (float)(1.0 / sqrt((double)D)); /* as torch: x * (D ** -0.5) */
    for (int64_t hd = 0; hd < heads; hd++) {
        if (D % 8 == 0)
            hadamard_head_v8(x + hd * D, D, s);
        else
            hadamard_head_scalar(x + hd * D, D, s);
    }
}

static void add_into(float *x, const float *y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* act[r, i] = silu(gu[r, i]) * gu[r, I + i] for columns [c0, c1) of every row */
static void silu_mul(const float *gu, float *act, int64_t R, int64_t I, int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < R; r++) {
        const float *g = gu + r * 2 * I, *u = g + I;
        float *a = act + r * I;
#pragma omp simd
        for (int64_t i = c0; i < c1; i++) {
            const float e = exp_nonpositive(-fabsf(g[i])); /* exp(-|g|) */
            const float sig = g[i] >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
            a[i] = g[i] * sig * u[i];
        }
    }
}

/* y[r, c] += d[r, c] for columns [c0, c1) of R rows of width n */
static void add_columns(float *y, const float *d, int64_t R, int64_t n, int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < R; r++) add_into(y + r * n + c0, d + r * n + c0, c1 - c0);
}

#endif
