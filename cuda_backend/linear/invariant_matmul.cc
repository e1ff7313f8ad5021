#include "cuda_backend/linear/invariant_matmul.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_backend/overlap/cublaslt_api.h"

namespace exactcoll::cuda::linear {
namespace {

// The cuBLASLt functions this file needs beyond CublasLtApi's (batched layouts, capabilities),
// looked up in the library CublasLtApi loaded (dlopen of the same name returns the same handle).
struct MoreLt {
  decltype(&::cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute = nullptr;
  decltype(&::cublasLtMatmulAlgoCapGetAttribute) MatmulAlgoCapGetAttribute = nullptr;
};

const CublasLtApi& lt() {
  try {
    return CublasLtApi::get();
  } catch (const CublasError& e) {
    throw MatmulUnavailable(e.what());
  }
}

const MoreLt& more() {
  static const MoreLt api = [] {
    const CublasLtApi& base = lt();
    void* library = dlopen(base.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) throw MatmulUnavailable("cannot reopen " + base.path);
    MoreLt m;
    m.MatrixLayoutSetAttribute =
        reinterpret_cast<decltype(m.MatrixLayoutSetAttribute)>(dlsym(library, "cublasLtMatrixLayoutSetAttribute"));
    m.MatmulAlgoCapGetAttribute =
        reinterpret_cast<decltype(m.MatmulAlgoCapGetAttribute)>(dlsym(library, "cublasLtMatmulAlgoCapGetAttribute"));
    if (m.MatrixLayoutSetAttribute == nullptr || m.MatmulAlgoCapGetAttribute == nullptr) {
      throw MatmulUnavailable(base.path +
                              " lacks cublasLtMatrixLayoutSetAttribute or cublasLtMatmulAlgoCapGetAttribute");
    }
    return m;  // the library stays loaded for the life of the process
  }();
  return api;
}

cudaDataType_t data_type(DType d) { return d == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F; }

std::string shape_text(const MatmulShape& s) {
  return "m=" + std::to_string(s.m) + " k=" + std::to_string(s.k) + " n=" + std::to_string(s.n) +
         " batch=" + std::to_string(s.batch);
}

// The matmul descriptor and the three layouts of the column-major view (lt_matmul.h): cuBLAS's "A"
// is our B as [n, k] (ld ldb), its "B" our A as [k, m] (ld lda), its C our C as [n, m] (ld ldc);
// batched with our strides where batch > 1.
struct Descriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;

  Descriptors(DType dtype, const MatmulShape& s) {
    const cudaDataType_t t = data_type(dtype);
    check_cublas(lt().MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t no = CUBLAS_OP_N;
    check_cublas(lt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &no, sizeof no),
                 "cublasLtMatmulDescSetAttribute(TRANSA)");
    check_cublas(lt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof no),
                 "cublasLtMatmulDescSetAttribute(TRANSB)");
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    check_cublas(lt().MatrixLayoutCreate(&a, t, u(s.n), u(s.k), s.ldb), "cublasLtMatrixLayoutCreate(B^T)");
    check_cublas(lt().MatrixLayoutCreate(&b, t, u(s.k), u(s.m), s.lda), "cublasLtMatrixLayoutCreate(A^T)");
    check_cublas(lt().MatrixLayoutCreate(&c, t, u(s.n), u(s.m), s.ldc), "cublasLtMatrixLayoutCreate(C^T)");
    if (s.batch > 1) {
      batched(a, s.batch, s.stride_b);
      batched(b, s.batch, s.stride_a);
      batched(c, s.batch, s.stride_c);
    }
  }
  ~Descriptors() {
    if (c) lt().MatrixLayoutDestroy(c);
    if (b) lt().MatrixLayoutDestroy(b);
    if (a) lt().MatrixLayoutDestroy(a);
    if (desc) lt().MatmulDescDestroy(desc);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  // Whether `algo` runs this shape with no workspace.
  bool runs(cublasLtHandle_t handle, const cublasLtMatmulAlgo_t& algo) const {
    cublasLtMatmulHeuristicResult_t result{};
    if (lt().MatmulAlgoCheck(handle, desc, a, b, c, c, &algo, &result) != CUBLAS_STATUS_SUCCESS) return false;
    return result.state == CUBLAS_STATUS_SUCCESS && result.workspaceSize == 0;
  }

 private:
  static void batched(cublasLtMatrixLayout_t layout, int64_t count, int64_t stride) {
    const int32_t n = static_cast<int32_t>(count);
    check_cublas(more().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n),
                 "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    check_cublas(
        more().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
        "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
  }
};

MatmulShape packed(int64_t m, int64_t k, int64_t n, int64_t batch) {
  MatmulShape s;
  s.m = m, s.k = k, s.n = n, s.batch = batch;
  s.lda = k, s.ldb = n, s.ldc = n;
  s.stride_a = m * k, s.stride_b = k * n, s.stride_c = m * n;
  return s;
}

template <class V>
bool config_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t which, V* value) {
  size_t written = 0;
  *value = V{};
  return lt().MatmulAlgoConfigGetAttribute(&algo, which, value, sizeof *value, &written) == CUBLAS_STATUS_SUCCESS;
}

template <class V>
bool cap_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t which, V* value) {
  size_t written = 0;
  *value = V{};
  return more().MatmulAlgoCapGetAttribute(&algo, which, value, sizeof *value, &written) == CUBLAS_STATUS_SUCCESS;
}

