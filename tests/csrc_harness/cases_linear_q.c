/* linear_int4.c's cases: test_kernel_cpu_int4.py's (2-, 3-, 5-, 6- (signed and not), 4- and 8-bit
 * weights, 4-bit codebook indices (IQ4), fp16, fp32 and two-level (int8 or 4-bit codes x fp16 per
 * 256: the K types)
 * parameters, with and without offsets, groups of 16 to 128, ragged N, bias, every row count of a
 * pass, thread counts): each row's output must be the same bits alone and in any pass on any
 * number of threads, close to linear_f32.c's over the dequantized weights (the quantized kernel
 * applies a group's scale and offset once: another summation order), and dequant_blocks_q must
 * give the dequantized values exactly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct {
    int64_t n, k;
    int bits, group, params_f32, offsets, bias, signed5, two_level, codebook, codes4;
} q_case;

static const int8_t IQ4_CODEBOOK[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

/* two-level parameters: int8 codes in [lo, lo + span) per group (codes4: 4-bit ones, 0..15, two
 * groups a byte), fp16 supers per 256 inputs of either sign (row 0's subnormal); values[p] =
 * super x code (exact in fp32) */
static void two_level(rng *g, const q_case *c, int lo, int span, int8_t **codes, uint16_t **supers,
                      float *values) {
    const int64_t nb = (c->n + LINEAR_BLOCK_N - 1) / LINEAR_BLOCK_N, kg = c->k / c->group, ks = c->k / 256;
    *codes = xcalloc(nb * kg * LINEAR_BLOCK_N, 1);
    *supers = xcalloc(nb * ks * LINEAR_BLOCK_N, 2);
    for (int64_t p = 0; p < nb * ks * LINEAR_BLOCK_N; p++) {
        const int row = (int)((p / (ks * LINEAR_BLOCK_N)) * 16 + p % LINEAR_BLOCK_N);
        float d = (uniform(g) * 0.02f + 0.001f) * (next_u64(g) % 2 ? 1.0f : -1.0f);
        (*supers)[p] = row >= c->n ? 0 : f16_bits(row == 0 ? d * 1e-3f : d);
    }
    for (int64_t p = 0; p < nb * kg * LINEAR_BLOCK_N; p++) {
        const int64_t b = p / (kg * LINEAR_BLOCK_N), grp = p / LINEAR_BLOCK_N % kg, lane = p % LINEAR_BLOCK_N;
        const int8_t code = c->codes4 ? (int8_t)(next_u64(g) % 16)
                                      : (int8_t)(lo + (int)(next_u64(g) % (uint64_t)span));
        if (c->codes4) /* group 2 i: byte i's low nibble, 2 i + 1: its high one */
            ((uint8_t *)*codes)[(b * kg + grp) / 2 * LINEAR_BLOCK_N + lane] |= (uint8_t)(code << (grp % 2 * 4));
        else
            (*codes)[p] = code;
        values[p] = f16_value((*supers)[(b * ks + grp * c->group / 256) * LINEAR_BLOCK_N + lane]) * (float)code;
    }
}

