#include "tools/progress/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace exactcoll::tools {

ProgressBar::ProgressBar(std::string label, std::function<std::pair<uint64_t, uint64_t>()> progress)
    : label_(std::move(label)), progress_(std::move(progress)) {
  if (isatty(STDERR_FILENO) == 1) thread_ = std::thread([this] { loop(); });
}

ProgressBar::~ProgressBar() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (drawn_) std::fprintf(stderr, "\r\033[K");
}

void ProgressBar::loop() {
  using namespace std::chrono_literals;
  std::unique_lock<std::mutex> lock(mutex_);
  if (stop_.wait_for(lock, 1s, [this] { return stopping_; })) return;  // short runs: no bar
  const auto start = std::chrono::steady_clock::now() - 1s;
  while (!stopping_) {
    const auto [done, total] = progress_();
    const double fraction = total == 0 ? 0.0 : static_cast<double>(done) / static_cast<double>(total);
    const int width = 30;
    const int filled = static_cast<int>(fraction * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "\r%s [%s] %3.0f%% %.1f s", label_.c_str(), bar.c_str(), fraction * 100.0, seconds);
    std::fflush(stderr);
    drawn_ = true;
    stop_.wait_for(lock, 200ms, [this] { return stopping_; });
  }
}

}  // namespace exactcoll::tools