// "algo 66 tile 20 splitK 1 reduction 0 swizzle 0 custom 0 stages 8 inner 0 cluster 2".
std::string config_text(const cublasLtMatmulAlgo_t& algo) {
  int32_t id = -1, split = 0;
  uint32_t tile = 0, reduction = 0, swizzle = 0, custom = 0, stages = 0;
  uint16_t inner = 0, cluster = 0;
  config_attr(algo, CUBLASLT_ALGO_CONFIG_ID, &id);
  config_attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile);
  config_attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split);
  config_attr(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction);
  config_attr(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle);
  config_attr(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom);
  config_attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages);
  config_attr(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner);
  config_attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster);
  return "algo " + std::to_string(id) + " tile " + std::to_string(tile) + " splitK " + std::to_string(split) +
         " reduction " + std::to_string(reduction) + " swizzle " + std::to_string(swizzle) + " custom " +
         std::to_string(custom) + " stages " + std::to_string(stages) + " inner " + std::to_string(inner) +
         " cluster " + std::to_string(cluster);
}

// Why `algo` may not be pinned, or "" when it may (the filters of the header).
std::string unpinnable(cublasLtHandle_t handle, DType dtype, int64_t k, const cublasLtMatmulAlgo_t& algo) {
  int32_t split = 0;
  uint32_t reduction = 0;
  if (!config_attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split)) return "split-K unreadable";
  if (split > 1) return "split-K " + std::to_string(split);
  if (!config_attr(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction)) return "reduction unreadable";
  if (reduction != CUBLASLT_REDUCTION_SCHEME_NONE) return "reduction scheme " + std::to_string(reduction);
  for (auto which : {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES,
                     CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES}) {
    uint32_t align = 0;
    // An algorithm that does not say is taken to need what the heuristic was told (16 bytes).
    if (cap_attr(algo, which, &align) && align > 16) return "needs " + std::to_string(align) + "-byte alignment";
  }
  // Probe shapes, one matrix each: the smallest decode row, a small prefill, odd sizes. Neither
  // batched layouts nor large products are required: the H100 runs of 2026-11-27 (cuBLASLt 13)
  // found every candidate (all sm90 "algo 66") refusing a batched m = 1 layout, and refusing
  // m = 4096 x n = 16384 without a workspace; run() computes such products in blocks, each with
  // the same configuration (header).
  const MatmulShape probes[] = {packed(1, k, 8, 1), packed(1, k, 4096, 1), packed(17, k, 136, 1),
                                packed(256, k, 4096, 1)};
  for (const MatmulShape& probe : probes) {
    Descriptors d(dtype, probe);
    if (!d.runs(handle, algo)) return "cannot run " + shape_text(probe);
  }
  return "";
}

// Whether the configuration runs a batch of leaves in one call at decode (m = 1) and at prefill.
std::string batch_text(cublasLtHandle_t handle, DType dtype, int64_t k, const cublasLtMatmulAlgo_t& algo) {
  const bool decode = Descriptors(dtype, packed(1, k, 4096, 8)).runs(handle, algo);
  const bool prefill = Descriptors(dtype, packed(64, k, 4096, 8)).runs(handle, algo);
  return std::string("batched m=1 ") + (decode ? "native" : "looped") + ", m=64 " + (prefill ? "native" : "looped");
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (*end != '\0' || v < 0) throw MatmulRefused(std::string(name) + " must be an integer >= 0, got " + text);
  return v;
}

