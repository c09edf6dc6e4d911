/* The whole decoder stack of a Llama-architecture model for one decode step, in C
 * (kernels/cpu_decoder.py builds the arguments; its reference is the model's own layer loop,
 * edge_runtime/model/llama.py, which tests compare it to).
 *
 * Why: with the linears at the machine's read bandwidth (linear_f32.c), the ~30 small torch ops
 * per layer (norms, rope, the KV write, attention, silu, residual adds) and the Python around them
 * cost as much as the weights' reads at batch 1 (docs/perf.md, "CPU decode step"). Here a step
 * is one call: per layer RMSNorm -> fused q/k/v -> (Qwen3: RMSNorm of each q and k head)
 * -> rope -> int8 KV write -> decode attention over
 * the flat rows (flat_kv.c; fp16 rows for a recent-key window) -> o_proj + residual -> RMSNorm -> fused gate/up -> silu * up ->
 * down_proj + residual. Every row is one query token: a decode token, or a token of a prefill
 * chunk (whose keys the attention parts list like a decode token's at its position). With
 * `rotate_kv`, q, k and v heads are Hadamard-rotated after rope and the attention output rotated
 * back, as kv/paged_context.py does around its attention for rotated (int8) stores.
 *
 * Math: fp32 throughout, the same formulas as the torch path (rms_norm: x * rsqrt(mean(x^2) + eps)
 * * w; rope in the rotate-half form; silu(g) = g * sigmoid(g)); sums run in another order, so the
 * results agree to rounding, not bit for bit. The KV write is bit-exact with quantize_int8.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "decoder_ops.h"
#include "edge_runtime_cpu.h"

typedef struct {
    const float *input_norm, *post_norm;  /* [hidden] */
    /* blocked weights, fp32 or quantized (edge_runtime_cpu.h, blocked_weight); biases or NULL */
    blocked_weight qkv_w;     const float *qkv_b;     /* [(H + 2 Hkv) D] x hidden */
    blocked_weight o_w;       const float *o_b;       /* [hidden] x H D */
    blocked_weight gate_up_w; const float *gate_up_b; /* [2 I] x hidden (gate rows, then up rows) */
    blocked_weight down_w;    const float *down_b;    /* [hidden] x I */
    const float *q_norm, *k_norm; /* [D]: RMSNorm of each q / k head before rope (Qwen3), or NULL */
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
    const float *kmean;        /* [layers, Hkv, D] mean keys of a centred-key int8 store, or NULL */
} kv_write;

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

typedef struct { /* what every thread of a step reads: shapes, inputs and the shared buffers */
    const decoder_dims *dm;
    float *x;                       /* [R, hidden] residual stream */
    int64_t R, Hd, H, Hkv, D, I, QKV, G;
    const float *cos, *sin;         /* [R, D] */
    const kv_write *writes;
    int num_writes, num_parts;
    const flat_part *parts;         /* as given: kmean holds all layers' mean keys (or NULL) */
    const int64_t *part_strides;
    float sm_scale;
    float *y, *qkv, *attn, *gu, *act; /* [R, hidden], [R, QKV], [R, H D], [R, 2 I], [R, I] */
    float *attn_scratch;
    int64_t scratch_stride;
    const layer_weights *lw;        /* [num_layers]: the next blocks read_ahead_plan asks for */
    int paired;                     /* gate block j and up block j cover the same columns */
} step_plan;

typedef struct { /* one thread's share of every phase, the same each layer */
    int t;
    float *h;                       /* [R, hidden]: its copy of the normed residual */
    int64_t r0, r1;                 /* rows of rope / rotation / KV writes */
    int64_t a0, a1;                 /* attention tasks */
    int64_t key_visits;             /* their keys, times two passes: read_ahead_plan's pace */
    int64_t qb0, qb1, hb0, hb1;     /* output blocks of q/k/v, of o_proj and down_proj */
    int64_t hc0, hc1;               /* the residual's columns those blocks cover */
    int64_t g0, g1, c0, c1;         /* gate (paired) or gate/up blocks; silu columns (unpaired) */
    flat_part own[MAX_PARTS];       /* the key parts, with this thread's layer offsets */
} thread_share;

