#include "coordinator/cluster/placement.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace flotilla::coordinator {
namespace {

std::vector<WorkerDesc> Workers(std::vector<std::pair<std::string, int>> nodes) {
  std::vector<WorkerDesc> out;
  for (auto& [node, n] : nodes) {
    for (int d = 0; d < n; ++d) {
      WorkerDesc w;
      w.worker_id = node + "-gpu" + std::to_string(d);
      w.node = node;
      w.device_index = d;
      out.push_back(std::move(w));
    }
  }
  return out;
}

constexpr uint64_t kGiB = uint64_t{1} << 30;

// Fake Hellos of GPU workers: `n` GPUs on each node, one worker per GPU, as a
// CUDA + NCCL build reports them.
std::vector<WorkerDesc> Gpus(std::vector<std::pair<std::string, int>> nodes,
                             uint64_t memory = 141 * kGiB, std::string name = "NVIDIA H200") {
  std::vector<WorkerDesc> out = Workers(std::move(nodes));
  for (WorkerDesc& w : out) {
    w.kind = DeviceKind::kCuda;
    w.host_id = "boot-id-of-" + w.node;
    w.device_uuid = "GPU-" + w.worker_id;
    w.device_name = name;
    w.memory_bytes = memory;
    w.memory_utilization = 0.9;
    w.device_transports = {cluster::DEVICE_TRANSPORT_CUDA_IPC, cluster::DEVICE_TRANSPORT_NCCL};
  }
  return out;
}

// `n` workers on GPU 0 of one node (several processes per GPU, as tests run).
// `n` workers on one GPU, each with its share of 0.9 of it (as flotilla up
// gives them).
std::vector<WorkerDesc> SharedGpu(int n, uint64_t memory) {
  std::vector<WorkerDesc> out = Gpus({{"a", n}}, memory);
  for (WorkerDesc& w : out) {
    w.device_index = 0;
    w.device_uuid = "GPU-the-one";
    w.memory_utilization = 0.9 / n;
  }
  return out;
}

bool Has(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(ParallelConfig, RejectsImpossibleLayoutsWithReason) {
  ModelConfig m = ModelConfig::Gptoss120b();
  EXPECT_TRUE(ParallelConfig::Create(8, 8, m).ok());
  auto s = ParallelConfig::Create(6, 4, m);
  EXPECT_NE(s.status().message().find("does not divide"), std::string::npos) << s.status();
  s = ParallelConfig::Create(12, 3, m);
  EXPECT_NE(s.status().message().find("kv heads"), std::string::npos) << s.status();
  s = ParallelConfig::Create(256, 1, m);
  EXPECT_NE(s.status().message().find("experts"), std::string::npos) << s.status();
  auto ok = ParallelConfig::Create(16, 4, m);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->dp_size(), 4);
  EXPECT_EQ(ok->dp_group_of(9), 2);
  EXPECT_EQ(ok->tp_rank_of(9), 1);
  EXPECT_EQ(ok->leader_of_group(2), 8);
}

TEST(ParallelConfig, TensorParallelMoeSlicesTheIntermediateInWholeBlocks) {
  // 2880 = 90 blocks of 32: 45 + 45 over 2 ranks, 23 23 22 22 over 4, 12 x 6 + 11 x 2 over 8.
  EXPECT_EQ(IntermediateSliceOf(2880, 1, 2).begin, 1440);
  EXPECT_EQ(IntermediateSliceOf(2880, 1, 2).size, 1440);
  const int sizes4[] = {736, 736, 704, 704}, begins4[] = {0, 736, 1472, 2176};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(IntermediateSliceOf(2880, r, 4).size, sizes4[r]) << r;
    EXPECT_EQ(IntermediateSliceOf(2880, r, 4).begin, begins4[r]) << r;
  }
  int covered = 0;
  for (int r = 0; r < 8; ++r) {
    const IntermediateSlice s = IntermediateSliceOf(2880, r, 8);
    EXPECT_EQ(s.begin, covered) << r;
    EXPECT_EQ(s.size % 32, 0) << r;
    covered += s.size;
  }
  EXPECT_EQ(covered, 2880);

