cmake_minimum_required(VERSION 3.25)
# The CLI's update story as a user runs it: keygen -> sign -> push to a stand-in service
# (update_test_server), replayed push refused, a cubin signed on the fly, a signed rollback, a
# rollback with an untrusted key, a .cu compiled for --target or for the service's GPU, a dead
# port, a bad key file.
#   -DTOOL=cubridge -DSERVER=update_test_server -DCUBIN=... -DSOURCE=a.cu -DWORK_DIR=...
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(step name expected_rc regex)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK_DIR}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE all ERROR_VARIABLE all)
  message(STATUS "${name}: exit ${rc}\n${all}")
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "${name}: exit ${rc}, expected ${expected_rc}:\n${all}")
  endif()
  if(NOT all MATCHES "${regex}")
    message(FATAL_ERROR "${name}: output does not match '${regex}':\n${all}")
  endif()
  set(last_output "${all}" PARENT_SCOPE)
endfunction()

step(keygen 0 "key id [0-9a-f]+" ${TOOL} keygen --out k)
step(keygen_other 0 "key id" ${TOOL} keygen --out other)
step(keygen_no_overwrite 1 "k.pub exists" ${TOOL} keygen --out k)
execute_process(COMMAND stat -c %a ${WORK_DIR}/k.key OUTPUT_VARIABLE mode OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT mode STREQUAL "600")
  message(FATAL_ERROR "k.key has mode ${mode}, expected 600")
endif()

step(sign 0 "f3.bundle: module 'filters' v3, cubin for sm_90"
     ${TOOL} sign --key k.key --name filters --version 3 ${CUBIN} -o f3.bundle)

file(WRITE ${WORK_DIR}/bad.key "cubridge-ed25519-secret not-hex\n")
file(CHMOD ${WORK_DIR}/bad.key PERMISSIONS OWNER_READ OWNER_WRITE)  # else refused as readable
step(sign_bad_key 1 "bad_key" ${TOOL} sign --key bad.key --name filters --version 3 ${CUBIN})
step(sign_missing_key 1 "cannot open 'missing.key'"
     ${TOOL} sign --key missing.key --name filters --version 3 ${CUBIN})

# One service, several pushes: each prints "exit=N" after its own output. Lines, not ';', separate
# the commands (';' would split the CMake argument).
set(script "
'${TOOL}' push {URL} f3.bundle 2>&1 && echo exit=0 || echo exit=$?
'${TOOL}' push {URL} f3.bundle 2>&1 && echo exit=0 || echo exit=$?
'${TOOL}' push {URL} '${CUBIN}' --key k.key --name filters --version 4 2>&1 && echo exit=0 || echo exit=$?
'${TOOL}' push {URL} --rollback filters --key other.key 2>&1 && echo exit=0 || echo exit=$?
'${TOOL}' push {URL} --rollback filters --key k.key 2>&1 && echo exit=0 || echo exit=$?
'${TOOL}' push {URL}/ --rollback filters --key k.key 2>&1 && echo exit=0 || echo exit=$?
'${TOOL}' push {URL} '${SOURCE}' --key k.key --name filters --version 5 --target sm_90 2>&1 && echo exit=0 || echo exit=$?
'${TOOL}' push {URL} '${SOURCE}' --key k.key --name filters --version 6 2>&1 && echo exit=0 || echo exit=$?
")
step(push_story 0
     "promoted 'filters' v3 \\(was v0\\) at http://127\\.0\\.0\\.1:[0-9]+\nexit=0\n\
cubridge: refused: 409 replayed_version: module 'filters' v3 is not above v3 \\(serving\\)\nexit=1\n\
promoted 'filters' v4 \\(was v3\\)[^\n]*\nexit=0\n\
cubridge: refused: 403 unknown_key: [^\n]*\nexit=1\n\
rolled back 'filters' v4 -> v3 at [^\n]*\nexit=0\n\
rolled back 'filters' v3 -> v4 at [^\n]*\nexit=0\n\
compiled [^\n]*hot_kernels.cu for sm_90 \\([0-9]+ bytes\\)\npromoted 'filters' v5 \\(was v4\\)[^\n]*\nexit=0\n\
compiled [^\n]*hot_kernels.cu for sm_90 [^\n]*\npromoted 'filters' v6 \\(was v5\\)[^\n]*\nexit=0\n"
     ${SERVER} --trust k.pub -- sh -c "${script}")

# Nothing listening: one clear line and its own exit code (tools/exit_codes.hpp).
step(push_dead_port 75 "^cubridge: cannot reach http://127\\.0\\.0\\.1:1: could not connect[^\n]*\n$"
     ${TOOL} push http://127.0.0.1:1 f3.bundle)
file(WRITE ${WORK_DIR}/garbage.bundle "hello")
step(push_not_a_bundle 1 "bundle refused, bad_magic" ${TOOL} push http://127.0.0.1:1 garbage.bundle)
