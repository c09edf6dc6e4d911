/* decoder.c's cases: test_kernel_cpu_decoder.py's one-call decode step on the tiny Llama
 * (head_dim 16, paired gate/up), the qwen2-style GQA model (biases, 3 query heads per kv head,
 * intermediate 100: unpaired), and a head_dim-64 model with Hadamard-rotated K/V (the vectorized
 * attention task and butterflies); plain and centred keys; rows over an int8 pool and an int8
 * arena plus an fp16 recent-key window; 1, 2 and 3 threads give the same bits. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* decoder.c's argument structs (kernels/cpu_decoder.py declares the same for ctypes) */
typedef struct {
    const float *input_norm, *post_norm, *qkv_w, *qkv_b, *o_w, *o_b, *gate_up_w, *gate_up_b,
        *down_w, *down_b;
} layer_weights;

typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate;
    float eps;
    int64_t rotate_kv;
} decoder_dims;

typedef struct {
    int8_t *k, *v;
    uint16_t *ks, *vs;
    const int64_t *tokens, *rows;
    int64_t n, layer_stride;
    const float *kmean;
} kv_write;

int decode_layers(const decoder_dims *dm, const layer_weights *lw, float *x, int64_t R,
                  const float *cos, const float *sin, const kv_write *writes, int num_writes,
                  flat_part *parts, const int64_t *part_strides, int num_parts, float sm_scale,
                  float *work, float *attn_scratch, int64_t scratch_stride, int nthreads);

enum { R = 4, SLOTS = 40, PARTS = 3 }; /* pool, arena (int8), window (fp16) */

typedef struct {
    int64_t layers, hidden, heads, kv_heads, dim, inter;
    int bias, rotate, centred;
    const char *name;
} model_shape;

static float *randn(rng *g, int64_t n, float scale, float shift) {
    float *x = xcalloc(n, 4);
    fill_normal(g, x, n, scale);
    for (int64_t i = 0; i < n; i++) x[i] += shift;
    return x;
}

/* blocked random weights for `outs` outputs of `ins` inputs, rows past `outs` zero */
static float *blocked_weights(rng *g, int64_t outs, int64_t ins, float scale) {
    const int64_t nb = (outs + LINEAR_BLOCK_N - 1) / LINEAR_BLOCK_N;
    float *w = xcalloc(nb * ins * LINEAR_BLOCK_N, 4);
    for (int64_t o = 0; o < outs; o++)
        for (int64_t i = 0; i < ins; i++)
            w[(o / LINEAR_BLOCK_N * ins + i) * LINEAR_BLOCK_N + o % LINEAR_BLOCK_N] = normal(g) * scale;
    return w;
}

typedef struct { /* one store: SLOTS tokens x layers x kv heads rows */
    int8_t *k, *v;
    uint16_t *ks, *vs;
} kv_store;

