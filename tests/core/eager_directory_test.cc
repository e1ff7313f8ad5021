// The eager directory (core/eager_directory.h) over heap mailboxes and fake allocations: the first
// call with a new allocation stages and exports it, peers open it at their next service, and then
// every peer's address of the input comes back with the input's offset; a peer that has not opened
// it, a failed open, an allocation that cannot be exported, a freed-and-reused address range, the
// slot limit, retired slots reused in a new generation (only once every peer has closed the old
// one), and ranks calling concurrently.
#include "core/eager_directory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace exactcoll {
namespace {

// Where rank `opener` maps rank `owner`'s allocation `id`: a fixed, distinct fake address.
uint64_t fake_mapping(int opener, int owner, uint64_t id) {
  return (uint64_t{1} << 40) + (static_cast<uint64_t>(opener) << 32) + (static_cast<uint64_t>(owner) << 28) +
         (id << 16);
}

EagerHandle handle_of(int owner, uint64_t id) {
  EagerHandle h{};
  std::snprintf(h.data(), h.size(), "rank %d id %llu", owner, static_cast<unsigned long long>(id));
  return h;
}

std::pair<int, uint64_t> parse_handle(const EagerHandle& h) {
  int owner = -1;
  unsigned long long id = 0;
  EXPECT_EQ(std::sscanf(h.data(), "rank %d id %llu", &owner, &id), 2) << h.data();
  return {owner, id};
}

// n ranks in one process: each rank's allocations (by base), what it refuses to export or open.
class World {
 public:
  explicit World(int n) : n_(n), allocations_(static_cast<size_t>(n)), refuse_open_(static_cast<size_t>(n)) {
    for (int r = 0; r < n; ++r) boxes_.push_back(std::make_unique<EagerMailbox>());
    std::vector<EagerMailbox*> raw;
    for (auto& b : boxes_) raw.push_back(b.get());
    for (int r = 0; r < n; ++r) dirs_.push_back(std::make_unique<EagerDirectory>(r, n, raw, fns(r)));
  }
  EagerDirectory& dir(int r) { return *dirs_[static_cast<size_t>(r)]; }
  EagerMailbox& box(int r) { return *boxes_[static_cast<size_t>(r)]; }
  // Rank r allocates [base, base + bytes) with a new id (replacing whatever lay there).
  uint64_t allocate(int r, uint64_t base, uint64_t bytes, bool exportable = true) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& mine = allocations_[static_cast<size_t>(r)];
    for (auto it = mine.begin(); it != mine.end();) {
      it = it->second.base < base + bytes && base < it->second.base + it->second.bytes ? mine.erase(it) : std::next(it);
    }
    const uint64_t id = ++next_id_;
    mine[base] = EagerAllocation{base, bytes, id};
    if (!exportable) unexportable_.insert(id);
    return id;
  }
  void refuse_open(int opener, uint64_t id) { refuse_open_[static_cast<size_t>(opener)].insert(id); }
  void service_all() {
    for (int r = 0; r < n_; ++r) dir(r).service();
  }
  void destroy_directories() { dirs_.clear(); }
  int exports_tried(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return exports_tried_[id];
  }
  std::multiset<std::pair<int, uint64_t>> closed;  // (closer, address)

 private:
  EagerDirectoryFns fns(int r) {
    EagerDirectoryFns f;
    f.find = [this, r](const void* p) -> std::optional<EagerAllocation> {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto a = reinterpret_cast<uint64_t>(p);
      for (const auto& [base, alloc] : allocations_[static_cast<size_t>(r)]) {
        if (a >= base && a < base + alloc.bytes) return alloc;
      }
      return std::nullopt;
    };
    f.export_handle = [this, r](const EagerAllocation& a) -> std::optional<EagerHandle> {
      std::lock_guard<std::mutex> lock(mutex_);
      ++exports_tried_[a.id];
      if (unexportable_.count(a.id) != 0) return std::nullopt;
      return handle_of(r, a.id);
    };
    f.open = [this, r](int peer, const EagerHandle& h) -> void* {
      const auto [owner, id] = parse_handle(h);
      EXPECT_EQ(owner, peer);
      std::lock_guard<std::mutex> lock(mutex_);
      if (refuse_open_[static_cast<size_t>(r)].count(id) != 0) return nullptr;
      return reinterpret_cast<void*>(fake_mapping(r, owner, id));
    };
    f.close = [this, r](int /*peer*/, void* address) {
      std::lock_guard<std::mutex> lock(mutex_);
      closed.insert({r, reinterpret_cast<uint64_t>(address)});
    };
    return f;
  }

