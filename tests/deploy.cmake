# What ships for operators (issue 16): a secured Kafka cluster and a
# least-privilege Redis user, for real (tests/secure_pipeline_check.py against
# the fixture broker's SASL_SSL listener), and the deployment files
# (tests/deploy_check.py: docker-compose, deploy/k8s, Prometheus rules, the
# Grafana dashboard against the metrics running processes export).
# Debian's python3 (confluent-kafka, yaml): /usr/bin first, as reference.cmake.
find_program(MOEQ_DEPLOY_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT MOEQ_DEPLOY_PYTHON)
  find_program(MOEQ_DEPLOY_PYTHON NAMES python3)
endif()
set(_moeq_bin $<TARGET_FILE:moeq>)
set(_moeq_env "MOEQ_TEST_ENV_FILE=${CMAKE_BINARY_DIR}/test-services/env")

foreach(pair
    "a_pipeline_over_sasl_ssl_answers_every_job:sasl_ssl_pipeline"
    "a_wrong_kafka_password_is_named_in_the_log:wrong_password"
    "an_untrusted_broker_certificate_is_named_in_the_log:untrusted_ca")
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 name)
  list(GET pair 1 case)
  add_test(NAME ${name} COMMAND ${MOEQ_DEPLOY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/secure_pipeline_check.py
           ${_moeq_bin} ${case})
  set_tests_properties(${name} PROPERTIES LABELS "integration;python" FIXTURES_REQUIRED services
    SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 240 ENVIRONMENT "${_moeq_env}")
endforeach()

add_test(NAME moeq_topics_creates_the_recommended_topics
         COMMAND ${MOEQ_DEPLOY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/topics_check.py ${_moeq_bin})
set_tests_properties(moeq_topics_creates_the_recommended_topics PROPERTIES LABELS "integration;python"
  FIXTURES_REQUIRED services SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 120 ENVIRONMENT "${_moeq_env}")

# The clients (clients/python, clients/node) against a real coordinator + worker.
foreach(lang python node)
  add_test(NAME ${lang}_client_awaits_each_result_by_id
           COMMAND ${MOEQ_DEPLOY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/clients_check.py ${_moeq_bin} ${lang})
  set_tests_properties(${lang}_client_awaits_each_result_by_id PROPERTIES LABELS "integration;python"
    FIXTURES_REQUIRED services SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 300 ENVIRONMENT "${_moeq_env}")
endforeach()

# The deployment files parse and agree with the code (compose, k8s, KEDA,
# promtool); every metric the dashboard and the alerts name is exported by a
# running coordinator and worker.
add_test(NAME deployment_files_are_valid_and_match_the_code
         COMMAND ${MOEQ_DEPLOY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/deploy_check.py static ${_moeq_bin})
set_tests_properties(deployment_files_are_valid_and_match_the_code PROPERTIES LABELS "unit;python"
  SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 120)
add_test(NAME dashboard_and_alerts_name_only_exported_metrics
         COMMAND ${MOEQ_DEPLOY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/deploy_check.py metrics ${_moeq_bin})
set_tests_properties(dashboard_and_alerts_name_only_exported_metrics PROPERTIES LABELS "integration;python"
  FIXTURES_REQUIRED services SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 240 ENVIRONMENT "${_moeq_env}")
