#include "cuda_backend/overlap/lt_matmul.h"

#include <algorithm>
#include <cstdint>

namespace exactcoll::cuda {
namespace {

const CublasLtApi& lt() { return CublasLtApi::get(); }

cudaDataType_t data_type(DType d) {
  if (d == DType::kBF16) return CUDA_R_16BF;
  if (d == DType::kFP16) return CUDA_R_16F;
  throw std::invalid_argument("LtMatmul: only bf16 and fp16 products are supported");
}

}  // namespace

// Descriptors of the column-major view (see the header): "A" = B [n, k], "B" = A [k, m], C [n, m].
struct LtMatmul::Descriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Descriptors(DType dtype, size_t m, size_t k, size_t n) {
    const cudaDataType_t t = data_type(dtype);
    check_cublas(lt().MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t no = CUBLAS_OP_N;
    check_cublas(lt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &no, sizeof no),
                 "cublasLtMatmulDescSetAttribute(TRANSA)");
    check_cublas(lt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof no),
                 "cublasLtMatmulDescSetAttribute(TRANSB)");
    check_cublas(lt().MatrixLayoutCreate(&a, t, n, k, static_cast<int64_t>(n)), "cublasLtMatrixLayoutCreate(B^T)");
    check_cublas(lt().MatrixLayoutCreate(&b, t, k, m, static_cast<int64_t>(k)), "cublasLtMatrixLayoutCreate(A^T)");
    check_cublas(lt().MatrixLayoutCreate(&c, t, n, m, static_cast<int64_t>(n)), "cublasLtMatrixLayoutCreate(C^T)");
  }
  ~Descriptors() {
    if (c) lt().MatrixLayoutDestroy(c);
    if (b) lt().MatrixLayoutDestroy(b);
    if (a) lt().MatrixLayoutDestroy(a);
    if (desc) lt().MatmulDescDestroy(desc);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
};

bool LtMatmul::supports(cublasLtHandle_t handle, DType dtype, size_t m, size_t k, size_t n, size_t workspace_bytes,
                        const cublasLtMatmulAlgo_t& algo) {
  try {
    LtMatmul::Descriptors d(dtype, m, k, n);
    cublasLtMatmulHeuristicResult_t result{};
    if (lt().MatmulAlgoCheck(handle, d.desc, d.a, d.b, d.c, d.c, &algo, &result) != CUBLAS_STATUS_SUCCESS) return false;
    return result.state == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= workspace_bytes;
  } catch (const std::exception&) {
    return false;
  }
}

LtMatmul::LtMatmul(cublasLtHandle_t handle, DType dtype, size_t m, size_t k, size_t n, void* workspace,
                   size_t workspace_bytes, std::optional<cublasLtMatmulAlgo_t> algo)
    : handle_(handle), m_(m), k_(k), n_(n), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  if (m == 0 || k == 0 || n == 0) throw std::invalid_argument("LtMatmul: empty shape");
  d_ = std::make_unique<Descriptors>(dtype, m, k, n);
  if (algo) {
    cublasLtMatmulHeuristicResult_t result{};
    check_cublas(lt().MatmulAlgoCheck(handle_, d_->desc, d_->a, d_->b, d_->c, d_->c, &*algo, &result),
                 "cublasLtMatmulAlgoCheck");
    if (result.state != CUBLAS_STATUS_SUCCESS || result.workspaceSize > workspace_bytes) {
      throw CublasError("LtMatmul: the given algorithm cannot run m=" + std::to_string(m) + " k=" + std::to_string(k) +
                        " n=" + std::to_string(n));
    }
    algo_ = *algo;
    return;
  }
  algo_ = candidates(handle, dtype, m, k, n, workspace_bytes, 1).front();
}

std::vector<cublasLtMatmulAlgo_t> LtMatmul::candidates(cublasLtHandle_t handle, DType dtype, size_t m, size_t k,
                                                       size_t n, size_t workspace_bytes, int count) {
  Descriptors d(dtype, m, k, n);
  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(lt().MatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = workspace_bytes;
  lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(count, 1)));
  int found = 0;
  const cublasStatus_t status =
      lt().MatmulAlgoGetHeuristic(handle, d.desc, d.a, d.b, d.c, d.c, pref, std::max(count, 1), results.data(), &found);
  lt().MatmulPreferenceDestroy(pref);
  check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
  std::vector<cublasLtMatmulAlgo_t> out;
  for (int i = 0; i < found; ++i) {
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
      out.push_back(results[static_cast<size_t>(i)].algo);
  }
  if (out.empty()) {
    throw CublasError("cuBLASLt offers no algorithm for m=" + std::to_string(m) + " k=" + std::to_string(k) +
                      " n=" + std::to_string(n));
  }
  return out;
}

LtMatmul::~LtMatmul() = default;

void LtMatmul::run(const void* a, const void* b, void* c, cudaStream_t stream) const {
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(lt().Matmul(handle_, d_->desc, &alpha, b, d_->a, a, d_->b, &beta, c, d_->c, c, d_->c, &algo_, workspace_,
                           workspace_bytes_, stream),
               "cublasLtMatmul");
}

std::string LtMatmul::algo_text() const {
  auto attr = [&](cublasLtMatmulAlgoConfigAttributes_t which) -> int64_t {
    uint32_t value = 0;
    size_t written = 0;
    if (lt().MatmulAlgoConfigGetAttribute(&algo_, which, &value, sizeof value, &written) != CUBLAS_STATUS_SUCCESS) {
      return -1;
    }
    return value;
  };
  return "algo " + std::to_string(attr(CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
         std::to_string(attr(CUBLASLT_ALGO_CONFIG_TILE_ID)) + " splitK " +
         std::to_string(attr(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " reduction " +
         std::to_string(attr(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)) + " swizzle " +
         std::to_string(attr(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)) + " stages " +
         std::to_string(attr(CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " cluster " +
         std::to_string(attr(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

}  // namespace exactcoll::cuda
