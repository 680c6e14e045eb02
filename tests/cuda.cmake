# engine/cuda: the kernels' shared arithmetic and index math (ops.cuh) runs on the host against the CPU
# engine's ops, bit for bit, on every machine (label unit); each CUDA kernel is compared with the CPU
# engine's op where a device exists (label gpu; exits 77 = skipped, with the reason printed, where there is
# none). docs/CUDA.md says which comparisons are exact.
if(TARGET moeq_engine)
  moeq_add_test(NAME test_cuda_ops_host SOURCES test_cuda_ops_host.c test_cuda_ops_cxx.cpp LIBS moeq_cuda_ops moeq_engine LABELS unit)
  target_include_directories(test_cuda_ops_host PRIVATE ${CMAKE_SOURCE_DIR}/engine ${CMAKE_SOURCE_DIR}/engine/cpu)
endif()
# The logits records (logits_reduce): the CPU op against a full sort, the CUDA kernel's block (logits_reduce.cuh)
# emulated on the host against the CPU op, and draws from a record against draws from the row, on every machine.
if(TARGET moeq_engine)
  moeq_add_test(NAME test_logits_reduce SOURCES test_logits_reduce.c LIBS moeq_cuda_ops moeq_engine LABELS unit)
  target_include_directories(test_logits_reduce PRIVATE ${CMAKE_SOURCE_DIR}/engine)
endif()
# The CUDA backend's index and split-KV arithmetic (backend_index.cuh) against the CPU backend, and its error
# paths (no device: a clear error; a build without CUDA: says so), on every machine.
if(TARGET moeq_engine AND TARGET moeq_genmodel)
  moeq_add_test(NAME test_backend_cuda_host SOURCES test_backend_cuda_host.c LIBS moeq_cuda_ops moeq_engine
                moeq_genmodel LABELS unit)
  target_include_directories(test_backend_cuda_host PRIVATE ${CMAKE_SOURCE_DIR}/engine)
  if(MOEQ_HAVE_CUDA_BACKEND)
    target_compile_definitions(test_backend_cuda_host PRIVATE MOEQ_HAVE_CUDA_BACKEND)
    target_link_libraries(test_backend_cuda_host PRIVATE moeq_backend_cuda moeq_cuda_kernels)
  endif()
endif()
if(MOEQ_HAVE_CUDA AND TARGET moeq_engine)
  moeq_add_test(NAME test_kernels_gpu SOURCES test_kernels_gpu.c LIBS moeq_cuda_kernels moeq_engine CUDA::cudart
                LABELS gpu)
  target_include_directories(test_kernels_gpu PRIVATE ${CMAKE_SOURCE_DIR}/engine ${CMAKE_SOURCE_DIR}/engine/cpu)
endif()
# The CUDA backend against the CPU backend, op by op and whole models through the engine (models written with
# the genmodel library, so the GPU check's engine-only build runs it).
if(MOEQ_HAVE_CUDA_BACKEND AND TARGET moeq_genmodel)
  moeq_add_test(NAME test_backend_cuda_gpu SOURCES test_backend_cuda_gpu.c
                LIBS moeq_engine moeq_genmodel moeq_backend_cuda moeq_cuda_kernels CUDA::cudart LABELS gpu TIMEOUT 300)
  target_include_directories(test_backend_cuda_gpu PRIVATE ${CMAKE_SOURCE_DIR}/engine)
  # The same cases on a CPU stand-in behind the device's contract, on every machine: the one device run can
  # then fail only for what the device does, not for the harness (a 300-token prompt on a 256-position model).
  add_test(NAME test_backend_cuda_gpu_harness COMMAND test_backend_cuda_gpu --cpu-standin)
  set_tests_properties(test_backend_cuda_gpu_harness PROPERTIES LABELS unit TIMEOUT 120)
