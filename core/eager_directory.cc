#include "core/eager_directory.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace exactcoll {

namespace {

// A slot at this generation is not reused again: retired[s] = generation + 1 then never wraps to 0.
constexpr uint32_t kLastGeneration = UINT32_MAX - 1;

}  // namespace

EagerDirectory::EagerDirectory(int rank, int world_size, std::vector<EagerMailbox*> mailboxes, EagerDirectoryFns fns)
    : rank_(rank),
      world_size_(world_size),
      mailboxes_(std::move(mailboxes)),
      fns_(std::move(fns)),
      seen_(static_cast<size_t>(world_size), 0),
      peer_changes_(static_cast<size_t>(world_size), 0),
      peer_(static_cast<size_t>(world_size), std::vector<PeerSlot>(kEagerSlots)) {
  if (world_size < 1 || world_size > kMaxRanks || rank < 0 || rank >= world_size ||
      mailboxes_.size() != static_cast<size_t>(world_size)) {
    throw std::invalid_argument("EagerDirectory: rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
                                " with " + std::to_string(mailboxes_.size()) + " mailboxes");
  }
}

EagerDirectory::~EagerDirectory() {
  for (int p = 0; p < world_size_; ++p) {
    for (const PeerSlot& slot : peer_[static_cast<size_t>(p)]) {
      if (slot.address != nullptr && fns_.close) fns_.close(p, slot.address);
    }
  }
}

void EagerDirectory::service_slot(int p, uint32_t s, bool first) {
  EagerMailbox& mine = *mailboxes_[static_cast<size_t>(rank_)];
  const EagerMailbox& theirs = *mailboxes_[static_cast<size_t>(p)];
  PeerSlot& slot = peer_[static_cast<size_t>(p)][s];
  // The generation first: its release covers exports[s] and every older retired value.
  const uint32_t generation = theirs.generation[s].load(std::memory_order_acquire);
  const bool retired = theirs.retired[s].load(std::memory_order_acquire) == generation + 1;
  auto close = [&] {
    if (fns_.close) fns_.close(p, slot.address);
    ++stats_.closes;
    slot.address = nullptr;
  };
  if (first || generation != slot.generation) {
    // A new slot, or the owner reused it. It reuses one only after this rank published closing the
    // old generation, so nothing is open here; were it, it goes before the new open.
    if (slot.address != nullptr) close();
    if (!retired) {  // a retired generation (freed already) is never opened
      slot.address = fns_.open(p, theirs.exports[s].handle);
      ++stats_.opens;
    }
    slot.generation = generation;
    mine.mapped[p][s].store(slot.address != nullptr ? reinterpret_cast<uint64_t>(slot.address) : kMappingFailed,
                            std::memory_order_release);
    mine.mapped_generation[p][s].store(generation, std::memory_order_release);
    return;
  }
  if (slot.address == nullptr || !retired) return;
  close();
  mine.mapped[p][s].store(kMappingFailed, std::memory_order_release);  // closed: the owner may reuse s
}

void EagerDirectory::service() {
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_) continue;
    const EagerMailbox& theirs = *mailboxes_[static_cast<size_t>(p)];
    uint32_t& seen = seen_[static_cast<size_t>(p)];
    // Before the slots it covers: a change stored after this load moves it again for the next service.
    const uint32_t changes = theirs.changes.load(std::memory_order_acquire);
    // Bounded: a peer publishes at most kEagerSlots slots.
    const uint32_t exported = std::min<uint32_t>(theirs.exported.load(std::memory_order_acquire), kEagerSlots);
    if (changes != peer_changes_[static_cast<size_t>(p)]) {
      peer_changes_[static_cast<size_t>(p)] = changes;
      for (uint32_t s = 0; s < seen; ++s) service_slot(p, s, /*first=*/false);
    }
    for (; seen < exported; ++seen) service_slot(p, seen, /*first=*/true);
  }
}

int EagerDirectory::peer_holding(size_t s) const {
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_) continue;
    const EagerMailbox& theirs = *mailboxes_[static_cast<size_t>(p)];
    // mapped_generation first: when it is this generation, mapped is that generation's entry.
    if (theirs.mapped_generation[rank_][s].load(std::memory_order_acquire) != own_[s].generation ||
        theirs.mapped[rank_][s].load(std::memory_order_acquire) != kMappingFailed) {
      return p;
    }
  }
  return -1;
}