  int n_;
  std::mutex mutex_;
  uint64_t next_id_ = 0;
  std::vector<std::unique_ptr<EagerMailbox>> boxes_;
  std::vector<std::map<uint64_t, EagerAllocation>> allocations_;
  std::set<uint64_t> unexportable_;
  std::vector<std::set<uint64_t>> refuse_open_;
  std::map<uint64_t, int> exports_tried_;
  std::vector<std::unique_ptr<EagerDirectory>> dirs_;
};

const void* at(uint64_t a) { return reinterpret_cast<const void*>(a); }

TEST(EagerDirectory, FirstCallExportsAndStagesThenPeersReadInPlaceAtTheirAddress) {
  World w(4);
  const uint64_t base = 0x7f0000000000, offset = 0x1230;
  const uint64_t id = w.allocate(2, base, 1 << 20);
  const void* views[kMaxRanks] = {};
  std::string why;
  EXPECT_FALSE(w.dir(2).views(at(base + offset), 4096, views, &why));
  EXPECT_NE(why.find("exported just now"), std::string::npos) << why;
  EXPECT_EQ(w.dir(2).stats().exports, 1u);
  // Rank 0 and 1 open it, rank 3 not yet: still staged, naming rank 3.
  w.dir(0).service();
  w.dir(1).service();
  EXPECT_FALSE(w.dir(2).views(at(base + offset), 4096, views, &why));
  EXPECT_NE(why.find("rank 3 has not opened"), std::string::npos) << why;
  w.dir(3).service();
  ASSERT_TRUE(w.dir(2).views(at(base + offset), 4096, views, &why)) << why;
  for (int p = 0; p < 4; ++p) {
    const uint64_t expected = p == 2 ? base + offset : fake_mapping(p, 2, id) + offset;
    EXPECT_EQ(reinterpret_cast<uint64_t>(views[p]), expected) << "peer " << p;
  }
  // Another tensor of the same allocation: no new export, its own offset.
  ASSERT_TRUE(w.dir(2).views(at(base + 0x80000), 64, views, &why)) << why;
  EXPECT_EQ(reinterpret_cast<uint64_t>(views[0]), fake_mapping(0, 2, id) + 0x80000);
  EXPECT_EQ(w.dir(2).stats().exports, 1u);
  EXPECT_EQ(w.dir(2).stats().in_place, 2u);
  EXPECT_EQ(w.dir(0).stats().opens, 1u);
}

TEST(EagerDirectory, AnInputOutsideEveryAllocationOrPastItsEndStages) {
  World w(2);
  w.allocate(0, 0x10000, 0x1000);
  const void* views[kMaxRanks] = {};
  std::string why;
  EXPECT_FALSE(w.dir(0).views(at(0x90000), 16, views, &why));
  EXPECT_NE(why.find("not inside one device allocation"), std::string::npos);
  EXPECT_FALSE(w.dir(0).views(at(0x10800), 0x1000, views, &why));  // runs past the allocation's end
  EXPECT_NE(why.find("not inside one device allocation"), std::string::npos);
  EXPECT_EQ(w.dir(0).stats().exports, 0u);
}

