#include "sim/trace.h"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <tuple>

#include "core/storage.h"

namespace exactcoll::sim {
namespace {

std::string hex_bits(uint32_t bits, int bytes) {
  char buf[16];
  std::snprintf(buf, sizeof buf, bytes == 2 ? "0x%04" PRIx32 : "0x%08" PRIx32, bits);
  return buf;
}

const char* access_name(Access a) { return a == Access::kRead ? "read" : "write"; }

// The common prefix of every line: {"t":..,"event":"..","launch":..,"op":"..","rank":..,"block":..
std::string head(const TraceEvent& e, const char* kind, const std::vector<std::string>& names) {
  const std::string op = e.launch < names.size() ? names[e.launch] : "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "{\"t\":%" PRIu64 ",\"event\":\"%s\",\"launch\":%u,\"op\":\"", e.t, kind, e.launch);
  std::string s = buf;
  s += op;
  std::snprintf(buf, sizeof buf, "\",\"rank\":%d", e.rank);
  s += buf;
  return s;
}

std::string access_text(const TraceAccess& a) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s %s[%" PRIu64 ",%" PRIu64 ") of rank %d", access_name(a.access),
                buffer_name(a.buffer), a.begin, a.end, a.peer);
  return buf;
}

}  // namespace

std::string float_text(float f) {
  if (f != f) return "nan";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::string(buf, r.ptr);
}

Tracer::Tracer(int ranks, std::vector<uint64_t> elements) : logs_(ranks), elements_(std::move(elements)) {
  std::sort(elements_.begin(), elements_.end());
  elements_.erase(std::unique(elements_.begin(), elements_.end()), elements_.end());
}

bool Tracer::element_traced(uint64_t index) const {
  return std::binary_search(elements_.begin(), elements_.end(), index);
}

std::vector<TraceEvent> Tracer::merged() const {
  std::vector<TraceEvent> all;
  size_t total = 0;
  for (const auto& log : logs_) total += log.size();
  all.reserve(total);
  for (const auto& log : logs_) all.insert(all.end(), log.begin(), log.end());
  // Stable: events of one rank keep their recording order; equal times keep rank order.
  std::stable_sort(all.begin(), all.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.t < b.t; });
  return all;
}

std::string Tracer::json_lines() const {
  std::string out;
  char buf[256];
  for (const TraceEvent& e : merged()) {
    switch (e.kind) {
      case TraceEvent::Kind::kLaunch:
        out += head(e, "launch", launch_names_);
        std::snprintf(buf, sizeof buf, ",\"blocks\":%d}\n", e.block);
        out += buf;
        break;
      case TraceEvent::Kind::kStep: {
        out += head(e, "step", launch_names_);
        std::snprintf(buf, sizeof buf, ",\"block\":%d,\"step\":\"%s\",\"accesses\":[", e.block, e.step);
        out += buf;
        for (size_t i = 0; i < e.accesses.size(); ++i) {
          const TraceAccess& a = e.accesses[i];
          std::snprintf(buf, sizeof buf,
                        "%s{\"access\":\"%s\",\"peer\":%d,\"buffer\":\"%s\",\"begin\":%" PRIu64 ",\"end\":%" PRIu64 "}",
                        i ? "," : "", access_name(a.access), a.peer, buffer_name(a.buffer), a.begin, a.end);
          out += buf;
        }
        out += "]}\n";
        break;
      }
      case TraceEvent::Kind::kSignal:
        out += head(e, "signal", launch_names_);
        std::snprintf(buf, sizeof buf, ",\"block\":%d,\"peer\":%d,\"set\":%d,\"epoch\":%u}\n", e.block, e.peer, e.set,
                      e.epoch);
        out += buf;
        break;
      case TraceEvent::Kind::kWait:
        out += head(e, "wait", launch_names_);
        std::snprintf(buf, sizeof buf, ",\"block\":%d,\"peer\":%d,\"set\":%d,\"epoch\":%u,\"since\":%" PRIu64 "}\n",
                      e.block, e.peer, e.set, e.epoch, e.since);
        out += buf;
        break;
      case TraceEvent::Kind::kFold:
        out += head(e, "fold", launch_names_);
        std::snprintf(buf, sizeof buf, ",\"block\":%d,\"index\":%" PRIu64 ",\"input_rank\":%d", e.block, e.index,
                      e.input_rank);
        out += buf;
        if (e.input_rank > 0) {
          out += ",\"acc_before\":\"" + hex_bits(float_to_bits(e.acc_before), 4) + "\",\"acc_before_value\":\"" +
                 float_text(e.acc_before) + "\"";
        }
        out += ",\"x\":\"" + hex_bits(float_to_bits(e.x), 4) + "\",\"x_value\":\"" + float_text(e.x) +
               "\",\"acc_after\":\"" + hex_bits(float_to_bits(e.acc_after), 4) + "\",\"acc_after_value\":\"" +
               float_text(e.acc_after) + "\"}\n";
        break;
      case TraceEvent::Kind::kTreeNode:
        out += head(e, "tree_node", launch_names_);
        std::snprintf(buf, sizeof buf, ",\"block\":%d,\"index\":%" PRIu64 ",\"left_rank\":%d,\"right_rank\":%d",
                      e.block, e.index, e.left_rank, e.input_rank);
        out += buf;
        out += ",\"left\":\"" + hex_bits(float_to_bits(e.acc_before), 4) + "\",\"left_value\":\"" +
               float_text(e.acc_before) + "\",\"right\":\"" + hex_bits(float_to_bits(e.x), 4) +
               "\",\"right_value\":\"" + float_text(e.x) + "\",\"sum\":\"" + hex_bits(float_to_bits(e.acc_after), 4) +
               "\",\"sum_value\":\"" + float_text(e.acc_after) + "\",\"stored\":\"" +
               hex_bits(e.stored_bits, e.storage_bytes) + "\",\"stored_value\":\"" + float_text(e.stored_value) +
               "\"}\n";
        break;
      case TraceEvent::Kind::kRound:
        out += head(e, "round", launch_names_);
        std::snprintf(buf, sizeof buf, ",\"block\":%d,\"index\":%" PRIu64, e.block, e.index);
        out += buf;
        out += ",\"acc\":\"" + hex_bits(float_to_bits(e.acc_before), 4) + "\",\"acc_value\":\"" +
               float_text(e.acc_before) + "\",\"stored\":\"" + hex_bits(e.stored_bits, e.storage_bytes) +
               "\",\"stored_value\":\"" + float_text(e.stored_value) + "\"}\n";
        break;
    }
  }
  return out;
}