  ModelConfig m = ModelConfig::Gptoss120b();
  auto tp = ParallelConfig::Create(8, 4, m, MoeLayout::kTensorParallel);
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_TRUE(tp->moe_tp());
  EXPECT_EQ(tp->ep_size(), 1);
  EXPECT_NE(tp->ToString().find("moe=tp"), std::string::npos) << tp->ToString();
  // One TP rank: nothing to slice, the experts stay whole.
  EXPECT_FALSE(ParallelConfig::Create(2, 1, m, MoeLayout::kTensorParallel)->moe_tp());
  // Every rank needs one block: the tiny model's 64 = 2 blocks.
  ModelConfig tiny = ModelConfig::Tiny();
  tiny.num_attention_heads = tiny.num_key_value_heads = 4;
  auto s = ParallelConfig::Create(4, 4, tiny, MoeLayout::kTensorParallel);
  EXPECT_TRUE(Has(s.status(), "at most 2 ranks per TP group")) << s.status();
}

TEST(Placement, MoeLayoutAutomaticOrAsAsked) {
  ModelConfig m = ModelConfig::Gptoss120b();
  const struct {
    cluster::MoeLayout requested;
    DeviceKind device;
    int world, tp;
    MoeLayout chosen;
  } cases[] = {
      // Automatic: tensor parallel only for a GPU instance of one TP group.
      {cluster::MOE_LAYOUT_UNSPECIFIED, DeviceKind::kCuda, 2, 2, MoeLayout::kTensorParallel},
      {cluster::MOE_LAYOUT_UNSPECIFIED, DeviceKind::kCuda, 4, 2, MoeLayout::kExpertParallel},
      {cluster::MOE_LAYOUT_UNSPECIFIED, DeviceKind::kCuda, 2, 1, MoeLayout::kExpertParallel},
      {cluster::MOE_LAYOUT_UNSPECIFIED, DeviceKind::kCpu, 2, 2, MoeLayout::kExpertParallel},
      // As asked.
      {cluster::MOE_LAYOUT_EP, DeviceKind::kCuda, 2, 2, MoeLayout::kExpertParallel},
      {cluster::MOE_LAYOUT_TP, DeviceKind::kCpu, 4, 2, MoeLayout::kTensorParallel},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(ChooseMoeLayout(c.requested, c.device, c.world, c.tp), c.chosen)
        << "requested " << c.requested << ", world " << c.world << ", tp " << c.tp;
  }
  LayoutRequest ask;
  ask.tp_size = 2;
  ask.moe = cluster::MOE_LAYOUT_TP;
  auto p = PlanPlacement(m, Gpus({{"a", 4}}), ask);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->parallel.moe_tp());
  EXPECT_EQ(p->parallel.dp_size(), 2);
  // Each rank holds half of every expert: the bytes of 64 whole ones.
  auto ep = PlanPlacement(m, Gpus({{"a", 2}}), {2, 0, {}, cluster::MOE_LAYOUT_EP});
  ASSERT_TRUE(ep.ok()) << ep.status();
  EXPECT_FALSE(ep->parallel.moe_tp());
  EXPECT_EQ(p->bytes_per_rank[0], ep->bytes_per_rank[0]);
}

TEST(ExpertMap, ContiguousSpreadsRemainderAndCoversAll) {
  auto m = ExpertMap::Contiguous(3, 10, 4);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->ExpertsOnRank(0, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(m->ExpertsOnRank(2, 1), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(m->ExpertsOnRank(1, 3), (std::vector<int>{8, 9}));
  EXPECT_EQ(m->SlotsOnRank(0, 3), 2);
  EXPECT_EQ(m->replicas(0, 7)[0], (ExpertLocation{2, 1}));
}

TEST(ExpertMap, ValidatesExplicitMaps) {
  using L = std::vector<std::vector<std::vector<ExpertLocation>>>;
  // Expert 1 replicated on both ranks.
  auto ok = ExpertMap::Create(2, 2, L{{{{0, 0}}, {{0, 1}, {1, 1}}, {{1, 0}}}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->replicas(0, 1).size(), 2u);
  EXPECT_EQ(ok->version(), 2u);
  EXPECT_FALSE(ExpertMap::Create(2, 2, L{{{{0, 0}}, {}}}).ok());                    // no replica
  EXPECT_FALSE(ExpertMap::Create(2, 2, L{{{{0, 0}}, {{0, 0}}}}).ok());              // slot twice
  EXPECT_FALSE(ExpertMap::Create(2, 2, L{{{{0, 0}}, {{2, 0}}}}).ok());              // bad rank
  EXPECT_FALSE(ExpertMap::Create(2, 2, L{{{{0, 0}}, {{1, 0}}}, {{{0, 0}}}}).ok());  // ragged
}

// Two nodes "a" and "b" of 4 GPUs at tp 4: no TP group spans them, DP group
// 0 is on "a" and 1 on "b".
void ExpectAGroupPerNode(const Placement& p) {
  EXPECT_EQ(p.groups_spanning_nodes, 0);
  for (const RankPlacement& r : p.ranks) EXPECT_EQ(r.node, r.dp_group == 0 ? "a" : "b") << r.rank;
}

TEST(Placement, KeepsTpGroupsInsideNodes) {
  // Two nodes of 4 GPUs, tp 4: each group on one node.
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"b", 4}, {"a", 4}}), {4, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectAGroupPerNode(*p);
  for (const RankPlacement& r : p->ranks) EXPECT_EQ(r.tp_rank, r.rank % 4) << r.rank;
  EXPECT_EQ(p->expert_map.SlotsOnRank(0, 7), 16);
}

TEST(Placement, GroupsCrossNodesOnlyWhenUnavoidable) {
  // Nodes of 3 and 1 workers with tp 2: one group on node a, one across a and b.
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 3}, {"b", 1}}), {2, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->groups_spanning_nodes, 1);
  EXPECT_EQ(p->ranks[0].node, "a");
  EXPECT_EQ(p->ranks[1].node, "a");
}

