/* flat_kv.c's cases: tests/test_kernel_flat_kv_cpu.py (the KV writes, decode attention over int8
 * and fp16 parts, the thread spans). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { LAYERS = 3, P = 8, HKV = 2, D = 16 };

/* the row of (slot, layer, head) in a [blocks, LAYERS, P, HKV] store */
static int64_t row_of(int64_t slot, int layer, int h) {
    return ((slot / P * LAYERS + layer) * P + slot % P) * HKV + h;
}

static float absmax(const float *x, int d) {
    float m = 0.0f;
    for (int i = 0; i < d; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* kernels/quantize.py's quantize_int8 (and quantize_int8_keys with a mean) for one row */
static void quantize_ref(const float *x, const float *mean, int d, int8_t *q, uint16_t *scale) {
    float c[256];
    const float *src = x;
    int centred = 0;
    if (mean) {
        for (int i = 0; i < d; i++) c[i] = x[i] - mean[i];
        if (absmax(c, d) < absmax(x, d)) src = c, centred = 1;
    }
    const float amax = absmax(src, d);
    const uint16_t h = f16_bits(amax > 0.0f ? amax / 127.0f : 1.0f);
    const float s = f16_value(h);
    for (int i = 0; i < d; i++) {
        float r = rintf(src[i] / s);
        q[i] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
    }
    *scale = (uint16_t)(h | (centred ? 0x8000u : 0u));
}

/* write_kv_int8 of T tokens at `slots` of `layer`, checked row by row against quantize_ref */
static void write_int8_case(const char *name, const float *k, const float *v, int T,
                            const int64_t *slots, int layer, const float *mean) {
    const int64_t nrows = 7 * LAYERS * P * HKV; /* 7 blocks: every slot below 56 */
    int8_t *ks = xcalloc(nrows * D, 1), *vs = xcalloc(nrows * D, 1);
    uint16_t *kss = xcalloc(nrows, 2), *vss = xcalloc(nrows, 2);
    int64_t *rows = xcalloc((int64_t)T * HKV, 8);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HKV; h++) rows[t * HKV + h] = row_of(slots[t], layer, h);
    write_kv_int8(k, v, HKV * D, HKV * D, T, HKV, D, rows, 0, ks, vs, kss, vss, mean);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HKV; h++) {
            int8_t q[D];
            uint16_t s;
            const int64_t row = rows[t * HKV + h];
            quantize_ref(k + (t * HKV + h) * D, mean ? mean + h * D : NULL, D, q, &s);
            if (memcmp(q, ks + row * D, D) || s != kss[row])
                fail("%s: key of token %d head %d differs from quantize_int8", name, t, h);
            quantize_ref(v + (t * HKV + h) * D, NULL, D, q, &s);
            if (memcmp(q, vs + row * D, D) || s != vss[row])
                fail("%s: value of token %d head %d differs from quantize_int8", name, t, h);
        }
    char n[64];
    snprintf(n, sizeof n, "%s/k", name), record(n, EXACT, 0, 0, ks, nrows * D);
    snprintf(n, sizeof n, "%s/v", name), record(n, EXACT, 0, 0, vs, nrows * D);
    snprintf(n, sizeof n, "%s/ks", name), record(n, EXACT, 0, 0, kss, nrows * 2);
    snprintf(n, sizeof n, "%s/vs", name), record(n, EXACT, 0, 0, vss, nrows * 2);
    free(ks), free(vs), free(kss), free(vss), free(rows);
}

static void fill_means(rng *g, float *means, int layers, int hkv, int d) {
    fill_normal(g, means, (int64_t)layers * hkv * d, 3.0f);
}

/* test_write_kv_flat_equals_reference (int8) and test_native_quantization_is_bit_exact_on_hard_values */
static void write_int8_cases(void) {
    rng g = {1};
    float means[LAYERS * HKV * D], k[7 * HKV * D], v[7 * HKV * D];
    fill_means(&g, means, LAYERS, HKV, D);
    const int64_t slots[7] = {5, 17, 18, 40, 47, 0, 23};
    for (int centred = 0; centred < 2; centred++)
        for (int layer = 0; layer <= 2; layer += 2) {
            const float *mean = centred ? means + layer * HKV * D : NULL;
            fill_normal(&g, k, 7 * HKV * D, 3.0f);
            fill_normal(&g, v, 7 * HKV * D, 1.0f);
            memset(k + 2 * HKV * D, 0, sizeof(float) * HKV * D); /* scale 1 */
            if (centred) {
                for (int t = 3; t < 7; t++)
                    for (int i = 0; i < HKV * D; i++) k[t * HKV * D + i] += mean[i];
                memcpy(k + 4 * HKV * D, mean, sizeof(float) * D); /* exactly the mean: scale -1 */
            }
            char name[64];
            snprintf(name, sizeof name, "write_int8/%s/layer%d", centred ? "centred" : "plain", layer);
            write_int8_case(name, k, v, 7, slots, layer, mean);
        }
    /* hard values: scales across fp16's normal and subnormal range, .5 ties, zero rows */
    static const float mags[9] = {1e-9f, 3e-7f, 6e-6f, 1e-4f, 0.01f, 1.0f, 30.0f, 1e3f, 6e4f};
    enum { T = 9 * 5 };
    float hk[(T + 2) * HKV * D], hv[(T + 2) * HKV * D];
    int64_t hslots[T + 2];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HKV * D; i++) hk[t * HKV * D + i] = normal(&g) * mags[t / 5];
    memset(hk, 0, sizeof(float) * HKV * D);
    for (int i = 0; i < D - 1; i++) hk[HKV * D + i] = (float)(-127 + 2 * i) + 0.5f; /* x/1 ties */
    hk[HKV * D + D - 1] = 127.0f;                                                    /* scale 1 */
    for (int t = 0; t < T + 2; t++) hslots[t] = t;
    for (int centred = 0; centred < 2; centred++) {
        float mean[HKV * D];
        for (int i = 0; i < HKV * D; i++) mean[i] = means[HKV * D + i] * 1e-3f;
        int n = T;
        if (centred) { /* the same values around the mean, and two keys equal to it */
            for (int t = 0; t < T; t++)
                for (int i = 0; i < HKV * D; i++) hk[t * HKV * D + i] += mean[i];
            memcpy(hk + T * HKV * D, mean, sizeof mean);
            memcpy(hk + (T + 1) * HKV * D, mean, sizeof mean);
            n = T + 2;
        }
        for (int i = 0; i < n * HKV * D; i++) hv[i] = -hk[i];
        write_int8_case(centred ? "write_int8/hard/centred" : "write_int8/hard/plain", hk, hv, n,
                        hslots, 1, centred ? mean : NULL);
    }
}