TEST(EagerDirectory, AFailedOpenStagesForGoodAndNamesThePeer) {
  World w(3);
  const uint64_t id = w.allocate(0, 0x10000, 0x10000);
  w.refuse_open(1, id);
  const void* views[kMaxRanks] = {};
  std::string why;
  EXPECT_FALSE(w.dir(0).views(at(0x10000), 16, views, &why));
  for (int round = 0; round < 3; ++round) {
    w.service_all();
    EXPECT_FALSE(w.dir(0).views(at(0x10000), 16, views, &why));
    EXPECT_NE(why.find("rank 1 could not open"), std::string::npos) << why;
  }
  EXPECT_EQ(w.dir(1).stats().opens, 1u);  // tried once, not at every service
}

TEST(EagerDirectory, AnUnexportableAllocationIsTriedOnce) {
  World w(2);
  const uint64_t id = w.allocate(0, 0x10000, 0x10000, /*exportable=*/false);
  const void* views[kMaxRanks] = {};
  std::string why;
  for (int call = 0; call < 5; ++call) {
    EXPECT_FALSE(w.dir(0).views(at(0x10000), 16, views, &why));
    EXPECT_NE(why.find("cannot be exported"), std::string::npos) << why;
    w.service_all();
  }
  EXPECT_EQ(w.exports_tried(id), 1);
  EXPECT_EQ(w.dir(1).stats().opens, 0u);
}

TEST(EagerDirectory, AFreedAndReusedRangeRetiresItsSlotAndPeersCloseIt) {
  World w(2);
  const uint64_t first = w.allocate(0, 0x100000, 0x100000);
  const void* views[kMaxRanks] = {};
  std::string why;
  EXPECT_FALSE(w.dir(0).views(at(0x100000), 16, views, &why));
  w.service_all();
  ASSERT_TRUE(w.dir(0).views(at(0x100000), 16, views, &why)) << why;
  EXPECT_EQ(reinterpret_cast<uint64_t>(views[1]), fake_mapping(1, 0, first));
  // The allocation is freed and a new one (new id) lands on part of its range: never the old view.
  const uint64_t second = w.allocate(0, 0x180000, 0x100000);
  EXPECT_FALSE(w.dir(0).views(at(0x180000), 16, views, &why));
  EXPECT_NE(why.find("exported just now"), std::string::npos) << why;
  EXPECT_EQ(w.dir(0).stats().retires, 1u);
  w.service_all();
  EXPECT_EQ(w.closed.count({1, fake_mapping(1, 0, first)}), 1u);
  ASSERT_TRUE(w.dir(0).views(at(0x180000), 16, views, &why)) << why;
  EXPECT_EQ(reinterpret_cast<uint64_t>(views[1]), fake_mapping(1, 0, second));
  w.service_all();
  EXPECT_EQ(w.closed.size(), 1u);  // closed once
}

TEST(EagerDirectory, APeerThatComesAfterTheRetirementNeverOpensTheOldSlot) {
  World w(3);
  w.allocate(0, 0x100000, 0x100000);
  const void* views[kMaxRanks] = {};
  std::string why;
  EXPECT_FALSE(w.dir(0).views(at(0x100000), 16, views, &why));  // slot 0 exported
  w.dir(1).service();                                           // rank 1 opens it, rank 2 not yet
  const uint64_t second = w.allocate(0, 0x100000, 0x100000);    // freed, reused: slot 0 retired
  EXPECT_FALSE(w.dir(0).views(at(0x100000), 16, views, &why));  // slot 1 exported
  w.service_all();
  EXPECT_EQ(w.dir(2).stats().opens, 1u) << "rank 2 opened only the new allocation";
  EXPECT_EQ(w.dir(1).stats().opens, 2u);
  EXPECT_EQ(w.dir(1).stats().closes, 1u);
  ASSERT_TRUE(w.dir(0).views(at(0x100000), 16, views, &why)) << why;
  EXPECT_EQ(reinterpret_cast<uint64_t>(views[2]), fake_mapping(2, 0, second));
}

