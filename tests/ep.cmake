# Expert-parallel exchange (ep/): placement, layout and the local transport (unit); the UCX transport
# with 1-4 ranks as forked processes over tcp and shared memory, and a rank killed with -9.
if(TARGET moeq_ep)
  moeq_add_test(NAME test_ep SOURCES test_ep.c LIBS moeq_ep LABELS unit)
endif()
if(TARGET moeq_ep)
  # Forked ranks on one host: no broker, no Redis; the ranks find each other through a temporary directory.
  moeq_add_test(NAME test_ep_ucx SOURCES test_ep_ucx.c LIBS moeq_ep LABELS unit TIMEOUT 600)
  # ep_int.h: the test hook that malforms a rank's dispatch messages (moeq_ep_test_mangle)
  target_include_directories(test_ep_ucx PRIVATE ${CMAKE_SOURCE_DIR}/ep)
endif()
# `moeq ep-plan`: a skewed stats file gives a placement file (with the predicted load) and JSON.
if(TARGET moeq)
  add_test(NAME ep_plan_prints_a_placement_file_and_its_predicted_load
           COMMAND sh -c "printf '# layer 0\\n900 10 10 10 50 20 5 5\\n' > ep_plan_stats.txt && '$<TARGET_FILE:moeq>' ep-plan --stats ep_plan_stats.txt --ranks 2 --replicas 2 > ep_plan_out.txt && grep -q '^moeq-ep-placement 1 experts=8 ranks=2$' ep_plan_out.txt && grep -q '^0 0 1$' ep_plan_out.txt && grep -q 'max/mean 1.0099 (identity placement: 1.8416)' ep_plan_out.txt && '$<TARGET_FILE:moeq>' ep-plan --stats ep_plan_stats.txt --ranks 2 --json | grep -q '\"max_over_mean\":1.8218,\"identity_max_over_mean\":1.8416' && echo ok")
  set_tests_properties(ep_plan_prints_a_placement_file_and_its_predicted_load PROPERTIES LABELS unit)
  # One stats file per rank of a group (each counts its own tokens): summed, they plan as the whole; files
  # with different numbers of experts are refused, naming both.
  add_test(NAME ep_plan_sums_the_stats_files_of_every_rank
           COMMAND sh -c "printf '450 5 5 5 25 10 3 2\n' > ep_plan_r0.txt && printf '# rank 1\n450,5,5,5,25,10,2,3\n' > ep_plan_r1.txt && printf '1 2 3\n' > ep_plan_r2.txt && '$<TARGET_FILE:moeq>' ep-plan --stats ep_plan_r0.txt --stats ep_plan_r1.txt --ranks 2 --replicas 2 | grep -q 'max/mean 1.0099 (identity placement: 1.8416)' && ! '$<TARGET_FILE:moeq>' ep-plan --stats ep_plan_r0.txt --stats ep_plan_r2.txt --ranks 2 2> ep_plan_err.txt && grep -q 'ep_plan_r2.txt has 3 experts, ep_plan_r0.txt has 8' ep_plan_err.txt && echo ok")
  set_tests_properties(ep_plan_sums_the_stats_files_of_every_rank PROPERTIES LABELS unit)
  # --ranks and --replicas are read whole: atoi read "abc" as 0 (refused as missing) and "2x" as 2.
  add_test(NAME ep_plan_refuses_numbers_that_are_not_numbers
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/test_ep_plan_numbers.sh $<TARGET_FILE:moeq>)
  set_tests_properties(ep_plan_refuses_numbers_that_are_not_numbers PROPERTIES LABELS unit)
endif()
# The NCCL transport where the toolkit and NCCL are found (label gpu: skipped, 77, with the reason, without a device).
if(TARGET moeq_ep_nccl)
  moeq_add_test(NAME test_ep_nccl SOURCES test_ep_nccl.c LIBS moeq_ep_nccl moeq_ep CUDA::cudart LABELS gpu TIMEOUT 300)
endif()
# ep/ knows no engine type: its sources include only its own headers and moeq_common's.
add_test(NAME ep_includes_only_its_own_and_common_headers
         COMMAND sh -c "bad=$(grep -rhoE '#include \"[^\"]+\"' '${CMAKE_SOURCE_DIR}/ep' | sort -u | grep -vE '\"(moeq/(ep|ep_placement|ep_plan|err|config|util)\\.h|ep_int\\.h)\"'); [ -z \"$bad\" ] && echo ok || { echo \"ep/ includes: $bad\"; exit 1; }")
set_tests_properties(ep_includes_only_its_own_and_common_headers PROPERTIES LABELS unit)
