# caviar_add_mpi_test(NAME target RANKS 1 2 4 [TIMEOUT s]): registers one ctest per rank count.
# Open MPI needs --oversubscribe beyond the 2 cores here, and --allow-run-as-root under CI (root).
function(caviar_add_mpi_test)
  cmake_parse_arguments(ARG "" "NAME;TARGET;TIMEOUT" "RANKS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  foreach(np IN LISTS ARG_RANKS)
    set(test_name ${ARG_NAME}.np${np})
    add_test(NAME ${test_name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                     --allow-run-as-root ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${ARG_TARGET}>
                     ${MPIEXEC_POSTFLAGS})
    # One OpenMP thread per rank: ranks x threads must not exceed what ctest -j expects.
    set_tests_properties(${test_name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} PROCESSORS ${np}
                         ENVIRONMENT "OMP_NUM_THREADS=1" LABELS mpi)
  endforeach()
endfunction()
