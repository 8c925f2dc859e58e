// StepProfile: off is silent; on, a summary line every N working steps with
// every phase, idle steps left out.
#include "worker/step_profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

namespace flotilla::worker {
namespace {

void RunStep(StepProfile& p, std::chrono::microseconds engine) {
  p.Mark(StepProfile::kBetween);
  p.Mark(StepProfile::kPlan);
  p.Mark(StepProfile::kExchange);
  p.Mark(StepProfile::kSend);
  std::this_thread::sleep_for(engine);
  p.Mark(StepProfile::kEngine);
  p.Mark(StepProfile::kComplete);
}

TEST(StepProfile, OffSaysNothing) {
  StepProfile p(0);
  EXPECT_FALSE(p.on());
  for (int i = 0; i < 5; ++i) {
    RunStep(p, std::chrono::microseconds(0));
    EXPECT_EQ(p.EndStep(true), "");
  }
}

TEST(StepProfile, SummarisesEveryNWorkingSteps) {
  StepProfile p(3);
  RunStep(p, std::chrono::microseconds(200));
  EXPECT_EQ(p.EndStep(true), "");
  RunStep(p, std::chrono::microseconds(0));
  EXPECT_EQ(p.EndStep(false), "");  // idle: not counted
  RunStep(p, std::chrono::microseconds(200));
  EXPECT_EQ(p.EndStep(true), "");
  RunStep(p, std::chrono::microseconds(200));
  const std::string line = p.EndStep(true);
  ASSERT_FALSE(line.empty());
  const nlohmann::json j = nlohmann::json::parse(line)["step_profile"];
  EXPECT_EQ(j["steps"], 3);
  for (const char* phase : {"between", "plan", "exchange", "send", "engine", "complete",
                            "engine_launch", "engine_wait"}) {
    EXPECT_TRUE(j.contains(std::string(phase) + "_us_p50")) << line;
    EXPECT_TRUE(j.contains(std::string(phase) + "_us_p99")) << line;
  }
  // The engine phase slept at least 200 us in every counted step, and a
  // step's wall time holds all of its phases.
  EXPECT_GE(j["engine_us_p50"].get<double>(), 200.0);
  EXPECT_GE(j["step_us_p50"].get<double>(), j["engine_us_p50"].get<double>());
  // The next summary starts afresh.
  RunStep(p, std::chrono::microseconds(0));
  EXPECT_EQ(p.EndStep(true), "");
}

}  // namespace
}  // namespace flotilla::worker