static void make_kv(rng *g, kv_store *s, int64_t rows, int64_t dim, int fp16, int centred) {
    const int es = fp16 ? 2 : 1;
    s->k = xcalloc(rows * dim, es), s->v = xcalloc(rows * dim, es);
    s->ks = fp16 ? NULL : xcalloc(rows, 2), s->vs = fp16 ? NULL : xcalloc(rows, 2);
    for (int64_t i = 0; i < rows * dim; i++) {
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
}

static void copy_kv(kv_store *dst, const kv_store *src, int64_t rows, int64_t dim, int fp16) {
    const int es = fp16 ? 2 : 1;
    memcpy(dst->k, src->k, (size_t)(rows * dim * es)), memcpy(dst->v, src->v, (size_t)(rows * dim * es));
    if (!fp16) memcpy(dst->ks, src->ks, (size_t)rows * 2), memcpy(dst->vs, src->vs, (size_t)rows * 2);
}

static int same_kv(const kv_store *a, const kv_store *b, int64_t rows, int64_t dim, int fp16) {
    const size_t n = (size_t)(rows * dim * (fp16 ? 2 : 1));
    return !memcmp(a->k, b->k, n) && !memcmp(a->v, b->v, n) &&
           (fp16 || (!memcmp(a->ks, b->ks, (size_t)rows * 2) && !memcmp(a->vs, b->vs, (size_t)rows * 2)));
}

/* Row r's keys: history in each part (ragged: a row with none in the pool, one with none in the
 * arena, one with a window), then its new token in the part its write goes to. */
static const int32_t HISTORY[PARTS][R] = {{13, 0, 20, 5}, {0, 9, 4, 0}, {0, 0, 3, 2}};
static const int WRITE_TO[R] = {0, 1, 2, 0}; /* the part each row's new token is written into */

static void decoder_case(const model_shape *m) {
    rng g = {(uint64_t)(m->hidden * 7 + m->dim + m->centred)};
    const int64_t Hd = m->hidden, H = m->heads, Hkv = m->kv_heads, D = m->dim, I = m->inter;
    const int64_t QKV = (H + 2 * Hkv) * D, L = m->layers, stride = SLOTS * Hkv, rows = L * stride;
    layer_weights *lw = xcalloc(L, sizeof *lw);
    void *owned[16 * 8];
    int n_owned = 0;
#define OWN(p) (owned[n_owned++] = (void *)(p))
    for (int64_t l = 0; l < L; l++) {
        lw[l].input_norm = OWN(randn(&g, Hd, 0.2f, 1.0f));
        lw[l].post_norm = OWN(randn(&g, Hd, 0.2f, 1.0f));
        lw[l].qkv_w = OWN(blocked_weights(&g, QKV, Hd, 0.15f));
        lw[l].o_w = OWN(blocked_weights(&g, Hd, H * D, 0.15f));
        lw[l].gate_up_w = OWN(blocked_weights(&g, 2 * I, Hd, 0.15f));
        lw[l].down_w = OWN(blocked_weights(&g, Hd, I, 0.15f));
        if (m->bias) {
            lw[l].qkv_b = OWN(randn(&g, QKV, 0.1f, 0.0f));
            lw[l].gate_up_b = OWN(randn(&g, 2 * I, 0.1f, 0.0f));
        }
    }
    float *means = OWN(randn(&g, L * Hkv * D, m->centred ? 3.0f : 0.0f, 0.0f));
    decoder_dims dm = {L, Hd, H, Hkv, D, I, 1e-5f, m->rotate};
    kv_store start[PARTS], st[PARTS], after_one[PARTS]; /* history; the run's; 1 thread's */
    for (int p = 0; p < PARTS; p++) {
        make_kv(&g, &start[p], rows, D, p == 2, m->centred);
        make_kv(&g, &st[p], rows, D, p == 2, 0);
        make_kv(&g, &after_one[p], rows, D, p == 2, 0);
    }
    /* indexes [R, Hkv, width]: history slots 0.., the new token at slot 30 + r */
    int64_t *index[PARTS], widths[PARTS], tokens[PARTS][R], wrows[PARTS][R * 8], counts[PARTS] = {0};
    int32_t lens[PARTS][R];
    for (int p = 0; p < PARTS; p++) {
        widths[p] = 1;
        for (int r = 0; r < R; r++) {
            lens[p][r] = HISTORY[p][r] + (WRITE_TO[r] == p);
            widths[p] = lens[p][r] > widths[p] ? lens[p][r] : widths[p];
        }
        index[p] = OWN(xcalloc(R * Hkv * widths[p], 8));
        for (int r = 0; r < R; r++) {
            for (int j = 0; j < lens[p][r]; j++) {
                const int64_t slot = j < HISTORY[p][r] ? (r * 7 + j * 3) % 30 : 30 + r;
                for (int64_t h = 0; h < Hkv; h++) index[p][(r * Hkv + h) * widths[p] + j] = slot * Hkv + h;
            }
            if (WRITE_TO[r] != p) continue;
            tokens[p][counts[p]] = r;
            for (int64_t h = 0; h < Hkv; h++) wrows[p][counts[p] * Hkv + h] = (30 + r) * Hkv + h;
            counts[p]++;
        }
    }
    float *x0 = OWN(randn(&g, R * Hd, 1.0f, 0.0f)), *cs = OWN(xcalloc(R * D, 4)), *sn = OWN(xcalloc(R * D, 4));
    for (int64_t i = 0; i < R * D; i++) { /* a point on the unit circle per pair */
        const float c = uniform(&g) * 2.0f - 1.0f;
        cs[i] = c, sn[i] = (i % 2 ? 1.0f : -1.0f) * (1.0f - c * c) * 0.9f;
    }
    float *x = OWN(xcalloc(R * Hd, 4)), *first = OWN(xcalloc(R * Hd, 4));
    int64_t most = 0;
    for (int r = 0; r < R; r++)
        most = lens[0][r] + lens[1][r] + lens[2][r] > most ? lens[0][r] + lens[1][r] + lens[2][r] : most;
    const int64_t scratch_stride = H / Hkv * most, strides[PARTS] = {stride, stride, stride};
    float *scratch = OWN(xcalloc(3 * scratch_stride, 4));
    float *work = OWN(xcalloc(R * (Hd + QKV + H * D + 3 * I) + 3 * R * Hd, 4));
    char name[64];
    for (int threads = 1; threads <= 3; threads++) {
        memcpy(x, x0, sizeof(float) * R * Hd);
        kv_write writes[PARTS];
        flat_part parts[PARTS];
        for (int p = 0; p < PARTS; p++) {
            copy_kv(&st[p], &start[p], rows, D, p == 2);
            writes[p] = (kv_write){st[p].k, st[p].v, st[p].ks, st[p].vs, tokens[p], wrows[p],
                                   counts[p], stride, p < 2 && m->centred ? means : NULL};
            parts[p] = (flat_part){.k = st[p].k, .v = st[p].v, .ks = st[p].ks, .vs = st[p].vs,
                                   .index = index[p], .lens = lens[p], .width = widths[p],
                                   .kmean = p < 2 && m->centred ? means : NULL};
        }
        const int rc = decode_layers(&dm, lw, x, R, cs, sn, writes, PARTS, parts, strides, PARTS,
                                     1.0f / (D == 16 ? 4.0f : 8.0f), work, scratch, scratch_stride,
                                     threads);
        if (rc) fail("decoder %s: returned %d", m->name, rc);
        if (threads == 1) {
            memcpy(first, x, sizeof(float) * R * Hd);
            for (int p = 0; p < PARTS; p++) copy_kv(&after_one[p], &st[p], rows, D, p == 2);
            /* the Python test: within 2e-4 of the largest logit of the torch layer loop */
            snprintf(name, sizeof name, "decoder/%s/hidden", m->name);
            record(name, F32_CLOSE, 2e-4f, 0.0f, x, R * Hd * 4);
            for (int p = 0; p < PARTS; p++) { /* the K/V it wrote: int8 up to a rounding flip */
                snprintf(name, sizeof name, "decoder/%s/part%d/k", m->name, p);
                record(name, p == 2 ? F16_CLOSE : I8_WITHIN_ONE, 2e-3f, 1e-4f, st[p].k, rows * D * (p == 2 ? 2 : 1));
                snprintf(name, sizeof name, "decoder/%s/part%d/v", m->name, p);
                record(name, p == 2 ? F16_CLOSE : I8_WITHIN_ONE, 2e-3f, 1e-4f, st[p].v, rows * D * (p == 2 ? 2 : 1));
                if (p == 2) continue;
                snprintf(name, sizeof name, "decoder/%s/part%d/ks", m->name, p);
                record(name, F16_CLOSE, 2e-3f, 0, st[p].ks, rows * 2);
                snprintf(name, sizeof name, "decoder/%s/part%d/vs", m->name, p);
                record(name, F16_CLOSE, 2e-3f, 0, st[p].vs, rows * 2);
            }
        } else {
            if (memcmp(first, x, sizeof(float) * R * Hd))
                fail("decoder %s: %d threads' hidden states differ from 1 thread's", m->name, threads);
            for (int p = 0; p < PARTS; p++)
                if (!same_kv(&after_one[p], &st[p], rows, D, p == 2))
                    fail("decoder %s: %d threads wrote other K/V than 1 thread", m->name, threads);
        }
    }
    for (int p = 0; p < PARTS; p++) {
        free(start[p].k), free(start[p].v), free(start[p].ks), free(start[p].vs);
        free(st[p].k), free(st[p].v), free(st[p].ks), free(st[p].vs);
        free(after_one[p].k), free(after_one[p].v), free(after_one[p].ks), free(after_one[p].vs);
    }
    while (n_owned) free(owned[--n_owned]);
    free(lw);
#undef OWN
}

void cases_decoder(void) {
    static const model_shape models[] = {
        {3, 64, 4, 2, 16, 160, 0, 0, 0, "llama-plain"},
        {3, 64, 4, 2, 16, 160, 0, 0, 1, "llama-centred"},
        {2, 96, 6, 2, 16, 100, 1, 0, 1, "qwen2-gqa-centred"},
        {2, 128, 4, 2, 64, 192, 0, 1, 1, "d64-rotated-centred"},
        {2, 128, 4, 2, 64, 192, 0, 1, 0, "d64-rotated-plain"},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) decoder_case(&models[i]);
}
