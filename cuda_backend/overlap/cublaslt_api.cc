#include "cuda_backend/overlap/cublaslt_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

namespace exactcoll::cuda {
namespace {

constexpr const char* kLibrary = "libcublasLt.so.13";

template <class Fn>
void bind(void* library, const char* symbol, Fn* fn) {
  void* address = dlsym(library, symbol);
  if (address == nullptr) throw CublasError(std::string(kLibrary) + " has no symbol " + symbol);
  *fn = reinterpret_cast<Fn>(address);
}

CublasLtApi load() {
  std::vector<std::string> tries = {kLibrary};
  if (const char* cuda = std::getenv("CUDA_PATH"); cuda != nullptr && *cuda != '\0') {
    tries.push_back(std::string(cuda) + "/lib64/" + kLibrary);
  }
  tries.push_back(std::string("/usr/local/cuda/lib64/") + kLibrary);
  void* library = nullptr;
  std::string errors;
  CublasLtApi api;
  for (const std::string& name : tries) {
    library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      api.path = name;
      break;
    }
    const char* why = dlerror();
    errors += "\n  " + name + ": " + (why != nullptr ? why : "unknown error");
  }
  if (library == nullptr) {
    throw CublasError(std::string("cannot load ") + kLibrary + " (set LD_LIBRARY_PATH to its directory):" + errors);
  }
  bind(library, "cublasLtCreate", &api.Create);
  bind(library, "cublasLtDestroy", &api.Destroy);
  bind(library, "cublasLtGetVersion", &api.GetVersion);
  bind(library, "cublasLtGetStatusString", &api.GetStatusString);
  bind(library, "cublasLtMatmulDescCreate", &api.MatmulDescCreate);
  bind(library, "cublasLtMatmulDescDestroy", &api.MatmulDescDestroy);
  bind(library, "cublasLtMatmulDescSetAttribute", &api.MatmulDescSetAttribute);
  bind(library, "cublasLtMatrixLayoutCreate", &api.MatrixLayoutCreate);
  bind(library, "cublasLtMatrixLayoutDestroy", &api.MatrixLayoutDestroy);
  bind(library, "cublasLtMatmulPreferenceCreate", &api.MatmulPreferenceCreate);
  bind(library, "cublasLtMatmulPreferenceDestroy", &api.MatmulPreferenceDestroy);
  bind(library, "cublasLtMatmulPreferenceSetAttribute", &api.MatmulPreferenceSetAttribute);
  bind(library, "cublasLtMatmulAlgoGetHeuristic", &api.MatmulAlgoGetHeuristic);
  bind(library, "cublasLtMatmulAlgoCheck", &api.MatmulAlgoCheck);
  bind(library, "cublasLtMatmulAlgoConfigGetAttribute", &api.MatmulAlgoConfigGetAttribute);
  bind(library, "cublasLtMatmul", &api.Matmul);
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

const CublasLtApi& CublasLtApi::get() {
  static std::once_flag once;
  static CublasLtApi api;
  static std::string error;
  std::call_once(once, [] {
    try {
      api = load();
    } catch (const CublasError& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw CublasError(error);
  return api;
}

void check_cublas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const char* text = "unknown status";
  try {
    text = CublasLtApi::get().GetStatusString(status);
  } catch (const CublasError&) {
  }
  throw CublasError(std::string(call) + " failed: " + text + " (status " + std::to_string(static_cast<int>(status)) +
                    ")");
}

}  // namespace exactcoll::cuda
