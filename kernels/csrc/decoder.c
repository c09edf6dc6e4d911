/* The whole decoder stack of a Llama-architecture model for one decode step, in C
 * (kernels/cpu_decoder.py builds the arguments; its reference is the model's own layer loop,
 * edge_runtime/model/llama.py, which tests compare it to).
 *
 * Why: with the linears at the machine's read bandwidth (linear_f32.c), the ~30 small torch ops
 * per layer (norms, rope, the KV write, attention, silu, residual adds) and the Python around them
 * cost as much as the weights' reads at batch 1 (docs/perf.md, "CPU decode step"). Here a step
 * is one call: per layer RMSNorm -> fused q/k/v -> rope -> int8 KV write -> decode attention over
 * the flat rows (flat_kv.c; fp16 rows for a recent-key window) -> o_proj + residual -> RMSNorm -> fused gate/up -> silu * up ->
 * down_proj + residual. Every row is one decode token (one query per sequence). With
 * `rotate_kv`, q, k and v heads are Hadamard-rotated after rope and the attention output rotated
 * back, as engine/paged_kv.py does around its attention for rotated (int8) stores.
 *
 * Math: fp32 throughout, the same formulas as the torch path (rms_norm: x * rsqrt(mean(x^2) + eps)
 * * w; rope in the rotate-half form; silu(g) = g * sigmoid(g)); sums run in another order, so the
 * results agree to rounding, not bit for bit. The KV write is bit-exact with quantize_int8.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "edge_runtime_cpu.h"

typedef struct {
    const float *input_norm, *post_norm;  /* [hidden] */
    const float *qkv_w, *qkv_b;           /* blocked [(H + 2 Hkv) D] x hidden; bias or NULL */
    const float *o_w, *o_b;               /* blocked [hidden] x H D */
    const float *gate_up_w, *gate_up_b;   /* blocked [2 I] x hidden (gate rows, then up rows) */
    const float *down_w, *down_b;         /* blocked [hidden] x I */
} layer_weights;

typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate;
    float eps;
    int64_t rotate_kv; /* the KV store holds Hadamard-rotated heads (kernels/hadamard.py) */
} decoder_dims;

typedef struct {               /* the new tokens' K/V that go to one store (pool, arena, window) */
    int8_t *k, *v;             /* int8 rows, or fp16 bits when ks == NULL (the recent-key window) */
    uint16_t *ks, *vs;
    const int64_t *tokens;     /* [n]: which rows of the batch */
    const int64_t *rows;       /* [n, Hkv]: their layer-0 row numbers in the store */
    int64_t n, layer_stride;   /* layer l's rows = layer 0's + l * layer_stride */
} kv_write;

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

/* Per-phase timers, built in with EDGE_RUNTIME_CPU_PHASE_TIMES=1 (kernels/cpu_native.py; `bench
 * step --decoder-phases` prints them): per thread and phase of a layer, the time until the thread
 * reached the phase's closing barrier ("work") and until it left it ("all": work + waiting for the
 * slowest thread), summed over layers and calls until read. Each thread writes its own row. */
#ifdef EDGE_RUNTIME_PHASE_TIMES
#define TIMED_THREADS 16
#define PHASES 6 /* norm + q/k/v, rope + KV writes, attention, o_proj + add, gate/up + silu, down + add */
static double phase_work[TIMED_THREADS][PHASES], phase_all[TIMED_THREADS][PHASES];
/* out: [threads][2][PHASES] (work, then all), seconds; the timers restart from zero. Returns the
 * number of phases. */
int decoder_phase_times(double *out, int threads) {
    for (int t = 0; t < threads && t < TIMED_THREADS; t++)
        for (int i = 0; i < PHASES; i++) {
            out[(t * 2) * PHASES + i] = phase_work[t][i];
            out[(t * 2 + 1) * PHASES + i] = phase_all[t][i];
            phase_work[t][i] = phase_all[t][i] = 0.0;
        }
    return PHASES;
}
#define PHASE_START double phase_t0_ = omp_get_wtime()
#define PHASE_WORK(i) if (t < TIMED_THREADS) phase_work[t][i] += omp_get_wtime() - phase_t0_
#define PHASE_ALL(i)                                                                               \
    if (t < TIMED_THREADS) {                                                                       \
        const double now_ = omp_get_wtime();                                                       \
        phase_all[t][i] += now_ - phase_t0_;                                                       \
        phase_t0_ = now_;                                                                          \
    }
