/* LD_PRELOAD shim: this process (and the threads it starts) sees an AVX2-only x86 CPU.
 *
 * Linux's CPUID faulting (`cpuid_fault` in /proc/cpuinfo, ARCH_SET_CPUID) makes every
 * `cpuid` instruction raise SIGSEGV. The handler runs the real instruction with faulting
 * briefly off, clears the feature bits an AMD Zen 2/3 lacks (AVX-512 in all its parts,
 * VNNI in both encodings, AVX512-BF16/FP16, AMX, GFNI) and steps over the instruction.
 * Every library that asks the CPU itself (oneDNN, MLAS in ONNX Runtime, OpenVINO, torch's
 * cpuinfo, gcc's -march=native) then picks its AVX2 code. Opening /proc/cpuinfo (where this
 * engine reads the flags) gives a copy without the same flags. What it cannot mask:
 * glibc's own string functions, chosen in ld.so before any preload runs (avx2_only.py
 * turns their AVX-512 off with GLIBC_TUNABLES). A SIGSEGV handler
 * the program installs (gcc's, Python's faulthandler) is kept aside and called for every
 * fault that is not a cpuid, so its crash reports still work.
 *
 * Build: gcc -O2 -shared -fPIC -o libcpuid_mask.so cpuid_mask.c -ldl
 * Use:   LD_PRELOAD=$PWD/libcpuid_mask.so python ...   (benchmarks/avx2_only.py does both)
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef ARCH_SET_CPUID
#define ARCH_SET_CPUID 0x1012
#endif

#define BIT(n) (1u << (n))

/* leaf 7, subleaf 0 */
static const uint32_t kClear7B = BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) |
                                 BIT(30) | BIT(31);  /* AVX512 F DQ IFMA PF ER CD BW VL */
static const uint32_t kClear7C = BIT(1) | BIT(6) | BIT(8) | BIT(11) | BIT(12) | BIT(14);
                                 /* AVX512 VBMI VBMI2, GFNI, AVX512 VNNI BITALG VPOPCNTDQ */
static const uint32_t kClear7D = BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) |
                                 BIT(25);  /* 4VNNIW 4FMAPS VP2INTERSECT, AMX-BF16, FP16,
                                              AMX-TILE, AMX-INT8 */
/* leaf 7, subleaf 1 */
static const uint32_t kClear71A = BIT(4) | BIT(5) | BIT(21) | BIT(23);
                                 /* AVX-VNNI, AVX512-BF16, AMX-FP16, AVX-IFMA */

static long set_faulting(int on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, !on); }

static void mask(uint32_t leaf, uint32_t sub, uint32_t *a, uint32_t *b, uint32_t *c,
                 uint32_t *d) {
    if (leaf == 7 && sub == 0) {
        *b &= ~kClear7B;
        *c &= ~kClear7C;
        *d &= ~kClear7D;
    } else if (leaf == 7 && sub == 1) {
        *a &= ~kClear71A;
    } else if (leaf == 0x1e || leaf == 0x1d) {  /* AMX palette and TMUL leaves */
        *a = *b = *c = *d = 0;
    }
}

/* The SIGSEGV action the program asked for: ours stays installed and forwards to it. */
static struct sigaction program_action;

static int (*real_sigaction(void))(int, const struct sigaction *, struct sigaction *) {
    static int (*real)(int, const struct sigaction *, struct sigaction *) = NULL;
    if (!real) real = dlsym(RTLD_NEXT, "sigaction");
    return real;
}

