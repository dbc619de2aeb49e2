#include "bench_ceiling.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "../kernels/cpu/cpu_isa.h"

/* ---- memory bandwidth ---- */

struct read_arg {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

__attribute__((target("avx512f"))) static uint64_t read512(const uint64_t *p, size_t n)
{
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 8));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 16));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 24));
    }
    /* summed as unsigned: the intrinsic reduction adds signed 64-bit values, which overflow */
    uint64_t lanes[8], sum = 0;
    _mm512_storeu_si512(lanes,
                        _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}

static void *read_loop(void *arg)
{
    struct read_arg *a = arg;
    if (__builtin_cpu_supports("avx512f")) {
        a->sum = read512(a->p, a->n);
        return NULL;
    }
    /* 8 independent sums: the compiler vectorizes it, and it reads every cache line */
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= a->n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a->p[i + (size_t)k];
    a->sum = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    return NULL;
}

static double read_bandwidth(const uint64_t *buf, size_t bytes, int threads)
{
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[64];
        struct read_arg a[64];
        size_t per = bytes / 8 / (size_t)threads;
        double t0 = bench_now_s();
        for (int i = 0; i < threads; i++) {
            a[i] = (struct read_arg){buf + (size_t)i * per, per, 0};
            if (i) pthread_create(&th[i], NULL, read_loop, &a[i]);
        }
        read_loop(&a[0]);
        for (int i = 1; i < threads; i++) pthread_join(th[i], NULL);
        double dt = bench_now_s() - t0;
        uint64_t x = 0;
        for (int i = 0; i < threads; i++) x ^= a[i].sum;
        if (x == 42) printf(" "); /* keeps the sums alive */
        best = fmax(best, (double)(per * 8 * (size_t)threads) / dt / 1e9);
    }
    return best;
}

static double memcpy_bandwidth(uint8_t *buf, size_t bytes)
{
    /* through a volatile pointer: the copy's destination is freed unread, and a plain memcpy
     * into it was removed as a dead store (the report said millions of GB/s) */
    void *(*volatile copy)(void *, const void *, size_t) = memcpy;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = bench_now_s();
        copy(buf + bytes / 2, buf, bytes / 2);
        double dt = bench_now_s() - t0;
        best = fmax(best, (double)(bytes / 2) / dt / 1e9); /* bytes read (as many written) */
    }
    return best;
}

/* ---- compute peak: independent chains of one instruction, no memory ---- */

#define TGT512      __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define PEAK_CHAINS 12 /* more than latency x throughput, so the chains never wait */

struct peak_arg {
    long iters;
    bool fma;
    float sink;
};

TGT512 static void *peak_loop(void *arg)
{
    struct peak_arg *a = arg;
    if (a->fma) {
        __m512 acc[PEAK_CHAINS], m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
        for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm512_set1_ps((float)k);
        for (long i = 0; i < a->iters; i++)
            for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm512_fmadd_ps(acc[k], m, c);
        __m512 t = acc[0];
        for (int k = 1; k < PEAK_CHAINS; k++) t = _mm512_add_ps(t, acc[k]);
        a->sink = _mm512_reduce_add_ps(t);
    } else {
        __m512i acc[PEAK_CHAINS], u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-2);
        for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm512_set1_epi32(k);
        for (long i = 0; i < a->iters; i++)
            for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm512_dpbusd_epi32(acc[k], u, v);
        __m512i t = acc[0];
        for (int k = 1; k < PEAK_CHAINS; k++) t = _mm512_add_epi32(t, acc[k]);
        uint32_t lanes[16], sum = 0; /* unsigned: the chains wrap, as the hardware does */
        _mm512_storeu_si512(lanes, t);
        for (int i = 0; i < 16; i++) sum += lanes[i];
        a->sink = (float)sum;
    }
    return NULL;
}

#define TGT256 __attribute__((target("avx2,fma")))

TGT256 static void *peak_loop_avx2(void *arg)
{
    struct peak_arg *a = arg;
    if (a->fma) {
        __m256 acc[PEAK_CHAINS], m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
        for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm256_set1_ps((float)k);
        for (long i = 0; i < a->iters; i++)
            for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm256_fmadd_ps(acc[k], m, c);
        float lanes[8], sum = 0;
        __m256 t = acc[0];
        for (int k = 1; k < PEAK_CHAINS; k++) t = _mm256_add_ps(t, acc[k]);
        _mm256_storeu_ps(lanes, t);
        for (int i = 0; i < 8; i++) sum += lanes[i];
        a->sink = sum;
    } else {
        /* the chains feed each result back as the signed operand, so none can be hoisted */
        __m256i acc[PEAK_CHAINS], u = _mm256_set1_epi8(3);
        for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm256_set1_epi8((char)k);
        for (long i = 0; i < a->iters; i++)
            for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm256_maddubs_epi16(u, acc[k]);
        __m256i t = acc[0];
        for (int k = 1; k < PEAK_CHAINS; k++) t = _mm256_xor_si256(t, acc[k]);
        uint32_t lanes[8], sum = 0;
        _mm256_storeu_si256((__m256i *)lanes, t);
        for (int i = 0; i < 8; i++) sum += lanes[i];
        a->sink = (float)sum;
    }
    return NULL;
}

