# cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -P check_install.cmake
# Installs the build into a scratch prefix, then configures, builds and runs the projects outside
# the tree whose modules the build has: consumer/ links every exported target
# (find_package(hyflow)), consumer_dataproto/ asks for the dataproto component with CAF and Boost
# unfindable, consumer_tracking/ for the tracking component with LibTorch, CAF and Boost
# unfindable.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  set(LAST_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

function(consume name)
  run("configure ${name}" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/${name}" -B "${WORK_DIR}/${name}" -G "${GENERATOR}"
      -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}" ${ARGN})
  run("build ${name}" ${CMAKE_COMMAND} --build "${WORK_DIR}/${name}")
  run("run ${name}" "${WORK_DIR}/${name}/${name}")
  if(NOT LAST_OUTPUT MATCHES "${name}: ok")
    message(FATAL_ERROR "install test: unexpected output of ${name}: ${LAST_OUTPUT}")
  endif()
  message(STATUS "install test: ${LAST_OUTPUT}")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/lib/cmake/hyflow/hyflowConfig.cmake")
  message(FATAL_ERROR "install test: hyflowConfig.cmake was not installed under ${prefix}/lib/cmake/hyflow")
endif()
if(EXISTS "${prefix}/lib/cmake/hyflow/hyflow_dataprotoTargets.cmake")
  consume(consumer_dataproto -DCMAKE_DISABLE_FIND_PACKAGE_CAF=ON -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON)
endif()
if(EXISTS "${prefix}/lib/cmake/hyflow/hyflow_trackingTargets.cmake")
  consume(consumer_tracking -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON -DCMAKE_DISABLE_FIND_PACKAGE_CAF=ON
          -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON)
endif()
if(EXISTS "${prefix}/lib/cmake/hyflow/hyflow_trainerTargets.cmake")
  consume(consumer)
endif()
