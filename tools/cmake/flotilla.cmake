# Helpers shared by every CMakeLists.txt in the project.

# Test code in a Release build is compiled at -O1 instead of -O3: about 30%
# less compile time per test source (measured: cluster_manager_test.cc 10.9 ->
# 7.8 s of CPU, api_auth_test.cc 23.7 -> 16.5 s), while the libraries under
# test keep the build type's level: what is tested is what ships, and the
# tests' work runs mostly in those libraries.
set(FLOTILLA_TEST_CXX_OPTIMIZATION $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release>>:-O1>)

# Unity builds. Parsing headers is most of what compiling one of our sources
# costs (gcc -ftime-report, Release: tests/cluster/cluster_test.cc spends 96%
# in parsing and template instantiation, 4% optimising at -O1;
# coordinator/grpc/services.cc 64% and 36% at -O3), and the sources of one
# target include mostly the same headers (gRPC, Protobuf, Abseil, the
# project's own). So the sources of the targets below are compiled as one
# translation unit per target (FLOTILLA_UNITY_BATCH 0: no batch limit), and
# those headers are parsed once per target. One unit per target, not batches
# of 8, also compiles the templates its sources share (gRPC handlers, json,
# std::function, CLI11) once instead of once per batch: a 2-job build of the
# 16 targets that had more than one batch took 433 s of CPU instead of 636
# (flotilla_cli 81.5 -> 48.8 s, flotilla_worker_runtime 68.8 -> 31.0 s).
# A target is listed once its
# sources share a unit cleanly: no two of them define the same name in an
# anonymous namespace (two files' `Invalid` helpers collide; rename one or
# share it), and no class of external linkage holds a type of one (gcc's
# -Wsubobject-linkage: HttpTransport::Impl's members are of the named
# namespace http_transport_detail for that reason).
# A folder's CPU test sources are one test program for the same reason
# (tests/README.md). With FLOTILLA_UNITY=OFF every source compiles on its own
# (what shows a header that forgot an include).
# Precompiled headers on top of the batches were measured and left out: one
# gRPC / Protobuf / Abseil / json (and GoogleTest) header per kind of target
# (tests at -O1, programs, unity libraries; GCC refuses one built with a
# macro such as _REENTRANT its user lacks, so every C++ source also needed
# -pthread) took one unit alone from 24.5 to 14.2 s of CPU on an idle
# machine, but a whole 2-job build of the same 165 objects from 1,414 to
# 1,553 s (each unit loads the ~250 MB header; units that include little of
# it lost most: flotilla_grammar 17.7 -> 22.5 s).
set(FLOTILLA_UNITY_TARGETS
  flotilla_common flotilla_grammar flotilla_harmony flotilla_model flotilla_engine_cpu
  flotilla_engine_cuda flotilla_worker_runtime flotilla_cluster flotilla_coordinator flotilla_openai flotilla_http
  flotilla_cli common_test engine_test grammar_test worker_runtime_test cluster_test
  worker_parts_test worker_speculative_test harmony_test cli_test http_test coordinator_test
  grpc_test net_test model_test tokenizer_test parallel_device_context_test comm_local_test
  proto_test kernels_cpu_test kernels_cuda_test cuda_engine_test flotilla_command_line
  flotilla_logging flotilla_ctl flotilla_placement flotilla_parallel_cuda flotilla_tokenizer
  flotilla_comm flotilla_comm_nccl flotilla_common_proto flotilla_common_grpc flotilla_kernels_cpu)
set(FLOTILLA_UNITY_BATCH 0)

# Project defaults for a target: warnings (as errors), the repository root on
# the include path, so headers are included as "common/status.h", and the
# unity build (above) for the targets listed there.
function(flotilla_target_defaults target)
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL "INTERFACE_LIBRARY")
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR})
    return()
  endif()
  if(FLOTILLA_UNITY AND target IN_LIST FLOTILLA_UNITY_TARGETS)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON
                          UNITY_BUILD_BATCH_SIZE ${FLOTILLA_UNITY_BATCH})
  endif()
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${FLOTILLA_CXX_WARNINGS}>)
  if(FLOTILLA_CUDA)
    set(_cuda_flags -Xcompiler=-Wall --expt-relaxed-constexpr)
    if(FLOTILLA_WERROR)
      list(APPEND _cuda_flags -Werror=all-warnings)
    endif()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${_cuda_flags}>)
  endif()
