#include "sim/trace_files.h"

namespace exactcoll::sim {

void write_trace_texts(const World& world, const std::string& json_path, const std::string& chrome_path,
                       npy::OutputFiles& files) {
  if (world.tracer() == nullptr) return;
  if (!json_path.empty()) {
    const std::string text = world.tracer()->json_lines();
    files.write(json_path, text.data(), text.size());
  }
  if (!chrome_path.empty()) {
    const std::string text = world.tracer()->chrome_trace(world.options().schedule == Schedule::kSeeded);
    files.write(chrome_path, text.data(), text.size());
  }
}

std::string write_trace_files(const World& world, const std::string& json_path, const std::string& chrome_path) {
  if (world.tracer() == nullptr) return "";
  try {
    npy::OutputFiles files({json_path, chrome_path});
    write_trace_texts(world, json_path, chrome_path, files);
    files.commit();
  } catch (const npy::NpyError& e) {
    return e.what();
  }
  return "";
}

}  // namespace exactcoll::sim
