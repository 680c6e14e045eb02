# Worker tests: the pure scheduler and params (unit); the pipeline against a
# real Kafka + Redis and the tiny model (integration, fixture `services`).
moeq_add_test(NAME test_worker_scheduler SOURCES test_worker_scheduler.c LIBS moeq_worker LABELS unit)
moeq_add_test(NAME test_worker_params SOURCES test_worker_params.c LIBS moeq_worker LABELS unit)
moeq_add_test(NAME test_worker_affinity SOURCES test_worker_affinity.c LIBS moeq_worker LABELS unit)
moeq_add_test(NAME test_worker_mtp_auto SOURCES test_worker_mtp_auto.c LIBS moeq_worker m LABELS unit)

get_target_property(_moeq_worker_defs moeq_worker INTERFACE_COMPILE_DEFINITIONS)
if(_moeq_worker_defs AND "MOEQ_WORKER_SHELL=1" IN_LIST _moeq_worker_defs)
  # Runs `moeq worker` processes (build the moeq target first) against the private services.
  moeq_add_test(NAME test_worker_metrics SOURCES test_worker_metrics.c LIBS moeq_worker LABELS unit)
  moeq_add_test(NAME test_worker_pipeline SOURCES test_worker_pipeline.c LIBS moeq_worker
    LABELS integration FIXTURES services TIMEOUT 240)
  # The same pipeline with workers on the CUDA backend (issue 14): results equal generate on the device, a kill -9
  # reclaimed, SIGTERM drained. Without a device: the engine's reason, skipped (77).
  # ... and with the CPU behind a GPU's contract (backend = cpu-device): the worker's device paths on every machine.
  add_test(NAME test_worker_pipeline_on_the_device_contract COMMAND test_worker_pipeline --backend cpu-device)
  # (after the CPU run: both write the same model directory when it is missing)
  set_tests_properties(test_worker_pipeline_on_the_device_contract PROPERTIES LABELS integration
    SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} FIXTURES_REQUIRED services TIMEOUT 240 DEPENDS test_worker_pipeline
    ENVIRONMENT "MOEQ_SOURCE_DIR=${CMAKE_SOURCE_DIR};MOEQ_BUILD_DIR=${CMAKE_BINARY_DIR};MOEQ_TEST_ENV_FILE=${CMAKE_BINARY_DIR}/test-services/env")
  if(MOEQ_HAVE_CUDA_BACKEND)
    add_test(NAME test_worker_pipeline_on_cuda COMMAND test_worker_pipeline --backend cuda)
    set_tests_properties(test_worker_pipeline_on_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE}
      FIXTURES_REQUIRED services TIMEOUT 240 DEPENDS test_worker_pipeline
      ENVIRONMENT "MOEQ_SOURCE_DIR=${CMAKE_SOURCE_DIR};MOEQ_BUILD_DIR=${CMAKE_BINARY_DIR};MOEQ_TEST_ENV_FILE=${CMAKE_BINARY_DIR}/test-services/env")
  endif()
  # MTP inside continuous batching: tiny-mtp and tiny, mtp_k on and off, every result equal to generate alone.
  moeq_add_test(NAME test_worker_mtp SOURCES test_worker_mtp.c LIBS moeq_worker
    LABELS integration FIXTURES services TIMEOUT 300)
  # ... with workers on the CPU behind a GPU's contract: MTP rounds and the prefix cache through the device paths
  add_test(NAME test_worker_mtp_on_the_device_contract COMMAND test_worker_mtp --backend cpu-device)
  set_tests_properties(test_worker_mtp_on_the_device_contract PROPERTIES LABELS integration
    SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} FIXTURES_REQUIRED services TIMEOUT 300 DEPENDS test_worker_mtp
    ENVIRONMENT "MOEQ_SOURCE_DIR=${CMAKE_SOURCE_DIR};MOEQ_BUILD_DIR=${CMAKE_BINARY_DIR};MOEQ_TEST_ENV_FILE=${CMAKE_BINARY_DIR}/test-services/env")
  # Issue 15: jobs sharing a 1,000-token instruction through two workers (small preset): generate's tokens,
  # the instruction reused by nearly every job (prefix cache or a running job's fork).
  moeq_add_test(NAME test_worker_prefix SOURCES test_worker_prefix.c LIBS moeq_worker
    LABELS integration FIXTURES services TIMEOUT 300)
  # Issue 11 through a worker: a NaN-poisoned job ends numerical_error beside a healthy batch-mate,
  # prompt_too_long at the model's context and at max_model_len, text with a 0x00 byte whole in both formats.
  moeq_add_test(NAME test_worker_numerics SOURCES test_worker_numerics.c LIBS moeq_worker
    LABELS integration FIXTURES services TIMEOUT 240)
  target_compile_definitions(test_worker_numerics PRIVATE MOEQ_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
endif()

# The whole pipeline through the real coordinator: Kafka -> coordinator -> Redis -> 2 workers -> Kafka,
# every result checked against `moeq generate` for the job alone (scripts/demo-pipeline.sh, verify mode).
if(TARGET test_worker_pipeline)
  add_test(NAME test_worker_end_to_end COMMAND sh -c
    ". \"$MOEQ_TEST_ENV_FILE\" && { test -f ${CMAKE_BINARY_DIR}/test-worker-model/config.json || ${CMAKE_BINARY_DIR}/cli/moeq gen-model --preset tiny --out ${CMAKE_BINARY_DIR}/test-worker-model >/dev/null; } && MOEQ_DEMO_KAFKA=$MOEQ_TEST_KAFKA MOEQ_DEMO_REDIS=$MOEQ_TEST_REDIS MOEQ_DEMO_VERIFY=1 MOEQ_DEMO_NAMESPACE=wktest$$ MOEQ_DEMO_TIMEOUT_S=90 MOEQ_BIN=${CMAKE_BINARY_DIR}/cli/moeq ${CMAKE_SOURCE_DIR}/scripts/demo-pipeline.sh ${CMAKE_BINARY_DIR}/test-worker-model ${CMAKE_BINARY_DIR}/test-worker-e2e")
  set_tests_properties(test_worker_end_to_end PROPERTIES LABELS integration FIXTURES_REQUIRED services TIMEOUT 240
    DEPENDS test_worker_pipeline
    ENVIRONMENT "MOEQ_TEST_ENV_FILE=${CMAKE_BINARY_DIR}/test-services/env")
endif()

# End to end and chaos through the real coordinator and worker processes (build the moeq target first):
# test_worker_e2e_harness.h runs them against the fixture's services.
if(TARGET test_worker_pipeline)
  # 1,000 jobs from the Python, Node and kcat example producers, each checked against generate alone.
  moeq_add_test(NAME test_worker_e2e SOURCES test_worker_e2e.c LIBS moeq_worker
    LABELS integration FIXTURES services TIMEOUT 300)
  # An expert-parallel group of 2 worker ranks (UCX over tcp): the Redis rendezvous and its generations, every
  # job once and equal to generate alone, SIGTERM of one rank drains both, kill -9 of a rank loses no job.
  moeq_add_test(NAME test_worker_group SOURCES test_worker_group.c LIBS moeq_worker
    LABELS integration FIXTURES services TIMEOUT 600)
  # `moeq submit` reads only its own results (job_hash, start by time), reports duplicates and stale results.
  moeq_add_test(NAME test_submit SOURCES test_submit.c LIBS moeq_worker
    LABELS integration FIXTURES services TIMEOUT 300)
  # A worker started mid-run joins the group, takes batches, and nothing is lost.
  moeq_add_test(NAME test_worker_scale SOURCES test_worker_scale.c LIBS moeq_worker
    LABELS integration FIXTURES services TIMEOUT 300)
  # Acknowledgements Redis did not take are retried (a proxy drops the connection at the XACK); a worker
  # restarted with the same id takes its own pending batches at once.
  moeq_add_test(NAME test_worker_acks SOURCES test_worker_acks.c LIBS moeq_worker Threads::Threads
    LABELS integration FIXTURES services TIMEOUT 300)
  # 5,000 jobs (MOEQ_BOUNDED_JOBS): once idle the batch streams are empty and used_memory is back to its start
  # plus the retained job records; alone, since it reads the server's used_memory.
  moeq_add_test(NAME test_worker_redis_bounded SOURCES test_worker_redis_bounded.c LIBS moeq_worker
    LABELS integration slow FIXTURES services TIMEOUT 400)
  set_tests_properties(test_worker_redis_bounded PROPERTIES RUN_SERIAL TRUE)
  # 5,000 jobs (MOEQ_CHAOS_JOBS) while workers and the coordinator are killed with -9 and Redis is restarted
  # once; alone, since it restarts the fixture's Redis.
  moeq_add_test(NAME test_worker_chaos SOURCES test_worker_chaos.c LIBS moeq_worker
    LABELS integration slow FIXTURES services TIMEOUT 600)
  set_tests_properties(test_worker_chaos PROPERTIES RUN_SERIAL TRUE)
endif()
