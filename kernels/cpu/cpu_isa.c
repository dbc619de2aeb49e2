#include "cpu_isa.h"

#include <stdlib.h>
#include <strings.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)

/* CPUID rather than __builtin_cpu_supports("f16c"), which clang 14 does not know (the fuzz build,
 * tests/fuzz, is clang's). */
static bool has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* CPUID.(EAX=7, ECX=1):EAX bit 4. (The OS saves the ymm state: the avx2 check says so.) */
static bool has_avxvnni(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
}

/* AMX-TILE and AMX-INT8 (CPUID.(EAX=7, ECX=0):EDX bits 24 and 25), and Linux's leave for this
 * process to use the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+; without it
 * the first tile instruction faults). The request is idempotent and process-wide: asking again
 * where it was granted only succeeds again. */
static bool has_amx_int8(void)
{
#if defined(__x86_64__) && defined(__linux__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
        return false;
    const long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return false;
#endif
}
#endif

bool cpu_isa_supported(enum cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_AUTO:
    case CPU_ISA_SCALAR:
        return true;
#if defined(__x86_64__) || defined(__i386__)
    case CPU_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case CPU_ISA_AVX512:
        __builtin_cpu_init();
        return cpu_isa_supported(CPU_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512vnni");
    case CPU_ISA_AVXVNNI:
        return cpu_isa_supported(CPU_ISA_AVX2) && has_avxvnni();
    case CPU_ISA_AMX:
        return cpu_isa_supported(CPU_ISA_AVX512) && has_amx_int8();
#else
    case CPU_ISA_AVX2:
    case CPU_ISA_AVX512:
    case CPU_ISA_AVXVNNI:
    case CPU_ISA_AMX:
        return false;
#endif
    }
    return false;
}

enum cpu_prefetch cpu_prefetch_best(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541 /* "AuthenticAMD" */ &&
        __get_cpuid(1, &a, &b, &c, &d)) {
        unsigned family = (a >> 8) & 0xf;
        if (family == 0xf) family += (a >> 20) & 0xff;
        if (family >= 0x1a) return CPU_PREFETCH_L1;
    }
#endif
    return CPU_PREFETCH_L2;
}

const char *cpu_prefetch_name(enum cpu_prefetch p)
{
    switch (p) {
    case CPU_PREFETCH_AUTO:
        return "auto";
    case CPU_PREFETCH_L2:
        return "l2";
    case CPU_PREFETCH_L1:
        return "l1";
    }
    return "unknown";
}

int cpu_prefetch_parse(const char *s)
{
    static const enum cpu_prefetch all[] = {CPU_PREFETCH_AUTO, CPU_PREFETCH_L2, CPU_PREFETCH_L1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcasecmp(s, cpu_prefetch_name(all[i]))) return (int)all[i];
    return -1;
}

enum cpu_isa cpu_isa_best(void)
{
    if (cpu_isa_supported(CPU_ISA_AMX)) return CPU_ISA_AMX;
    if (cpu_isa_supported(CPU_ISA_AVX512)) return CPU_ISA_AVX512;
    if (cpu_isa_supported(CPU_ISA_AVXVNNI)) return CPU_ISA_AVXVNNI;
    if (cpu_isa_supported(CPU_ISA_AVX2)) return CPU_ISA_AVX2;
    return CPU_ISA_SCALAR;
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_AUTO:
        return "auto";
    case CPU_ISA_SCALAR:
        return "scalar";
    case CPU_ISA_AVX2:
        return "avx2";
    case CPU_ISA_AVX512:
        return "avx512";
    case CPU_ISA_AVXVNNI:
        return "avxvnni";
    case CPU_ISA_AMX:
        return "amx";
    }
    return "unknown";
}

int cpu_isa_parse(const char *s)
{
    static const enum cpu_isa all[] = {CPU_ISA_AUTO,    CPU_ISA_SCALAR, CPU_ISA_AVX2,
                                       CPU_ISA_AVXVNNI, CPU_ISA_AVX512, CPU_ISA_AMX};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcasecmp(s, cpu_isa_name(all[i]))) return (int)all[i];
    return -1;
}

int cpu_isa_resolve(enum cpu_isa want, enum cpu_isa *out, struct qerr *err)
{
    if (want == CPU_ISA_AUTO) want = cpu_isa_best();
    if (!cpu_isa_supported(want))
        return qerr_set(err, QERR_UNSUPPORTED, "cpu backend: this CPU cannot run %s kernels",
                        cpu_isa_name(want));
    *out = want;
    return 0;
}