std::pair<int64_t, int64_t> reference_shape() {
  const char* text = std::getenv("EXACTCOLL_INVARIANT_MATMUL_REFERENCE");
  if (text == nullptr || *text == '\0') return {kReferenceM, kReferenceN};
  long long m = 0, n = 0;
  char tail = 0;
  if (std::sscanf(text, "%lldx%lld%c", &m, &n, &tail) != 2 || m < 1 || n < 8 || m > 65536 || n > 65536) {
    throw MatmulRefused(std::string("EXACTCOLL_INVARIANT_MATMUL_REFERENCE must be MxN (1..65536 x 8..65536), got ") +
                        text);
  }
  return {m, n};
}

}  // namespace

// ---- the per-device object --------------------------------------------------------------------------

namespace {

// How run() computes one shape: one call, or blocks of rows and columns of C (one call each, for
// every batch entry in turn), all with the pinned configuration.
struct Block {
  std::shared_ptr<const Descriptors> d;
  int64_t row = 0, col = 0;
};
struct Plan {
  std::vector<Block> blocks;
  bool per_entry = false;  // blocks run once per batch entry (strides added), not batched
};

// Rounds half of n up to a multiple of 8 (block columns keep C's and B's 16-byte alignment).
int64_t half_columns(int64_t n) { return std::max<int64_t>(8, (n / 2 + 7) / 8 * 8); }

// The plan for shape s under algo: the whole product in one call if the configuration runs it
// without workspace; else one matrix per call, in the largest blocks (halving columns down to 1024,
// then rows down to 64, then columns down to 8) that it runs. Empty when nothing runs.
Plan make_plan(cublasLtHandle_t handle, DType dtype, const MatmulShape& s, const cublasLtMatmulAlgo_t& algo) {
  Plan plan;
  auto whole = std::make_shared<const Descriptors>(dtype, s);
  if (whole->runs(handle, algo)) {
    plan.blocks.push_back({whole, 0, 0});
    return plan;
  }
  plan.per_entry = s.batch > 1;
  MatmulShape one = s;
  one.batch = 1;
  int64_t mb = s.m, nb = s.n;
  auto block_shape = [&](int64_t m, int64_t n) {
    MatmulShape b = one;
    b.m = m, b.n = n;
    return b;
  };
  while (!Descriptors(dtype, block_shape(mb, nb)).runs(handle, algo)) {
    if (nb > 1024) {
      nb = half_columns(nb);
    } else if (mb > 64) {
      mb = (mb + 1) / 2;
    } else if (nb > 8) {
      nb = half_columns(nb);
    } else {
      return {};
    }
  }
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<const Descriptors>> made;
  for (int64_t row = 0; row < s.m; row += mb) {
    for (int64_t col = 0; col < s.n; col += nb) {
      const int64_t m = std::min(mb, s.m - row), n = std::min(nb, s.n - col);
      auto& d = made[{m, n}];
      if (!d) {
        d = std::make_shared<const Descriptors>(dtype, block_shape(m, n));
        if (!d->runs(handle, algo)) return {};
      }
      plan.blocks.push_back({d, row, col});
    }
  }
  return plan;
}

}  // namespace

struct InvariantMatmul::State {
  cublasLtHandle_t handle = nullptr;
  std::mutex mutex;
  // (dtype, K) -> its pinned configuration; never erased (references stay valid).
  std::map<std::pair<int, int64_t>, std::unique_ptr<PinnedConfig>> pinned;
  // The descriptors of every shape run (checked against its pinned configuration when made).
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::shared_ptr<const Plan>> shapes;
  static constexpr size_t kMaxShapes = 4096;
};

InvariantMatmul& InvariantMatmul::on_device(int device) {
  static std::mutex mutex;
  static auto* objects = new std::map<int, std::unique_ptr<InvariantMatmul>>();  // never destroyed: usable at exit
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*objects)[device];
  if (!slot) slot.reset(new InvariantMatmul());
  return *slot;
}

InvariantMatmul::InvariantMatmul() : state_(std::make_unique<State>()) {
  more();  // both function tables, or MatmulUnavailable
  check_cublas(lt().Create(&state_->handle), "cublasLtCreate");
}

