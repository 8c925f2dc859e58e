// What placement knows about one registered worker: the parts of its Hello
// that decide where its rank goes and whether its shards fit. Plain data; the
// cluster manager fills it from the Hello, tests write it by hand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/cluster.pb.h"

namespace flotilla::coordinator {

enum class DeviceKind { kCpu, kCuda };

// The engine's default share of its GPU when a worker does not report one.
inline constexpr double kDefaultGpuMemoryUtilization = 0.90;

struct WorkerDesc {
  std::string worker_id;
  std::string node;           // node name; TP groups prefer one node (GPU groups must)
  int device_index = 0;       // GPU ordinal on the node (0 for CPU workers)
  uint64_t memory_bytes = 0;  // device memory; 0 = unknown (no check)
  DeviceKind kind = DeviceKind::kCpu;
  // GPU workers only; every field may be left empty or zero (not reported).
  std::string host_id;                         // the machine's identity (kernel boot id)
  std::string device_uuid;                     // the physical GPU; empty = node and ordinal
  std::string device_name;                     // e.g. "NVIDIA H100 80GB HBM3", for messages
  uint64_t free_memory_bytes = 0;              // free on the GPU when the worker registered
  double memory_utilization = 0;               // its engine's share of the GPU; 0 = the default
  // What it can join; empty = not reported (taken to be both).
  std::vector<cluster::DeviceTransport> device_transports;
};

// One key per physical GPU, so workers sharing a GPU add their needs up. The
// UUID is the identity when known: two processes may see one GPU under
// different ordinals (CUDA_VISIBLE_DEVICES).
inline std::string GpuKey(const WorkerDesc& w) {
  return w.device_uuid.empty() ? absl::StrCat(w.node, "/", w.device_index) : w.device_uuid;
}

// "GPU 3 of node 'a' (NVIDIA H100 80GB HBM3)", for messages.
inline std::string DescribeGpu(const WorkerDesc& w) {
  return absl::StrCat("GPU ", w.device_index, " of node '", w.node, "'",
                      w.device_name.empty() ? "" : absl::StrCat(" (", w.device_name, ")"));
}

}  // namespace flotilla::coordinator