TEST(EagerDirectory, PastTheSlotLimitCallsStage) {
  World w(2);
  const void* views[kMaxRanks] = {};
  std::string why;
  for (int s = 0; s < kEagerSlots; ++s) {
    const uint64_t base = 0x1000000 + static_cast<uint64_t>(s) * 0x10000;
    w.allocate(0, base, 0x10000);
    EXPECT_FALSE(w.dir(0).views(at(base), 16, views, &why));
  }
  const uint64_t extra = 0x1000000 + static_cast<uint64_t>(kEagerSlots) * 0x10000;
  w.allocate(0, extra, 0x10000);
  EXPECT_FALSE(w.dir(0).views(at(extra), 16, views, &why));
  EXPECT_NE(why.find("eager slots of this rank are used"), std::string::npos) << why;
  w.service_all();
  EXPECT_TRUE(w.dir(0).views(at(0x1000000), 16, views, &why)) << why;  // the first slots still serve
  EXPECT_EQ(w.dir(1).stats().opens, static_cast<uint64_t>(kEagerSlots));
}

// Like torch.cuda.empty_cache() in a loop: each round frees a block and allocates a new one over
// its range. Far more allocations than slots, every one read in place at the peers' new mapping.
TEST(EagerDirectory, RetiredSlotsAreReusedForMoreAllocationsThanSlots) {
  constexpr int kRanks = 3, kBlocks = 5, kRounds = 6 * kEagerSlots;
  World w(kRanks);
  const uint64_t region = 0x40000000;
  auto base_of = [&](int b) { return region + static_cast<uint64_t>(b) * 0x100000; };
  std::vector<uint64_t> ids(kBlocks);
  const void* views[kMaxRanks] = {};
  std::string why;
  for (int b = 0; b < kBlocks; ++b) {
    ids[b] = w.allocate(0, base_of(b), 0x100000);
    EXPECT_FALSE(w.dir(0).views(at(base_of(b)), 64, views, &why));
  }
  w.service_all();
  std::set<uint64_t> opened_mappings;  // what rank 1 was handed, over the run: one per allocation
  for (int round = 0; round < kRounds; ++round) {
    const int b = round % kBlocks;
    const uint64_t offset = 0x40 * static_cast<uint64_t>(round % 64);
    ids[b] = w.allocate(0, base_of(b), 0x100000);  // the old block is freed, a new one lies over it
    ASSERT_FALSE(w.dir(0).views(at(base_of(b) + offset), 64, views, &why)) << "round " << round;
    ASSERT_NE(why.find("exported just now"), std::string::npos) << "round " << round << ": " << why;
    w.service_all();
    // Every block in place at its current allocation's mapping, the new one included.
    for (int c = 0; c < kBlocks; ++c) {
      ASSERT_TRUE(w.dir(0).views(at(base_of(c) + offset), 64, views, &why)) << "round " << round << ": " << why;
      for (int p = 0; p < kRanks; ++p) {
        const uint64_t expected = p == 0 ? base_of(c) + offset : fake_mapping(p, 0, ids[c]) + offset;
        ASSERT_EQ(reinterpret_cast<uint64_t>(views[p]), expected) << "round " << round << " block " << c;
      }
      opened_mappings.insert(reinterpret_cast<uint64_t>(views[1]) - offset);
    }
  }
  const EagerDirectoryStats& st = w.dir(0).stats();
  EXPECT_EQ(st.exports, static_cast<uint64_t>(kBlocks + kRounds));
  EXPECT_EQ(st.retires, static_cast<uint64_t>(kRounds));
  EXPECT_GE(st.reuses, static_cast<uint64_t>(kBlocks + kRounds - kEagerSlots));
  // Every allocation but block 0's first (replaced in round 0, before any read) read at its own mapping.
  EXPECT_EQ(opened_mappings.size(), static_cast<size_t>(kBlocks + kRounds - 1));
  for (int p = 1; p < kRanks; ++p) {
    EXPECT_EQ(w.dir(p).stats().opens, static_cast<uint64_t>(kBlocks + kRounds)) << "rank " << p;
    EXPECT_EQ(w.dir(p).stats().closes, static_cast<uint64_t>(kRounds)) << "rank " << p;  // each retired one once
  }
  EXPECT_EQ(w.closed.size(), static_cast<size_t>((kRanks - 1) * kRounds));
}

