#include "core/handle_exchange.h"

#include <cstring>
#include <stdexcept>
#include <utility>

#include "core/fnv1a.h"

namespace exactcoll {
namespace {

void put_u64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

bool get_u64(const std::string& in, size_t* pos, uint64_t* v) {
  if (*pos > in.size() || in.size() - *pos < 8) return false;
  uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r |= static_cast<uint64_t>(static_cast<unsigned char>(in[*pos + i])) << (8 * i);
  *pos += 8;
  *v = r;
  return true;
}

}  // namespace

std::string encode_handles(const std::vector<ExportedBuffer>& buffers) {
  std::string out;
  put_u64(&out, buffers.size());
  for (const auto& b : buffers) {
    put_u64(&out, b.base);
    put_u64(&out, b.size);
    put_u64(&out, b.offset);
    put_u64(&out, b.handle.size());
    out += b.handle;
  }
  return out;
}

std::vector<ExportedBuffer> decode_handles(const std::string& bytes, const std::string& source) {
  auto bad = [&](const std::string& what) {
    return std::runtime_error("handle exchange: malformed handle list from " + source + ": " + what);
  };
  size_t pos = 0;
  uint64_t count = 0;
  if (!get_u64(bytes, &pos, &count)) throw bad("no buffer count");
  // Each buffer takes at least 32 bytes: a count beyond that is a corrupt list, not an allocation.
  if (count > (bytes.size() - pos) / 32) throw bad("buffer count " + std::to_string(count) + " exceeds the data");
  std::vector<ExportedBuffer> out(count);
  for (auto& b : out) {
    uint64_t length = 0;
    if (!get_u64(bytes, &pos, &b.base) || !get_u64(bytes, &pos, &b.size) || !get_u64(bytes, &pos, &b.offset) ||
        !get_u64(bytes, &pos, &length)) {
      throw bad("truncated buffer entry");
    }
    if (length > bytes.size() - pos) throw bad("handle length " + std::to_string(length) + " exceeds the data");
    b.handle = bytes.substr(pos, length);
    pos += length;
  }
  if (pos != bytes.size()) throw bad(std::to_string(bytes.size() - pos) + " trailing bytes");
  return out;
}

HandleExchange::HandleExchange(Store& store, int rank, int world_size, OpenHandleFn open, CloseHandleFn close,
                               HandleExchangeOptions options)
    : store_(store),
      rank_(rank),
      world_size_(world_size),
      open_(std::move(open)),
      close_(std::move(close)),
      options_(std::move(options)) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("HandleExchange: rank " + std::to_string(rank) + " outside world of " +
                                std::to_string(world_size));
  }
}

std::string HandleExchange::key(uint64_t round, const std::string& what, int rank) const {
  std::string k = options_.key_prefix;
  k.append("/").append(std::to_string(round)).append("/").append(what);
  if (rank >= 0) k.append("/").append(std::to_string(rank));
  return k;
}

bool HandleExchange::misses(const std::vector<ExportedBuffer>& mine) const {
  for (const auto& b : mine) {
    const auto it = records_.find({b.base, b.size, b.offset});
    if (it == records_.end() || it->second.handle != b.handle) return true;
  }
  return false;
}

std::string HandleExchange::get_or_explain(const std::string& key, int peer, const char* what) {
  try {
    return store_.get(key, options_.timeout);
  } catch (const StoreError& e) {
    throw StoreError("handle exchange round " + std::to_string(round_) + " (rank " + std::to_string(rank_) + " of " +
                     std::to_string(world_size_) + "): rank " + std::to_string(peer) + " never published its " + what +
                     " (key '" + key + "'): " + e.what());
  }
}

std::string HandleExchange::list_digest(const std::vector<ExportedBuffer>& buffers) {
  uint64_t h = kFnv1aOffset;  // over each buffer's base, size, offset and handle bytes
  for (const ExportedBuffer& b : buffers) {
    for (const uint64_t v : {b.base, b.size, b.offset, static_cast<uint64_t>(b.handle.size())}) h = fnv1a_u64(h, v);
    h = fnv1a_bytes(h, b.handle.data(), b.handle.size());
  }
  return std::to_string(buffers.size()) + "/" + std::to_string(h);
}