std::string Tracer::chrome_trace(bool time_is_steps) const {
  const std::vector<TraceEvent> all = merged();
  auto ts = [&](uint64_t t) {
    char buf[32];
    if (time_is_steps) {
      std::snprintf(buf, sizeof buf, "%" PRIu64, t);
    } else {
      std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(t) / 1000.0);
    }
    return std::string(buf);
  };
  // A step lasts until the same (rank, block)'s next event (the work follows the step record).
  std::map<std::pair<int, int>, size_t> last_step;
  std::vector<uint64_t> step_end(all.size(), 0);
  for (size_t i = 0; i < all.size(); ++i) {
    const TraceEvent& e = all[i];
    if (e.kind == TraceEvent::Kind::kLaunch || e.kind == TraceEvent::Kind::kFold ||
        e.kind == TraceEvent::Kind::kTreeNode) {
      continue;
    }
    const auto key = std::make_pair(e.rank, e.block);
    auto it = last_step.find(key);
    if (it != last_step.end()) {
      step_end[it->second] = e.kind == TraceEvent::Kind::kWait ? e.since : e.t;
      last_step.erase(it);
    }
    if (e.kind == TraceEvent::Kind::kStep) last_step[key] = i;
  }
  const int stream_tid = kMaxBlocks;
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto emit = [&](const std::string& line) {
    if (!first) out += ",\n";
    first = false;
    out += line;
  };
  std::map<int, int> max_block;
  for (const TraceEvent& e : all) {
    if (e.kind != TraceEvent::Kind::kLaunch) max_block[e.rank] = std::max(max_block[e.rank], e.block);
  }
  for (size_t r = 0; r < logs_.size(); ++r) {
    const std::string pid = std::to_string(r);
    emit("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"args\":{\"name\":\"rank " + pid + "\"}}");
    emit("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pid + ",\"args\":{\"sort_index\":" + pid + "}}");
    emit("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + std::to_string(stream_tid) +
         ",\"args\":{\"name\":\"stream\"}}");
    const int blocks = max_block.count(static_cast<int>(r)) ? max_block[static_cast<int>(r)] + 1 : 0;
    for (int b = 0; b < blocks; ++b) {
      emit("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + std::to_string(b) +
           ",\"args\":{\"name\":\"block " + std::to_string(b) + "\"}}");
    }
  }
  for (size_t i = 0; i < all.size(); ++i) {
    const TraceEvent& e = all[i];
    const std::string op = e.launch < launch_names_.size() ? launch_names_[e.launch] : "";
    const std::string where = "\"pid\":" + std::to_string(e.rank) +
                              ",\"tid\":" + std::to_string(e.kind == TraceEvent::Kind::kLaunch ? stream_tid : e.block);
    const std::string args_launch = "\"launch\":" + std::to_string(e.launch) + ",\"op\":\"" + op + "\"";
    switch (e.kind) {
      case TraceEvent::Kind::kLaunch:
        emit("{\"name\":\"launch " + std::to_string(e.launch) + " " + op + "\",\"ph\":\"i\",\"s\":\"t\"," + where +
             ",\"ts\":" + ts(e.t) + ",\"args\":{" + args_launch + ",\"blocks\":" + std::to_string(e.block) + "}}");
        break;
      case TraceEvent::Kind::kStep: {
        std::string accesses;
        for (const auto& a : e.accesses) accesses += (accesses.empty() ? "" : "; ") + access_text(a);
        const uint64_t end = std::max(step_end[i], e.t);
        const std::string dur = time_is_steps ? std::to_string(std::max<uint64_t>(end - e.t, 1)) : ts(end - e.t);
        emit("{\"name\":\"" + std::string(e.step) + "\",\"ph\":\"X\"," + where + ",\"ts\":" + ts(e.t) +
             ",\"dur\":" + dur + ",\"args\":{" + args_launch + ",\"accesses\":\"" + accesses + "\"}}");
        break;
      }
      case TraceEvent::Kind::kSignal:
        emit("{\"name\":\"signal epoch " + std::to_string(e.epoch) + " to rank " + std::to_string(e.peer) +
             "\",\"ph\":\"i\",\"s\":\"t\"," + where + ",\"ts\":" + ts(e.t) + ",\"args\":{" + args_launch +
             ",\"set\":" + std::to_string(e.set) + "}}");
        break;
      case TraceEvent::Kind::kWait: {
        const std::string dur = time_is_steps ? std::to_string(e.t - e.since) : ts(e.t - e.since);
        emit("{\"name\":\"wait epoch " + std::to_string(e.epoch) + " from rank " + std::to_string(e.peer) +
             "\",\"ph\":\"X\"," + where + ",\"ts\":" + ts(e.since) + ",\"dur\":" + dur + ",\"args\":{" + args_launch +
             ",\"set\":" + std::to_string(e.set) + "}}");
        break;
      }
      case TraceEvent::Kind::kFold: {
        // One instant per fold step of a traced element, on the (rank, block) that folded it.
        std::string args =
            args_launch + ",\"index\":" + std::to_string(e.index) + ",\"input_rank\":" + std::to_string(e.input_rank);
        if (e.input_rank > 0) {
          args +=
              ",\"acc_before\":\"" + hex_bits(float_to_bits(e.acc_before), 4) + " (" + float_text(e.acc_before) + ")\"";
        }
        args += ",\"x\":\"" + hex_bits(float_to_bits(e.x), 4) + " (" + float_text(e.x) + ")\",\"acc_after\":\"" +
                hex_bits(float_to_bits(e.acc_after), 4) + " (" + float_text(e.acc_after) + ")\"";
        emit("{\"name\":\"fold element " + std::to_string(e.index) + " + rank " + std::to_string(e.input_rank) +
             "\",\"ph\":\"i\",\"s\":\"t\"," + where + ",\"ts\":" + ts(e.t) + ",\"args\":{" + args + "}}");
        break;
      }
      case TraceEvent::Kind::kTreeNode:
        emit("{\"name\":\"tree node element " + std::to_string(e.index) + " ranks " + std::to_string(e.left_rank) +
             ".. + " + std::to_string(e.input_rank) + "..\",\"ph\":\"i\",\"s\":\"t\"," + where + ",\"ts\":" + ts(e.t) +
             ",\"args\":{" + args_launch + ",\"sum\":\"" + hex_bits(float_to_bits(e.acc_after), 4) + " (" +
             float_text(e.acc_after) + ")\",\"stored\":\"" + hex_bits(e.stored_bits, e.storage_bytes) + " (" +
             float_text(e.stored_value) + ")\"}}");
        break;
      case TraceEvent::Kind::kRound:
        emit("{\"name\":\"round element " + std::to_string(e.index) + "\",\"ph\":\"i\",\"s\":\"t\"," + where +
             ",\"ts\":" + ts(e.t) + ",\"args\":{" + args_launch + ",\"acc\":\"" +
             hex_bits(float_to_bits(e.acc_before), 4) + " (" + float_text(e.acc_before) + ")\",\"stored\":\"" +
             hex_bits(e.stored_bits, e.storage_bytes) + " (" + float_text(e.stored_value) + ")\"}}");
        break;
    }
  }
  out += "\n]}\n";
  return out;
}

}  // namespace exactcoll::sim