// All slots live, one freed and replaced: its slot is the only one to reuse, and the owner waits
// until every peer has closed the old generation (staging, exporting nothing) before it does.
TEST(EagerDirectory, ARetiredSlotIsReusedOnlyOnceEveryPeerHasClosedIt) {
  World w(3);
  const void* views[kMaxRanks] = {};
  std::string why;
  auto base_of = [](int s) { return 0x1000000 + static_cast<uint64_t>(s) * 0x10000; };
  std::vector<uint64_t> ids(kEagerSlots);
  for (int s = 0; s < kEagerSlots; ++s) {
    ids[s] = w.allocate(0, base_of(s), 0x10000);
    EXPECT_FALSE(w.dir(0).views(at(base_of(s)), 16, views, &why));
  }
  w.service_all();
  ASSERT_TRUE(w.dir(0).views(at(base_of(7)), 16, views, &why)) << why;
  const uint64_t old_mapping = fake_mapping(1, 0, ids[7]);
  EXPECT_EQ(reinterpret_cast<uint64_t>(views[1]), old_mapping);
  // Block 7 is freed and a new allocation lies over it: slot 7 retired, but rank 1 still maps it.
  const uint64_t fresh = w.allocate(0, base_of(7), 0x10000);
  EXPECT_FALSE(w.dir(0).views(at(base_of(7)), 16, views, &why));
  EXPECT_NE(why.find("eager slots of this rank are used (a retired one waits for rank 1"), std::string::npos) << why;
  w.dir(2).service();  // rank 2 closes it; rank 1 has not run yet
  EXPECT_FALSE(w.dir(0).views(at(base_of(7)), 16, views, &why));
  EXPECT_NE(why.find("waits for rank 1 to close it"), std::string::npos) << why;
  EXPECT_EQ(w.dir(0).stats().exports, static_cast<uint64_t>(kEagerSlots));  // nothing exported meanwhile
  EXPECT_EQ(w.dir(0).stats().reuses, 0u);
  EXPECT_EQ(w.closed.count({1, old_mapping}), 0u);
  EXPECT_TRUE(w.dir(0).views(at(base_of(8)), 16, views, &why)) << why;  // the others still serve
  w.dir(1).service();                                                   // closes it
  EXPECT_EQ(w.closed.count({1, old_mapping}), 1u);
  EXPECT_FALSE(w.dir(0).views(at(base_of(7)), 16, views, &why));
  EXPECT_NE(why.find("exported just now"), std::string::npos) << why;
  EXPECT_EQ(w.dir(0).stats().reuses, 1u);
  EXPECT_EQ(w.box(0).exported.load(), static_cast<uint32_t>(kEagerSlots));  // slot 7, generation 1
  EXPECT_EQ(w.box(0).generation[7].load(), 1u);
  // Every peer's entry still names generation 0 (closed): staged, not "could not open".
  EXPECT_FALSE(w.dir(0).views(at(base_of(7)), 16, views, &why));
  EXPECT_NE(why.find("rank 1 has not opened"), std::string::npos) << why;
  w.dir(1).service();
  EXPECT_FALSE(w.dir(0).views(at(base_of(7)), 16, views, &why));
  EXPECT_NE(why.find("rank 2 has not opened"), std::string::npos) << why;
  w.dir(2).service();
  ASSERT_TRUE(w.dir(0).views(at(base_of(7) + 0x100), 16, views, &why)) << why;
  EXPECT_EQ(reinterpret_cast<uint64_t>(views[1]), fake_mapping(1, 0, fresh) + 0x100);
  EXPECT_EQ(reinterpret_cast<uint64_t>(views[2]), fake_mapping(2, 0, fresh) + 0x100);
  EXPECT_EQ(w.dir(1).stats().opens, static_cast<uint64_t>(kEagerSlots + 1));
  w.destroy_directories();  // the new mapping closed once, the old one not again
  EXPECT_EQ(w.closed.count({1, old_mapping}), 1u);
  EXPECT_EQ(w.closed.count({1, fake_mapping(1, 0, fresh)}), 1u);
}

