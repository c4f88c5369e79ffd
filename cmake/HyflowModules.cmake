# The module graph (docs/architecture.md, "Modules and dependency direction") in one place:
# the build order, which hyflow modules each module links, and the packages each one needs.
# The top-level build closes HYFLOW_MODULES over these edges, HyflowDependencies finds only the
# packages of the selected modules, and the installed hyflowConfig.cmake loads a requested
# component with exactly its modules and packages.

# Build order: a module only links modules listed before it.
set(HYFLOW_ALL_MODULES core dataproto actors cluster algos parallel tokenizers cuda models inference rollout workers tracking
    trainer apps)

set(HYFLOW_MODULE_DEPS_core "")
set(HYFLOW_MODULE_DEPS_dataproto core)
set(HYFLOW_MODULE_DEPS_actors dataproto)
set(HYFLOW_MODULE_DEPS_cluster actors)
set(HYFLOW_MODULE_DEPS_parallel algos)
set(HYFLOW_MODULE_DEPS_tokenizers dataproto)
set(HYFLOW_MODULE_DEPS_cuda core)
set(HYFLOW_MODULE_DEPS_models cuda dataproto)
set(HYFLOW_MODULE_DEPS_inference models cuda)
set(HYFLOW_MODULE_DEPS_algos dataproto)
set(HYFLOW_MODULE_DEPS_rollout inference models)
set(HYFLOW_MODULE_DEPS_workers actors rollout inference models algos parallel)
set(HYFLOW_MODULE_DEPS_tracking core)
set(HYFLOW_MODULE_DEPS_trainer workers tokenizers algos cluster tracking)
set(HYFLOW_MODULE_DEPS_apps trainer cluster)

# Packages per module, as find_package()/find_dependency() arguments with "|" for spaces.
set(HYFLOW_MODULE_PACKAGES_core "nlohmann_json|3.10")
set(HYFLOW_MODULE_PACKAGES_dataproto "Threads;Torch;cereal")
set(HYFLOW_MODULE_PACKAGES_actors "CAF|0.17")
set(HYFLOW_MODULE_PACKAGES_cluster "CAF|0.17;OpenSSL")
set(HYFLOW_MODULE_PACKAGES_parallel "Torch")
set(HYFLOW_MODULE_PACKAGES_tokenizers "Torch;ICU|COMPONENTS|uc|i18n")
set(HYFLOW_MODULE_PACKAGES_cuda "Torch")
set(HYFLOW_MODULE_PACKAGES_models "Torch")
set(HYFLOW_MODULE_PACKAGES_inference "Torch;OpenMP|COMPONENTS|CXX")
set(HYFLOW_MODULE_PACKAGES_algos "Torch")
set(HYFLOW_MODULE_PACKAGES_rollout "Torch")
set(HYFLOW_MODULE_PACKAGES_workers "Torch")
set(HYFLOW_MODULE_PACKAGES_trainer "Boost|COMPONENTS|program_options;yaml-cpp")
set(HYFLOW_MODULE_PACKAGES_apps "Boost|COMPONENTS|program_options")
if(HYFLOW_CUDA)
  list(APPEND HYFLOW_MODULE_PACKAGES_cuda CUDAToolkit)
  list(APPEND HYFLOW_MODULE_PACKAGES_cluster CUDAToolkit)
  list(APPEND HYFLOW_MODULE_PACKAGES_parallel CUDAToolkit NCCL)
endif()

# hyflow_module_closure(<out> <modules>...): the modules with everything they link, in build
# order. FATAL_ERROR naming an unknown module.
function(hyflow_module_closure out)
  set(todo ${ARGN})
  set(seen "")
  while(todo)
    list(POP_FRONT todo m)
    if(NOT m IN_LIST HYFLOW_ALL_MODULES)
      string(REPLACE ";" ", " known "${HYFLOW_ALL_MODULES}")
      message(FATAL_ERROR "hyflow: unknown module '${m}' in HYFLOW_MODULES (modules: ${known})")
    endif()
    if(NOT m IN_LIST seen)
      list(APPEND seen ${m})
      list(APPEND todo ${HYFLOW_MODULE_DEPS_${m}})
    endif()
  endwhile()
  set(ordered "")
  foreach(m IN LISTS HYFLOW_ALL_MODULES)
    if(m IN_LIST seen)
      list(APPEND ordered ${m})
    endif()
  endforeach()
  set(${out} ${ordered} PARENT_SCOPE)
endfunction()

# hyflow_module_packages(<out> <modules>...): the distinct package specs of the modules.
function(hyflow_module_packages out)
  set(specs "")
  foreach(m IN LISTS ARGN)
    foreach(spec IN LISTS HYFLOW_MODULE_PACKAGES_${m})
      if(NOT spec IN_LIST specs)
        list(APPEND specs "${spec}")
      endif()
    endforeach()
  endforeach()
  set(${out} ${specs} PARENT_SCOPE)
endfunction()
