/* fp32 linear on CPU over weights in a blocked layout (kernels/cpu_linear.py packs and tests it).
 *
 * Layout: W [N, K] row-major becomes Wb [ceil(N / 16)][K][16]: for each block of 16 output rows,
 * the 16 weights of every input column k are adjacent (rows past N are zero). A decode step reads
 * each weight once as one 64-byte line per k and multiplies it by x[r, k] broadcast, for every row r
 * of the batch: no horizontal sums, R x 16 accumulators in registers, one sequential stream per
 * thread. That is what lets one row run at the machine's read bandwidth (docs/cpu-backend.md, "CPU
 * linears"); torch's MKL GEMV and oneDNN's inner product reached 40-55% of it here.
 *
 * linear_blocked_f32: Y[r, n] = sum_k X[r, k] * W[n, k] (+ bias[n]) for r < R, n < N.
 * Rows are taken 6 at a time (12 vector accumulators: fits AVX2's 16 registers; 12 at a time on
 * AVX-512 targets, one 16-lane accumulator per row of its 32 registers), in row blocks of 48 so a
 * block of X stays in cache while the weight blocks stream by; blocks of 16 outputs are split
 * statically over `nthreads` OpenMP threads. fp32 accumulation in k order per output, so a row's
 * outputs do not depend on the rows it shares a pass with.
 */
#include <stdint.h>
#include <string.h>

#include "edge_runtime_cpu.h" /* v8f, load_v8, store_v8, splat_v8 */

#define BLOCK_N LINEAR_BLOCK_N
#if defined(__AVX512F__)
/* 12 rows a pass: 7-12 rows (decode batches, short prefills in a mixed step) stream each weight
 * line once instead of twice; on the Intel Xeon VM batch-8 decode steps 39-42 -> 31-32 ms and a
 * 20-token prefill over a cached prefix 70-74 -> 61-65 ms (docs/perf.md, "bench step"). */
#define MAX_ROWS 12
#else
#define MAX_ROWS 6
#endif
#define ROW_BLOCK 48
/* Software prefetch 4 KiB ahead in the weight stream, for 3+ rows only: measured on huge pages
 * (docs/cpu-backend.md, "CPU linears"), it helps 5 rows and costs 1-2 rows (-4 to -8% when the
 * machine's bandwidth is high): with one row the hardware prefetcher keeps up on its own. 4 KiB
 * ahead: five-row passes over the model's linears 9.0 ms vs 9.7 ms at 1 KiB (2 and 8 KiB
 * slower) in the high-bandwidth mode, equal in the low one (docs/cpu-backend.md, "CPU linears"). */
#define PREFETCH_FLOATS 1024
/* Its locality hint. NTA (0) is what the AMD EPYC (Zen 4) VM was tuned with; on an Intel Xeon
 * VM NTA-prefetched weight lines cost the batch-5 step 33 ms against 27 ms
 * with T0 (3), batch 1 unchanged (`bench step --batch 1,5 --prompt-tokens 512`, alternated,
 * docs/cpu-backend.md "CPU linears"); no prefetch at all: 33-34 ms. */
#if defined(__znver1__) || defined(__znver2__) || defined(__znver3__) || defined(__znver4__) || \
    defined(__znver5__)
#define PREFETCH_LOCALITY 0
#else
#define PREFETCH_LOCALITY 3
#endif
#define PREFETCH_WEIGHTS(p) __builtin_prefetch((p), 0, PREFETCH_LOCALITY)

#if defined(__AVX512F__)
/* A block's 16 weights of one k as one 16-lane vector: the same multiply-adds in the same order
 * as the 8-lane kernel below (bit-identical), with half the instructions per weight line (one load
 * and R multiply-adds with the x[r, k] broadcast folded in). Zen 4 runs a 16-lane FMA as two
 * 8-lane halves, so the arithmetic rate is unchanged; but with fewer instructions in flight per
 * line, more lines fit in the out-of-order window: five rows over the model's linears 12.5-12.9 ->
 * 11.3-11.5 ms in the VM's high-bandwidth mode, equal or better in the low one (docs/perf.md,
 * "CPU linears"). */
typedef float v16f __attribute__((vector_size(64), aligned(4), may_alias));
#define DEFINE_KERNEL(RB)                                                                          \
    static void kernel_##RB(const float *wb, int64_t K, const float *X, int64_t ldx, float *Y,     \
                            int64_t ldy, int ncols, const float *bias) {                           \
        v16f acc[RB];                                                                              \
        for (int r = 0; r < RB; r++) acc[r] = (v16f){0};                                           \
        for (int64_t k = 0; k < K; k++) {                                                          \
            if (RB >= 3) PREFETCH_WEIGHTS(wb + k * BLOCK_N + PREFETCH_FLOATS);                     \
            const v16f w = *(const v16f *)(wb + k * BLOCK_N);                                      \
            for (int r = 0; r < RB; r++) acc[r] += w * X[r * ldx + k];                             \
        }                                                                                          \
        for (int r = 0; r < RB; r++) {                                                             \
            float out[BLOCK_N];                                                                    \
            *(v16f *)out = acc[r];                                                                 \
            if (bias)                                                                              \
                for (int j = 0; j < ncols; j++) out[j] += bias[j];                                 \
            memcpy(Y + r * ldy, out, sizeof(float) * ncols);                                       \
        }                                                                                          \
    }