TEST(Placement, AutomaticTpFitsSmallestNode) {
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 8}, {"b", 8}}), {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->parallel.tp_size(), 8);
  p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 2}, {"b", 4}}), {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->parallel.tp_size(), 2);
  EXPECT_EQ(p->groups_spanning_nodes, 0);
  p = PlanPlacement(ModelConfig::Tiny(), Workers({{"a", 3}}), {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->parallel.tp_size(), 1);  // 3 does not divide 2 kv heads
  p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 4}}), {0, 2});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->parallel.tp_size(), 2);
}

TEST(Placement, RefusesImpossibleLayouts) {
  ModelConfig m = ModelConfig::Gptoss120b();
  EXPECT_EQ(PlanPlacement(m, {}, {}).status().code(), absl::StatusCode::kFailedPrecondition);
  auto s = PlanPlacement(m, Workers({{"a", 4}}), {2, 3});
  EXPECT_NE(s.status().message().find("4 workers"), std::string::npos) << s.status();
  s = PlanPlacement(m, Workers({{"a", 6}}), {4, 0});
  EXPECT_FALSE(s.ok());
  std::vector<WorkerDesc> dup = Workers({{"a", 2}});
  dup[1].worker_id = dup[0].worker_id;
  EXPECT_NE(PlanPlacement(m, dup, {}).status().message().find("twice"), std::string::npos);
}

TEST(Placement, RefusesShardsThatDoNotFit) {
  // 120b on one 80 GB GPU: ~65 GB of weights fits; on two 24 GB GPUs it cannot.
  ModelConfig m = ModelConfig::Gptoss120b();
  std::vector<WorkerDesc> one = Workers({{"a", 1}});
  one[0].memory_bytes = 80ull << 30;
  auto p = PlanPlacement(m, one, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->bytes_per_rank[0], 55ull << 30);
  EXPECT_LT(p->bytes_per_rank[0], 70ull << 30);
  std::vector<WorkerDesc> two = Workers({{"a", 2}});
  for (auto& w : two) w.memory_bytes = 24ull << 30;
  auto s = PlanPlacement(m, two, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.status().message().find("MiB"), std::string::npos) << s.status();
}

TEST(GpuPlacement, EightGpusOfOneNodeAtEveryTp) {
  ModelConfig m = ModelConfig::Gptoss120b();
  for (int tp : {8, 4, 2, 1}) {
    auto p = PlanPlacement(m, Gpus({{"a", 8}}), {tp, 0});
    ASSERT_TRUE(p.ok()) << "tp " << tp << ": " << p.status();
    EXPECT_EQ(p->device, DeviceKind::kCuda);
    EXPECT_EQ(p->parallel.tp_size(), tp);
    EXPECT_EQ(p->parallel.dp_size(), 8 / tp);
    // Automatic MoE layout: tensor parallel for one TP group of the node.
    EXPECT_EQ(p->parallel.moe_tp(), tp == 8);
    EXPECT_EQ(p->parallel.ep_size(), tp == 8 ? 1 : 8);
    EXPECT_EQ(p->groups_spanning_nodes, 0);
    EXPECT_EQ(p->device_transport, cluster::DEVICE_TRANSPORT_CUDA_IPC);
    for (const RankPlacement& r : p->ranks) {
      EXPECT_EQ(r.device_index, r.rank);  // neighbouring GPUs form a group
      EXPECT_EQ(r.dp_group, r.rank / tp);
      EXPECT_EQ(p->expert_map.SlotsOnRank(0, r.rank), 16);  // 128 experts over 8 ranks
    }
    ASSERT_EQ(p->device_bytes_per_rank.size(), 8u);
    // Weights, 4k tokens of KV and the runtime: ~10.5 GiB at tp 8, ~12.4 at tp 1.
    EXPECT_GT(p->device_bytes_per_rank[0], 10 * kGiB);
    EXPECT_LT(p->device_bytes_per_rank[0], 13 * kGiB);
  }
  // Automatic: the whole node is one TP group.
  auto p = PlanPlacement(m, Gpus({{"a", 8}}), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->parallel.tp_size(), 8);
}

