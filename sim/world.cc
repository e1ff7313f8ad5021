#include "sim/world.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

#include "sim/schedulers.h"

namespace exactcoll::sim {
namespace {

constexpr size_t kAlignment = 64;

std::atomic<uint64_t> next_world_id{1};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

const char* schedule_name(Schedule s) { return s == Schedule::kThreads ? "threads" : "seeded"; }

World::World(WorldOptions options) : options_(std::move(options)), world_id_(next_world_id.fetch_add(1)) {
  if (options_.ranks < 1 || options_.ranks > kMaxRanks) {
    throw std::invalid_argument("a world has 1.." + std::to_string(kMaxRanks) + " ranks, not " +
                                std::to_string(options_.ranks));
  }
  if (options_.fail_rank < -1 || options_.fail_rank >= options_.ranks) {
    throw std::invalid_argument("fail_rank " + std::to_string(options_.fail_rank) + " is not a rank of a world of " +
                                std::to_string(options_.ranks));
  }
  heaps_.resize(options_.ranks);
  peers_.resize(options_.ranks);
  try {
    for (int r = 0; r < options_.ranks; ++r) {
      heaps_[r].signals.name = "signals";
      heaps_[r].input.name = "input";
      heaps_[r].scratch.name = "scratch";
      heaps_[r].output.name = "output";
      heaps_[r].lamport.name = "lamport";
      allocate(heaps_[r].signals, r, sizeof(SignalBuffer));
      allocate(heaps_[r].input, r, 64);
      allocate(heaps_[r].scratch, r, 64);
      allocate(heaps_[r].lamport, r, 64);
    }
    if (options_.trace) tracer_ = std::make_unique<Tracer>(options_.ranks, options_.trace_elements);
    for (int r = 0; r < options_.ranks; ++r) {
      HandleExchangeOptions hx;
      hx.key_prefix = "sim/world" + std::to_string(world_id_);
      hx.timeout = options_.store_timeout;
      exchangers_.push_back(std::make_unique<HandleExchange>(
          store_, r, options_.ranks, [this](int peer, const ExportedBuffer& b) { return open_handle(peer, b); },
          CloseHandleFn{}, hx));
    }
    sync_handles();
  } catch (...) {
    release_heaps();  // no destructor runs for a constructor that throws
    throw;
  }
}

World::~World() { release_heaps(); }

void World::release_heaps() {
  for (auto& heap : heaps_) {
    for (Region* region : {&heap.signals, &heap.input, &heap.scratch, &heap.output, &heap.lamport}) {
      std::free(region->data);
      region->data = nullptr;
    }
    for (auto& region : heap.extra) {
      std::free(region.data);
      region.data = nullptr;
    }
  }
}

void World::allocate(Region& region, int rank, size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, rounded);
  if (data == nullptr) {
    throw std::bad_alloc();
  }
  // The Lamport region starts as sentinels (all bits set, whatever the type: core/lamport.h).
  std::memset(data, &region == &heaps_[rank].lamport ? 0xFF : 0, rounded);
  std::free(region.data);
  region.data = static_cast<std::byte*>(data);
  region.bytes = rounded;
  region.generation = next_generation_++;
  (void)rank;
}

void World::grow(Region& region, int rank, size_t bytes) {
  if (region.bytes >= bytes) return;
  allocate(region, rank, bytes);
  if (&region != &heaps_[rank].output) handles_dirty_ = true;
}

int World::add_buffer(const std::string& name, size_t bytes) {
  const int id = static_cast<int>(extra_names_.size());
  extra_names_.push_back(name);
  for (int r = 0; r < options_.ranks; ++r) {
    heaps_[r].extra.emplace_back();
    heaps_[r].extra.back().name = "extra" + std::to_string(id) + ":" + name;
    allocate(heaps_[r].extra.back(), r, bytes);
  }
  handles_dirty_ = true;
  return id;
}

void* World::local_buffer(int id, int rank) const { return heaps_.at(rank).extra.at(id).data; }
void* World::local_input(int rank) const { return heaps_.at(rank).input.data; }
void* World::local_scratch(int rank) const { return heaps_.at(rank).scratch.data; }
void* World::local_lamport(int rank) const { return heaps_.at(rank).lamport.data; }
SignalBuffer* World::local_signals(int rank) const {
  return reinterpret_cast<SignalBuffer*>(heaps_.at(rank).signals.data);
}

const HandleExchangeStats& World::exchange_stats(int rank) const { return exchangers_.at(rank)->stats(); }

std::vector<ExportedBuffer> World::exports(int rank) const {
  const Heap& heap = heaps_[rank];
  std::vector<ExportedBuffer> out;
  auto add = [&](const Region& region) {
    ExportedBuffer b;
    b.handle = "sim/" + std::to_string(world_id_) + "/" + std::to_string(rank) + "/" + region.name + "/" +
               std::to_string(region.generation);
    b.base = reinterpret_cast<uintptr_t>(region.data);
    b.size = region.bytes;
    out.push_back(std::move(b));
  };
  add(heap.signals);
  add(heap.input);
  add(heap.scratch);
  add(heap.lamport);
  for (const Region& region : heap.extra) add(region);
  return out;
}

// The simulator's "IPC open": the handle names a region of the peer's heap; opening it yields a
// pointer into that heap (the same address, ranks sharing one process).
void* World::open_handle(int peer, const ExportedBuffer& buffer) {
  const Heap& heap = heaps_.at(peer);
  auto matches = [&](const Region& region) {
    const std::string expected = "sim/" + std::to_string(world_id_) + "/" + std::to_string(peer) + "/" + region.name +
                                 "/" + std::to_string(region.generation);
    return buffer.handle == expected && buffer.base == reinterpret_cast<uintptr_t>(region.data) &&
           buffer.size == region.bytes;
  };
  for (const Region* region : {&heap.signals, &heap.input, &heap.scratch, &heap.lamport}) {
    if (matches(*region)) return region->data;
  }
  for (const Region& region : heap.extra) {
    if (matches(region)) return region.data;
  }
  throw std::runtime_error("sim: handle '" + buffer.handle + "' of rank " + std::to_string(peer) +
                           " names no live region of its heap");
}

void World::sync_handles() {
  const int n = options_.ranks;
  std::vector<std::vector<std::vector<void*>>> results(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  // Fault injection, step 0: the failing rank never joins (its peers time out naming it).
  if (options_.fail_rank >= 0 && options_.fail_at_step == 0) fault_fired_.store(true);
  try {
    for (int r = 0; r < n; ++r) {
      if (rank_dead(r)) continue;
      threads.emplace_back([&, r] {
        try {
          results[r] = exchangers_[r]->exchange(exports(r));
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    }
  } catch (const std::system_error& e) {
    // No thread for a rank (e.g. out of memory): the started ones time out without it; join them.
    for (auto& t : threads) t.join();
    failed_ = true;
    throw SimError(SimFailure::kError, std::string("could not start a thread for the handle exchange: ") + e.what());
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!errors[r]) continue;
    failed_ = true;  // the exchangers' rounds no longer agree: the world is spent
    try {
      std::rethrow_exception(errors[r]);
    } catch (const StoreError& e) {
      throw SimError(SimFailure::kTimeout, e.what() + fault_note());
    } catch (const std::exception& e) {
      throw SimError(SimFailure::kError, std::string("handle exchange: ") + e.what() + fault_note());
    }
  }
  if (fault_fired_.load()) {
    failed_ = true;
    throw SimError(SimFailure::kRankDied,
                   "the handle exchange completed without rank " + std::to_string(options_.fail_rank) + fault_note());
  }
  for (int r = 0; r < n; ++r) {
    PeerTable& table = peers_[r];
    const auto& res = results[r];
    table.extra.assign(heaps_[r].extra.size(), {});
    table.scratch_bytes = heaps_[r].scratch.bytes;
    table.lamport_bytes = heaps_[r].lamport.bytes;
    for (int p = 0; p < n; ++p) {
      table.signals[p] = static_cast<SignalBuffer*>(res[0][p]);
      table.input[p] = res[1][p];
      table.scratch[p] = res[2][p];
      table.lamport[p] = res[3][p];
      for (size_t i = 0; i < heaps_[r].extra.size(); ++i) table.extra[i][p] = res[4 + i][p];
    }
  }
  handles_dirty_ = false;
}

void World::fault_step(int rank) {
  if (rank != options_.fail_rank) return;
  fault_check(rank);
  if (fault_steps_.fetch_add(1) + 1 == options_.fail_at_step) {
    fault_fired_.store(true);
    throw RankDied{};
  }
}

void World::fault_check(int rank) const {
  if (rank_dead(rank)) throw RankDied{};
}

std::string World::fault_note() const {
  if (!fault_fired_.load()) return "";
  const std::string r = std::to_string(options_.fail_rank);
  return "\n(rank " + r + " was stopped by fault injection " +
         (options_.fail_at_step == 0 ? std::string("before it joined the world")
                                     : "at its synchronization step " + std::to_string(options_.fail_at_step)) +
         ": --fail-rank " + r + " --fail-at-step " + std::to_string(options_.fail_at_step) + ")";
}

void World::validate(const QueuedLaunch& q) const {
  const Launch& l = q.launch;
  const std::string what = "launch '" + l.name + "': ";
  if (l.blocks < 1 || l.blocks > kMaxBlocks) {
    throw std::invalid_argument(what + "blocks must be 1.." + std::to_string(kMaxBlocks) + ", not " +
                                std::to_string(l.blocks));
  }
  if (!l.inputs.empty() && static_cast<int>(l.inputs.size()) != options_.ranks) {
    throw std::invalid_argument(what + "one input per rank is needed");
  }
  if (!l.outputs.empty() && static_cast<int>(l.outputs.size()) != options_.ranks) {
    throw std::invalid_argument(what + "one output per rank is needed");
  }
  if (l.publish_views && static_cast<int>(l.input_views.size()) != options_.ranks) {
    throw std::invalid_argument(what + "a launch that publishes its input views needs one row of views per rank");
  }
  if (!l.publish_views && !l.input_views.empty()) {
    throw std::invalid_argument(what + "input views are published only by a launch with publish_views");
  }
  if (l.views_fault != ViewsFault::kNone && !l.publish_views) {
    throw std::invalid_argument(what + "a broken views protocol needs a launch that publishes its views");
  }
  if (l.views_fault_rank < -1 || l.views_fault_rank >= options_.ranks) {
    throw std::invalid_argument(what + "views_fault_rank " + std::to_string(l.views_fault_rank) + " is not a rank");
  }
  if (l.output_is_input && l.output_bytes > l.input_bytes) {
    throw std::invalid_argument(what + "an output written over the input must fit it (output_bytes <= input_bytes)");
  }
}

void World::stage(int rank, uint32_t k, Executor* executor) {
  fault_check(rank);
  const QueuedLaunch& q = queue_[k];
  if (!q.launch.inputs.empty() && q.launch.inputs[rank] != nullptr && q.launch.input_bytes > 0) {
    std::memcpy(heaps_[rank].input.data, q.launch.inputs[rank], q.launch.input_bytes);
  }
  if (q.launch.before) q.launch.before(rank);
  if (tracer_) {
    TraceEvent e;
    e.kind = TraceEvent::Kind::kLaunch;
    e.t = executor->now();
    e.launch = launch_base_ + k;
    e.rank = rank;
    e.block = q.launch.blocks;
    tracer_->add(std::move(e));
  }
  note_progress();
}

void World::finish(int rank, uint32_t k) {
  const QueuedLaunch& q = queue_[k];
  if (!q.launch.outputs.empty() && q.kernel_outputs[rank] != q.launch.outputs[rank]) {
    std::memcpy(q.launch.outputs[rank], q.kernel_outputs[rank], q.launch.output_bytes);
  }
}

BlockEnv World::block_env(int rank, int block, uint32_t k, Executor* executor) {
  const QueuedLaunch& q = queue_[k];
  BlockEnv env;
  env.rank = rank;
  env.world_size = options_.ranks;
  env.block = block;
  env.num_blocks = q.launch.blocks;
  env.launch = launch_base_ + k;
  env.peers = &peers_[rank];
  env.output = q.kernel_outputs.empty() ? nullptr : q.kernel_outputs[rank];
  env.executor = executor;
  env.tracer = tracer_.get();
  if (q.launch.publish_views) {
    env.input_views = &q.launch.input_views[rank];
    if (q.launch.views_fault_rank < 0 || q.launch.views_fault_rank == rank) env.views_fault = q.launch.views_fault;
  }
  return env;
}

void World::run_block(int rank, int block, uint32_t k, Executor* executor) {
  fault_check(rank);
  const BlockEnv env = block_env(rank, block, k, executor);
  queue_[k].run_block(env, tracer_ != nullptr);
  note_progress();
}

void World::run() {
  const int n = options_.ranks;
  // The queue is emptied whatever happens (launch ids keep counting, for traces).
  struct Clear {
    World* w;
    ~Clear() {
      w->launch_base_ += static_cast<uint32_t>(w->queue_.size());
      w->queue_.clear();
    }
  } clear{this};
  if (failed_) {
    throw std::logic_error(
        "sim::World: an earlier run on this world failed (its flags are in an unknown state); "
        "make a new world");
  }
  // 1. Check the launches and size the heaps for the largest of them.
  size_t input_bytes = 0, scratch_bytes = 0, output_bytes = 0, lamport_bytes = 0;
  uint64_t units = 0;
  for (const QueuedLaunch& q : queue_) {
    validate(q);
    input_bytes = std::max(input_bytes, q.launch.input_bytes);
    scratch_bytes = std::max(scratch_bytes, q.launch.scratch_bytes);
    lamport_bytes = std::max(lamport_bytes, q.launch.lamport_bytes);
    output_bytes = std::max(output_bytes, q.launch.output_bytes);
    units += static_cast<uint64_t>(n) * (q.launch.blocks + 1);
  }
  for (int r = 0; r < n; ++r) {
    grow(heaps_[r].input, r, input_bytes);
    grow(heaps_[r].scratch, r, scratch_bytes);
    grow(heaps_[r].lamport, r, lamport_bytes);
  }
  // 2. Outputs: the user's buffer when 16-byte aligned (the context's promise), else staged.
  for (QueuedLaunch& q : queue_) {
    q.kernel_outputs.assign(q.launch.outputs.begin(), q.launch.outputs.end());
    for (int r = 0; r < static_cast<int>(q.kernel_outputs.size()); ++r) {
      if (q.launch.output_is_input) {
        q.kernel_outputs[r] = heaps_[r].input.data;
      } else if (!aligned16(q.kernel_outputs[r])) {
        grow(heaps_[r].output, r, output_bytes);
        q.kernel_outputs[r] = heaps_[r].output.data;
      }
    }
  }
  // 3. New or grown buffers: exchange handles (every rank misses, so every rank exchanges).
  if (handles_dirty_) sync_handles();
  if (tracer_) {
    for (const QueuedLaunch& q : queue_) launch_names_.push_back(q.launch.name);
    tracer_->set_launch_names(launch_names_);
  }
  progress_done_.store(0);
  progress_total_.store(units);
  // 4. Run.
  try {
    if (options_.schedule == Schedule::kThreads) {
      ThreadsScheduler scheduler(*this, options_.wait_timeout);
      scheduler.run();
    } else {
      SeededScheduler scheduler(*this, options_.schedule_seed, options_.max_steps);
      struct KeepSteps {
        World* w;
        const SeededScheduler& s;
        ~KeepSteps() { w->last_steps_ = s.steps(); }
      } keep{this, scheduler};
      scheduler.run();
    }
  } catch (const SimError& e) {
    failed_ = true;
    throw SimError(e.kind(), e.what() + fault_note());
  } catch (...) {
    failed_ = true;
    throw;
  }
  if (fault_fired_.load()) {
    failed_ = true;
    throw SimError(SimFailure::kRankDied, "rank " + std::to_string(options_.fail_rank) +
                                              " did not finish; its peers finished without it" + fault_note());
  }
}

uint32_t lamport_load_word(const void* p, int bytes) {
  if (bytes == 2)
    return std::atomic_ref<uint16_t>(*static_cast<uint16_t*>(const_cast<void*>(p))).load(std::memory_order_acquire);
  return std::atomic_ref<uint32_t>(*static_cast<uint32_t*>(const_cast<void*>(p))).load(std::memory_order_acquire);
}

void lamport_store_word(void* p, int bytes, uint32_t value) {
  if (bytes == 2) {
    std::atomic_ref<uint16_t>(*static_cast<uint16_t*>(p))
        .store(static_cast<uint16_t>(value), std::memory_order_release);
  } else {
    std::atomic_ref<uint32_t>(*static_cast<uint32_t*>(p)).store(value, std::memory_order_release);
  }
}

std::string lamport_poll_text(const LamportPoll& where, int peer) {
  return "peer " + std::to_string(peer) + "'s slot of Lamport buffer " + std::to_string(where.buffer) + " (call " +
         std::to_string(where.call) + "), element " + std::to_string(where.element);
}

void throw_misaligned_pack(const BlockEnv& env, const void* p, const char* access) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::string where = "an address " + std::to_string(at % 16) + " bytes past a 16-byte boundary";
  for (int q = 0; q < env.world_size && env.peers != nullptr; ++q) {
    const auto base = reinterpret_cast<uintptr_t>(env.peers->scratch[q]);
    if (base != 0 && at >= base && at < base + env.peers->scratch_bytes) {
      where = "rank " + std::to_string(q) + "'s scratch + " + std::to_string(at - base) + " bytes";
    }
  }
  throw SimError(SimFailure::kError, "rank " + std::to_string(env.rank) + " block " + std::to_string(env.block) +
                                         ": a 16-byte " + access + " " + where +
                                         ": not 16-byte aligned (on a GPU: cudaErrorMisalignedAddress)");
}

void Executor::lamport_wait(const BlockEnv& env, const void* word, int bytes, uint32_t sentinel, int peer,
                            const LamportPoll& where) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (lamport_load_word(word, bytes) == sentinel) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw SimError(SimFailure::kTimeout, "rank " + std::to_string(env.rank) + " block " + std::to_string(env.block) +
                                               " polled " + lamport_poll_text(where, peer) +
                                               " for 20000 ms: it still holds the sentinel; rank " +
                                               std::to_string(peer) + " never wrote it");
    }
    std::this_thread::yield();
  }
}

}  // namespace exactcoll::sim