endfunction()

# flotilla_add_library(name [STATIC|INTERFACE] SOURCES ... [DEPS ...] [PRIVATE_DEPS ...])
function(flotilla_add_library name)
  cmake_parse_arguments(ARG "INTERFACE" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  if(ARG_INTERFACE)
    add_library(${name} INTERFACE)
    flotilla_target_defaults(${name})
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
    return()
  endif()
  add_library(${name} STATIC ${ARG_SOURCES})
  flotilla_target_defaults(${name})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
endfunction()

# flotilla_add_proto(name PROTO file.proto [GRPC] [DECODING header.h] [DEPS other_proto ...])
# Compiles one .proto into the library ${name}_proto. Generated headers are
# included as "proto/<file>.pb.h". With GRPC the service stubs are generated too;
# DECODING names a header (under the source root) the generated .grpc.pb.h
# includes first (proto/request_decoding.h says why).
function(flotilla_add_proto name)
  cmake_parse_arguments(ARG "GRPC" "PROTO;DECODING" "DEPS" ${ARGN})
  get_filename_component(_abs ${ARG_PROTO} ABSOLUTE)
  get_filename_component(_stem ${ARG_PROTO} NAME_WE)
  set(_out ${PROJECT_BINARY_DIR}/gen/proto)
  file(MAKE_DIRECTORY ${_out})
  set(_srcs ${_out}/${_stem}.pb.cc)
  set(_hdrs ${_out}/${_stem}.pb.h)
  set(_args --proto_path=${PROJECT_SOURCE_DIR} --cpp_out=${PROJECT_BINARY_DIR}/gen)
  if(ARG_GRPC)
    list(APPEND _srcs ${_out}/${_stem}.grpc.pb.cc)
    list(APPEND _hdrs ${_out}/${_stem}.grpc.pb.h)
    set(_grpc_out ${PROJECT_BINARY_DIR}/gen)
    if(ARG_DECODING)
      set(_grpc_out additional_header_includes=${ARG_DECODING}:${_grpc_out})
    endif()
    list(APPEND _args --grpc_out=${_grpc_out}
         --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>)
  endif()
  add_custom_command(
    OUTPUT ${_srcs} ${_hdrs}
    COMMAND protobuf::protoc ${_args} ${_abs}
    DEPENDS ${_abs} protobuf::protoc
    COMMENT "protoc ${ARG_PROTO}"
    VERBATIM)
  add_library(${name}_proto STATIC ${_srcs})
  target_include_directories(${name}_proto PUBLIC ${PROJECT_BINARY_DIR}/gen ${PROJECT_SOURCE_DIR})
  # Generated code is not ours to fix: no project warnings on it. Nor
  # UBSan's checks in the sanitizer and fuzz builds: they triple its compile
  # time (cluster.pb.cc under clang: 17.7 s of CPU with them, 7.9 s with ASan
  # and the fuzzer's coverage alone, which stay). The fuzz build, which CI
  # runs beside the tests at the lowest priority, also compiles it without
  # optimisation (4.6 s).
  target_compile_options(${name}_proto PRIVATE -w)
  if(FLOTILLA_SANITIZE)
    target_compile_options(${name}_proto PRIVATE -fno-sanitize=undefined)
  endif()
  if(FLOTILLA_FUZZ)
    target_compile_options(${name}_proto PRIVATE -O0)
  endif()
  target_link_libraries(${name}_proto PUBLIC protobuf::libprotobuf ${ARG_DEPS})
  if(ARG_GRPC)
    target_link_libraries(${name}_proto PUBLIC gRPC::grpc++)
  endif()
endfunction()

# flotilla_add_program(name SOURCES ... [LIBS ...]): an executable with the
# project's compile settings (benchmarks, examples).
function(flotilla_add_program name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  flotilla_target_defaults(${name})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS})
endfunction()

