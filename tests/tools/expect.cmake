cmake_minimum_required(VERSION 3.25)
# Runs COMMAND (a ;-list) and checks its exit code against EXIT (a ;-list of accepted codes) and
# its combined output against MATCH (a regex). Used to test the cubridge command as a user runs it.
string(REPLACE "|" ";" COMMAND "${COMMAND}")
string(REPLACE "|" ";" EXIT "${EXIT}")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT rc IN_LIST EXIT)
  message(FATAL_ERROR "exit code ${rc}, expected one of ${EXIT}; output:\n${all}")
endif()
if(DEFINED MATCH AND NOT all MATCHES "${MATCH}")
  message(FATAL_ERROR "output does not match '${MATCH}':\n${all}")
endif()
message(STATUS "exit ${rc}:\n${all}")