#else
#define PHASE_START
#define PHASE_WORK(i)
#define PHASE_ALL(i)
#endif
/* the barrier that closes phase i */
#define END_PHASE(i)                                                                               \
    PHASE_WORK(i);                                                                                 \
    _Pragma("omp barrier") PHASE_ALL(i)

#define MAX_PARTS 8
#define BN LINEAR_BLOCK_N

/* x: [R, hidden] residual stream, in/out. cos, sin: [R, D]. parts: the decode rows' keys (layer
 * l's rows are at l * part_strides[p] past layer 0's). work: R * (hidden + qkv + H D + 3 I) +
 * nthreads * R * hidden floats; attn_scratch: min(nthreads, R * Hkv) * scratch_stride floats
 * (flat_kv.c). Returns 0, or what a kernel refuses, checked before any work (-1 a key-less row or
 * a bad shape, -2 head_dim too large).
 *
 * The whole step is one OpenMP region, and each phase splits its work over the team in the same
 * contiguous spans every layer (span_of; the attention tasks by decode_attention_span, balanced by
 * key counts): a thread computes the same output columns of each
 * linear, adds them into the residual stream itself, runs the silu*up of the gate/up columns it
 * computed, rotates back the attention heads it computed, and normalizes the whole residual into
 * its own copy of the linears' input (the norm is cheap; the copy saves the other thread reading
 * it across the chiplets). Data crosses between threads only where a phase needs all of the
 * previous one's columns (each linear's input, attention's q/k/v rows), and a layer has six
 * barriers instead of ~14 fork/join and loop barriers of a region per kernel. With the VM's two
 * vCPUs on two chiplets each crossing costs ~170 ns per line (tools/vcpu_probe.c; docs/perf.md,
 * "Ninth session"). The results are bit-identical to a region per kernel: each output is computed
 * by the same code on the same inputs, whichever thread computes it. */