static void forward(int sig, siginfo_t *info, void *context) {
    void (*handler)(int) = program_action.sa_handler;
    if (program_action.sa_flags & SA_SIGINFO) {
        program_action.sa_sigaction(sig, info, context);
    } else if (handler != SIG_DFL && handler != SIG_IGN) {
        handler(sig);
    } else {  /* a real crash: returning re-runs the instruction under the default action */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction()(sig, &dfl, NULL);
    }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    greg_t *regs = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)regs[REG_RIP];
    /* a faulting cpuid is a general-protection fault: SI_KERNEL, the instruction mapped */
    if (info->si_code != SI_KERNEL || ip[0] != 0x0f || ip[1] != 0xa2) {
        forward(sig, info, context);
        return;
    }
    uint32_t leaf = (uint32_t)regs[REG_RAX], sub = (uint32_t)regs[REG_RCX];
    uint32_t a, b, c, d;
    set_faulting(0);
    __cpuid_count(leaf, sub, a, b, c, d);
    set_faulting(1);
    mask(leaf, sub, &a, &b, &c, &d);
    regs[REG_RAX] = a;
    regs[REG_RBX] = b;
    regs[REG_RCX] = c;
    regs[REG_RDX] = d;
    regs[REG_RIP] += 2;
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (sig != SIGSEGV) return real_sigaction()(sig, act, old);
    if (old) *old = program_action;
    if (act) program_action = *act;
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
    if (sig != SIGSEGV) {
        static sighandler_t (*real)(int, sighandler_t) = NULL;
        if (!real) real = (sighandler_t (*)(int, sighandler_t))dlsym(RTLD_NEXT, "signal");
        return real(sig, handler);
    }
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

/* /proc/cpuinfo's "flags" words the masked CPU would not show */
static int hidden_flag(const char *word, size_t len) {
    static const char *const prefixes[] = {"avx512", "amx", "avx_vnni", "avx_ifma", "gfni"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        size_t n = strlen(prefixes[i]);
        if (len >= n && strncmp(word, prefixes[i], n) == 0) return 1;
    }
    return 0;
}

/* A memfd holding /proc/cpuinfo with the hidden flags dropped from each "flags" line. */
static int masked_cpuinfo(void) {
    FILE *in = fopen("/proc/cpuinfo", "r");
    int out = memfd_create("cpuinfo", 0);
    if (!in || out < 0) abort();
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, in)) > 0) {
        if (strncmp(line, "flags", 5) != 0) {
            if (write(out, line, len) != len) abort();
            continue;
        }
        char *word = strchr(line, ':') + 1;
        if (write(out, line, word - line) < 0) abort();
        for (char *end; *word && *word != '\n'; word = end) {
            while (*word == ' ') word++;
            for (end = word; *end && *end != ' ' && *end != '\n'; end++) {}
            if (end > word && !hidden_flag(word, end - word)) {
                if (write(out, " ", 1) != 1 || write(out, word, end - word) < 0) abort();
            }
        }
        if (write(out, "\n", 1) != 1) abort();
    }
    free(line);
    fclose(in);
    lseek(out, 0, SEEK_SET);
    return out;
}

/* open() and friends: /proc/cpuinfo comes from masked_cpuinfo(), the rest passes through */
#define PASS_OPEN(name, ...)                                                    \
    static int (*real)(__VA_ARGS__) = NULL;                                     \
    if (!real) real = (int (*)(__VA_ARGS__))dlsym(RTLD_NEXT, name);

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = va_arg(ap, mode_t);
    va_end(ap);
    if (strcmp(path, "/proc/cpuinfo") == 0) return masked_cpuinfo();
    PASS_OPEN("open", const char *, int, mode_t)
    return real(path, flags, mode);
}

int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dir, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = va_arg(ap, mode_t);
    va_end(ap);
    if (strcmp(path, "/proc/cpuinfo") == 0) return masked_cpuinfo();
    PASS_OPEN("openat", int, const char *, int, mode_t)
    return real(dir, path, flags, mode);
}

int openat64(int dir, const char *path, int flags, ...) __attribute__((alias("openat")));

__attribute__((constructor)) static void start(void) {
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_segv;
    act.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&act.sa_mask);
    program_action.sa_handler = SIG_DFL;
    if (real_sigaction()(SIGSEGV, &act, NULL) != 0 || set_faulting(1) != 0) {
        fputs("cpuid_mask: this CPU or kernel has no CPUID faulting; nothing is masked\n",
              stderr);
        _exit(3);
    }
}