#else
#define DEFINE_KERNEL(RB)                                                                          \
    static void kernel_##RB(const float *wb, int64_t K, const float *X, int64_t ldx, float *Y,     \
                            int64_t ldy, int ncols, const float *bias) {                           \
        v8f acc[RB][2];                                                                            \
        for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = (v8f){0};                             \
        for (int64_t k = 0; k < K; k++) {                                                          \
            if (RB >= 3) PREFETCH_WEIGHTS(wb + k * BLOCK_N + PREFETCH_FLOATS);                     \
            const v8f w0 = load_v8(wb + k * BLOCK_N), w1 = load_v8(wb + k * BLOCK_N + 8);          \
            for (int r = 0; r < RB; r++) {                                                         \
                float x = X[r * ldx + k];                                                          \
                const v8f xb = splat_v8(x);                                                        \
                acc[r][0] += w0 * xb;                                                              \
                acc[r][1] += w1 * xb;                                                              \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < RB; r++) {                                                             \
            float out[BLOCK_N];                                                                    \
            store_v8(out, acc[r][0]);                                                              \
            store_v8(out + 8, acc[r][1]);                                                          \
            if (bias)                                                                              \
                for (int j = 0; j < ncols; j++) out[j] += bias[j];                                 \
            memcpy(Y + r * ldy, out, sizeof(float) * ncols);                                       \
        }                                                                                          \
    }

#endif

DEFINE_KERNEL(1)
DEFINE_KERNEL(2)
DEFINE_KERNEL(3)
DEFINE_KERNEL(4)
DEFINE_KERNEL(5)
DEFINE_KERNEL(6)
#if MAX_ROWS == 12
DEFINE_KERNEL(7)
DEFINE_KERNEL(8)
DEFINE_KERNEL(9)
DEFINE_KERNEL(10)
DEFINE_KERNEL(11)
DEFINE_KERNEL(12)
#endif

typedef void (*kernel_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t, int,
                          const float *);
static const kernel_fn KERNELS[MAX_ROWS + 1] = {0,        kernel_1, kernel_2, kernel_3,
                                                kernel_4, kernel_5, kernel_6,
#if MAX_ROWS == 12
                                                kernel_7, kernel_8, kernel_9, kernel_10,
                                                kernel_11, kernel_12
#endif
};

void linear_blocks_f32(const float *Wb, const float *bias, const float *X, int64_t ldx, float *Y,
                       int64_t ldy, int64_t N, int64_t K, int64_t R, int64_t b0, int64_t b1) {
    for (int64_t r0 = 0; r0 < R; r0 += ROW_BLOCK) {
        const int64_t r1 = r0 + ROW_BLOCK < R ? r0 + ROW_BLOCK : R;
        for (int64_t b = b0; b < b1; b++) {
            const float *wb = Wb + b * K * BLOCK_N;
            const int ncols = (int)(N - b * BLOCK_N < BLOCK_N ? N - b * BLOCK_N : BLOCK_N);
            const float *bb = bias ? bias + b * BLOCK_N : 0;
            for (int64_t r = r0; r < r1; r += MAX_ROWS) {
                const int rb = (int)(r1 - r < MAX_ROWS ? r1 - r : MAX_ROWS);
                KERNELS[rb](wb, K, X + r * ldx, ldx, Y + r * ldy + b * BLOCK_N, ldy, ncols, bb);
            }
        }
    }
}

/* Wb: [ceil(N/16)][K][16]; X: [R, K] with rows ldx floats apart; Y: [R, N] with rows ldy apart;
 * bias: [N] or NULL. Each thread computes a contiguous span of the output blocks for every row
 * (span_of). Returns 0, or -1 on a bad argument. */
int linear_blocked_f32(const float *Wb, const float *bias, const float *X, int64_t ldx, float *Y,
                       int64_t ldy, int64_t N, int64_t K, int64_t R, int nthreads) {
    if (N <= 0 || K <= 0 || R < 0 || ldx < K || ldy < N) return -1;
    const int64_t nb = (N + BLOCK_N - 1) / BLOCK_N;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int64_t b0, b1;
        span_of(nb, team_thread(), team_size(), &b0, &b1);
        linear_blocks_f32(Wb, bias, X, ldx, Y, ldy, N, K, R, b0, b1);
    }
    return 0;
}