# flotilla_add_test(name SOURCES ... [LIBS ...] [LABELS gpu|multigpu ...]
#                   [SLOW_TESTS Suite.Test ...] [TIMEOUT s] [CLUSTER] [NODE]
#                   [SERIAL] [PROGRAMS target ...] [DEFINITIONS NAME=VALUE ...])
# One gtest binary; each TEST becomes its own ctest entry carrying LABELS, so
# `ctest -L gpu` or `ctest -LE slow` select them. SLOW_TESTS names the tests
# (Suite.Test, or the start of a parameterized name) that also get the `slow`
# label: end-to-end checks of behaviour about time (deadlines, timeouts, stays
# responsive), which assert generous bounds only. CLUSTER: the test starts
# local clusters (FLOTILLA_BIN_DIR names where the coordinator and the worker
# are built, and they are built first); NODE: it runs node clients
# (FLOTILLA_NODE, FLOTILLA_NODE_MODULES); PROGRAMS: further targets built
# before it; DEFINITIONS: further compile definitions. SERIAL: its tests run
# with no other test beside them (ctest's RUN_SERIAL), for those that compare
# times measured on the machine, which a test running beside them (a soak
# that restarts workers) would move.
function(flotilla_add_test name)
  cmake_parse_arguments(ARG "CLUSTER;NODE;SERIAL" "TIMEOUT"
                        "SOURCES;LIBS;LABELS;SLOW_TESTS;PROGRAMS;DEFINITIONS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  flotilla_target_defaults(${name})
  target_compile_options(${name} PRIVATE ${FLOTILLA_TEST_CXX_OPTIMIZATION})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  if(ARG_CLUSTER)
    list(APPEND ARG_DEFINITIONS FLOTILLA_BIN_DIR="${FLOTILLA_BIN_DIR}")
    list(APPEND ARG_PROGRAMS flotilla-coordinator flotilla-worker)
  endif()
  if(ARG_NODE)
    list(APPEND ARG_DEFINITIONS FLOTILLA_NODE="${FLOTILLA_NODE}"
         FLOTILLA_NODE_MODULES="${FLOTILLA_NODE_MODULES}")
  endif()
  if(ARG_DEFINITIONS)
    target_compile_definitions(${name} PRIVATE ${ARG_DEFINITIONS})
  endif()
  if(ARG_PROGRAMS)
    add_dependencies(${name} ${ARG_PROGRAMS})
  endif()
  set(_properties TIMEOUT ${ARG_TIMEOUT})
  if(ARG_SERIAL)
    list(APPEND _properties RUN_SERIAL ON)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    PROPERTIES ${_properties})
  if(ARG_LABELS OR ARG_SLOW_TESTS)
    _flotilla_test_labels(${name} "${ARG_LABELS}" "${ARG_SLOW_TESTS}")
  endif()
endfunction()

# gtest_discover_tests flattens its PROPERTIES, so a list of labels would
# lose all but the first; a file ctest reads after the discovered tests sets
# them, and `slow` on each test whose name starts with one of `slow_tests`
# (parameterized names end in their value), warning of one that matches none.
function(_flotilla_test_labels name labels slow_tests)
  set(_content "if(DEFINED ${name}_TESTS)\n")
  if(labels)
    string(APPEND _content
      "  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${labels}\")\n")
  endif()
  set(_slow_labels ${labels} slow)
  foreach(_slow IN LISTS slow_tests)
    string(APPEND _content
      "  set(_found OFF)\n"
      "  foreach(_test IN LISTS ${name}_TESTS)\n"
      "    string(FIND \"\${_test}\" [==[${_slow}]==] _at)\n"
      "    if(_at EQUAL 0)\n"
      "      set_tests_properties(\"\${_test}\" PROPERTIES LABELS \"${_slow_labels}\")\n"
      "      set(_found ON)\n"
      "    endif()\n"
      "  endforeach()\n"
      "  if(NOT _found)\n"
      "    message(WARNING [==[${name}: no test ${_slow} to label slow]==])\n"
      "  endif()\n")
  endforeach()
  string(APPEND _content "endif()\n")
  set(_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake")
  file(WRITE "${_file}" "${_content}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${_file}")
endfunction()