/* random integers and parameters in the blocked layout; `dequant` gets the fp32 blocked values */
static blocked_weight make_weight(rng *g, const q_case *c, float *dequant) {
    const int64_t nb = (c->n + LINEAR_BLOCK_N - 1) / LINEAR_BLOCK_N, kg = c->k / c->group;
    const int64_t params = nb * kg * LINEAR_BLOCK_N, psize = c->params_f32 ? 4 : 2;
    uint8_t *data = xcalloc(nb * c->k * c->bits * 2, 1);
    char *scales = xcalloc(params, psize), *offsets = c->offsets ? xcalloc(params, psize) : NULL;
    float *s = xcalloc(params, 4), *o = xcalloc(params, 4);
    int8_t *scode = NULL, *ocode = NULL;
    uint16_t *ssuper = NULL, *osuper = NULL;
    if (c->two_level) {
        two_level(g, c, -32, 96, &scode, &ssuper, s);
        if (c->offsets) two_level(g, c, -128, 256, &ocode, &osuper, o);
        free(scales), free(offsets);
        scales = (char *)scode, offsets = (char *)ocode;
    }
    for (int64_t p = 0; p < params && !c->two_level; p++) {
        const int row = (int)(p % LINEAR_BLOCK_N), past = (p / (kg * LINEAR_BLOCK_N)) * 16 + row >= c->n;
        /* the sources' values: fp16 scales (fp32 ones are AWQ's fp16 s or Q4_K's d sc, with
         * offsets -s z), so s q and s z are exact and s q + o rounds once, FMA or not */
        float sv = past ? 0.0f : f16_value(f16_bits(uniform(g) * 0.02f + 0.001f));
        float ov = past || !offsets ? 0.0f
                   : c->params_f32 ? -(sv * (float)(int)(next_u64(g) % 16)) : normal(g) * 0.05f;
        if (c->params_f32) {
            ((float *)scales)[p] = sv, s[p] = sv;
            if (offsets) ((float *)offsets)[p] = ov, o[p] = ov;
        } else {
            ((uint16_t *)scales)[p] = f16_bits(sv), s[p] = f16_value(f16_bits(sv));
            if (offsets) ((uint16_t *)offsets)[p] = f16_bits(ov), o[p] = f16_value(f16_bits(ov));
        }
    }
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < c->k; i++)
            for (int lane = 0; lane < LINEAR_BLOCK_N; lane++) {
                const int past = b * 16 + lane >= c->n;
                int q;
                if (c->bits == 2) { /* bits 2 (lane % 4) of byte lane / 4 */
                    q = past ? 0 : (int)(next_u64(g) % 4);
                    data[(b * c->k + i) * 4 + lane / 4] |= (uint8_t)(q << (lane % 4 * 2));
                } else if (c->bits == 3) { /* bits 3 lane of the line's 48 bits, little-endian */
                    q = past ? 0 : (int)(next_u64(g) % 8) - (c->signed5 ? 4 : 0);
                    uint8_t *line = data + (b * c->k + i) * 6;
                    const int at = 3 * lane;
                    line[at / 8] |= (uint8_t)(((q & 7) << (at % 8)) & 0xFF);
                    if (at % 8 > 5) line[at / 8 + 1] |= (uint8_t)((q & 7) >> (8 - at % 8));
                } else if (c->bits == 4) {
                    q = past ? 0 : (int)(next_u64(g) % 16);
                    data[(b * c->k + i) * 8 + lane % 8] |= (uint8_t)(q << (lane / 8 * 4));
                    if (c->codebook) q = IQ4_CODEBOOK[q];
                } else if (c->bits == 6) { /* the nibble, then the fifth and sixth bits' planes */
                    q = past ? 0 : (int)(next_u64(g) % 64) - (c->signed5 ? 32 : 0);
                    uint8_t *line = data + (b * c->k + i) * 12;
                    line[lane % 8] |= (uint8_t)((q & 15) << (lane / 8 * 4));
                    line[8 + lane / 8] |= (uint8_t)(((q >> 4) & 1) << (lane % 8));
                    line[10 + lane / 8] |= (uint8_t)(((q >> 5) & 1) << (lane % 8));
                } else if (c->bits == 5) { /* the nibble, then the fifth bit's plane */
                    q = past ? 0 : (int)(next_u64(g) % 32) - (c->signed5 ? 16 : 0);
                    uint8_t *line = data + (b * c->k + i) * 10;
                    line[lane % 8] |= (uint8_t)((q & 15) << (lane / 8 * 4));
                    line[8 + lane / 8] |= (uint8_t)(((q >> 4) & 1) << (lane % 8));
                } else {
                    q = past ? 0 : (int)(next_u64(g) % 256) - 128;
                    ((int8_t *)data)[(b * c->k + i) * 16 + lane] = (int8_t)q;
                }
                const int64_t p = (b * kg + i / c->group) * LINEAR_BLOCK_N + lane;
                dequant[(b * c->k + i) * LINEAR_BLOCK_N + lane] = s[p] * (float)q + o[p];
            }
    free(s), free(o);
    return (blocked_weight){data, scales, offsets, c->bits, c->group, c->params_f32, c->signed5,
                            ssuper, osuper, c->codebook ? IQ4_CODEBOOK : NULL, c->codes4};
}

