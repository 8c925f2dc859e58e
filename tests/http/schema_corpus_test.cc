// The schema corpus (schema_corpus/: zod and pydantic-style schemas as
// clients write them) against a LocalCluster on the default synthetic model,
// through the official `openai` npm client: every schema is refused by name
// or enforced, its answers validated by ajv (schema_corpus_test.js).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/run_command.h"
#include "tools/cli/local_cluster.h"

namespace flotilla {
namespace {

TEST(SchemaCorpus, EverySchemaIsEnforcedOrRefusedByName) {
  setenv("FLOTILLA_BIN_DIR", FLOTILLA_BIN_DIR, 1);
  cli::LocalClusterOptions o;
  o.workers = 1;
  o.threads_per_worker = 1;
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string model = (*cluster)->model().substr((*cluster)->model().find_last_of('/') + 1);
  const std::string dir = FLOTILLA_HTTP_TEST_DIR;
  const std::string cmd = std::string("NODE_PATH=") + FLOTILLA_NODE_MODULES + " " + FLOTILLA_NODE +
                          " " + dir + "/schema_corpus_test.js http://" +
                          (*cluster)->http_address() + "/v1 " + model + " " + dir +
                          "/schema_corpus/corpus.json";
  const auto [rc, out] = testing_util::RunCommandWithStderr(cmd);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("all ok"), std::string::npos) << out;
}

}  // namespace
}  // namespace flotilla