/* test_native_fp16_write_is_bit_exact: torch's .to(float16) bits on fp16's hard values */
static void write_f16_cases(void) {
    static const float hard[14] = {0.0f, -0.0f, 6e-8f, -3e-8f, 1e-5f, 65504.0f, 65520.0f, 7e4f,
                                   -1e6f, __builtin_inff(), 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                                   0x1p-24f * 1.5f, 0x1p-14f * 0.75f};
    rng g = {5};
    for (int dim = 64; dim >= 12; dim -= 52) {
        enum { TOK = 4, H = 3 };
        const int n = TOK * H * dim;
        float *x = xcalloc(n, 4), *neg = xcalloc(n, 4);
        for (int i = 0; i < n; i++) {
            float p = 1.0f;
            for (int e = (int)(next_u64(&g) % 14) - 9; e != 0; e += e < 0 ? 1 : -1)
                p = e < 0 ? p / 10.0f : p * 10.0f;
            x[i] = normal(&g) * p;
        }
        memcpy(x, hard, sizeof hard);
        for (int i = 0; i < n; i++) neg[i] = -x[i];
        int64_t rows[TOK * H];
        for (int i = 0; i < TOK * H; i++) rows[i] = TOK * H - 1 - i; /* scattered */
        uint16_t *ks = xcalloc(n, 2), *vs = xcalloc(n, 2);
        write_kv_f16(x, neg, H * dim, H * dim, TOK, H, dim, rows, 0, ks, vs);
        for (int j = 0; j < TOK * H; j++)
            for (int i = 0; i < dim; i++) {
                const float a = x[j * dim + i];
                if (ks[rows[j] * dim + i] != f16_bits(a) || vs[rows[j] * dim + i] != f16_bits(-a))
                    fail("write_kv_f16 head_dim %d: %g -> 0x%04x, want 0x%04x", dim, (double)a,
                         ks[rows[j] * dim + i], f16_bits(a));
            }
        char name[64];
        snprintf(name, sizeof name, "write_f16/d%d/k", dim), record(name, EXACT, 0, 0, ks, (int64_t)n * 2);
        snprintf(name, sizeof name, "write_f16/d%d/v", dim), record(name, EXACT, 0, 0, vs, (int64_t)n * 2);
        free(x), free(neg), free(ks), free(vs);
    }
}

void cases_write_kv(void) {
    write_int8_cases();
    write_f16_cases();
}

/* test_attention_spans_are_contiguous_and_balanced_by_keys */
void cases_spans(void) {
    static const int32_t lens_sets[5][5] = {{600, 600, 600, 600, 600}, {40, 900, 35, 610, 12},
                                            {3, 1, 700}, {5}, {2, 9}};
    static const int counts[5] = {5, 5, 3, 1, 2};
    const int hkv = 3;
    for (int s = 0; s < 5; s++)
        for (int team = 1; team <= 4; team++) {
            flat_part part = {.lens = lens_sets[s]};
            const int R = counts[s], tasks = R * hkv;
            int64_t spans[8], covered = 0, total = 0, longest = 0;
            for (int r = 0; r < R; r++) {
                total += lens_sets[s][r];
                longest = lens_sets[s][r] > longest ? lens_sets[s][r] : longest;
            }
            for (int t = 0; t < team; t++) {
                decode_attention_span(&part, 1, R, hkv, t, team, &spans[2 * t], &spans[2 * t + 1]);
                if (spans[2 * t] != covered && spans[2 * t + 1] > spans[2 * t])
                    fail("spans set %d team %d: thread %d starts at %lld, not %lld", s, team, t,
                         (long long)spans[2 * t], (long long)covered);
                int64_t keys = 0;
                for (int64_t i = spans[2 * t]; i < spans[2 * t + 1]; i++) keys += lens_sets[s][i / hkv];
                if ((double)keys > (double)total * hkv / team + (double)longest)
                    fail("spans set %d team %d: thread %d has %lld keys", s, team, t, (long long)keys);
                if (spans[2 * t + 1] > spans[2 * t]) covered = spans[2 * t + 1];
            }
            if (covered != tasks) fail("spans set %d team %d cover %lld of %d tasks", s, team,
                                       (long long)covered, tasks);
            char name[64];
            snprintf(name, sizeof name, "spans/set%d/team%d", s, team);
            record(name, EXACT, 0, 0, spans, 16 * team);
        }
}
