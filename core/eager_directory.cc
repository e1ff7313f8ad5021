#include "core/eager_directory.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace exactcoll {

EagerDirectory::EagerDirectory(int rank, int world_size, std::vector<EagerMailbox*> mailboxes, EagerDirectoryFns fns)
    : rank_(rank),
      world_size_(world_size),
      mailboxes_(std::move(mailboxes)),
      fns_(std::move(fns)),
      seen_(static_cast<size_t>(world_size), 0),
      retirements_(static_cast<size_t>(world_size), 0),
      open_(static_cast<size_t>(world_size), std::vector<void*>(kEagerSlots, nullptr)) {
  if (world_size < 1 || world_size > kMaxRanks || rank < 0 || rank >= world_size ||
      mailboxes_.size() != static_cast<size_t>(world_size)) {
    throw std::invalid_argument("EagerDirectory: rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
                                " with " + std::to_string(mailboxes_.size()) + " mailboxes");
  }
}

EagerDirectory::~EagerDirectory() {
  for (int p = 0; p < world_size_; ++p) {
    for (void* address : open_[static_cast<size_t>(p)]) {
      if (address != nullptr && fns_.close) fns_.close(p, address);
    }
  }
}

void EagerDirectory::service() {
  EagerMailbox& mine = *mailboxes_[static_cast<size_t>(rank_)];
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_) continue;
    const EagerMailbox& theirs = *mailboxes_[static_cast<size_t>(p)];
    std::vector<void*>& opened = open_[static_cast<size_t>(p)];
    uint32_t& seen = seen_[static_cast<size_t>(p)];
    // Bounded: a peer publishes at most kEagerSlots slots.
    const uint32_t exported = std::min<uint32_t>(theirs.exported.load(std::memory_order_acquire), kEagerSlots);
    for (; seen < exported; ++seen) {
      if (theirs.retired[seen].load(std::memory_order_acquire) != 0) {  // freed already: never opened
        mine.mapped[p][seen].store(kMappingFailed, std::memory_order_release);
        continue;
      }
      void* address = fns_.open(p, theirs.exports[seen].handle);
      ++stats_.opens;
      opened[seen] = address;
      mine.mapped[p][seen].store(address != nullptr ? reinterpret_cast<uint64_t>(address) : kMappingFailed,
                                 std::memory_order_release);
    }
    const uint32_t retirements = theirs.retirements.load(std::memory_order_acquire);
    if (retirements == retirements_[static_cast<size_t>(p)]) continue;
    retirements_[static_cast<size_t>(p)] = retirements;
    for (uint32_t s = 0; s < seen; ++s) {
      if (opened[s] == nullptr || theirs.retired[s].load(std::memory_order_acquire) == 0) continue;
      if (fns_.close) fns_.close(p, opened[s]);
      ++stats_.closes;
      opened[s] = nullptr;
      mine.mapped[p][s].store(kMappingFailed, std::memory_order_release);
    }
  }
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
      const uint64_t mapped = mailboxes_[static_cast<size_t>(p)]->mapped[rank_][s].load(std::memory_order_acquire);
      if (mapped == 0) return staged("rank " + std::to_string(p) + " has not opened the input's allocation yet");
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
    mine.retired[s].store(1, std::memory_order_release);
    ++stats_.retires;
    // After the flag: a peer that sees the new count finds every flag it counts.
    mine.retirements.store(static_cast<uint32_t>(stats_.retires), std::memory_order_release);
  }
  if (own_.size() == static_cast<size_t>(kEagerSlots)) {
    return staged("all " + std::to_string(kEagerSlots) + " eager slots of this rank are used");
  }
  const std::optional<EagerHandle> handle = fns_.export_handle(a);
  if (!handle) {
    // A cache of refusals (bounded: an evicted id is only tried again).
    if (unexportable_.size() == static_cast<size_t>(kEagerSlots)) unexportable_.erase(unexportable_.begin());
    unexportable_.push_back(a.id);
    return staged("the input's allocation cannot be exported (no IPC handle)");
  }
  const size_t s = own_.size();
  mine.exports[s] = EagerMailbox::Export{*handle, a.base, a.bytes, a.id};
  own_.push_back(OwnSlot{a, false});
  mine.exported.store(static_cast<uint32_t>(s + 1), std::memory_order_release);
  ++stats_.exports;
  return staged("the input's allocation was exported just now; peers open it before their next call");
}

}  // namespace exactcoll