TEST(GpuPlacement, TwoNodesOfFourKeepTpGroupsInsideNodes) {
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), Gpus({{"b", 4}, {"a", 4}}), {4, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectAGroupPerNode(*p);
  for (const RankPlacement& r : p->ranks) EXPECT_EQ(r.device_index, r.tp_rank) << r.rank;
  EXPECT_EQ(p->parallel.ep_size(), 8);  // EP spans both nodes
  EXPECT_EQ(p->device_transport, cluster::DEVICE_TRANSPORT_NCCL);
}

TEST(GpuPlacement, RefusesTpGroupAcrossNodes) {
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), Gpus({{"a", 4}, {"b", 4}}), {8, 0});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(p.status(), "tp 8 would put a TP group across nodes")) << p.status();
  EXPECT_TRUE(Has(p.status(), "'a' 4, 'b' 4")) << p.status();
  EXPECT_TRUE(Has(p.status(), "(1, 2, 4)")) << p.status();
  // CPU workers of the same shape still may (today's behaviour).
  EXPECT_TRUE(PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 3}, {"b", 1}}), {2, 0}).ok());
  EXPECT_FALSE(PlanPlacement(ModelConfig::Gptoss120b(), Gpus({{"a", 3}, {"b", 1}}), {2, 0}).ok());
}

TEST(GpuPlacement, AutomaticTpTilesEveryNode) {
  // 3 + 3 GPUs: tp 2 would leave a group across the nodes, so tp 1.
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), Gpus({{"a", 3}, {"b", 3}}), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->parallel.tp_size(), 1);
  // CPU workers take tp 2 with a group spanning the nodes.
  p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 3}, {"b", 3}}), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->parallel.tp_size(), 2);
  EXPECT_EQ(p->groups_spanning_nodes, 1);
  // 6 + 2 GPUs: tp 2 tiles both.
  p = PlanPlacement(ModelConfig::Gptoss120b(), Gpus({{"a", 6}, {"b", 2}}), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->parallel.tp_size(), 2);
}

TEST(GpuPlacement, RefusesWhole120bOnA40GbGpuAndSaysWhatItNeeds) {
  ModelConfig m = ModelConfig::Gptoss120b();
  auto p = PlanPlacement(m, Gpus({{"a", 1}}, 40 * kGiB, "NVIDIA A100-SXM4-40GB"), {});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  const absl::Status& s = p.status();
  EXPECT_TRUE(Has(s, "rank 0 (worker 'a-gpu0') needs about 62.")) << s;
  EXPECT_TRUE(Has(s, "GPU 0 of node 'a' (NVIDIA A100-SXM4-40GB)")) << s;
  EXPECT_TRUE(Has(s, "128 of 128 experts per layer")) << s;
  EXPECT_TRUE(Has(s, "the GPU has 40.0 GiB, 36.0 GiB of it usable")) << s;
  EXPECT_TRUE(Has(s, "a GPU of at least 68.9 GiB")) << s;
  // An 80 GB GPU (an H100 reports 79.6 GiB) and an H200 hold it.
  EXPECT_TRUE(PlanPlacement(m, Gpus({{"a", 1}}, 81559ull << 20, "NVIDIA H100 80GB HBM3"), {}).ok());
  auto h200 = PlanPlacement(m, Gpus({{"a", 1}}), {});
  ASSERT_TRUE(h200.ok()) << h200.status();
  EXPECT_EQ(h200->device_transport, cluster::DEVICE_TRANSPORT_UNSPECIFIED);  // one rank: no peers
  // Two 40 GB GPUs split the experts: ~33.6 GiB each fits 36 GiB.
  EXPECT_TRUE(PlanPlacement(m, Gpus({{"a", 2}}, 40 * kGiB), {1, 0}).ok());
  // A lower utilization shrinks what the GPU offers.
  std::vector<WorkerDesc> low = Gpus({{"a", 1}}, 80 * kGiB);
  low[0].memory_utilization = 0.5;
  auto refused = PlanPlacement(m, low, {});
  EXPECT_TRUE(Has(refused.status(), "40.0 GiB of it usable at gpu memory utilization 0.50"))
      << refused.status();
}

