/* decode_attention_int8's cases: test_native_decode_attention_equals_torch_path (every shape of
 * SHAPES: the vectorized task for head_dim 64/128 and 1-8 query heads per kv head, the any-shape
 * task otherwise; plain and centred keys; two int8 parts with ragged rows; strided queries;
 * layers 0 and 2), and the same with an fp16 part (the recent-key window) added. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { LAYERS = 3, PAGE = 8, ROWS = 4 };

typedef struct { /* one store and its part */
    int8_t *k, *v;
    uint16_t *ks, *vs;
    int64_t *index;
    int32_t lens[ROWS];
} store;

/* random int8 K/V and fp16 scales (negative on about half of the keys when centred), and an
 * index of `lens` random distinct tokens per row (layer-0 rows) */
static void make_store(rng *g, store *s, int blocks, int hkv, int d, const int32_t *lens,
                       int width, int centred, int fp16) {
    const int64_t rows = (int64_t)blocks * LAYERS * PAGE * hkv;
    s->k = xcalloc(rows * d, fp16 ? 2 : 1);
    s->v = xcalloc(rows * d, fp16 ? 2 : 1);
    s->ks = fp16 ? NULL : xcalloc(rows, 2);
    s->vs = fp16 ? NULL : xcalloc(rows, 2);
    for (int64_t i = 0; i < rows * d; i++) {
        if (fp16) {
            ((uint16_t *)(void *)s->k)[i] = f16_bits(normal(g));
            ((uint16_t *)(void *)s->v)[i] = f16_bits(normal(g));
        } else {
            s->k[i] = (int8_t)((int)(next_u64(g) % 255) - 127);
            s->v[i] = (int8_t)((int)(next_u64(g) % 255) - 127);
        }
    }
    for (int64_t i = 0; !fp16 && i < rows; i++) {
        s->ks[i] = f16_bits(uniform(g) * 0.02f + 0.001f);
        s->vs[i] = f16_bits(uniform(g) * 0.02f + 0.001f);
        if (centred && uniform(g) < 0.5f) s->ks[i] |= 0x8000u;
    }
    const int tokens = blocks * PAGE;
    int *perm = xcalloc(tokens, sizeof(int));
    s->index = xcalloc((int64_t)ROWS * hkv * (width ? width : 1), 8);
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < tokens; i++) perm[i] = i;
        for (int i = 0; i < width; i++) { /* a partial Fisher-Yates: `width` distinct tokens */
            const int j = i + (int)(next_u64(g) % (uint64_t)(tokens - i)), t = perm[j];
            perm[j] = perm[i], perm[i] = t;
            const int64_t base = ((int64_t)(t / PAGE) * LAYERS * PAGE + t % PAGE) * hkv;
            for (int h = 0; h < hkv; h++) s->index[((int64_t)r * hkv + h) * width + i] = base + h;
        }
        s->lens[r] = lens[r];
    }
    free(perm);
}

static void free_store(store *s) {
    free(s->k), free(s->v), free(s->ks), free(s->vs), free(s->index);
}

static int max_len(const int32_t *lens) {
    int m = 0;
    for (int r = 0; r < ROWS; r++) m = lens[r] > m ? lens[r] : m;
    return m;
}

static void attention_case(int d, int heads, int hkv, int centred, int window) {
    static const int32_t lens[3][ROWS] = {{13, 0, 20, 1}, {0, 9, 4, 2}, {3, 1, 0, 2}};
    rng g = {(uint64_t)(d * 1000 + heads * 10 + centred + 100 * window)};
    const int nparts = window ? 3 : 2, G = heads / hkv;
    float *means = xcalloc((int64_t)LAYERS * hkv * d, 4);
    if (centred) fill_normal(&g, means, (int64_t)LAYERS * hkv * d, 3.0f);
    store st[3];
    static const int blocks[3] = {7, 3, 2};
    for (int p = 0; p < nparts; p++)
        make_store(&g, &st[p], blocks[p], hkv, d, lens[p], max_len(lens[p]), centred && p < 2,
                   p == 2);
    const int64_t q_stride = (int64_t)(heads + 2) * d; /* q rows of a fused q/k/v split */
    float *q = xcalloc(ROWS * q_stride, 4);
    fill_normal(&g, q, ROWS * q_stride, 1.0f);
    int64_t most = 0;
    for (int r = 0; r < ROWS; r++) {
        int64_t n = 0;
        for (int p = 0; p < nparts; p++) n += lens[p][r];
        most = n > most ? n : most;
    }
    const int64_t scratch_stride = G * most;
    float *scratch = xcalloc(2 * scratch_stride, 4);
    float *out1 = xcalloc((int64_t)ROWS * heads * d, 4), *out2 = xcalloc((int64_t)ROWS * heads * d, 4);
    for (int layer = 0; layer <= 2; layer += 2) {
        flat_part parts[3];
        for (int p = 0; p < nparts; p++)
            parts[p] = (flat_part){.k = st[p].k, .v = st[p].v, .ks = st[p].ks, .vs = st[p].vs,
                                   .index = st[p].index, .lens = st[p].lens,
                                   .width = max_len(lens[p]),
                                   .layer_offset = (int64_t)layer * PAGE * hkv,
                                   .kmean = centred && p < 2 ? means + (int64_t)layer * hkv * d : NULL};
        const float sm = 1.0f / (d == 16 ? 4.0f : d == 64 ? 8.0f : 11.3137085f);
        int rc1 = decode_attention_int8(q, parts, nparts, ROWS, heads, hkv, d, q_stride, sm, out1,
                                        scratch, scratch_stride, 1);
        int rc2 = decode_attention_int8(q, parts, nparts, ROWS, heads, hkv, d, q_stride, sm, out2,
                                        scratch, scratch_stride, 2);
        char name[64];
        snprintf(name, sizeof name, "attention/d%d/h%d/kv%d/%s%s/layer%d", d, heads, hkv,
                 centred ? "centred" : "plain", window ? "+window" : "", layer);
        if (rc1 || rc2) fail("%s: returned %d, %d", name, rc1, rc2);
        if (memcmp(out1, out2, sizeof(float) * ROWS * heads * d))
            fail("%s: 1 and 2 threads differ", name);
        /* the Python test: within atol 1e-5, rtol 1e-4 of torch, x86 and Arm alike */
        record(name, F32_CLOSE, 2e-5f, 2e-4f, out1, (int64_t)ROWS * heads * d * 4);
    }
    for (int p = 0; p < nparts; p++) free_store(&st[p]);
    free(means), free(q), free(scratch), free(out1), free(out2);
}

void cases_attention(void) {
    static const int shapes[7][3] = {{16, 6, 2}, {64, 6, 2}, {64, 2, 2}, {128, 8, 2},
                                     {64, 10, 2}, {64, 16, 2}, {64, 18, 2}};
    for (int s = 0; s < 7; s++)
        for (int centred = 0; centred < 2; centred++)
            attention_case(shapes[s][0], shapes[s][1], shapes[s][2], centred, 0);
    attention_case(16, 6, 2, 1, 1);
    attention_case(64, 6, 2, 1, 1);
    attention_case(128, 4, 2, 0, 1);
}