// A reused slot's allocation freed again before any peer looked at it: the peers' entries still
// say "closed" of the old generation, which does not count; the owner waits for them to publish
// the new one (retired, so never opened) before it reuses the slot once more.
TEST(EagerDirectory, AGenerationRetiredBeforeAPeerSawItWaitsForThatPeer) {
  World w(2);
  const void* views[kMaxRanks] = {};
  std::string why;
  auto base_of = [](int s) { return 0x1000000 + static_cast<uint64_t>(s) * 0x10000; };
  for (int s = 0; s < kEagerSlots; ++s) {
    w.allocate(0, base_of(s), 0x10000);
    EXPECT_FALSE(w.dir(0).views(at(base_of(s)), 16, views, &why));
  }
  w.service_all();
  w.allocate(0, base_of(7), 0x10000);
  EXPECT_FALSE(w.dir(0).views(at(base_of(7)), 16, views, &why));  // retired, rank 1 still maps it
  w.service_all();
  EXPECT_FALSE(w.dir(0).views(at(base_of(7)), 16, views, &why));  // generation 1
  ASSERT_EQ(w.dir(0).stats().reuses, 1u);
  const uint64_t third = w.allocate(0, base_of(7), 0x10000);  // freed again before rank 1 ran
  EXPECT_FALSE(w.dir(0).views(at(base_of(7)), 16, views, &why));
  EXPECT_NE(why.find("waits for rank 1 to close it"), std::string::npos) << why;
  EXPECT_EQ(w.dir(0).stats().reuses, 1u);
  w.service_all();
  EXPECT_EQ(w.dir(1).stats().opens, static_cast<uint64_t>(kEagerSlots)) << "generation 1 was never opened";
  EXPECT_FALSE(w.dir(0).views(at(base_of(7)), 16, views, &why));
  EXPECT_NE(why.find("exported just now"), std::string::npos) << why;
  EXPECT_EQ(w.box(0).generation[7].load(), 2u);
  w.service_all();
  ASSERT_TRUE(w.dir(0).views(at(base_of(7)), 16, views, &why)) << why;
  EXPECT_EQ(reinterpret_cast<uint64_t>(views[1]), fake_mapping(1, 0, third));
}

// A peer's entry of an older generation is never used, whatever address it holds (here forged,
// as if a peer had not closed the old generation when the owner reused the slot).
TEST(EagerDirectory, AMappingOfAnOlderGenerationIsNeverUsed) {
  World w(2);
  const void* views[kMaxRanks] = {};
  std::string why;
  const uint64_t first = w.allocate(0, 0x100000, 0x100000);
  EXPECT_FALSE(w.dir(0).views(at(0x100000), 16, views, &why));  // slot 0
  w.service_all();
  w.allocate(0, 0x100000, 0x100000);
  EXPECT_FALSE(w.dir(0).views(at(0x100000), 16, views, &why));  // slot 0 retired, slot 1
  w.service_all();
  const uint64_t third = w.allocate(0, 0x100000, 0x100000);
  EXPECT_FALSE(w.dir(0).views(at(0x100000), 16, views, &why));  // slot 1 retired, slot 0 generation 1
  ASSERT_EQ(w.dir(0).stats().reuses, 1u);
  // Rank 1's entry for slot 0 as if it still mapped generation 0.
  w.box(1).mapped[0][0].store(fake_mapping(1, 0, first));
  EXPECT_FALSE(w.dir(0).views(at(0x100000), 16, views, &why));
  EXPECT_NE(why.find("rank 1 has not opened"), std::string::npos) << why;
  w.dir(1).service();  // publishes generation 1
  ASSERT_TRUE(w.dir(0).views(at(0x100000), 16, views, &why)) << why;
  EXPECT_EQ(reinterpret_cast<uint64_t>(views[1]), fake_mapping(1, 0, third));
}