TEST(GpuPlacement, WorkersSharingOneGpuAddTheirNeeds) {
  ModelConfig m = ModelConfig::Gptoss120b();
  // One 120b rank fits an 80 GiB GPU; four ranks on it (replicated embeddings
  // and runtime four times) do not.
  ASSERT_TRUE(PlanPlacement(m, SharedGpu(1, 80 * kGiB), {}).ok());
  // Each worker's --gpu-memory-utilization is its own share of the GPU
  // (flotilla up divides its flag by the workers per GPU): four shares of
  // 0.225 leave a 120b rank short on its own.
  std::vector<WorkerDesc> four = SharedGpu(4, 80 * kGiB);
  auto p = PlanPlacement(m, four, {1, 0});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Has(p.status(), "rank 0 (worker 'a-gpu0') needs about")) << p.status();
  EXPECT_TRUE(Has(p.status(), "its share of the GPU's 80.0 GiB at gpu memory utilization 0.23"))
      << p.status();
  // Shares that each fit but together exceed the GPU are refused as a sum.
  for (WorkerDesc& w : four) w.memory_utilization = 0.3;
  p = PlanPlacement(m, four, {1, 0});
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status(),
                  "ranks 0, 1, 2, 3 (workers 'a-gpu0', 'a-gpu1', 'a-gpu2', "
                  "'a-gpu3') share GPU 0 of node 'a'"))
      << p.status();
  EXPECT_TRUE(Has(p.status(), "together")) << p.status();
  // An H200 holds all four; they talk over CUDA IPC (NCCL would refuse them).
  p = PlanPlacement(m, SharedGpu(4, 141 * kGiB), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->parallel.tp_size(), 4);
  EXPECT_EQ(p->device_transport, cluster::DEVICE_TRANSPORT_CUDA_IPC);
  uint64_t sum = 0;
  for (uint64_t b : p->device_bytes_per_rank) sum += b;
  EXPECT_GT(sum, 70 * kGiB);
  // 20b: four workers on one 40 GB GPU.
  EXPECT_TRUE(PlanPlacement(ModelConfig::Gptoss20b(), SharedGpu(4, 40 * kGiB), {}).ok());
}

TEST(GpuPlacement, RefusesWhenOtherProcessesHoldTheGpu) {
  std::vector<WorkerDesc> w = Gpus({{"a", 1}}, 80 * kGiB);
  w[0].free_memory_bytes = 20 * kGiB;
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), w, {});
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status(), "only 20.0 GiB of its 80.0 GiB was free")) << p.status();
  w[0].free_memory_bytes = 79 * kGiB;
  EXPECT_TRUE(PlanPlacement(ModelConfig::Gptoss120b(), w, {}).ok());
}

TEST(GpuPlacement, ChoosesTheDeviceTransport) {
  ModelConfig m = ModelConfig::Gptoss120b();
  // One node: CUDA IPC; a worker without it moves the node to NCCL.
  std::vector<WorkerDesc> one_node = Gpus({{"a", 4}});
  EXPECT_EQ(PlanPlacement(m, one_node, {})->device_transport, cluster::DEVICE_TRANSPORT_CUDA_IPC);
  one_node[2].device_transports = {cluster::DEVICE_TRANSPORT_NCCL};
  EXPECT_EQ(PlanPlacement(m, one_node, {})->device_transport, cluster::DEVICE_TRANSPORT_NCCL);
  // Two nodes: NCCL, which every rank must offer.
  std::vector<WorkerDesc> two_nodes = Gpus({{"a", 2}, {"b", 2}});
  EXPECT_EQ(PlanPlacement(m, two_nodes, {2, 0})->device_transport, cluster::DEVICE_TRANSPORT_NCCL);
  two_nodes[3].device_transports = {cluster::DEVICE_TRANSPORT_CUDA_IPC};
  auto p = PlanPlacement(m, two_nodes, {2, 0});
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status(), "rank 3 (worker 'b-gpu1') cannot use nccl (it offers: cuda-ipc)"))
      << p.status();
  EXPECT_TRUE(Has(p.status(), "span 2 nodes")) << p.status();
  // Two ranks on one GPU across nodes: NCCL allows one rank per GPU.
  std::vector<WorkerDesc> shared = Gpus({{"a", 2}, {"b", 2}});
  shared[1].device_index = 0;
  shared[1].device_uuid = shared[0].device_uuid;
  shared[0].memory_utilization = shared[1].memory_utilization = 0.45;
  p = PlanPlacement(m, shared, {2, 0});
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status(), "nccl allows one rank per GPU")) << p.status();
  // CPU workers have no device transport.
  EXPECT_EQ(PlanPlacement(m, Workers({{"a", 2}}), {})->device_transport,
            cluster::DEVICE_TRANSPORT_UNSPECIFIED);
}

