/* The harness's driver: records, self-check failures, inputs; runs every case group.
 * Usage: harness OUTPUT_FILE. Exit 0 when every self-check passed (the records are compared by
 * the test), 1 otherwise. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static FILE *out;
static int failures;

void record(const char *name, enum record_kind kind, float tol, float tol2, const void *data,
            int64_t nbytes) {
    /* name (64 bytes, NUL-padded), kind, tol, tol2 (int32, float, float), nbytes, the bytes */
    char padded[64] = {0};
    strncpy(padded, name, sizeof padded - 1);
    int32_t k = (int32_t)kind;
    if (fwrite(padded, 1, sizeof padded, out) != sizeof padded || fwrite(&k, 4, 1, out) != 1 ||
        fwrite(&tol, 4, 1, out) != 1 || fwrite(&tol2, 4, 1, out) != 1 ||
        fwrite(&nbytes, 8, 1, out) != 1 || fwrite(data, 1, (size_t)nbytes, out) != (size_t)nbytes) {
        fprintf(stderr, "harness: cannot write the record %s\n", name);
        exit(2);
    }
}

void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "harness: FAILED: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    failures++;
}

uint64_t next_u64(rng *g) {
    uint64_t z = (g->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float uniform(rng *g) { return (float)(next_u64(g) >> 40) * (1.0f / 16777216.0f); }

float normal(rng *g) {
    double s = 0.0; /* exact: 12 multiples of 2^-24 below 1 */
    for (int i = 0; i < 12; i++) s += (double)uniform(g);
    return (float)(s - 6.0);
}

void fill_normal(rng *g, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = normal(g) * scale;
}

void *xcalloc(int64_t count, int64_t size) {
    void *p = calloc((size_t)(count > 0 ? count : 1), (size_t)size);
    if (!p) {
        fprintf(stderr, "harness: out of memory\n");
        exit(2);
    }
    return p;
}

#if defined(__FLT16_MANT_DIG__) /* the compiler's own conversion (fcvt on Arm) */
uint16_t f16_bits(float x) {
    _Float16 h = (_Float16)x;
    uint16_t b;
    memcpy(&b, &h, sizeof b);
    return b;
}
#else /* round to nearest even on the integer mantissa */
uint16_t f16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const int32_t e = (int32_t)((u >> 23) & 0xffu) - 127;
    uint32_t m = u & 0x7fffffu;
    if (e == 128) return sign | 0x7c00u | (m ? 0x200u : 0u);
    if (e > 15) return sign | 0x7c00u;
    if (e < -25) return sign;
    m |= 0x800000u;                                   /* 24-bit significand */
    const int shift = e >= -14 ? 13 : 13 + (-14 - e); /* bits dropped */
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) q++;
    if (e >= -14) return sign | (uint16_t)((((uint32_t)(e + 15)) << 10) + (q - 0x400u));
    return sign | (uint16_t)q; /* subnormal; a carry into 0x400 is the smallest normal */
}
#endif

float f16_value(uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0 ? (float)m * (1.0f / 16777216.0f)
              : e == 31 ? (m ? __builtin_nanf("") : __builtin_inff())
                        : (float)(1024 + m) * __builtin_ldexpf(1.0f, e - 25);
    return (h & 0x8000) ? -v : v;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTPUT_FILE\n", argv[0]);
        return 2;
    }
    out = fopen(argv[1], "wb");
    if (!out) {
        perror(argv[1]);
        return 2;
    }
    cases_write_kv();
    cases_attention();
    cases_spans();
    cases_linear();
    cases_linear_q();
    cases_argmax();
    cases_read_ahead();
    cases_decoder();
    if (fclose(out) != 0) {
        perror(argv[1]);
        return 2;
    }
    if (failures) fprintf(stderr, "harness: %d self-checks failed\n", failures);
    return failures ? 1 : 0;
}