void* HandleExchange::open_cached(int peer, const ExportedBuffer& buffer) {
  const OpenKey k{buffer.base, buffer.size, peer};
  auto it = opened_.find(k);
  if (it != opened_.end() && it->second.handle == buffer.handle) return it->second.base;
  if (it != opened_.end()) {
    // Same address and size, different allocation (freed and reallocated): the old mapping is stale.
    if (close_) close_(peer, it->second.base);
    ++stats_.closes;
    opened_.erase(it);
  }
  void* base = open_(peer, buffer);
  ++stats_.opens;
  opened_[k] = Opened{buffer.handle, base};
  return base;
}

std::vector<std::vector<void*>> HandleExchange::exchange(const std::vector<ExportedBuffer>& mine) {
  ++round_;
  ++stats_.calls;
  const uint64_t round = round_;

  // 1. Publish this rank's miss bit and the digest of its whole list (which buffers, in which
  //    order): the records pair buffer i of this rank with buffer i of each peer as the last
  //    exchange did, so a round whose lists pair differently must exchange even when every
  //    buffer is known (rank 0 exports a1 where rank 1 exports b2, after a round that paired a1
  //    with b1 and a2 with b2).
  const bool missed = misses(mine);
  stats_.last_missed = missed;
  const std::string own = std::string(missed ? "1" : "0") + ":" + list_digest(mine);
  store_.set(key(round, "miss", rank_), own);

  // 2. Read every rank's: every rank sees the same values, so takes the same decision.
  bool any_missed = false;
  std::vector<std::string> digests(static_cast<size_t>(world_size_));
  for (int p = 0; p < world_size_; ++p) {
    const std::string value = p == rank_ ? own : get_or_explain(key(round, "miss", p), p, "miss bit");
    any_missed = any_missed || value.rfind("1", 0) == 0;
    digests[static_cast<size_t>(p)] = value.substr(value.find(':') + 1);
  }
  any_missed = any_missed || digests != exchanged_digests_;
  // Every rank has published round `round`'s bit, so every rank is done with round-1's keys.
  if (round > 1) {
    store_.erase(key(round - 1, "miss", rank_));
    store_.erase(key(round - 1, "handles", rank_));
  }
  stats_.last_exchanged = any_missed;

  std::vector<std::vector<void*>> peers(mine.size(), std::vector<void*>(world_size_, nullptr));
  if (!any_missed) {
    // 3a. Nobody missed: every buffer is in the record, with every peer's address.
    for (size_t i = 0; i < mine.size(); ++i) peers[i] = records_.at({mine[i].base, mine[i].size, mine[i].offset}).peers;
    return peers;
  }

  // 3b. Exchange: publish all handles, open what is new, then a barrier.
  ++stats_.exchanges;
  store_.set(key(round, "handles", rank_), encode_handles(mine));
  for (size_t i = 0; i < mine.size(); ++i) {
    peers[i][rank_] = reinterpret_cast<void*>(static_cast<uintptr_t>(mine[i].base + mine[i].offset));
  }
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_) continue;
    const std::string source = "rank " + std::to_string(p) + " (round " + std::to_string(round) + ")";
    const std::vector<ExportedBuffer> theirs =
        decode_handles(get_or_explain(key(round, "handles", p), p, "handle list"), source);
    if (theirs.size() != mine.size()) {
      throw std::runtime_error("handle exchange round " + std::to_string(round) + ": rank " + std::to_string(p) +
                               " exported " + std::to_string(theirs.size()) + " buffers, rank " +
                               std::to_string(rank_) + " exported " + std::to_string(mine.size()) +
                               " (every rank must export corresponding buffers)");
    }
    for (size_t i = 0; i < theirs.size(); ++i) {
      char* base = static_cast<char*>(open_cached(p, theirs[i]));
      peers[i][p] = base + theirs[i].offset;
    }
  }
  const std::string barrier = key(round, "barrier", -1);
  try {
    store_.barrier(barrier, rank_, world_size_, options_.timeout);
  } catch (const StoreError& e) {
    throw StoreError("handle exchange round " + std::to_string(round) + " (rank " + std::to_string(rank_) +
                     "): the closing barrier '" + barrier + "' did not complete: " + e.what());
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    records_[{mine[i].base, mine[i].size, mine[i].offset}] = Record{mine[i].handle, peers[i]};
  }
  exchanged_digests_ = digests;
  return peers;
}

}  // namespace exactcoll
