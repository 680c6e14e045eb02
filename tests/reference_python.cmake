# MOEQ_REFERENCE_RUN: the command that runs the float64 reference's scripts (tests/reference/): Debian's
# /usr/bin/python3 when it has numpy (not a pyenv or venv python), else the first python3 on PATH that has it
# (a GPU image's, where numpy lives in a venv); without one, a command that prints the reason and exits 77
# (skipped). Included by reference.cmake and cuda.cmake (the GPU check's build has only the latter).
if(DEFINED MOEQ_REFERENCE_RUN)
  return()
endif()
set(MOEQ_REFERENCE_RUN "")
foreach(_py /usr/bin/python3 python3)
  if(_py STREQUAL "python3")
    find_program(MOEQ_REFERENCE_PATH_PYTHON NAMES python3)
    set(_py "${MOEQ_REFERENCE_PATH_PYTHON}")
  endif()
  if(_py AND EXISTS "${_py}" AND NOT MOEQ_REFERENCE_RUN)
    execute_process(COMMAND ${_py} -c "import numpy" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
    if(_rc EQUAL 0)
      set(MOEQ_REFERENCE_RUN ${_py})
    endif()
  endif()
endforeach()
if(NOT MOEQ_REFERENCE_RUN)
  message(STATUS "moeq: reference tests skipped (no python3 with numpy; apt-get install python3-numpy)")
  set(MOEQ_REFERENCE_RUN sh -c "echo 'skipped: no python3 with numpy (apt-get install python3-numpy)'; exit 77" --)
endif()
