#include "tools/cli/info_command.h"

#include <google/protobuf/util/json_util.h>

#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "common/build_info.h"
#include "proto/common.pb.h"
#if FLOTILLA_WITH_CUDA
#include "kernels/cuda/device.h"
#endif

namespace flotilla::cli {
namespace {

struct InfoOptions {
  bool json = false;
};

void RunInfo(const InfoOptions& opts) {
  const BuildInfo& b = GetBuildInfo();
  common::BuildInfo build;
  build.set_version(b.version);
  build.set_cuda(b.cuda);
  build.set_nccl(b.nccl);
  build.set_ucx(b.ucx);
  build.set_sanitize(b.sanitize);
  build.set_build_type(b.build_type);

  std::vector<common::DeviceInfo> devices;
  common::DeviceInfo cpu;
  cpu.set_kind(common::DeviceInfo::CPU);
  cpu.set_name("host cpu x" + std::to_string(std::thread::hardware_concurrency()));
  devices.push_back(cpu);
#if FLOTILLA_WITH_CUDA
  for (int i = 0; i < kernels::cuda::DeviceCount(); ++i) {
    kernels::cuda::DeviceProps p;
    if (!kernels::cuda::GetDeviceProps(i, &p)) continue;
    common::DeviceInfo d;
    d.set_kind(common::DeviceInfo::CUDA);
    d.set_index(i);
    d.set_name(p.name);
    d.set_memory_bytes(p.memory_bytes);
    d.set_compute_capability(p.compute_capability);
    devices.push_back(d);
  }
#endif

  if (opts.json) {
    google::protobuf::util::JsonPrintOptions jo;
    jo.always_print_primitive_fields = true;
    jo.preserve_proto_field_names = true;
    std::string out, dev;
    (void)google::protobuf::util::MessageToJsonString(build, &out, jo);
    std::cout << "{\"build\":" << out << ",\"devices\":[";
    for (size_t i = 0; i < devices.size(); ++i) {
      dev.clear();
      (void)google::protobuf::util::MessageToJsonString(devices[i], &dev, jo);
      std::cout << (i ? "," : "") << dev;
    }
    std::cout << "]}\n";
    return;
  }
  std::cout << "flotilla " << b.version << " (" << b.build_type << ")\n"
            << "  cuda: " << (b.cuda ? "yes" : "no") << "  nccl: " << (b.nccl ? "yes" : "no")
            << "  ucx: " << (b.ucx ? "yes" : "no")
            << "  sanitizers: " << (b.sanitize ? "asan+ubsan" : "off") << "\n"
            << "devices:\n";
  for (const auto& d : devices) {
    std::cout << "  " << common::DeviceInfo::Kind_Name(d.kind()) << " " << d.index() << ": "
              << d.name();
    if (d.kind() == common::DeviceInfo::CUDA) {
      std::cout << ", " << d.memory_bytes() / (1 << 20) << " MiB, sm_"
                << d.compute_capability();
    }
    std::cout << "\n";
  }
}

}  // namespace

void AddInfoCommand(CLI::App& app) {
  auto opts = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand("info", "Show build features and visible devices");
  cmd->add_flag("--json", opts->json, "Print one JSON object");
  cmd->callback([opts] { RunInfo(*opts); });
}

}  // namespace flotilla::cli
