# kernels/: the plain-C references are unit-tested everywhere; each CUDA kernel
# is compared against its reference where a device exists (label gpu; exits
# 77 = skipped, with the reason printed, where there is none).
moeq_add_test(NAME test_kernels_ref SOURCES test_kernels_ref.c LIBS moeq_kernels_ref LABELS unit)
if(MOEQ_HAVE_CUDA)
  moeq_add_test(NAME test_kernels_gpu SOURCES test_kernels_gpu.c LIBS moeq_kernels moeq_kernels_ref CUDA::cudart
                LABELS gpu)
endif()
# The cuBLAS and NCCL the build found load at run time and are the pinned
# CUDA 13 line (no GPU needed).
if(MOEQ_HAVE_CUBLAS AND MOEQ_HAVE_NCCL)
  moeq_add_test(NAME test_cuda_libs SOURCES test_cuda_libs.c LIBS moeq_cublas moeq_nccl LABELS unit)
endif()
