// A progress bar on stderr for long simulator runs: drawn only after the run has taken a second,
// and only when stderr is a terminal (never in logs or pipes).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace exactcoll::tools {

class ProgressBar {
 public:
  // progress() returns (done, total) and is polled from a helper thread.
  ProgressBar(std::string label, std::function<std::pair<uint64_t, uint64_t>()> progress);
  // Stops polling and erases the bar if one was drawn.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

 private:
  void loop();
  std::string label_;
  std::function<std::pair<uint64_t, uint64_t>()> progress_;
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  bool drawn_ = false;
  std::thread thread_;
};

}  // namespace exactcoll::tools
