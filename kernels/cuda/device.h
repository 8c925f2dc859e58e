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
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
};

// Fills `props` for device `ordinal`; returns false when it does not exist.
bool GetDeviceProps(int ordinal, DeviceProps* props);

// Free and total memory of device `ordinal` as the driver sees them now (other
// processes' use included). Creates this process's context on the device if
// it has none (that context's memory counts as used). Returns false when the
// device does not exist or cannot be queried; the current device is kept.
bool GetDeviceMemory(int ordinal, uint64_t* free_bytes, uint64_t* total_bytes);

}  // namespace flotilla::kernels::cuda
