// A kernel timeline for machines without Nsight Systems: a library the CUDA
// driver loads into any program (CUDA_INJECTION64_PATH) that records every
// kernel's start and end on the GPU through CUPTI's activity API, graph
// replays included, and writes them as CSV when the program exits:
//   CUDA_INJECTION64_PATH=$PWD/build/tools/libflotilla_kernel_trace.so
//   FLOTILLA_KERNEL_TRACE=trace.csv build/tools/engine_cuda_bench --batches 1
// (both variables set for the traced program)
// Columns: start_ns,end_ns,stream,graph_id,graph_node_id,grid,block,name
// (times from CUPTI's clock; names demangled, commas replaced). The records
// are copied out of CUPTI's buffers as they complete, so the cost inside the
// traced program is CUPTI's own (a decode step's graph replay about 8% longer
// on an H200).
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

struct Record {
  uint64_t start, end, graph_node;
  uint32_t stream, graph;
  int32_t grid, block;
  std::string name;
};

std::mutex g_mu;
std::vector<Record>* g_records = nullptr;

std::string Demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : name;
  std::free(d);
  std::replace(s.begin(), s.end(), ',', ';');
  return s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      continue;
    }
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    g_records->push_back(Record{k->start, k->end, k->graphNodeId, k->streamId, k->graphId,
                                k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                                Demangle(k->name)});
  }
  std::free(buffer);
}

void WriteTrace() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("FLOTILLA_KERNEL_TRACE");
  FILE* f = std::fopen(path != nullptr ? path : "kernel_trace.csv", "w");
  if (f == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  std::sort(g_records->begin(), g_records->end(),
            [](const Record& a, const Record& b) { return a.start < b.start; });
  std::fprintf(f, "start_ns,end_ns,stream,graph_id,graph_node_id,grid,block,name\n");
  for (const Record& r : *g_records) {
    std::fprintf(f, "%llu,%llu,%u,%u,%llu,%d,%d,%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.stream, r.graph,
                 static_cast<unsigned long long>(r.graph_node), r.grid, r.block, r.name.c_str());
  }
  std::fclose(f);
}

}  // namespace

// The entry point the CUDA driver calls once it has loaded the library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  g_records = new std::vector<Record>();
  g_records->reserve(1 << 18);
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity\n");
    return 0;
  }
  std::atexit(WriteTrace);
  return 1;
}