static void linear_q_case(const q_case *c) {
    static const int row_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 25, 40};
    enum { MOST = 40 };
    const int64_t n = c->n, k = c->k, nb = (n + LINEAR_BLOCK_N - 1) / LINEAR_BLOCK_N;
    rng g = {(uint64_t)(n * 977 + k * 13 + c->bits * 5 + c->group + c->params_f32)};
    float *wb = xcalloc(nb * k * LINEAR_BLOCK_N, 4), *tiles = xcalloc(nb * k * LINEAR_BLOCK_N, 4);
    blocked_weight wt = make_weight(&g, c, wb);
    float *b = c->bias ? xcalloc(n, 4) : NULL;
    if (b) fill_normal(&g, b, n, 1.0f);
    const int64_t ldx = k + 3;
    float *x = xcalloc(MOST * ldx, 4), *want = xcalloc(MOST * n, 4), *y = xcalloc(MOST * n, 4);
    fill_normal(&g, x, MOST * ldx, 1.0f);
    char name[64];
    snprintf(name, sizeof name, "linear_q/n%lld/k%lld/%sint%d%s/g%d/%s%s%s", (long long)n,
             (long long)k, c->signed5 ? "s" : "", c->bits, c->codebook ? "book" : "", c->group,
             c->two_level ? (c->codes4 ? "u4x16" : "i8x16") : c->params_f32 ? "f32" : "f16", c->offsets ? "/off" : "",
             c->bias ? "/bias" : "");
    if (dequant_blocks_q(&wt, k, 0, nb, tiles, 2) || memcmp(tiles, wb, sizeof(float) * nb * k * 16))
        fail("%s: dequant_blocks_q is not the dequantized weight", name);
    float *dense = xcalloc(MOST * n, 4), largest = 0;
    for (int r = 0; r < MOST; r++) { /* each row alone, and the fp32 kernel over the dequantized weight */
        if (linear_blocked_q(&wt, b, x + r * ldx, ldx, want + r * n, n, n, k, 1, 1) ||
            linear_blocked_f32(wb, b, x + r * ldx, ldx, dense + r * n, n, n, k, 1, 1))
            fail("%s: a kernel refused a row", name);
    }
    for (int64_t i = 0; i < MOST * n; i++) largest = fmaxf(largest, fabsf(dense[i]));
    for (int64_t i = 0; i < MOST * n; i++)
        if (fabsf(want[i] - dense[i]) > 1e-5f * fabsf(dense[i]) + 2e-6f * largest) {
            fail("%s: output %lld is %g, the fp32 kernel's %g", name, (long long)i, want[i], dense[i]);
            break;
        }
    for (size_t rc = 0; rc < sizeof row_counts / sizeof row_counts[0]; rc++)
        for (int threads = 1; threads <= 2; threads++) {
            const int rows = row_counts[rc];
            memset(y, 0, sizeof(float) * MOST * n);
            if (linear_blocked_q(&wt, b, x, ldx, y, n, n, k, rows, threads))
                fail("%s: refused %d rows", name, rows);
            if (memcmp(y, want, sizeof(float) * rows * n))
                fail("%s, %d rows, %d threads: not each row's result alone", name, rows, threads);
        }
    record(name, F32_CLOSE, 1e-6f, 1e-5f, y, MOST * n * 4);
    blocked_weight bad = wt;
    bad.group = (int)k + 1; /* K not a multiple of it */
    if (linear_blocked_q(&bad, b, x, ldx, y, n, n, k, 1, 1) != -1)
        fail("%s: a group that does not divide K accepted", name);
    free((void *)wt.data), free((void *)wt.scales), free((void *)wt.offsets);
    free((void *)wt.super_scales), free((void *)wt.super_offsets);
    free(wb), free(tiles), free(b), free(x), free(want), free(y), free(dense);
}

void cases_linear_q(void) {
    static const q_case cases[] = {
        {16, 64, 4, 32, 0, 1, 0, 0, 0, 0, 0},    /* GGUF Q4_0 / Q4_1 */
        {37, 96, 4, 32, 0, 1, 1, 0, 0, 0, 0},    /* ragged N: a partial last block */
        {200, 256, 4, 64, 1, 1, 0, 0, 0, 0, 0},  /* AWQ parameters */
        {72, 256, 4, 128, 0, 1, 1, 0, 0, 0, 0},
        {51, 128, 8, 32, 0, 0, 0, 0, 0, 0, 0},   /* Q8_0 */
        {40, 256, 8, 16, 1, 0, 0, 0, 0, 0, 0},   /* 8-bit, group 16, fp32 */
        {51, 128, 5, 32, 0, 0, 0, 1, 0, 0, 0}, /* Q5_0: signed 5-bit, no offset */
        {37, 96, 5, 32, 0, 1, 1, 0, 0, 0, 0},  /* Q5_1 */
        {72, 256, 5, 32, 1, 1, 0, 0, 0, 0, 0}, /* 5-bit, fp32 */
        {24, 64, 4, 16, 1, 1, 0, 0, 0, 0, 0},  /* 4-bit, group 16 */
        {72, 512, 4, 32, 0, 1, 0, 0, 1, 0, 0},  /* Q4_K: two-level parameters */
        {37, 512, 5, 32, 0, 1, 1, 0, 1, 0, 0},  /* Q5_K */
        {40, 256, 6, 16, 0, 0, 0, 1, 1, 0, 0},  /* Q6_K: signed 6-bit, two-level, no offset */
        {24, 256, 4, 16, 0, 1, 0, 0, 1, 0, 0},  /* 4-bit, group 16, two-level */
        {56, 256, 6, 16, 0, 1, 1, 0, 0, 0, 0},  /* unsigned 6-bit, one-level */
        {51, 128, 4, 32, 0, 0, 0, 0, 0, 1, 0},  /* IQ4_NL: codebook indices */
        {40, 512, 4, 32, 0, 0, 1, 0, 1, 1, 0},  /* IQ4_XS: codebook, two-level */
        {24, 256, 2, 16, 0, 1, 0, 0, 1, 0, 1},  /* Q2_K: 2-bit, two-level 4-bit codes */
        {37, 512, 2, 16, 0, 1, 1, 0, 1, 0, 1},
        {40, 256, 3, 16, 0, 0, 0, 1, 1, 0, 0},  /* Q3_K: signed 3-bit, two-level, no offset */
        {37, 512, 3, 16, 0, 0, 1, 1, 1, 0, 0},
        {40, 512, 3, 16, 0, 1, 1, 1, 1, 0, 0},  /* Q2_K fused with Q3_K: signed 3-bit, offsets */
        {56, 64, 3, 16, 0, 1, 1, 0, 0, 0, 0},   /* unsigned 3-bit, one-level */
        {51, 128, 2, 32, 1, 1, 0, 0, 0, 0, 0},  /* 2-bit, fp32 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) linear_q_case(&cases[c]);
}
