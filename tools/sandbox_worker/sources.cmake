# The sandbox worker's sources, for its executable here and for the copy the Python package
# packs (python/CMakeLists.txt, where the tools are off).
set(CUBRIDGE_SANDBOX_WORKER_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/worker.cpp
  ${CMAKE_CURRENT_LIST_DIR}/buffer_mappings.cpp
  ${CMAKE_CURRENT_LIST_DIR}/last_words.cpp)
