/* linear_f32.c's, argmax.c's and the read-ahead walk's cases: test_kernel_cpu_linear.py (every
 * row count of a pass and across the 48-row blocks, ragged output counts, bias, thread counts),
 * test_kernel_argmax_cpu.py (lengths around the 64-wide blocks, ties, -inf, NaN and strided rows)
 * and test_read_ahead_walks_the_ranges_in_order_and_stops_at_its_budget. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* W [N, K] row-major -> blocked [ceil(N / 16)][K][16], rows past N zero (cpu_linear.py's packing) */
static float *blocked(const float *w, int64_t n, int64_t k) {
    const int64_t nb = (n + LINEAR_BLOCK_N - 1) / LINEAR_BLOCK_N;
    float *wb = xcalloc(nb * k * LINEAR_BLOCK_N, 4);
    for (int64_t o = 0; o < n; o++)
        for (int64_t i = 0; i < k; i++)
            wb[(o / LINEAR_BLOCK_N * k + i) * LINEAR_BLOCK_N + o % LINEAR_BLOCK_N] = w[o * k + i];
    return wb;
}

static void linear_case(int64_t n, int64_t k, int bias) {
    static const int row_counts[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                     16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 31, 32, 37, 47, 48,
                                     49, 50, 100};
    enum { MOST = 100 };
    rng g = {(uint64_t)(n * 131 + k * 7 + bias)};
    float *w = xcalloc(n * k, 4), *b = bias ? xcalloc(n, 4) : NULL;
    fill_normal(&g, w, n * k, 1.0f);
    if (b) fill_normal(&g, b, n, 1.0f);
    float *wb = blocked(w, n, k);
    const int64_t ldx = k + 3; /* strided rows, as a q/k/v split's views */
    float *x = xcalloc(MOST * ldx, 4), *alone = xcalloc(MOST * n, 4), *y = xcalloc(MOST * n, 4);
    fill_normal(&g, x, MOST * ldx, 1.0f);
    for (int r = 0; r < MOST; r++) /* each row alone: what every pass must give it */
        if (linear_blocked_f32(wb, b, x + r * ldx, ldx, alone + r * n, n, n, k, 1, 1))
            fail("linear %lldx%lld: refused one row", (long long)n, (long long)k);
    for (size_t c = 0; c < sizeof row_counts / sizeof row_counts[0]; c++) {
        const int rows = row_counts[c];
        for (int threads = 1; threads <= 2; threads++) {
            memset(y, 0, sizeof(float) * MOST * n);
            if (linear_blocked_f32(wb, b, x, ldx, y, n, n, k, rows, threads))
                fail("linear %lldx%lld: refused %d rows", (long long)n, (long long)k, rows);
            if (memcmp(y, alone, sizeof(float) * rows * n))
                fail("linear %lldx%lld, %d rows, %d threads: not the rows' own results",
                     (long long)n, (long long)k, rows, threads);
        }
    }
    char name[64];
    snprintf(name, sizeof name, "linear/n%lld/k%lld/%s", (long long)n, (long long)k,
             bias ? "bias" : "nobias");
    /* the Python tests: within 1e-5 (1e-4 at K = 80) of F.linear */
    record(name, F32_CLOSE, 1e-6f, 1e-5f, alone, MOST * n * 4);
    float *zero = xcalloc(1, 4);
    if (linear_blocked_f32(wb, b, x, ldx, zero, n, n, k, 0, 2) != 0)
        fail("linear: zero rows refused");
    if (linear_blocked_f32(wb, b, x, k - 1, y, n, n, k, 1, 1) != -1)
        fail("linear: a row stride below K accepted");
    free(zero), free(w), free(b), free(wb), free(x), free(alone), free(y);
}

