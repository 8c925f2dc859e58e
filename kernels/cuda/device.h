// Device discovery. Pure CUDA runtime; no Abseil, gRPC or protobuf here.
#pragma once

#include <cstdint>
#include <string>

namespace flotilla::kernels::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU.
int DeviceCount();

struct DeviceProps {
  std::string name;
  uint64_t memory_bytes = 0;
  int compute_capability = 0;  // major * 10 + minor
  int multiprocessors = 0;
};

// Fills `props` for device `ordinal`; returns false when it does not exist.
bool GetDeviceProps(int ordinal, DeviceProps* props);

}  // namespace flotilla::kernels::cuda
