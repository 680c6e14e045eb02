/*
 * test_cuda_libs.c — the cuBLAS/cuBLASLt and NCCL found by the build (the
 * pinned wheels in .deps/cuda, see scripts/setup.d/40-cuda-wheels.sh) are
 * the ones the loader picks at run time, and they are the pinned versions.
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
}

static void the_nccl_found_by_the_build_loads_and_matches_its_header(void **state) {
    (void)state;
    int v = 0;
    assert_int_equal(ncclGetVersion(&v), ncclSuccess);
    print_message("NCCL %d (header %d)\n", v, NCCL_VERSION_CODE);
    assert_int_equal(v, NCCL_VERSION_CODE);
    assert_true(v >= NCCL_VERSION(2, 30, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_cublas_found_by_the_build_loads_and_is_the_cuda_13_line),
        cmocka_unit_test(the_nccl_found_by_the_build_loads_and_matches_its_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
