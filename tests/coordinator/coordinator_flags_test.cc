// The coordinator binary refuses communicator settings it cannot honour at
// start, before listening: the flag (or its FLOTILLA_* variable), the value and
// the accepted values in the message, a non-zero exit. And the parsers behind
// those flags, which also name enum values for logs and operators.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "common/comm_names.h"
#include "tests/run_command.h"

namespace flotilla {
namespace {

struct Ran {
  int rc = -1;
  std::string output;
};

// Runs `command` through the shell (bounded by timeout(1): a coordinator that
// accepted the value would listen and never return on its own).
Ran RunCommand(const std::string& command) {
  auto [rc, output] = testing_util::RunCommandWithStderr("timeout 20 env " + command);
  return {rc, std::move(output)};
}

const std::string kCoordinator = std::string(FLOTILLA_BIN_DIR) +
                                 "/flotilla-coordinator --model synthetic:tiny "
                                 "--listen 127.0.0.1:0 --http-listen '' ";

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CoordinatorFlags, NcclAsTheHostCommunicatorIsRefusedNamingTheFlag) {
  const Ran flag = RunCommand(kCoordinator + "--comm nccl");
  EXPECT_NE(flag.rc, 0) << flag.output;
  EXPECT_NE(flag.rc, 124) << "it started: " << flag.output;  // timeout(1)'s code
  EXPECT_TRUE(Has(flag.output, "--comm")) << flag.output;
  EXPECT_TRUE(Has(flag.output, "'nccl' is not a host communicator; accepted: ucx")) << flag.output;
  EXPECT_TRUE(Has(flag.output, "--device-transport nccl")) << flag.output;
  // What the GPU manifests used to set.
  const Ran env = RunCommand("FLOTILLA_COMM=nccl " + kCoordinator);
  EXPECT_NE(env.rc, 0) << env.output;
  EXPECT_NE(env.rc, 124) << "it started: " << env.output;
  EXPECT_TRUE(Has(env.output, "--comm")) << env.output;
  EXPECT_TRUE(Has(env.output, "accepted: ucx")) << env.output;
}

TEST(CoordinatorFlags, AnUnknownDeviceTransportIsRefusedWithTheAcceptedValues) {
  for (const std::string& command : {kCoordinator + "--device-transport nvlink",
                                    "FLOTILLA_DEVICE_TRANSPORT=nvlink " + kCoordinator}) {
    const Ran r = RunCommand(command);
    EXPECT_NE(r.rc, 0) << r.output;
    EXPECT_NE(r.rc, 124) << "it started: " << r.output;
    EXPECT_TRUE(Has(r.output, "--device-transport")) << r.output;
    EXPECT_TRUE(Has(r.output, "'nvlink' is not a device transport; accepted: auto, cuda-ipc, nccl"))
        << r.output;
  }
}

TEST(CommNames, ParseWhatTheyNameAndRefuseTheRest) {
  EXPECT_EQ(*ParseCommBackend("ucx"), cluster::COMM_BACKEND_UCX);
  EXPECT_FALSE(ParseCommBackend("none").ok());  // the coordinator's choice for W = 1 only
  EXPECT_FALSE(ParseCommBackend("").ok());
  for (cluster::DeviceTransport t :
       {cluster::DEVICE_TRANSPORT_UNSPECIFIED, cluster::DEVICE_TRANSPORT_CUDA_IPC,
        cluster::DEVICE_TRANSPORT_NCCL}) {
    EXPECT_EQ(*ParseDeviceTransport(DeviceTransportName(t)), t);
  }
  EXPECT_EQ(CommBackendName(cluster::COMM_BACKEND_NONE), "none");
  EXPECT_EQ(CommBackendName(static_cast<cluster::CommBackend>(9)), "unknown (9)");
  EXPECT_EQ(DeviceTransportName(static_cast<cluster::DeviceTransport>(7)), "unknown (7)");
  EXPECT_EQ(ParseDeviceTransport("NCCL").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flotilla