static void share_of(const step_plan *p, const flat_part *parts, float *norms, int t, int T,
                     thread_share *s) {
    const int64_t tasks = p->R * p->Hkv, team = T < tasks ? T : tasks;
    s->t = t;
    s->h = norms + (int64_t)t * p->R * p->Hd;
    memcpy(s->own, parts, sizeof(flat_part) * (size_t)p->num_parts);
    s->r0 = 0; /* from 3 rows on split over the threads; fewer: thread 0 does all */
    s->r1 = t == 0 ? p->R : 0;
    if (p->R >= 3) span_of(p->R, t, T, &s->r0, &s->r1);
    s->a0 = s->a1 = 0;
    if (t < team)
        decode_attention_span(parts, p->num_parts, (int)p->R, (int)p->Hkv, t, (int)team, &s->a0,
                              &s->a1);
    s->key_visits = 2 * decode_attention_keys(parts, p->num_parts, (int)p->Hkv, s->a0, s->a1);
    span_of((p->QKV + BN - 1) / BN, t, T, &s->qb0, &s->qb1);
    span_of((p->Hd + BN - 1) / BN, t, T, &s->hb0, &s->hb1);
    s->hc0 = s->hb0 * BN;
    s->hc1 = s->hb1 * BN < p->Hd ? s->hb1 * BN : p->Hd;
    span_of(p->paired ? p->I / BN : (2 * p->I + BN - 1) / BN, t, T, &s->g0, &s->g1);
    span_of(p->I, t, T, &s->c0, &s->c1);
}

/* RMSNorm of the residual into the thread's own copy, then its q/k/v blocks */
static void qkv_phase(const step_plan *p, const thread_share *s, const layer_weights *w) {
    rms_norm(p->x, w->input_norm, s->h, p->R, p->Hd, p->dm->eps);
    linear_blocks(&w->qkv_w, w->qkv_b, s->h, p->Hd, p->qkv, p->QKV, p->QKV, p->Hd, p->R,
                      s->qb0, s->qb1);
}

/* the q/k head norms, rope (and the Hadamard rotation) of the thread's rows, and their KV writes */
static void rope_kv_phase(const step_plan *p, const thread_share *s, const layer_weights *w,
                          int64_t l) {
    const int64_t H = p->H, Hkv = p->Hkv, D = p->D, QKV = p->QKV;
    for (int64_t r = s->r0; r < s->r1; r++) { /* q heads then k heads are adjacent: one pass */
        float *row = p->qkv + r * QKV;
        if (w->q_norm) rms_norm(row, w->q_norm, row, H, D, p->dm->eps); /* in place, per head */
        if (w->k_norm) rms_norm(row + H * D, w->k_norm, row + H * D, Hkv, D, p->dm->eps);
        rope(row, H + Hkv, D, p->cos + r * D, p->sin + r * D);
        if (p->dm->rotate_kv) hadamard_rotate(p->qkv + r * QKV, H + 2 * Hkv, D); /* q, k, v */
    }
    for (int w = 0; w < p->num_writes; w++) {
        const kv_write *kw = p->writes + w;
        for (int64_t i = 0; i < kw->n; i++) {
            const int64_t tok = kw->tokens[i];
            if (tok < s->r0 || tok >= s->r1) continue;
            const float *row = p->qkv + tok * QKV;
            if (kw->ks)
                write_kv_int8(row + H * D, row + (H + Hkv) * D, QKV, QKV, 1, (int)Hkv, (int)D,
                              kw->rows + i * Hkv, l * kw->layer_stride, kw->k, kw->v, kw->ks,
                              kw->vs, kw->kmean ? kw->kmean + l * Hkv * D : NULL);
            else
                write_kv_f16(row + H * D, row + (H + Hkv) * D, QKV, QKV, 1, (int)Hkv, (int)D,
                             kw->rows + i * Hkv, l * kw->layer_stride, (uint16_t *)kw->k,
                             (uint16_t *)kw->v);
        }
    }
}