int decode_layers(const decoder_dims *dm, const layer_weights *lw, float *x, int64_t R,
                  const float *cos, const float *sin, const kv_write *writes, int num_writes,
                  flat_part *parts, const int64_t *part_strides, int num_parts, float sm_scale,
                  float *work, float *attn_scratch, int64_t scratch_stride, int nthreads) {
    const int64_t Hd = dm->hidden, H = dm->num_heads, Hkv = dm->num_kv_heads, D = dm->head_dim;
    const int64_t I = dm->intermediate, QKV = (H + 2 * Hkv) * D;
    if (Hd <= 0 || H <= 0 || Hkv <= 0 || D <= 0 || I <= 0 || R < 0 || num_parts > MAX_PARTS)
        return -1;
    int rc = decode_attention_check(parts, num_parts, (int)R, (int)D);
    if (rc) return rc;
    float *y = work;               /* [R, hidden]: o_proj's and down_proj's output */
    float *qkv = y + R * Hd;       /* [R, QKV] */
    float *attn = qkv + R * QKV;   /* [R, H D] */
    float *gu = attn + R * H * D;  /* [R, 2 I] */
    float *act = gu + R * 2 * I;   /* [R, I] */
    float *norms = act + R * I;    /* nthreads x [R, hidden]: each thread's normed input */
    const int64_t G = H / Hkv, tasks = R * Hkv;
    /* gate block j and up block j cover the same columns when I is a multiple of the block, so a
     * thread can compute both and then silu*up of those columns with no barrier between */
    const int paired = I % BN == 0;
    const int64_t qkv_blocks = (QKV + BN - 1) / BN, hd_blocks = (Hd + BN - 1) / BN;
    const int64_t gu_blocks = (2 * I + BN - 1) / BN, gate_blocks = I / BN;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        const int t = team_thread(), T = team_size();
        float *h = norms + (int64_t)t * R * Hd;
        flat_part own[MAX_PARTS]; /* layer offsets set per layer, per thread */
        memcpy(own, parts, sizeof(flat_part) * (size_t)num_parts);
        /* rows for rope / rotation / KV writes: split from 3 rows on (fewer: thread 0 does all) */
        int64_t r0 = 0, r1 = t == 0 ? R : 0;
        if (R >= 3) span_of(R, t, T, &r0, &r1);
        int64_t qb0, qb1, hb0, hb1, a0, a1;
        span_of(qkv_blocks, t, T, &qb0, &qb1);
        span_of(hd_blocks, t, T, &hb0, &hb1);
        const int64_t hc0 = hb0 * BN, hc1 = hb1 * BN < Hd ? hb1 * BN : Hd;
        const int team = (int)(T < tasks ? T : tasks);
        a0 = a1 = 0;
        if (t < team) decode_attention_span(parts, num_parts, (int)R, (int)Hkv, t, team, &a0, &a1);
        PHASE_START;
        for (int64_t l = 0; l < dm->num_layers; l++) {
            const layer_weights *w = lw + l;
            rms_norm(x, w->input_norm, h, R, Hd, dm->eps);
            linear_blocks_f32(w->qkv_w, w->qkv_b, h, Hd, qkv, QKV, QKV, Hd, R, qb0, qb1);
            END_PHASE(0);
            for (int64_t r = r0; r < r1; r++) { /* q heads then k heads are adjacent: one pass */
                rope(qkv + r * QKV, H + Hkv, D, cos + r * D, sin + r * D);
                if (dm->rotate_kv) hadamard_rotate(qkv + r * QKV, H + 2 * Hkv, D); /* q, k, v */
            }
            for (int s = 0; s < num_writes; s++) { /* the KV writes of this thread's rows */
                const kv_write *kw = writes + s;
                for (int64_t i = 0; i < kw->n; i++) {
                    const int64_t tok = kw->tokens[i];
                    if (tok < r0 || tok >= r1) continue;
                    const float *row = qkv + tok * QKV;
                    if (kw->ks)
                        write_kv_int8(row + H * D, row + (H + Hkv) * D, QKV, QKV, 1, (int)Hkv,
                                      (int)D, kw->rows + i * Hkv, l * kw->layer_stride, kw->k,
                                      kw->v, kw->ks, kw->vs);
                    else
                        write_kv_f16(row + H * D, row + (H + Hkv) * D, QKV, QKV, 1, (int)Hkv,
                                     (int)D, kw->rows + i * Hkv, l * kw->layer_stride,
                                     (uint16_t *)kw->k, (uint16_t *)kw->v);
                }
            }
            END_PHASE(1);
            for (int p = 0; p < num_parts; p++) own[p].layer_offset = l * part_strides[p];
            if (t < team) {
                decode_attention_share(qkv, own, num_parts, (int)H, (int)Hkv, (int)D, QKV, sm_scale,
                                       attn, attn_scratch + (int64_t)t * scratch_stride, a0, a1);
                if (dm->rotate_kv) /* back from the rotated basis: the heads this thread wrote */
                    for (int64_t i = a0; i < a1; i++)
                        hadamard_rotate(attn + (i / Hkv) * H * D + (i % Hkv) * G * D, G, D);
            }
            END_PHASE(2);
            linear_blocks_f32(w->o_w, w->o_b, attn, H * D, y, Hd, Hd, H * D, R, hb0, hb1);
            add_columns(x, y, R, Hd, hc0, hc1);
            END_PHASE(3);
            rms_norm(x, w->post_norm, h, R, Hd, dm->eps);
            if (paired) {
                int64_t g0, g1;
                span_of(gate_blocks, t, T, &g0, &g1);
                linear_blocks_f32(w->gate_up_w, w->gate_up_b, h, Hd, gu, 2 * I, 2 * I, Hd, R, g0, g1);
                linear_blocks_f32(w->gate_up_w, w->gate_up_b, h, Hd, gu, 2 * I, 2 * I, Hd, R,
                                  gate_blocks + g0, gate_blocks + g1);
                silu_mul(gu, act, R, I, g0 * BN, g1 * BN);
            } else {
                int64_t g0, g1, c0, c1;
                span_of(gu_blocks, t, T, &g0, &g1);
                linear_blocks_f32(w->gate_up_w, w->gate_up_b, h, Hd, gu, 2 * I, 2 * I, Hd, R, g0, g1);
                END_PHASE(4);
                span_of(I, t, T, &c0, &c1);
                silu_mul(gu, act, R, I, c0, c1);
            }
            END_PHASE(4);
            linear_blocks_f32(w->down_w, w->down_b, act, I, y, Hd, Hd, I, R, hb0, hb1);
            add_columns(x, y, R, Hd, hc0, hc1);
            END_PHASE(5);
        }
    }
    return 0;
}