void cases_linear(void) {
    linear_case(48, 40, 0);
    linear_case(88, 40, 1);  /* three fused parts of 40, 24, 24 */
    linear_case(192, 40, 0);
    linear_case(20, 40, 1);  /* 13 + 7: one full block and a ragged one */
    linear_case(72, 80, 1);
    linear_case(200, 96, 1);
}

/* the first index of the maximum, -1 for a row holding a NaN (argmax.c's contract) */
static int64_t argmax_ref(const float *x, int64_t n) {
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) return -1;
        if (x[i] > x[at]) at = i;
    }
    return at;
}

static void argmax_case(const char *name, const float *x, int64_t rows, int64_t n, int64_t stride) {
    int64_t *got = xcalloc(rows, 8);
    argmax_rows(x, rows, n, stride, got);
    for (int64_t r = 0; r < rows; r++)
        if (got[r] != argmax_ref(x + r * stride, n))
            fail("%s row %lld: %lld, want %lld", name, (long long)r, (long long)got[r],
                 (long long)argmax_ref(x + r * stride, n));
    record(name, EXACT, 0, 0, got, rows * 8);
    free(got);
}

void cases_argmax(void) {
    static const int64_t lengths[] = {1, 7, 63, 64, 65, 200, 49152, 49157};
    for (size_t c = 0; c < sizeof lengths / sizeof lengths[0]; c++) {
        const int64_t n = lengths[c];
        rng g = {(uint64_t)n};
        float *x = xcalloc(6 * n, 4);
        fill_normal(&g, x, 6 * n, 1.0f);
        for (int64_t i = 0; i < n; i++) {
            x[n + i] = (float)((int)(next_u64(&g) % 6) - 3); /* many ties */
            x[2 * n + i] = -__builtin_inff();
            x[5 * n + i] = (float)(int)(normal(&g) * 10.0f) / 10.0f; /* ties inside and across blocks */
        }
        x[3 * n + n - 1] = 100.0f; /* the maximum in the tail after the last whole block */
        x[4 * n] = 100.0f;
        char name[64];
        snprintf(name, sizeof name, "argmax/n%lld", (long long)n);
        argmax_case(name, x, 6, n, n);
        free(x);
    }
    rng g = {1};
    float wide[4 * 300];
    fill_normal(&g, wide, 4 * 300, 1.0f);
    wide[2 * 300 + 17] = __builtin_nanf("");
    wide[3 * 300 + 249] = __builtin_nanf(""); /* in the tail */
    argmax_case("argmax/strided-nan", wide, 4, 250, 300);
}

static void walk_case(const char *name, const char *const *begin, const char *const *end, int n,
                      int per_step, int64_t left, int steps, int64_t want_total, const int *want) {
    int lines[8] = {0};
    const int64_t total = read_ahead_walk(begin, end, n, per_step, left, steps, lines);
    if (total != want_total || memcmp(lines, want, sizeof(int) * (size_t)steps))
        fail("%s: %lld lines (%d %d %d %d %d)", name, (long long)total, lines[0], lines[1],
             lines[2], lines[3], lines[4]);
    record(name, EXACT, 0, 0, lines, 4 * steps);
}

void cases_read_ahead(void) {
    /* ranges of 3, 0 and 2 lines (the empty one is skipped); nothing is read, a prefetch cannot fault */
    static char area[16384];
    const char *b[3] = {area, area + 4096, area + 8192}, *e[3] = {area + 3 * 64, area + 4096,
                                                                  area + 8192 + 100};
    walk_case("read_ahead/to-the-end", b, e, 3, 2, 100, 5, 5, (const int[]){2, 2, 1, 0, 0});
    walk_case("read_ahead/budget", b, e, 3, 2, 3, 5, 3, (const int[]){2, 1, 0, 0, 0});
    walk_case("read_ahead/none", b, e, 3, 0, 100, 3, 0, (const int[]){0, 0, 0});
    walk_case("read_ahead/empty", b, b, 1, 4, 100, 2, 0, (const int[]){0, 0});
}
