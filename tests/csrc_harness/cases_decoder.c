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
    const float *input_norm, *post_norm;
    blocked_weight qkv_w;     const float *qkv_b;
    blocked_weight o_w;       const float *o_b;
    blocked_weight gate_up_w; const float *gate_up_b;
    blocked_weight down_w;    const float *down_b;
    const float *q_norm, *k_norm; /* NULL here: no per-head q/k RMSNorm (Qwen3's) */
} layer_weights;

/* an fp32 blocked weight (bits 32: linear_f32.c's layout) */
static blocked_weight fp32_weight(const float *data) {
    blocked_weight w = {data, NULL, NULL, 32, 0, 0, 0, NULL, NULL, NULL, 0};
    return w;
}

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

typedef struct { /* one model's decode step: weights, the stores before it, the rows' keys */
    const model_shape *m;
    decoder_dims dm;
    layer_weights *lw;
    float *means, *x0, *cs, *sn;
    kv_store start[PARTS];
    int64_t rows, stride, widths[PARTS], counts[PARTS];
    int64_t *index[PARTS], tokens[PARTS][R], wrows[PARTS][R * 8];
    int32_t lens[PARTS][R];
    void *owned[128];
    int n_owned;
} step_fixture;

static void *own(step_fixture *f, void *p) { return f->owned[f->n_owned++] = p; }

static void make_weights(step_fixture *f, rng *g) {
    const model_shape *m = f->m;
    const int64_t Hd = m->hidden, I = m->inter, QKV = (m->heads + 2 * m->kv_heads) * m->dim;
    f->lw = own(f, xcalloc(m->layers, sizeof *f->lw));
    for (int64_t l = 0; l < m->layers; l++) {
        layer_weights *w = &f->lw[l];
        w->input_norm = own(f, randn(g, Hd, 0.2f, 1.0f));
        w->post_norm = own(f, randn(g, Hd, 0.2f, 1.0f));
        w->qkv_w = fp32_weight(own(f, blocked_weights(g, QKV, Hd, 0.15f)));
        w->o_w = fp32_weight(own(f, blocked_weights(g, Hd, m->heads * m->dim, 0.15f)));
        w->gate_up_w = fp32_weight(own(f, blocked_weights(g, 2 * I, Hd, 0.15f)));
        w->down_w = fp32_weight(own(f, blocked_weights(g, Hd, I, 0.15f)));
        if (m->bias) {
            w->qkv_b = own(f, randn(g, QKV, 0.1f, 0.0f));
            w->gate_up_b = own(f, randn(g, 2 * I, 0.1f, 0.0f));
        }
    }
    f->means = own(f, randn(g, m->layers * m->kv_heads * m->dim, m->centred ? 3.0f : 0.0f, 0.0f));
    f->x0 = own(f, randn(g, R * Hd, 1.0f, 0.0f));
    f->cs = own(f, xcalloc(R * m->dim, 4));
    f->sn = own(f, xcalloc(R * m->dim, 4));
    for (int64_t i = 0; i < R * m->dim; i++) { /* rope is linear in them: any values test it */
        const float c = uniform(g) * 2.0f - 1.0f;
        f->cs[i] = c, f->sn[i] = (i % 2 ? 1.0f : -1.0f) * (1.0f - c * c) * 0.9f;
    }
}

/* indexes [R, Hkv, width]: history slots below 30, the new token of row r at slot 30 + r */
static void make_rows(step_fixture *f) {
    const int64_t Hkv = f->m->kv_heads;
    for (int p = 0; p < PARTS; p++) {
        f->widths[p] = 1;
        f->counts[p] = 0;
        for (int r = 0; r < R; r++) {
            f->lens[p][r] = HISTORY[p][r] + (WRITE_TO[r] == p);
            f->widths[p] = f->lens[p][r] > f->widths[p] ? f->lens[p][r] : f->widths[p];
        }
        int64_t *index = f->index[p] = own(f, xcalloc(R * Hkv * f->widths[p], 8));
        for (int r = 0; r < R; r++) {
            for (int j = 0; j < f->lens[p][r]; j++) {
                const int64_t slot = j < HISTORY[p][r] ? (r * 7 + j * 3) % 30 : 30 + r;
                for (int64_t h = 0; h < Hkv; h++) index[(r * Hkv + h) * f->widths[p] + j] = slot * Hkv + h;
            }
            if (WRITE_TO[r] != p) continue;
            f->tokens[p][f->counts[p]] = r;
            for (int64_t h = 0; h < Hkv; h++) f->wrows[p][f->counts[p] * Hkv + h] = (30 + r) * Hkv + h;
            f->counts[p]++;
        }
    }
}

