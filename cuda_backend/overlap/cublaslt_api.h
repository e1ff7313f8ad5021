// cuBLASLt, opened at run time (dlopen of libcublasLt.so.13), so that the exactcoll binary starts
// on machines where the library is not on the loader's path; only the overlap commands need it.
// Looked up as "libcublasLt.so.13" (LD_LIBRARY_PATH, the binary's run path, the loader cache),
// then in $CUDA_PATH/lib64 and /usr/local/cuda/lib64.
//
// Example:
//   const CublasLtApi& lt = CublasLtApi::get();   // throws CublasError naming what was tried
//   cublasLtHandle_t h; check_cublas(lt.Create(&h), "cublasLtCreate");
#pragma once

#include <cublasLt.h>

#include <stdexcept>
#include <string>

namespace exactcoll::cuda {

struct CublasError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CublasLtApi {
  decltype(&::cublasLtCreate) Create = nullptr;
  decltype(&::cublasLtDestroy) Destroy = nullptr;
  decltype(&::cublasLtGetVersion) GetVersion = nullptr;
  decltype(&::cublasLtGetStatusString) GetStatusString = nullptr;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmulAlgoCheck) MatmulAlgoCheck = nullptr;
  decltype(&::cublasLtMatmulAlgoConfigGetAttribute) MatmulAlgoConfigGetAttribute = nullptr;
  decltype(&::cublasLtMatmul) Matmul = nullptr;
  std::string path;  // the file that was loaded

  // Returns the process-wide API, loading the library on first use. Throws CublasError naming
  // every place tried, or the missing symbol.
  static const CublasLtApi& get();
};

// Throws CublasError("<call> failed: <cuBLASLt's message>") unless status is CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t status, const char* call);

}  // namespace exactcoll::cuda
