/* The C harness of kernels/csrc's kernel tests, for builds this machine cannot load into Python
 * (the aarch64 cross-build, run under qemu-user; tests/test_kernel_csrc_aarch64.py builds and runs
 * it). It runs the cases of tests/test_kernel_flat_kv_cpu.py, test_kernel_cpu_linear.py,
 * test_kernel_cpu_int4.py, test_kernel_argmax_cpu.py and test_kernel_cpu_decoder.py on inputs it makes itself (the same on
 * every machine: integer-derived values, no libm), and
 *   - checks what it can know alone (bit-exact fp16 rounding against the compiler's _Float16
 *     where the target has it, argmax against a plain scan, spans that cover every task once,
 *     results that do not depend on the thread count or on how many rows share a pass), and
 *   - writes every output as a record; the test compares the aarch64 build's records with the
 *     x86 build's, which the Python kernel tests check against the torch references.
 * Compiled without -ffp-contract=fast or reassociation, so the inputs are the same bits
 * everywhere; kernels/csrc is compiled with the product's own flags. */
#ifndef EDGE_RUNTIME_HARNESS_H
#define EDGE_RUNTIME_HARNESS_H

#include <stdint.h>
#include <stdio.h>

#include "edge_runtime_cpu.h"

/* how the test compares a record of the aarch64 run with the x86 run's */
enum record_kind {
    EXACT = 0,       /* the same bytes */
    F32_CLOSE = 1,   /* fp32: |a - b| <= tol * max|b| + tol2 * |b| */
    I8_WITHIN_ONE = 2, /* int8: at most 1 apart, in under 1e-3 of the entries */
    F16_CLOSE = 3,   /* fp16 bits: |a - b| <= tol * |b| + tol2 * max|b| */
};

void record(const char *name, enum record_kind kind, float tol, float tol2, const void *data,
            int64_t nbytes);

/* a failed self-check: printed, and the run exits non-zero at the end */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* deterministic inputs: splitmix64 */
typedef struct {
    uint64_t s;
} rng;

uint64_t next_u64(rng *g);
float uniform(rng *g);  /* [0, 1), multiples of 2^-24 */
float normal(rng *g);   /* ~N(0, 1): Irwin-Hall of 12 uniforms */
void fill_normal(rng *g, float *x, int64_t n, float scale);
void *xcalloc(int64_t count, int64_t size);
uint16_t f16_bits(float x); /* round to nearest even (the kernel's float_to_half re-derived) */
float f16_value(uint16_t h);

void cases_write_kv(void);
void cases_attention(void);
void cases_spans(void);
void cases_linear(void);
void cases_linear_q(void);
void cases_argmax(void);
void cases_read_ahead(void);
void cases_decoder(void);

/* kernels/csrc entry points without a declaration in edge_runtime_cpu.h */
int64_t read_ahead_walk(const char *const *begin, const char *const *end, int n, int per_step,
                        int64_t left, int steps, int *lines);
int linear_blocked_q(const blocked_weight *wt, const float *bias, const float *X, int64_t ldx,
                     float *Y, int64_t ldy, int64_t N, int64_t K, int64_t R, int nthreads);
int dequant_blocks_q(const blocked_weight *wt, int64_t K, int64_t b0, int64_t b1, float *out,
                     int nthreads);

#endif