/* Read ahead during attention (edge_runtime_cpu.h, read_ahead): the first READ_AHEAD_BYTES of
 * the thread's next weight blocks (its o_proj blocks, gate and up blocks, down_proj blocks: what
 * it reads next, in that order), spread over its key visits at up to READ_AHEAD_MAX_STEP lines
 * per visit. 1 MiB (the size of Zen 4's L2) and 4 lines: alternated in-step phase timings,
 * batch 5 at 512 tokens in the VM's high-bandwidth mode, step 15.7 vs 16.5 ms (medians of 7 runs
 * each: o_proj and gate/up faster, attention ~0.2 ms slower); 2 MiB or 8 lines slowed the
 * attention more than they sped the linears, prefetching into L1 too; the low mode and batch 1
 * unchanged within the spread (docs/cpu-backend.md, "CPU decoder layers"). */
#define READ_AHEAD_BYTES (1 << 20)
#define READ_AHEAD_MAX_STEP 4
/* append output blocks [b0, b1) of a blocked matrix with K inputs */
static void add_blocks(read_ahead *a, const blocked_weight *w, int64_t K, int64_t b0, int64_t b1) {
    weight_block_bytes(w, K, b0, b1, &a->begin[a->n], &a->end[a->n]);
    a->left += (a->end[a->n] - a->begin[a->n] + 63) / 64;
    a->n++;
}

static void read_ahead_plan(const step_plan *p, const thread_share *s, int64_t l, read_ahead *a) {
    const layer_weights *w = p->lw + l;
    a->n = a->i = 0;
    a->left = 0;
    add_blocks(a, &w->o_w, p->H * p->D, s->hb0, s->hb1);
    add_blocks(a, &w->gate_up_w, p->Hd, s->g0, s->g1);
    if (p->paired) add_blocks(a, &w->gate_up_w, p->Hd, p->I / BN + s->g0, p->I / BN + s->g1);
    add_blocks(a, &w->down_w, p->I, s->hb0, s->hb1);
    a->cur = a->begin[0];
    if (a->left > READ_AHEAD_BYTES / 64) a->left = READ_AHEAD_BYTES / 64;
    const int64_t visits = s->key_visits;
    const int64_t per = visits > 0 ? (a->left + visits - 1) / visits : 0;
    a->per_step = (int)(per < READ_AHEAD_MAX_STEP ? per : READ_AHEAD_MAX_STEP);
}

/* For tests: walk a read_ahead over n ranges (begin/end byte addresses; nothing is read, a
 * prefetch cannot fault) with `per_step` and `left`, for `steps` steps; lines[i] = how many lines
 * step i asked for; returns the total. */
int64_t read_ahead_walk(const char *const *begin, const char *const *end, int n, int per_step,
                        int64_t left, int steps, int *lines) {
    if (n < 1 || n > READ_AHEAD_RANGES) return -1;
    read_ahead a = {.n = n, .i = 0, .cur = begin[0], .per_step = per_step, .left = left};
    for (int i = 0; i < n; i++) a.begin[i] = begin[i], a.end[i] = end[i];
    int64_t total = 0;
    for (int i = 0; i < steps; i++) total += lines[i] = read_ahead_step(&a);
    return total;
}

/* the thread's attention tasks, and the rotation back of the heads they wrote */
static void attention_phase(const step_plan *p, thread_share *s, int64_t l) {
    for (int i = 0; i < p->num_parts; i++) { /* parts[i].kmean: all layers' means, or NULL */
        s->own[i].layer_offset = l * p->part_strides[i];
        s->own[i].kmean = p->parts[i].kmean ? p->parts[i].kmean + l * p->Hkv * p->D : NULL;
    }
    if (s->a1 <= s->a0) return;
    read_ahead ahead;
    read_ahead_plan(p, s, l, &ahead);
    decode_attention_share(p->qkv, s->own, p->num_parts, (int)p->H, (int)p->Hkv, (int)p->D, p->QKV,
                           p->sm_scale, p->attn, p->attn_scratch + (int64_t)s->t * p->scratch_stride,
                           s->a0, s->a1, &ahead);
    if (p->dm->rotate_kv) /* back from the rotated basis */
        for (int64_t i = s->a0; i < s->a1; i++)
            hadamard_rotate(p->attn + (i / p->Hkv) * p->H * p->D + (i % p->Hkv) * p->G * p->D,
                            p->G, p->D);
}

/* the thread's o_proj or down_proj blocks (weights w, bias b, input X of width K), added into
 * the residual's columns they cover */
