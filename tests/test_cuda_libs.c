/*
 * test_cuda_libs.c — the cuBLAS/cuBLASLt and NCCL found by the build (the
 * pinned wheels in .deps/cuda, see scripts/setup.d/40-cuda-wheels.sh) are
 * the ones the loader picks at run time, and they are the pinned versions
 * (MOEQ_PINNED_*, from the hook's stamp). A build on other wheels (a GPU
 * image's python3 packages: its NCCL was 2.28.9 on 2026-12-05) has no stamp:
 * there the loaded libraries must match their headers and the CUDA 13 line.
 * Runs on every machine with nvcc: none of these calls needs a GPU. What
 * needs one (a handle, a communicator) is in the gpu-labelled tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <nccl.h>
#include <stdio.h>

static void the_cublas_found_by_the_build_loads_and_is_the_cuda_13_line(void **state) {
    (void)state;
    int major = 0, minor = 0, patch = 0;
    assert_int_equal(cublasGetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasGetProperty(MINOR_VERSION, &minor), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasGetProperty(PATCH_LEVEL, &patch), CUBLAS_STATUS_SUCCESS);
    size_t lt = cublasLtGetVersion();
    print_message("cuBLAS %d.%d.%d, cuBLASLt %zu (headers %d.%d.%d)\n", major, minor, patch, lt, CUBLAS_VER_MAJOR,
                  CUBLAS_VER_MINOR, CUBLAS_VER_PATCH);
    assert_int_equal(major, 13);
    assert_int_equal(major, CUBLAS_VER_MAJOR); /* the header and the loaded library agree */
    assert_int_equal(minor, CUBLAS_VER_MINOR);
    assert_true(lt / 10000 == 13);
#ifdef MOEQ_PINNED_CUBLAS_MAJOR
    assert_int_equal(major, MOEQ_PINNED_CUBLAS_MAJOR);
    assert_int_equal(minor, MOEQ_PINNED_CUBLAS_MINOR);
#else
    print_message("not the setup hook's wheels (no stamp): the pinned cuBLAS version is not checked\n");
#endif
}

static void the_nccl_found_by_the_build_loads_and_matches_its_header(void **state) {
    (void)state;
    int v = 0;
    assert_int_equal(ncclGetVersion(&v), ncclSuccess);
    print_message("NCCL %d (header %d)\n", v, NCCL_VERSION_CODE);
    assert_int_equal(v, NCCL_VERSION_CODE);
#ifdef MOEQ_PINNED_NCCL
    assert_int_equal(v, MOEQ_PINNED_NCCL);
#else
    print_message("not the setup hook's wheels (no stamp): the pinned NCCL version is not checked\n");
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_cublas_found_by_the_build_loads_and_is_the_cuda_13_line),
        cmocka_unit_test(the_nccl_found_by_the_build_loads_and_matches_its_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
