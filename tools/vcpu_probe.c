/* Where the two vCPUs of this VM sit relative to each other, sampled over time (docs/perf.md,
 * "Machines"): per sample, with one thread pinned to each of CPUs 0 and 1,
 *   - read bandwidth of the two threads together (each sums half of a 512 MiB buffer),
 *   - 8-wide FMAs per second on one thread and on two (independent chains, no memory),
 *   - the one-way time of a cache line between the two threads (a ping-pong on one atomic).
 * On the development VM the samples fall in two groups: ~30-35 GB/s with a ~32 ns line transfer,
 * and ~45-65 GB/s with ~170 ns; FMA rates are the same in both. The second is what two cores on two
 * chiplets (separate L3s and memory links) look like, the first two cores sharing one.
 *
 *   gcc -O2 -march=native -pthread tools/vcpu_probe.c -o /tmp/vcpu_probe && /tmp/vcpu_probe 60
 *
 * x86-64 Linux with AVX2/FMA; argument: samples (default 10), one every ~0.5 s.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { JOB_FMA = 1, JOB_READ = 2, JOB_PINGPONG = 3 };
#define FMA_ITERS 20000000L
#define PINGPONG_ROUNDS 200000L

static float *buffer;
static const size_t buffer_floats = (size_t)128 << 20; /* 512 MiB */
static volatile float sink;
static _Atomic int generation, finished, job;
static _Alignas(64) _Atomic long ball;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin_to(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static float fma_chains(long n) { /* 8 independent chains: the FMA pipes' rate, not latency */
    const __m256 m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(0.0001f);
    __m256 a0 = _mm256_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (long i = 0; i < n; i++) {
        a0 = _mm256_fmadd_ps(a0, m, c), a1 = _mm256_fmadd_ps(a1, m, c);
        a2 = _mm256_fmadd_ps(a2, m, c), a3 = _mm256_fmadd_ps(a3, m, c);
        a4 = _mm256_fmadd_ps(a4, m, c), a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c), a7 = _mm256_fmadd_ps(a7, m, c);
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                   _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    return _mm256_cvtss_f32(s);
}

static float read_half(int half) {
    __m256 s = _mm256_setzero_ps();
    const size_t n = buffer_floats / 2;
    for (size_t i = half * n; i < (half + 1) * n; i += 8) s = _mm256_add_ps(s, _mm256_load_ps(buffer + i));
    return _mm256_cvtss_f32(s);
}

static void ping_pong(int side) { /* side 0 moves the ball from even to odd, side 1 back */
    for (long i = 0; i < PINGPONG_ROUNDS; i++) {
        const long mine = 2 * i + side;
        while (atomic_load(&ball) != mine) _mm_pause();
        atomic_store(&ball, mine + 1);
    }
}

static void run_job(int side, int which) {
    if (which == JOB_FMA) sink = fma_chains(FMA_ITERS);
    else if (which == JOB_READ) sink = read_half(side);
    else ping_pong(side);
}

static void *second_thread(void *unused) {
    (void)unused;
    pin_to(1);
    for (int seen = 0;;) {
        while (atomic_load(&generation) == seen) _mm_pause();
        seen = atomic_load(&generation);
        run_job(1, atomic_load(&job));
        atomic_fetch_add(&finished, 1);
    }
    return NULL;
}

static double both_threads(int which) { /* seconds until both sides finished `which` */
    atomic_store(&finished, 0);
    atomic_store(&ball, 0);
    atomic_store(&job, which);
    const double t0 = now();
    atomic_fetch_add(&generation, 1);
    run_job(0, which);
    while (atomic_load(&finished) < 1) _mm_pause();
    return now() - t0;
}

int main(int argc, char **argv) {
    const int samples = argc > 1 ? atoi(argv[1]) : 10;
    pin_to(0);
    buffer = aligned_alloc(64, buffer_floats * sizeof(float));
    if (!buffer) return 1;
    for (size_t i = 0; i < buffer_floats; i++) buffer[i] = 1.0f;
    pthread_t other;
    pthread_create(&other, NULL, second_thread, NULL);
    for (int s = 0; s < samples; s++) {
        usleep(500000);
        const double read_gbs = buffer_floats * sizeof(float) / both_threads(JOB_READ) / 1e9;
        double t0 = now();
        sink = fma_chains(FMA_ITERS);
        const double fma1 = 8.0 * FMA_ITERS / (now() - t0) / 1e9;
        const double fma2 = 2 * 8.0 * FMA_ITERS / both_threads(JOB_FMA) / 1e9;
        const double line_ns = both_threads(JOB_PINGPONG) / (2.0 * PINGPONG_ROUNDS) * 1e9;
        printf("read (2 threads) %5.1f GB/s | 8-wide FMAs %.2f G/s on 1 thread, %.2f G/s on 2 | "
               "cache line one way %4.0f ns\n", read_gbs, fma1, fma2, line_ns);
        fflush(stdout);
    }
    return 0;
}
