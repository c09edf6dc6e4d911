/* Declarations shared by the CPU kernels in kernels/csrc (built into one library by
 * kernels/cpu_native.py). */
#ifndef EDGE_RUNTIME_CPU_H
#define EDGE_RUNTIME_CPU_H

#include <stdint.h>
#include <string.h>

typedef struct {
    const int8_t *k, *v;        /* flat rows [*, D] */
    const uint16_t *ks, *vs;    /* fp16 scales [*] (same row numbers) */
    const int64_t *index;       /* [R, Hkv, width] layer-0 row numbers */
    const int32_t *lens;        /* [R] valid entries of each row's list */
    int64_t width;
    int64_t layer_offset;
} flat_part;

void write_kv_int8(const float *k, const float *v, int64_t k_stride_t, int64_t v_stride_t, int T,
                   int Hkv, int D, const int64_t *rows, int64_t layer_offset, int8_t *k_store,
                   int8_t *v_store, uint16_t *k_scales, uint16_t *v_scales);

int decode_attention_int8(const float *q, const flat_part *parts, int num_parts, int R, int H,
                          int Hkv, int D, int64_t q_stride_r, float sm_scale, float *out,
                          float *scratch, int64_t scratch_stride, int nthreads);

int linear_blocked_f32(const float *Wb, const float *bias, const float *X, int64_t ldx, float *Y,
                       int64_t ldy, int64_t N, int64_t K, int64_t R, int nthreads);

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

#endif
