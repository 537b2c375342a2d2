/*
 * gpuload: known work on a real GPU, so that the exporter's NVML readings can be checked against
 * what was run (benches/gpu/real_gpu_check.sh, BENCHMARKS.md "A real GPU").
 *
 * It needs no CUDA toolkit: libcuda.so.1 (the driver) is opened at run time and the kernels are
 * PTX text, which the driver compiles for whatever GPU it finds. Phases, each for N seconds:
 *   fma  N   every SM busy with dependent FP32 FMAs, no memory traffic  (SM activity high, DRAM ~0)
 *   copy N   a streaming copy of two 1 GiB buffers                       (DRAM bandwidth high)
 *   mma  N   mma.sync m16n8k16 f16->f32 in a loop, registers only        (tensor pipe high)
 *   idle N   a context held and nothing launched                         (all activity ~0)
 * Usage: gpuload [--device I] PHASE SECONDS [PHASE SECONDS ...]
 * Each phase prints one line: its name, start and end (Unix seconds), launches.
 * Build: cc -O2 -o gpuload gpuload.c -ldl
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(CUdevice *, int);
static CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
static CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice);
static CUresult (*cuModuleLoadDataEx)(CUmodule *, const void *, unsigned, int *, void **);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, void *, void **, void **);
static CUresult (*cuCtxSynchronize)(void);
static CUresult (*cuGetErrorString)(CUresult, const char **);

#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16

static const char PTX[] =
    ".version 7.0\n"
    ".target sm_80\n"
    ".address_size 64\n"
    /* Four independent FMA chains per thread; `iters` rounds. */
    ".visible .entry fma_loop(.param .u64 out, .param .u32 iters)\n"
    "{\n"
    "  .reg .u64 %rd<4>;\n"
    "  .reg .u32 %r<8>;\n"
    "  .reg .f32 %f<8>;\n"
    "  .reg .pred %p<2>;\n"
    "  ld.param.u64 %rd1, [out];\n"
    "  ld.param.u32 %r1, [iters];\n"
    "  mov.u32 %r2, %tid.x;\n"
    "  mov.u32 %r3, %ctaid.x;\n"
    "  mov.u32 %r4, %ntid.x;\n"
    "  mad.lo.u32 %r5, %r3, %r4, %r2;\n"
    "  cvt.rn.f32.u32 %f1, %r5;\n"
    "  add.f32 %f2, %f1, 0f3F800000;\n"
    "  add.f32 %f3, %f1, 0f40000000;\n"
    "  add.f32 %f4, %f1, 0f40400000;\n"
    "  mov.f32 %f5, 0f3F7FFFEF;\n"
    "  mov.f32 %f6, 0f3A83126F;\n"
    "FMA_LOOP:\n"
    "  fma.rn.f32 %f1, %f1, %f5, %f6;\n"
    "  fma.rn.f32 %f2, %f2, %f5, %f6;\n"
    "  fma.rn.f32 %f3, %f3, %f5, %f6;\n"
    "  fma.rn.f32 %f4, %f4, %f5, %f6;\n"
    "  sub.u32 %r1, %r1, 1;\n"
    "  setp.ne.u32 %p1, %r1, 0;\n"
    "  @%p1 bra FMA_LOOP;\n"
    "  add.f32 %f1, %f1, %f2;\n"
    "  add.f32 %f3, %f3, %f4;\n"
    "  add.f32 %f1, %f1, %f3;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.u64 %rd2, %rd2, %rd3;\n"
    "  st.global.f32 [%rd2], %f1;\n"
    "  ret;\n"
    "}\n"
    /* dst[i] = src[i] for 16-byte elements, a grid-stride loop over n elements. */
    ".visible .entry copy16(.param .u64 dst, .param .u64 src, .param .u64 n)\n"
    "{\n"
    "  .reg .u64 %rd<10>;\n"
    "  .reg .u32 %r<6>;\n"
    "  .reg .b32 %v<4>;\n"
    "  .reg .pred %p<2>;\n"
    "  ld.param.u64 %rd1, [dst];\n"
    "  ld.param.u64 %rd2, [src];\n"
    "  ld.param.u64 %rd3, [n];\n"
    "  cvta.to.global.u64 %rd1, %rd1;\n"
    "  cvta.to.global.u64 %rd2, %rd2;\n"
    "  mov.u32 %r1, %tid.x;\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %nctaid.x;\n"
    "  mad.lo.u32 %r5, %r2, %r3, %r1;\n"
    "  cvt.u64.u32 %rd4, %r5;\n"
    "  mul.wide.u32 %rd5, %r3, %r4;\n"
    "  setp.ge.u64 %p1, %rd4, %rd3;\n"
    "  @%p1 bra COPY_END;\n"
    "COPY_LOOP:\n"
    "  shl.b64 %rd6, %rd4, 4;\n"
    "  add.u64 %rd7, %rd2, %rd6;\n"
    "  add.u64 %rd8, %rd1, %rd6;\n"
    "  ld.global.v4.b32 {%v0, %v1, %v2, %v3}, [%rd7];\n"
    "  st.global.v4.b32 [%rd8], {%v0, %v1, %v2, %v3};\n"
    "  add.u64 %rd4, %rd4, %rd5;\n"
    "  setp.lt.u64 %p1, %rd4, %rd3;\n"
    "  @%p1 bra COPY_LOOP;\n"
    "COPY_END:\n"
    "  ret;\n"
    "}\n"
    /* A dependent chain of warp-wide tensor-core MMAs on registers; `iters` rounds. */
    ".visible .entry mma_loop(.param .u64 out, .param .u32 iters)\n"
    "{\n"
    "  .reg .u64 %rd<4>;\n"
    "  .reg .u32 %r<8>;\n"
    "  .reg .b32 %a<4>;\n"
    "  .reg .b32 %b<2>;\n"
    "  .reg .f32 %c<8>;\n"
    "  .reg .pred %p<2>;\n"
    "  ld.param.u64 %rd1, [out];\n"
    "  ld.param.u32 %r1, [iters];\n"
    "  mov.b32 %a0, 0x3C003C00;\n"
    "  mov.b32 %a1, 0x3C003C00;\n"
    "  mov.b32 %a2, 0x3C003C00;\n"
    "  mov.b32 %a3, 0x3C003C00;\n"
    "  mov.b32 %b0, 0x00000000;\n"
    "  mov.b32 %b1, 0x00000000;\n"
    "  mov.f32 %c0, 0f00000000;\n"
    "  mov.f32 %c1, 0f00000000;\n"
    "  mov.f32 %c2, 0f00000000;\n"
    "  mov.f32 %c3, 0f00000000;\n"
    "  mov.f32 %c4, 0f00000000;\n"
    "  mov.f32 %c5, 0f00000000;\n"
    "  mov.f32 %c6, 0f00000000;\n"
    "  mov.f32 %c7, 0f00000000;\n"
    "MMA_LOOP:\n"
    "  mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%c0, %c1, %c2, %c3}, {%a0, %a1, %a2, %a3}, {%b0, %b1}, {%c0, %c1, %c2, %c3};\n"
    "  mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%c4, %c5, %c6, %c7}, {%a0, %a1, %a2, %a3}, {%b0, %b1}, {%c4, %c5, %c6, %c7};\n"
    "  sub.u32 %r1, %r1, 1;\n"
    "  setp.ne.u32 %p1, %r1, 0;\n"
    "  @%p1 bra MMA_LOOP;\n"
    "  add.f32 %c0, %c0, %c4;\n"
    "  mov.u32 %r2, %tid.x;\n"
    "  mov.u32 %r3, %ctaid.x;\n"
    "  mov.u32 %r4, %ntid.x;\n"
    "  mad.lo.u32 %r5, %r3, %r4, %r2;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.u64 %rd2, %rd2, %rd3;\n"
    "  st.global.f32 [%rd2], %c0;\n"
    "  ret;\n"
    "}\n";