#define TGTVNNI __attribute__((target("avx2,avxvnni")))

/* vpdpbusd on 256 bits (AVX-VNNI); the fp32 peak is the AVX2 loop's */
TGTVNNI static void *peak_loop_vnni256(void *arg)
{
    struct peak_arg *a = arg;
    if (a->fma) return peak_loop_avx2(arg);
    __m256i acc[PEAK_CHAINS], u = _mm256_set1_epi8(3), v = _mm256_set1_epi8(-2);
    for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm256_set1_epi32(k);
    for (long i = 0; i < a->iters; i++)
        for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm256_dpbusd_avx_epi32(acc[k], u, v);
    __m256i t = acc[0];
    for (int k = 1; k < PEAK_CHAINS; k++) t = _mm256_add_epi32(t, acc[k]);
    uint32_t lanes[8], sum = 0; /* unsigned: the chains wrap, as the hardware does */
    _mm256_storeu_si256((__m256i *)lanes, t);
    for (int i = 0; i < 8; i++) sum += lanes[i];
    a->sink = (float)sum;
    return NULL;
}

/* The loops the kernels of isa run on, where this CPU has them: AUTO is the best it has. */
static enum cpu_isa peak_isa(enum cpu_isa isa)
{
    if (isa == CPU_ISA_AUTO) isa = cpu_isa_best();
    return cpu_isa_supported(isa) ? isa : CPU_ISA_SCALAR;
}

const char *bench_int8_peak_insn(enum cpu_isa isa)
{
    switch (peak_isa(isa)) {
    case CPU_ISA_AVX512:
    case CPU_ISA_AMX: /* the vector unit's peak: what the AVX-512 kernels could reach */
        return "vpdpbusd";
    case CPU_ISA_AVXVNNI:
        return "vpdpbusd-ymm";
    case CPU_ISA_AVX2:
        return "vpmaddubsw";
    default:
        return "-";
    }
}

double bench_compute_peak(bool fma, int threads, enum cpu_isa kernels)
{
    enum cpu_isa isa = peak_isa(kernels);
    if (isa == CPU_ISA_SCALAR || threads > 64 || threads < 1) return 0;
    bool avx512 = isa == CPU_ISA_AVX512 || isa == CPU_ISA_AMX;
    void *(*loop)(void *) = avx512                   ? peak_loop
                            : isa == CPU_ISA_AVXVNNI ? peak_loop_vnni256
                                                     : peak_loop_avx2;
    /* per instruction: fp32 FMA 2 flops a lane; int8 2 ops a multiply-add (vpdpbusd 4 a dword
     * lane, vpmaddubsw 2 a word lane: 64 on 256 bits either way) */
    double per_insn = avx512 ? (fma ? 32.0 : 128.0) : (fma ? 16.0 : 64.0);
    /* many short windows, the fastest kept: on a shared machine a short one is likelier to run
     * undisturbed (3 windows of 4M iterations moved the one-thread int8 figure from 473 to 712
     * GOP/s run to run). One thread runs in its own windows of ~0.1 ms, as the kernels' fastest
     * calls are timed; more threads need windows long enough to hide starting them. */
    const long iters = threads == 1 ? 50000 : 1000000;
    const int reps = threads == 1 ? 200 : 12;
    double best = 0;
    for (int rep = 0; rep < reps; rep++) {
        pthread_t th[64];
        struct peak_arg a[64];
        double t0 = bench_now_s();
        for (int i = 0; i < threads; i++) {
            a[i] = (struct peak_arg){.iters = iters, .fma = fma};
            if (i) pthread_create(&th[i], NULL, loop, &a[i]);
        }
        loop(&a[0]);
        for (int i = 1; i < threads; i++) pthread_join(th[i], NULL);
        double dt = bench_now_s() - t0;
        double ops = (double)iters * PEAK_CHAINS * per_insn * threads;
        best = fmax(best, ops / dt / 1e9);
    }
    return best;
}

double bench_read_bandwidth(int threads)
{
    size_t bytes = 512u << 20;
    if (threads < 1 || threads > 64) return 0;
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes);
    double bw = read_bandwidth(buf, bytes, threads);
    free(buf);
    return bw;
}

double bench_memcpy_bandwidth(void)
{
    size_t bytes = 512u << 20;
    uint8_t *buf = aligned_alloc(64, bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes);
    double bw = memcpy_bandwidth(buf, bytes);
    free(buf);
    return bw;
}