TEST(EagerDirectory, TheDestructorClosesWhatItOpened) {
  World w(3);
  const uint64_t a = w.allocate(0, 0x10000, 0x10000);
  const uint64_t b = w.allocate(1, 0x20000, 0x10000);
  const void* views[kMaxRanks] = {};
  w.dir(0).views(at(0x10000), 16, views);
  w.dir(1).views(at(0x20000), 16, views);
  w.service_all();
  EXPECT_TRUE(w.closed.empty());
  w.destroy_directories();
  const std::multiset<std::pair<int, uint64_t>> expected = {
      {1, fake_mapping(1, 0, a)}, {2, fake_mapping(2, 0, a)}, {0, fake_mapping(0, 1, b)}, {2, fake_mapping(2, 1, b)}};
  EXPECT_EQ(w.closed, expected);
}

TEST(EagerDirectory, ConcurrentRanksOnlyEverSeeTheirPeersRealAddresses) {
  constexpr int kRanks = 4, kCalls = 4000, kBlocks = 6;
  World w(kRanks);
  // Each rank cycles through kBlocks allocations; every 50 calls one is freed and reallocated, so
  // each rank makes more allocations than it has slots and reuses retired ones. A rank runs at
  // most kAhead calls past the slowest (servicing while it waits): on 2 shared cores a rank could
  // otherwise make all its calls while a peer is not scheduled, and stage them all.
  constexpr int kAhead = 20;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kRanks);
  std::atomic<int> started{0}, finished{0};
  std::vector<std::atomic<int>> progress(kRanks);  // calls made (kCalls once a rank stopped)
  for (auto& made : progress) made.store(0);
  auto slowest = [&] {
    int least = kCalls;
    for (const auto& made : progress) least = std::min(least, made.load());
    return least;
  };
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<uint64_t> ids(kBlocks);
      const uint64_t region = 0x10000000ull * static_cast<uint64_t>(r + 1);
      for (int b = 0; b < kBlocks; ++b) ids[b] = w.allocate(r, region + b * 0x100000ull, 0x100000);
      int in_place = 0;
      std::string last_why;
      started.fetch_add(1);
      while (started.load() < kRanks) std::this_thread::yield();
      for (int call = 0; call < kCalls && failures[r].empty(); progress[r].store(++call)) {
        while (call > slowest() + kAhead) {  // ends: the slowest rank never waits here
          w.dir(r).service();
          std::this_thread::yield();
        }
        const int b = call % kBlocks;
        if (call % 50 == 49) ids[b] = w.allocate(r, region + b * 0x100000ull, 0x100000);
        std::this_thread::yield();  // 2 cores, 4 ranks: let the others run between calls
        w.dir(r).service();
        const void* views[kMaxRanks] = {};
        const uint64_t input = region + b * 0x100000ull + 0x40 * static_cast<uint64_t>(call % 100);
        std::string why;
        if (!w.dir(r).views(at(input), 64, views, &why)) {
          last_why = why;
          continue;
        }
        ++in_place;
        for (int p = 0; p < kRanks; ++p) {
          const uint64_t expected = p == r ? input : fake_mapping(p, r, ids[b]) + (input - region - b * 0x100000ull);
          if (reinterpret_cast<uint64_t>(views[p]) != expected) {
            failures[r] = "call " + std::to_string(call) + " peer " + std::to_string(p) + ": a stale or wrong view";
          }
        }
      }
      // Peers still serving: a rank that finished first keeps opening what the others export.
      progress[r].store(kCalls);
      finished.fetch_add(1);
      while (finished.load() < kRanks) {
        w.dir(r).service();
        std::this_thread::yield();
      }
      if (failures[r].empty() && in_place < kCalls / 4) {
        failures[r] = "only " + std::to_string(in_place) + " calls in place; the last staged because " + last_why;
      }
      if (failures[r].empty() && w.dir(r).stats().exports <= static_cast<uint64_t>(kEagerSlots)) {
        failures[r] = "only " + std::to_string(w.dir(r).stats().exports) + " allocations exported";
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

}  // namespace
}  // namespace exactcoll