static void check(CUresult r, const char *what) {
    if (r != 0) {
        const char *s = "unknown";
        if (cuGetErrorString) cuGetErrorString(r, &s);
        fprintf(stderr, "gpuload: %s failed: %s (%d)\n", what, s, r);
        exit(1);
    }
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "gpuload: libcuda.so.1 has no %s\n", name);
        exit(1);
    }
    return p;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int arg = 1, ordinal = 0;
    if (argc > 2 && strcmp(argv[1], "--device") == 0) {
        ordinal = atoi(argv[2]);
        arg = 3;
    }
    if (argc - arg < 2 || (argc - arg) % 2) {
        fprintf(stderr, "usage: gpuload [--device I] fma|copy|mma|idle SECONDS [...]\n");
        return 2;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "gpuload: cannot open libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    cuInit = sym(lib, "cuInit");
    cuDeviceGet = sym(lib, "cuDeviceGet");
    cuDeviceGetAttribute = sym(lib, "cuDeviceGetAttribute");
    cuCtxCreate = sym(lib, "cuCtxCreate_v2");
    cuModuleLoadDataEx = sym(lib, "cuModuleLoadDataEx");
    cuModuleGetFunction = sym(lib, "cuModuleGetFunction");
    cuMemAlloc = sym(lib, "cuMemAlloc_v2");
    cuMemsetD8 = sym(lib, "cuMemsetD8_v2");
    cuLaunchKernel = sym(lib, "cuLaunchKernel");
    cuCtxSynchronize = sym(lib, "cuCtxSynchronize");
    cuGetErrorString = sym(lib, "cuGetErrorString");

    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fma, copy, mma;
    int sms = 0;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, ordinal), "cuDeviceGet");
    check(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "SM count");
    check(cuCtxCreate(&ctx, 0, dev), "cuCtxCreate");

    char log[8192] = {0};
    int opts[2] = {5 /* CU_JIT_ERROR_LOG_BUFFER */, 6 /* CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES */};
    void *vals[2] = {log, (void *)(uintptr_t)sizeof log};
    CUresult r = cuModuleLoadDataEx(&mod, PTX, 2, opts, vals);
    if (r != 0) fprintf(stderr, "gpuload: PTX: %s\n", log);
    check(r, "cuModuleLoadDataEx");
    check(cuModuleGetFunction(&fma, mod, "fma_loop"), "fma_loop");
    check(cuModuleGetFunction(&copy, mod, "copy16"), "copy16");
    check(cuModuleGetFunction(&mma, mod, "mma_loop"), "mma_loop");

    /* 8 blocks of 256 threads per SM keep every SM's warp slots full. */
    unsigned blocks = (unsigned)sms * 8, threads = 256;
    CUdeviceptr out, a, b;
    size_t gib = (size_t)1 << 30;
    check(cuMemAlloc(&out, (size_t)blocks * threads * 4), "cuMemAlloc out");
    check(cuMemAlloc(&a, gib), "cuMemAlloc a");
    check(cuMemAlloc(&b, gib), "cuMemAlloc b");
    check(cuMemsetD8(a, 1, gib), "cuMemsetD8");
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    printf("gpuload: device %d, %d SMs, %u blocks x %u threads\n", ordinal, sms, blocks, threads);
    fflush(stdout);

    for (; arg + 1 < argc; arg += 2) {
        const char *phase = argv[arg];
        double seconds = atof(argv[arg + 1]), start = now(), end = start + seconds;
        long launches = 0;
        if (strcmp(phase, "idle") == 0) {
            while (now() < end) usleep(50000);
        } else {
            unsigned iters = 1u << 16;
            unsigned long long n = gib / 16;
            void *fma_args[] = {&out, &iters};
            void *copy_args[] = {&b, &a, &n};
            CUfunction f;
            void **args;
            if (strcmp(phase, "fma") == 0) {
                f = fma, args = fma_args;
            } else if (strcmp(phase, "mma") == 0) {
                f = mma, args = fma_args;
            } else if (strcmp(phase, "copy") == 0) {
                f = copy, args = copy_args;
            } else {
                fprintf(stderr, "gpuload: unknown phase %s\n", phase);
                return 2;
            }
            while (now() < end) {
                check(cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, NULL, args, NULL), phase);
                check(cuCtxSynchronize(), phase);
                launches++;
            }
        }
        printf("phase %s %.3f %.3f launches %ld\n", phase, start, now(), launches);
        fflush(stdout);
    }
    return 0;
}