/* one decode_layers call from the fixture's starting stores into `st`, x */
static void run_step(step_fixture *f, kv_store *st, float *x, int threads) {
    const model_shape *m = f->m;
    const int64_t Hd = m->hidden, H = m->heads, Hkv = m->kv_heads, D = m->dim, I = m->inter;
    int64_t most = 0;
    for (int r = 0; r < R; r++) {
        const int64_t n = f->lens[0][r] + f->lens[1][r] + f->lens[2][r];
        most = n > most ? n : most;
    }
    const int64_t scratch_stride = H / Hkv * most, strides[PARTS] = {f->stride, f->stride, f->stride};
    float *scratch = xcalloc(3 * scratch_stride, 4);
    float *work = xcalloc(R * (Hd + (H + 2 * Hkv) * D + H * D + 3 * I) + 3 * R * Hd, 4);
    kv_write writes[PARTS];
    flat_part parts[PARTS];
    memcpy(x, f->x0, sizeof(float) * R * Hd);
    for (int p = 0; p < PARTS; p++) {
        copy_kv(&st[p], &f->start[p], f->rows, D, p == 2);
        const float *mean = p < 2 && m->centred ? f->means : NULL;
        writes[p] = (kv_write){st[p].k, st[p].v, st[p].ks, st[p].vs, f->tokens[p], f->wrows[p],
                               f->counts[p], f->stride, mean};
        parts[p] = (flat_part){.k = st[p].k, .v = st[p].v, .ks = st[p].ks, .vs = st[p].vs,
                               .index = f->index[p], .lens = f->lens[p], .width = f->widths[p],
                               .kmean = mean};
    }
    const int rc = decode_layers(&f->dm, f->lw, x, R, f->cs, f->sn, writes, PARTS, parts, strides,
                                 PARTS, 1.0f / (D == 16 ? 4.0f : 8.0f), work, scratch,
                                 scratch_stride, threads);
    if (rc) fail("decoder %s: returned %d", m->name, rc);
    free(scratch), free(work);
}

/* the hidden states and the K/V the step wrote (int8 up to a rounding flip, as the Python test) */
static void record_step(const step_fixture *f, const kv_store *st, const float *x) {
    const char *n = f->m->name;
    const int64_t rd = f->rows * f->m->dim;
    char name[64];
    snprintf(name, sizeof name, "decoder/%s/hidden", n); /* within 2e-4 of the largest value */
    record(name, F32_CLOSE, 2e-4f, 0.0f, x, R * f->m->hidden * 4);
    for (int p = 0; p < PARTS; p++) {
        const enum record_kind kind = p == 2 ? F16_CLOSE : I8_WITHIN_ONE;
        snprintf(name, sizeof name, "decoder/%s/part%d/k", n, p);
        record(name, kind, 2e-3f, 1e-4f, st[p].k, rd * (p == 2 ? 2 : 1));
        snprintf(name, sizeof name, "decoder/%s/part%d/v", n, p);
        record(name, kind, 2e-3f, 1e-4f, st[p].v, rd * (p == 2 ? 2 : 1));
        if (p == 2) continue;
        snprintf(name, sizeof name, "decoder/%s/part%d/ks", n, p);
        record(name, F16_CLOSE, 2e-3f, 0, st[p].ks, f->rows * 2);
        snprintf(name, sizeof name, "decoder/%s/part%d/vs", n, p);
        record(name, F16_CLOSE, 2e-3f, 0, st[p].vs, f->rows * 2);
    }
}

static void free_kv(kv_store *s) { free(s->k), free(s->v), free(s->ks), free(s->vs); }

/* 1 thread's step recorded; 2 and 3 threads must give the same bits (hidden states and K/V) */
static void decoder_case(const model_shape *m) {
    rng g = {(uint64_t)(m->hidden * 7 + m->dim + m->centred)};
    step_fixture f = {.m = m, .stride = SLOTS * m->kv_heads};
    f.rows = m->layers * f.stride;
    f.dm = (decoder_dims){m->layers, m->hidden, m->heads, m->kv_heads, m->dim, m->inter, 1e-5f, m->rotate};
    make_weights(&f, &g);
    make_rows(&f);
    kv_store st[PARTS], first_kv[PARTS];
    for (int p = 0; p < PARTS; p++) {
        make_kv(&g, &f.start[p], f.rows, m->dim, p == 2, m->centred);
        make_kv(&g, &st[p], f.rows, m->dim, p == 2, 0);
        make_kv(&g, &first_kv[p], f.rows, m->dim, p == 2, 0);
    }
    float *x = xcalloc(R * m->hidden, 4), *first = xcalloc(R * m->hidden, 4);
    run_step(&f, first_kv, first, 1);
    record_step(&f, first_kv, first);
    for (int threads = 2; threads <= 3; threads++) {
        run_step(&f, st, x, threads);
        if (memcmp(first, x, sizeof(float) * R * m->hidden))
            fail("decoder %s: %d threads' hidden states differ from 1 thread's", m->name, threads);
        for (int p = 0; p < PARTS; p++)
            if (!same_kv(&first_kv[p], &st[p], f.rows, m->dim, p == 2))
                fail("decoder %s: %d threads wrote other K/V than 1 thread", m->name, threads);
    }
    for (int p = 0; p < PARTS; p++) free_kv(&f.start[p]), free_kv(&st[p]), free_kv(&first_kv[p]);
    while (f.n_owned) free(f.owned[--f.n_owned]);
    free(x), free(first);
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