bool EagerDirectory::views(const void* input, size_t bytes, const void* views[kMaxRanks], std::string* why) {
  auto staged = [&](const std::string& reason) {
    ++stats_.staged;
    if (why != nullptr) *why = reason;
    return false;
  };
  const std::optional<EagerAllocation> found = fns_.find(input);
  const auto address = reinterpret_cast<uint64_t>(input);
  if (!found || address < found->base || address + bytes > found->base + found->bytes) {
    return staged("the input is not inside one device allocation");
  }
  const EagerAllocation& a = *found;
  EagerMailbox& mine = *mailboxes_[static_cast<size_t>(rank_)];
  for (size_t s = 0; s < own_.size(); ++s) {
    if (own_[s].retired || own_[s].allocation.id != a.id) continue;
    for (int p = 0; p < world_size_; ++p) {
      if (p == rank_) continue;
      const EagerMailbox& theirs = *mailboxes_[static_cast<size_t>(p)];
      // mapped_generation first (see peer_holding); an older generation's entry is never used.
      const uint32_t generation = theirs.mapped_generation[rank_][s].load(std::memory_order_acquire);
      const uint64_t mapped = theirs.mapped[rank_][s].load(std::memory_order_acquire);
      if (generation != own_[s].generation || mapped == 0) {
        return staged("rank " + std::to_string(p) + " has not opened the input's allocation yet");
      }
      if (mapped == kMappingFailed) {
        return staged("rank " + std::to_string(p) + " could not open the input's allocation");
      }
      views[p] = reinterpret_cast<const void*>(mapped + (address - a.base));
    }
    views[rank_] = input;
    ++stats_.in_place;
    return true;
  }
  if (std::find(unexportable_.begin(), unexportable_.end(), a.id) != unexportable_.end()) {
    return staged("the input's allocation cannot be exported (no IPC handle)");
  }
  // A new allocation where an exported one lay: that one was freed, so peers may close it.
  for (size_t s = 0; s < own_.size(); ++s) {
    const EagerAllocation& old = own_[s].allocation;
    if (own_[s].retired || old.base >= a.base + a.bytes || a.base >= old.base + old.bytes) continue;
    own_[s].retired = true;
    mine.retired[s].store(own_[s].generation + 1, std::memory_order_release);
    ++stats_.retires;
    // After the flag: a peer that sees the new count finds every flag it counts.
    mine.changes.store(++changes_, std::memory_order_release);
  }
  // The slot for it: a retired one that every peer has closed, else a new one (bounded: kEagerSlots).
  size_t slot = own_.size();
  int waiting_for = -1;  // a peer that still holds a retired slot
  for (size_t s = 0; s < own_.size(); ++s) {
    if (!own_[s].retired || own_[s].generation == kLastGeneration) continue;
    const int holder = peer_holding(s);
    if (holder < 0) {
      slot = s;
      break;
    }
    if (waiting_for < 0) waiting_for = holder;
  }
  if (slot == static_cast<size_t>(kEagerSlots)) {
    return staged("all " + std::to_string(kEagerSlots) + " eager slots of this rank are used" +
                  (waiting_for >= 0 ? " (a retired one waits for rank " + std::to_string(waiting_for) + " to close it)"
                                    : " by live allocations"));
  }
  const std::optional<EagerHandle> handle = fns_.export_handle(a);
  if (!handle) {
    // A cache of refusals (bounded: an evicted id is only tried again).
    if (unexportable_.size() == static_cast<size_t>(kEagerSlots)) unexportable_.erase(unexportable_.begin());
    unexportable_.push_back(a.id);
    return staged("the input's allocation cannot be exported (no IPC handle)");
  }
  // Every peer's last read of exports[slot] (a reused one) came before its published close.
  mine.exports[slot] = EagerMailbox::Export{*handle, a.base, a.bytes, a.id};
  if (slot == own_.size()) {
    own_.push_back(OwnSlot{a, 0, false});
    mine.exported.store(static_cast<uint32_t>(slot + 1), std::memory_order_release);
  } else {
    own_[slot] = OwnSlot{a, own_[slot].generation + 1, false};
    mine.generation[slot].store(own_[slot].generation, std::memory_order_release);
    ++stats_.reuses;
    mine.changes.store(++changes_, std::memory_order_release);
  }
  ++stats_.exports;
  return staged("the input's allocation was exported just now; peers open it before their next call");
}

}  // namespace exactcoll
