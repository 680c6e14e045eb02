/*
 * bench/cuda/peak.cu — bench-cuda-peak: what one GPU can do, measured in the
 * run that uses the figures (bench-engine --backend cuda runs it beside its
 * own rounds, as bench-ep runs ucx_perftest). Prints one JSON object:
 *
 *   d2d_copy_gb_s  cudaMemcpyAsync device to device of `--bytes` (2 GiB), bytes
 *                  read + written per second (the issue's "device-to-device
 *                  bandwidth", the decode roofline's denominator)
 *   read_gb_s      a streaming read of the same buffer (float4 loads, all
 *                  SMs): what reading weights once per token can reach
 *   cublas_bf16    per `--gemm M,N,K`: cublasGemmEx BF16 x BF16 -> BF16 with
 *                  FP32 accumulation, Y (M,N) = X (M,K) W (N,K)^T (the engine's
 *                  NT shape), TFLOP/s = 2MNK / seconds, median of 20 calls
 *
 * usage: bench-cuda-peak [--device N] [--bytes B] [--gemm M,N,K]... (at most 8)
 * Exit 1 with {"error": "..."} when a CUDA or cuBLAS call fails (named).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

char g_err[512];

bool cuda_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return true;
    if (!g_err[0]) snprintf(g_err, sizeof g_err, "%s: %s", what, cudaGetErrorString(e));
    return false;
}

bool blas_ok(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    if (!g_err[0]) snprintf(g_err, sizeof g_err, "%s: cuBLAS status %d", what, (int)s);
    return false;
}

/* A fixed pseudo-random fill: zeros would let the GEMM run cooler (and faster) than real data does. */
__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = __float2bfloat16(((float)(h & 0xffff) / 32768.0f - 1.0f) * 0.05f);
    }
}

/* Every element read once; the sum is stored only when it is a value it cannot be, so the loads stay. */
__global__ void read_all(const float4 *p, size_t n, float *sink) {
    float acc = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = __ldg(p + i);
        acc += v.x + v.y + v.z + v.w;
    }
    if (acc == -1.0f) *sink = acc;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

/* Seconds of each of `iters` runs of fn on the stream, timed by events. */
template <class F> bool time_runs(cudaStream_t st, int iters, F fn, std::vector<double> *out) {
    cudaEvent_t a, b;
    if (!cuda_ok(cudaEventCreate(&a), "cudaEventCreate") || !cuda_ok(cudaEventCreate(&b), "cudaEventCreate"))
        return false;
    bool ok = true;
    for (int i = 0; i < iters && ok; i++) {
        ok = cuda_ok(cudaEventRecord(a, st), "cudaEventRecord") && fn() &&
             cuda_ok(cudaEventRecord(b, st), "cudaEventRecord") && cuda_ok(cudaEventSynchronize(b), "sync");
        float ms = 0;
        if (ok && cuda_ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime")) out->push_back(ms / 1e3);
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ok;
}

struct gemm_shape {
    long m, n, k;
    double tflops;
};

bool bandwidth(cudaStream_t st, size_t bytes, int sms, double *copy_gbs, double *read_gbs) {
    void *src = nullptr, *dst = nullptr;
    float *sink = nullptr;
    bool ok = cuda_ok(cudaMalloc(&src, bytes), "cudaMalloc (source)") &&
              cuda_ok(cudaMalloc(&dst, bytes), "cudaMalloc (destination)") &&
              cuda_ok(cudaMalloc(&sink, sizeof(float)), "cudaMalloc") &&
              cuda_ok(cudaMemsetAsync(src, 1, bytes, st), "cudaMemsetAsync");
    std::vector<double> t;
    ok = ok && time_runs(st, 3, [&] { return cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st),
                                                      "cudaMemcpyAsync D2D"); }, &t); /* warm-up */
    t.clear();
    ok = ok && time_runs(st, 10, [&] { return cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st),
                                                       "cudaMemcpyAsync D2D"); }, &t);
    if (ok) *copy_gbs = 2.0 * (double)bytes / median(t) / 1e9;
    int per_sm = 0;
    ok = ok && cuda_ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, read_all, 512, 0), "occupancy");
    size_t n4 = bytes / sizeof(float4);
    int blocks = sms * (per_sm > 0 ? per_sm : 1);
    auto read = [&] {
        read_all<<<blocks, 512, 0, st>>>((const float4 *)src, n4, sink);
        return cuda_ok(cudaGetLastError(), "read_all launch");
    };
    t.clear();
    ok = ok && time_runs(st, 3, read, &t);
    t.clear();
    ok = ok && time_runs(st, 10, read, &t);
    if (ok) *read_gbs = (double)(n4 * sizeof(float4)) / median(t) / 1e9;
    cudaFree(src), cudaFree(dst), cudaFree(sink);
    return ok;
}

