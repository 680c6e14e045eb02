# kernels/: the plain-C references are unit-tested everywhere; each CUDA kernel
# is compared against its reference where a device exists (label gpu; exits
# 77 = skipped, with the reason printed, where there is none).
moeq_add_test(NAME test_kernels_ref SOURCES test_kernels_ref.c LIBS moeq_kernels_ref LABELS unit)
if(MOEQ_HAVE_CUDA)
  moeq_add_test(NAME test_kernels_gpu SOURCES test_kernels_gpu.c LIBS moeq_kernels moeq_kernels_ref CUDA::cudart
                LABELS gpu)
endif()