TEST(GpuPlacement, ARequestedDeviceTransportIsKeptOrRefusedWithTheReason) {
  ModelConfig m = ModelConfig::Gptoss120b();
  LayoutRequest nccl{
      .tp_size = 2, .dp_groups = 0, .device_transport = cluster::DEVICE_TRANSPORT_NCCL};
  // One node would get CUDA IPC; asked for NCCL, it gets NCCL.
  EXPECT_EQ(PlanPlacement(m, Gpus({{"a", 4}}), nccl)->device_transport,
            cluster::DEVICE_TRANSPORT_NCCL);
  LayoutRequest ipc = nccl;
  ipc.device_transport = cluster::DEVICE_TRANSPORT_CUDA_IPC;
  auto p = PlanPlacement(m, Gpus({{"a", 2}, {"b", 2}}), ipc);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status(), "device transport cuda-ipc cannot link the GPU ranks")) << p.status();
  EXPECT_TRUE(Has(p.status(), "span 2 nodes")) << p.status();
  std::vector<WorkerDesc> without_nccl = Gpus({{"a", 4}});
  without_nccl[1].device_transports = {cluster::DEVICE_TRANSPORT_CUDA_IPC};
  p = PlanPlacement(m, without_nccl, nccl);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status(), "cannot use nccl (it offers: cuda-ipc)")) << p.status();
  // CPU ranks have no device transport, whatever was asked for.
  EXPECT_EQ(PlanPlacement(m, Workers({{"a", 2}}), nccl)->device_transport,
            cluster::DEVICE_TRANSPORT_UNSPECIFIED);
}

TEST(GpuPlacement, RefusesMixedDevicesAndAmbiguousNodes) {
  ModelConfig m = ModelConfig::Gptoss120b();
  std::vector<WorkerDesc> mixed = Gpus({{"a", 2}});
  mixed[1].kind = DeviceKind::kCpu;
  auto p = PlanPlacement(m, mixed, {});
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status(), "the workers mix devices: 'a-gpu0' runs on cuda and 'a-gpu1' on cpu"))
      << p.status();
  // Two machines both calling themselves "a" cannot share GPU memory.
  std::vector<WorkerDesc> twins = Gpus({{"a", 2}});
  twins[1].host_id = "another-machine";
  p = PlanPlacement(m, twins, {});
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status(), "both say node 'a' but run on different machines")) << p.status();
}

TEST(GpuPlacement, NewcomersTakeRanksOnlyWhereTheyFit) {
  ModelConfig m = ModelConfig::Gptoss120b();
  std::vector<WorkerDesc> workers = Gpus({{"a", 2}, {"b", 2}});
  auto p = PlanPlacement(m, workers, {2, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<WorkerDesc> holders = workers;
  holders[1].worker_id = "a-new";
  EXPECT_TRUE(CheckRankHolders(m, *p, holders).ok());
  holders[1].node = "c";  // its TP group is on node a
  EXPECT_TRUE(Has(CheckRankHolders(m, *p, holders), "rank 1's TP group is on node 'a'"));
  holders[1] = workers[1];
  holders[1].kind = DeviceKind::kCpu;
  EXPECT_TRUE(Has(CheckRankHolders(m, *p, holders), "runs on cpu"));
  holders[1] = workers[1];
  holders[1].memory_bytes = 16 * kGiB;
  EXPECT_EQ(CheckRankHolders(m, *p, holders).code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace flotilla::coordinator