endif()
# The cuBLAS and NCCL the build found load at run time and are the pinned
# CUDA 13 line (no GPU needed).
# Where the wheels are the setup hook's (its stamp names them), the test holds the loaded libraries to those
# versions exactly; elsewhere (a GPU image's own python3 wheels, as gpu-check.sh finds them) it checks that each
# loaded library is its header's and the CUDA 13 line, and says the versions are not the pinned ones.
if(MOEQ_HAVE_CUBLAS AND MOEQ_HAVE_NCCL)
  moeq_add_test(NAME test_cuda_libs SOURCES test_cuda_libs.c LIBS moeq_cublas moeq_nccl LABELS unit)
  if(EXISTS "${MOEQ_CUDA_WHEELS_DIR}/.wheels")
    file(READ "${MOEQ_CUDA_WHEELS_DIR}/.wheels" _stamp)
    if(_stamp MATCHES "nvidia-nccl-cu13==([0-9]+)\\.([0-9]+)\\.([0-9]+)")
      math(EXPR _nccl_code "${CMAKE_MATCH_1} * 10000 + ${CMAKE_MATCH_2} * 100 + ${CMAKE_MATCH_3}")
      target_compile_definitions(test_cuda_libs PRIVATE MOEQ_PINNED_NCCL=${_nccl_code})
    endif()
    if(_stamp MATCHES "nvidia-cublas==([0-9]+)\\.([0-9]+)\\.")
      target_compile_definitions(test_cuda_libs PRIVATE MOEQ_PINNED_CUBLAS_MAJOR=${CMAKE_MATCH_1}
                                 MOEQ_PINNED_CUBLAS_MINOR=${CMAKE_MATCH_2})
    endif()
  endif()
endif()
# The CUDA backend meets the float64 reference as the CPU engine does (issue 14): compare_engine.py and
# compare_mtp.py with every `moeq logits` / `moeq generate` on --backend cuda, the same tolerance (1e-4 of
# max(1, max|logit|)) on every preset and dtype the CPU comparison runs, in the batch-invariant mode (own
# kernels) and, on the presets of the engine's own layout, the cuBLAS mode. Label gpu: without a device they
# print the engine's reason and exit 77 (skipped). The GPU check's engine-only build has `moeq` for them.
if(TARGET moeq AND MOEQ_HAVE_CUDA_BACKEND)
  include(${CMAKE_CURRENT_SOURCE_DIR}/reference_python.cmake)
  set(_ref ${CMAKE_CURRENT_SOURCE_DIR}/reference)
  add_test(NAME engine_logits_on_cuda_match_the_float64_reference
    COMMAND ${MOEQ_REFERENCE_RUN} ${_ref}/compare_engine.py --moeq $<TARGET_FILE:moeq>
      --work ${CMAKE_BINARY_DIR}/reference-cuda-work --engine-args "--backend cuda" --skip-without-device)
  add_test(NAME engine_logits_on_cuda_with_cublas_match_the_float64_reference
    COMMAND ${MOEQ_REFERENCE_RUN} ${_ref}/compare_engine.py --moeq $<TARGET_FILE:moeq>
      --work ${CMAKE_BINARY_DIR}/reference-cuda-cublas-work --cases tiny:bf16,tiny:f8,tiny-v2:bf16,small:bf16
      --engine-args "--backend cuda --no-batch-invariant" --skip-without-device)
  add_test(NAME engine_mtp_logits_on_cuda_match_the_float64_reference
    COMMAND ${MOEQ_REFERENCE_RUN} ${_ref}/compare_mtp.py --moeq $<TARGET_FILE:moeq>
      --work ${CMAKE_BINARY_DIR}/reference-cuda-mtp-work --engine-args "--backend cuda" --skip-without-device)
  set_tests_properties(engine_logits_on_cuda_match_the_float64_reference
    engine_logits_on_cuda_with_cublas_match_the_float64_reference engine_mtp_logits_on_cuda_match_the_float64_reference
    PROPERTIES LABELS gpu SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 300 REQUIRED_FILES $<TARGET_FILE:moeq>)
endif()
# Expert-parallel groups on the CUDA backend (label gpu; test_engine_group.c --backend cuda): 2 and 3 ranks sharing
# the one device over UCX tcp, each holding only its own experts in device memory (expert_weights = group), give
# the single-process CUDA engine's logits bit for bit. Needs UCX (the GPU check's build has it only where the image
# has pkg-config ucx). Without a device: the backend's reason, exit 77 (skipped).
if(MOEQ_HAVE_CUDA_BACKEND AND MOEQ_HAVE_UCX AND TARGET moeq_engine AND TARGET moeq)
  if(NOT TARGET test_engine_group) # the GPU check's build (MOEQ_CUDA_CHECK_ONLY) has no engine.cmake
    moeq_add_test(NAME test_engine_group SOURCES test_engine_group.c LIBS moeq_engine moeq_ep LABELS unit
                  TIMEOUT 600)
    target_include_directories(test_engine_group PRIVATE ${CMAKE_SOURCE_DIR}/engine)
    add_dependencies(test_engine_group moeq)
  endif()
  add_test(NAME test_engine_group_cuda COMMAND test_engine_group --backend cuda)
  set_tests_properties(test_engine_group_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
    ENVIRONMENT "MOEQ_BUILD_DIR=${CMAKE_BINARY_DIR}")
endif()