static void out_proj_phase(const step_plan *p, const thread_share *s, const blocked_weight *w,
                           const float *b, const float *X, int64_t K) {
    linear_blocks(w, b, X, K, p->y, p->Hd, p->Hd, K, p->R, s->hb0, s->hb1);
    add_columns(p->x, p->y, p->R, p->Hd, s->hc0, s->hc1);
}

/* RMSNorm into the thread's copy, then its gate/up blocks; paired: gate blocks [g0, g1) and the
 * up blocks of the same columns, then silu * up of those columns */
static void gate_up_phase(const step_plan *p, const thread_share *s, const layer_weights *w) {
    const int64_t I = p->I;
    rms_norm(p->x, w->post_norm, s->h, p->R, p->Hd, p->dm->eps);
    linear_blocks(&w->gate_up_w, w->gate_up_b, s->h, p->Hd, p->gu, 2 * I, 2 * I, p->Hd, p->R,
                  s->g0, s->g1);
    if (!p->paired) return;
    linear_blocks(&w->gate_up_w, w->gate_up_b, s->h, p->Hd, p->gu, 2 * I, 2 * I, p->Hd, p->R,
                  I / BN + s->g0, I / BN + s->g1);
    silu_mul(p->gu, p->act, p->R, I, s->g0 * BN, s->g1 * BN);
}

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
 * "Machines" and "CPU decoder layers"). The results are bit-identical to a region per kernel: each output is computed
 * by the same code on the same inputs, whichever thread computes it. */
int decode_layers(const decoder_dims *dm, const layer_weights *lw, float *x, int64_t R,
                  const float *cos, const float *sin, const kv_write *writes, int num_writes,
                  flat_part *parts, const int64_t *part_strides, int num_parts, float sm_scale,
                  float *work, float *attn_scratch, int64_t scratch_stride, int nthreads) {
    const int64_t Hd = dm->hidden, H = dm->num_heads, Hkv = dm->num_kv_heads, D = dm->head_dim;
    const int64_t I = dm->intermediate, QKV = (H + 2 * Hkv) * D;
    if (Hd <= 0 || H <= 0 || Hkv <= 0 || D <= 0 || I <= 0 || R < 0 || num_parts > MAX_PARTS)
        return -1;
    const int rc = decode_attention_check(parts, num_parts, (int)R, (int)D);
    if (rc) return rc;
    step_plan p = {.dm = dm, .x = x, .R = R, .Hd = Hd, .H = H, .Hkv = Hkv, .D = D, .I = I,
                   .QKV = QKV, .G = H / Hkv, .cos = cos, .sin = sin, .writes = writes,
                   .num_writes = num_writes, .num_parts = num_parts, .parts = parts,
                   .part_strides = part_strides,
                   .sm_scale = sm_scale, .attn_scratch = attn_scratch,
                   .scratch_stride = scratch_stride, .paired = I % BN == 0, .lw = lw};
    p.y = work;
    p.qkv = p.y + R * Hd;
    p.attn = p.qkv + R * QKV;
    p.gu = p.attn + R * H * D;
    p.act = p.gu + R * 2 * I;
    float *norms = p.act + R * I; /* nthreads x [R, hidden] */
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        thread_share s;
        share_of(&p, parts, norms, team_thread(), team_size(), &s);
        const int t = s.t; /* for the phase timers */
        PHASE_START;
        for (int64_t l = 0; l < dm->num_layers; l++) {
            const layer_weights *w = lw + l;
            qkv_phase(&p, &s, w);
            END_PHASE(0);
            rope_kv_phase(&p, &s, w, l);
            END_PHASE(1);
            attention_phase(&p, &s, l);
            END_PHASE(2);
            out_proj_phase(&p, &s, &w->o_w, w->o_b, p.attn, H * D);
            END_PHASE(3);
            gate_up_phase(&p, &s, w);
            if (!p.paired) { /* silu * up once every gate/up column is there */
                END_PHASE(4);
                silu_mul(p.gu, p.act, R, I, s.c0, s.c1);
            }
            END_PHASE(4);
            out_proj_phase(&p, &s, &w->down_w, w->down_b, p.act, I);
            END_PHASE(5);
        }
        (void)t;
    }
    return 0;
}