bool gemm(cudaStream_t st, cublasHandle_t h, gemm_shape *g) {
    __nv_bfloat16 *x = nullptr, *w = nullptr, *y = nullptr;
    size_t nx = (size_t)g->m * g->k, nw = (size_t)g->n * g->k, ny = (size_t)g->m * g->n;
    bool ok = cuda_ok(cudaMalloc(&x, nx * 2), "cudaMalloc (X)") && cuda_ok(cudaMalloc(&w, nw * 2), "cudaMalloc (W)") &&
              cuda_ok(cudaMalloc(&y, ny * 2), "cudaMalloc (Y)");
    if (ok) {
        fill_bf16<<<1024, 256, 0, st>>>(x, nx, 1u);
        fill_bf16<<<1024, 256, 0, st>>>(w, nw, 2u);
        ok = cuda_ok(cudaGetLastError(), "fill_bf16 launch");
    }
    const float one = 1.0f, zero = 0.0f;
    /* column-major: Y^T (N, M) = W (N, K) . X^T (K, M); W is stored (N, K) row-major = (K, N) column-major */
    auto call = [&] {
        return blas_ok(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)g->n, (int)g->m, (int)g->k, &one, w,
                                    CUDA_R_16BF, (int)g->k, x, CUDA_R_16BF, (int)g->k, &zero, y, CUDA_R_16BF,
                                    (int)g->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx BF16");
    };
    std::vector<double> t;
    ok = ok && time_runs(st, 3, call, &t);
    t.clear();
    ok = ok && time_runs(st, 20, call, &t);
    if (ok) g->tflops = 2.0 * (double)g->m * (double)g->n * (double)g->k / median(t) / 1e12;
    cudaFree(x), cudaFree(w), cudaFree(y);
    return ok;
}

int fail(void) {
    printf("{\"bench\": \"cuda-peak\", \"error\": \"%s\"}\n", g_err[0] ? g_err : "unknown");
    return 1;
}

}  // namespace

int main(int argc, char **argv) {
    int device = 0;
    size_t bytes = (size_t)2 << 30;
    std::vector<gemm_shape> shapes;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--device")) device = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--bytes")) bytes = (size_t)strtoull(argv[i + 1], nullptr, 10);
        else if (!strcmp(argv[i], "--gemm") && shapes.size() < 8) {
            gemm_shape g = {0, 0, 0, 0};
            if (sscanf(argv[i + 1], "%ld,%ld,%ld", &g.m, &g.n, &g.k) != 3 || g.m < 1 || g.n < 1 || g.k < 1)
                return fprintf(stderr, "bench-cuda-peak: --gemm M,N,K (positive)\n"), 2;
            shapes.push_back(g);
        } else
            return fprintf(stderr, "usage: bench-cuda-peak [--device N] [--bytes B] [--gemm M,N,K]...\n"), 2;
    }
    if (bytes < ((size_t)1 << 20)) bytes = (size_t)1 << 20;
    bytes &= ~(size_t)15;
    cudaDeviceProp prop;
    cudaStream_t st = nullptr;
    cublasHandle_t h = nullptr;
    if (!cuda_ok(cudaSetDevice(device), "cudaSetDevice") || !cuda_ok(cudaGetDeviceProperties(&prop, device), "props") ||
        !cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate") ||
        !blas_ok(cublasCreate(&h), "cublasCreate") || !blas_ok(cublasSetStream(h, st), "cublasSetStream"))
        return fail();
    double copy_gbs = 0, read_gbs = 0;
    if (!bandwidth(st, bytes, prop.multiProcessorCount, &copy_gbs, &read_gbs)) return fail();
    for (auto &g : shapes)
        if (!gemm(st, h, &g)) return fail();
    printf("{\"bench\": \"cuda-peak\", \"device\": %d, \"name\": \"%s\", \"sm\": \"%d.%d\", \"sms\": %d, "
           "\"memory_bytes\": %zu, \"buffer_bytes\": %zu, \"d2d_copy_gb_s\": %.1f, \"read_gb_s\": %.1f, "
           "\"cublas_bf16\": [",
           device, prop.name, prop.major, prop.minor, prop.multiProcessorCount, (size_t)prop.totalGlobalMem, bytes,
           copy_gbs, read_gbs);
    for (size_t i = 0; i < shapes.size(); i++)
        printf("%s{\"m\": %ld, \"n\": %ld, \"k\": %ld, \"tflops\": %.1f}", i ? ", " : "", shapes[i].m, shapes[i].n,
               shapes[i].k, shapes[i].tflops);
    printf("], \"method\": \"d2d: cudaMemcpyAsync of buffer_bytes, (read + written) / median of 10; read: float4 "
           "loads over the buffer, all SMs at full occupancy, median of 10; cublas_bf16: cublasGemmEx BF16 inputs "
           "and output, FP32 compute, default algorithm, Y(M,N) = X(M,K) W(N,K)^T, 2MNK / median of 20\"}\n");
    cublasDestroy(h);
    cudaStreamDestroy(st);
    return 0;
}