const PinnedConfig& InvariantMatmul::pinned(DType dtype, int64_t k) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto& slot = state_->pinned[{static_cast<int>(dtype), k}];
  if (slot) return *slot;
  const auto [ref_m, ref_n] = reference_shape();
  const int64_t wanted = env_int("EXACTCOLL_INVARIANT_MATMUL_CANDIDATE", 0);
  const MatmulShape reference = packed(ref_m, k, ref_n, 1);
  Descriptors d(dtype, reference);
  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(lt().MatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t no_workspace = 0;
  const uint32_t align = 16;
  lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &no_workspace, sizeof no_workspace);
  for (auto which : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                     CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    lt().MatmulPreferenceSetAttribute(pref, which, &align, sizeof align);
  }
  constexpr int kAsk = 32;
  std::vector<cublasLtMatmulHeuristicResult_t> results(kAsk);
  int found = 0;
  const cublasStatus_t status =
      lt().MatmulAlgoGetHeuristic(state_->handle, d.desc, d.a, d.b, d.c, d.c, pref, kAsk, results.data(), &found);
  lt().MatmulPreferenceDestroy(pref);
  const std::string what = std::string(dtype_name(dtype)) + " K=" + std::to_string(k);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    throw MatmulRefused("cuBLASLt offers no algorithm without workspace for " + what + " at the reference shape " +
                        shape_text(reference));
  }
  std::vector<std::pair<int, cublasLtMatmulAlgo_t>> usable;
  std::string rejected;
  for (int i = 0; i < found; ++i) {
    const cublasLtMatmulHeuristicResult_t& r = results[static_cast<size_t>(i)];
    if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize != 0) continue;
    const std::string why = unpinnable(state_->handle, dtype, k, r.algo);
    if (why.empty()) {
      usable.emplace_back(i, r.algo);
    } else if (rejected.size() < 1500) {
      rejected += "\n  candidate " + std::to_string(i) + " (" + config_text(r.algo) + "): " + why;
    }
  }
  if (static_cast<int64_t>(usable.size()) <= wanted) {
    throw MatmulRefused("no cuBLASLt configuration can be pinned for " + what + " (" + std::to_string(usable.size()) +
                        " of " + std::to_string(found) + " candidates pass; candidate " + std::to_string(wanted) +
                        " asked for):" + rejected);
  }
  auto config = std::make_unique<PinnedConfig>();
  const auto& [index, algo] = usable[static_cast<size_t>(wanted)];
  config->algo = algo;
  config->align_bytes = align;
  config->text = what + ": " + config_text(algo) + " (candidate " + std::to_string(index) + " of " +
                 std::to_string(found) + " at m=" + std::to_string(ref_m) + " n=" + std::to_string(ref_n) + "; " +
                 batch_text(state_->handle, dtype, k, algo) + "; cuBLASLt " + std::to_string(lt().GetVersion()) + ")";
  slot = std::move(config);
  return *slot;
}

void InvariantMatmul::run(const void* a, const void* b, void* c, DType dtype, const MatmulShape& s,
                          cudaStream_t stream) {
  check_call(a, b, c, dtype, s);
  if (s.m == 0) return;
  const PinnedConfig& config = pinned(dtype, s.k);
  const State::Key key{static_cast<int>(dtype),
                       s.m,
                       s.k,
                       s.n,
                       s.batch,
                       s.lda,
                       s.ldb,
                       s.ldc,
                       s.batch > 1 ? s.stride_a : 0,
                       s.batch > 1 ? s.stride_b : 0,
                       s.batch > 1 ? s.stride_c : 0};
  std::shared_ptr<const Plan> plan;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto it = state_->shapes.find(key);
    if (it != state_->shapes.end()) plan = it->second;
  }
  if (!plan) {
    auto made = std::make_shared<const Plan>(make_plan(state_->handle, dtype, s, config.algo));
    if (made->blocks.empty()) {
      throw MatmulRefused("the configuration pinned for " + config.text + " cannot run " + shape_text(s) + " (lda=" +
                          std::to_string(s.lda) + " ldb=" + std::to_string(s.ldb) + " ldc=" + std::to_string(s.ldc) +
                          ") without a workspace, whole or in blocks: refused rather than run with another "
                          "configuration, whose bits could differ");
    }
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->shapes.size() >= State::kMaxShapes) state_->shapes.clear();  // users hold their own references
    plan = state_->shapes.emplace(key, std::move(made)).first->second;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const int64_t entries = plan->per_entry ? s.batch : 1;
  const int64_t size = dtype_size(dtype);
  for (int64_t i = 0; i < entries; ++i) {
    for (const Block& block : plan->blocks) {
      const Descriptors& d = *block.d;
      const auto* ai = static_cast<const char*>(a) + (i * s.stride_a + block.row * s.lda) * size;
      const auto* bi = static_cast<const char*>(b) + (i * s.stride_b + block.col) * size;
      auto* ci = static_cast<char*>(c) + (i * s.stride_c + block.row * s.ldc + block.col) * size;
      check_cublas(lt().Matmul(state_->handle, d.desc, &alpha, bi, d.a, ai, d.b, &beta, ci, d.c, ci, d.c, &config.algo,
                               nullptr, 0, stream),
                   "cublasLtMatmul");
    }
  }
}

}  // namespace exactcoll::cuda::linear
