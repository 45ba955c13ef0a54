#pragma once
// For io/ only: parallel HDF5 needs the raw MPI_Comm to open files over MPI-IO.
#include <mpi.h>

#include <cstring>

#include "comm/comm.hpp"

namespace caviar {

inline MPI_Comm native(const Comm& comm) {
  MPI_Comm c;
  std::memcpy(&c, comm.native_handle(), sizeof(MPI_Comm));
  return c;
}

}  // namespace caviar
