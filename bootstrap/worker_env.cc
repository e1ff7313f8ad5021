#include "bootstrap/worker_env.h"

#include <charconv>
#include <cstdlib>
#include <limits>
#include <vector>

#include "store/wire.h"

namespace exactcoll {
namespace {

constexpr const char* kHowWorkersStart =
    "start workers with `exactcoll launch --nproc N -- <command>` or torchrun, which set RANK, WORLD_SIZE, "
    "LOCAL_RANK, MASTER_ADDR and MASTER_PORT";

// Collects problems so that one error names all of them.
class Problems {
 public:
  void add(std::string problem) { lines_.push_back(std::move(problem)); }
  bool empty() const { return lines_.empty(); }
  std::string message() const {
    std::string text = "worker environment:";
    for (const auto& line : lines_) text += "\n  " + line;
    return text;
  }

 private:
  std::vector<std::string> lines_;
};

// Returns the value of `name` as an integer in [min_value, max_value], or nullopt after adding a
// problem (unset, not a whole number, out of range).
std::optional<int64_t> read_int(const EnvLookup& lookup, const std::string& name, int64_t min_value, int64_t max_value,
                                Problems& problems) {
  const std::optional<std::string> text = lookup(name);
  if (!text) {
    problems.add(name + " is not set (" + kHowWorkersStart + ")");
    return std::nullopt;
  }
  int64_t value = 0;
  const char* end = text->data() + text->size();
  const auto [stop, ec] = std::from_chars(text->data(), end, value);
  if (text->empty() || ec != std::errc() || stop != end) {
    problems.add(name + "='" + *text + "' is not a whole number");
    return std::nullopt;
  }
  if (value < min_value || value > max_value) {
    problems.add(name + "=" + *text + " is outside " + std::to_string(min_value) + ".." + std::to_string(max_value));
    return std::nullopt;
  }
  return value;
}

bool has_space(const std::string& text) {
  for (const char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return true;
  }
  return false;
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

WorkerEnv parse_worker_env(const EnvLookup& lookup) {
  Problems problems;
  WorkerEnv env;
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();

  // 1. The integers, each on its own; then the relations between them.
  const auto world_size = read_int(lookup, "WORLD_SIZE", 1, kIntMax, problems);
  const auto rank = read_int(lookup, "RANK", 0, kIntMax, problems);
  const auto local_rank = read_int(lookup, "LOCAL_RANK", 0, kIntMax, problems);
  // The store's port: EXACTCOLL_STORE_PORT, else MASTER_PORT + 1 (never MASTER_PORT itself, which
  // torch's store holds); MASTER_PORT is needed only for that default.
  const bool store_port_set = lookup("EXACTCOLL_STORE_PORT").has_value();
  std::optional<int64_t> port, store_port;
  if (store_port_set) {
    store_port = read_int(lookup, "EXACTCOLL_STORE_PORT", 1, 65535, problems);
    if (lookup("MASTER_PORT")) port = read_int(lookup, "MASTER_PORT", 1, 65535, problems);
  } else {
    port = read_int(lookup, "MASTER_PORT", 1, 65535, problems);
    if (port && *port == 65535) {
      problems.add("MASTER_PORT=65535 leaves no port above it for the exactcoll store: set EXACTCOLL_STORE_PORT");
    } else if (port) {
      store_port = *port + 1;
    }
  }
  if (world_size && rank && *rank >= *world_size) {
    problems.add("RANK=" + std::to_string(*rank) + " is not below WORLD_SIZE=" + std::to_string(*world_size));
  }
  if (world_size && local_rank && *local_rank >= *world_size) {
    problems.add("LOCAL_RANK=" + std::to_string(*local_rank) +
                 " is not below WORLD_SIZE=" + std::to_string(*world_size));
  }

  // 2. The addresses.
  const std::optional<std::string> master_addr = lookup("MASTER_ADDR");
  if (!master_addr) {
    problems.add(std::string("MASTER_ADDR is not set (") + kHowWorkersStart + ")");
  } else if (master_addr->empty() || has_space(*master_addr)) {
    problems.add("MASTER_ADDR='" + *master_addr + "' is not a host name or address");
  }
  const std::optional<std::string> bind = lookup("EXACTCOLL_STORE_BIND");
  if (bind && (bind->empty() || has_space(*bind))) {
    problems.add("EXACTCOLL_STORE_BIND='" + *bind + "' is not an address (e.g. 127.0.0.1 or 0.0.0.0)");
  }

  // 3. The token: required, so that nobody else on the machine can join the job's store.
  const std::optional<std::string> token = lookup("EXACTCOLL_STORE_TOKEN");
  if (!token || token->empty()) {
    problems.add(
        "EXACTCOLL_STORE_TOKEN is not set: every rank must present the same secret to join the rendezvous "
        "store (it hands out GPU memory handles). `exactcoll launch` makes one; under torchrun export one "
        "before starting it, e.g.\n      export EXACTCOLL_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')");
  } else if (token->size() < kMinStoreTokenChars) {
    problems.add("EXACTCOLL_STORE_TOKEN has " + std::to_string(token->size()) + " characters; use at least " +
                 std::to_string(kMinStoreTokenChars) + " random ones (e.g. 32 hex digits from /dev/urandom)");
  } else if (token->size() > store_wire::kMaxTokenBytes) {
    // Every hello would be refused as an oversized frame: say so now, naming the variable.
    problems.add("EXACTCOLL_STORE_TOKEN has " + std::to_string(token->size()) + " characters; the store's hello " +
                 "carries at most " + std::to_string(store_wire::kMaxTokenBytes) + " (32 hex digits are plenty)");
  }

  if (!problems.empty()) throw BootstrapError(problems.message());
  env.world_size = static_cast<int>(*world_size);
  env.rank = static_cast<int>(*rank);
  env.local_rank = static_cast<int>(*local_rank);
  env.master_port = port ? static_cast<uint16_t>(*port) : 0;
  env.store_port = static_cast<uint16_t>(*store_port);
  env.master_addr = *master_addr;
  env.store_token = *token;
  if (bind) env.store_bind_address = *bind;
  return env;
}

}  // namespace exactcoll
