#include "tools/gpu/device_util.h"

#include <algorithm>
#include <sstream>

#include "cuda_backend/cuda_check.h"

namespace exactcoll::gpu {

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  EXC_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 256)));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
  other.ptr_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Stream::Stream() { EXC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

namespace {

struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  Events() {
    EXC_CUDA_CHECK(cudaEventCreate(&start));
    EXC_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Events() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  double elapsed_us() const {
    float ms = 0;
    EXC_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) * 1000.0;
  }
};

}  // namespace

CapturedGraph::CapturedGraph(cudaStream_t stream, const std::function<void()>& enqueue) {
  cudaGraph_t graph = nullptr;
  EXC_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue();
  EXC_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  EXC_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph, 0));
  EXC_CUDA_CHECK(cudaGraphDestroy(graph));
}

CapturedGraph::~CapturedGraph() {
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
}

void CapturedGraph::launch(cudaStream_t stream) const { EXC_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

double time_graph_us(cudaStream_t stream, const std::function<void()>& enqueue, int ops, int warmup, int replays,
                     const std::function<void()>& check, LaunchCost launch_cost) {
  cudaGraph_t graph = nullptr;
  EXC_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    for (int i = 0; i < ops; ++i) enqueue();
  } catch (...) {
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    throw;
  }
  EXC_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  EXC_CUDA_CHECK(instantiated);
  std::vector<double> per_op;
  try {
    Events ev;
    for (int i = 0; i < warmup; ++i) EXC_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    for (int i = 0; i < replays; ++i) {
      if (launch_cost == LaunchCost::kHidden) EXC_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // the lead
      EXC_CUDA_CHECK(cudaEventRecord(ev.start, stream));
      EXC_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      EXC_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
      EXC_CUDA_CHECK(cudaEventSynchronize(ev.stop));
      per_op.push_back(ev.elapsed_us() / ops);
      check();
    }
  } catch (...) {
    (void)cudaGraphExecDestroy(exec);
    throw;
  }
  EXC_CUDA_CHECK(cudaGraphExecDestroy(exec));
  return median(per_op);
}

double time_eager_us(cudaStream_t stream, const std::function<void()>& enqueue, int ops, int warmup, int rounds,
                     const std::function<void()>& check, LaunchCost launch_cost) {
  Events ev;
  for (int i = 0; i < warmup; ++i) enqueue();
  std::vector<double> per_op;
  for (int r = 0; r < rounds; ++r) {
    if (launch_cost == LaunchCost::kHidden) {
      for (int i = 0; i < ops; ++i) enqueue();  // the lead round
    }
    EXC_CUDA_CHECK(cudaEventRecord(ev.start, stream));
    for (int i = 0; i < ops; ++i) enqueue();
    EXC_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
    EXC_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    per_op.push_back(ev.elapsed_us() / ops);
    check();
  }
  return median(per_op);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool parse_counts(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (const std::string& item : split_list(text)) {
    if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos) return false;
    const int64_t v = std::stoll(item);
    if (v < 1) return false;
    out->push_back(v);
  }
  return !out->empty();
}

}  // namespace exactcoll::gpu
