#include "tools/cli.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <new>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "core/registry.h"

namespace exactcoll::cli {
namespace {

std::map<std::string, Command>& registry() {
  static std::map<std::string, Command> commands;
  return commands;
}

bool parse_int(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_double(const std::string& text, double* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = v;
  return true;
}

}  // namespace

Registrar::Registrar(Command command) {
  const std::string name = command.name;
  registry()[name] = std::move(command);
}

std::vector<Command> registered_commands() {
  std::vector<Command> out;
  for (const auto& [name, command] : registry()) out.push_back(command);
  return out;
}

std::string resolve_path(const std::string& path) {
  if (path.empty() || path[0] == '/' || path == "-") return path;
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (cwd == nullptr || *cwd == '\0') return path;
  return std::string(cwd) + "/" + path;
}

std::string check_timeout_ms(int64_t timeout_ms) {
  if (timeout_ms >= 1 && timeout_ms <= kLongestTimeoutMs) return "";
  return "--timeout-ms must be 1.." + std::to_string(kLongestTimeoutMs) + " (about 24.8 days), got " +
         std::to_string(timeout_ms);
}

int fail(const std::string& command, const std::string& message, int code) {
  std::cerr << "exactcoll " << command << ": " << message << "\n";
  return code;
}

int run_command(int argc, char** argv) {
  const std::string name = argv[1];
  const auto commands = registered_commands();
  const auto it = std::find_if(commands.begin(), commands.end(), [&](const Command& c) { return c.name == name; });
  if (it == commands.end()) {
    std::cerr << "exactcoll: unknown command '" << name << "' (exactcoll --help lists them)\n";
    return kExitUsage;
  }
  try {
    return it->run(argc - 1, argv + 1);
  } catch (const std::bad_alloc&) {
    return fail(name, "out of memory (a smaller problem, or more memory, is needed)", kExitFailure);
  } catch (const std::system_error& e) {
    return fail(name, std::string("system error: ") + e.what(), kExitFailure);
  } catch (const std::exception& e) {
    return fail(name, std::string("internal error: ") + e.what() + " (please report it)", kExitFailure);
  }
}

uint64_t memory_limit_bytes() {
  // MemAvailable: what the kernel can give without swapping, other processes' memory left out
  // (the machine's total would let a large request through to the OOM killer).
  uint64_t limit = UINT64_MAX;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      limit = std::strtoull(line.c_str() + 13, nullptr, 10) * 1024;
      break;
    }
  }
  if (limit == UINT64_MAX) {
    const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page_bytes > 0) limit = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_bytes);
  }
  for (const int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit r{};
    if (getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY) limit = std::min<uint64_t>(limit, r.rlim_cur);
  }
  return limit;
}

std::string check_memory(uint64_t bytes, const std::string& what) {
  const uint64_t limit = memory_limit_bytes();
  if (bytes <= limit) return "";
  auto gib = [](uint64_t b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(b) / static_cast<double>(uint64_t{1} << 30));
    return std::string(text);
  };
  return what + " need " + gib(bytes) + ", more than the " + gib(limit) +
         " this process may use (the machine's available memory, or its ulimit -v / prlimit --as)";
}

ArgParser::ArgParser(std::string usage, std::string description)
    : usage_(std::move(usage)), description_(std::move(description)) {}

void ArgParser::add_string(const std::string& name, std::string* value, const std::string& help) {
  flags_.push_back({name, Kind::kString, value, help, {}, *value});
}
void ArgParser::add_int(const std::string& name, int64_t* value, const std::string& help) {
  flags_.push_back({name, Kind::kInt, value, help, {}, std::to_string(*value)});
}
void ArgParser::add_short(char letter, const std::string& name) {
  if (find(name) == nullptr) throw std::logic_error("add_short: no flag --" + name);
  shorts_[std::string("-") + letter] = name;
}

void ArgParser::set_default_note(const std::string& name, const std::string& note) {
  for (auto& f : flags_) {
    if (f.name == name) {
      f.default_text = note;
      f.default_is_note = true;
    }
  }
}
void ArgParser::add_double(const std::string& name, double* value, const std::string& help) {
  std::ostringstream os;
  os << *value;
  flags_.push_back({name, Kind::kDouble, value, help, {}, os.str()});
}
void ArgParser::add_bool(const std::string& name, bool* value, const std::string& help) {
  flags_.push_back({name, Kind::kBool, value, help, {}, ""});
}
void ArgParser::add_choice(const std::string& name, std::string* value, std::vector<std::string> choices,
                           const std::string& help) {
  flags_.push_back({name, Kind::kChoice, value, help, std::move(choices), *value});
}
void ArgParser::add_op_choice(const std::string& name, std::string* value, std::vector<std::string> choices,
                              const std::string& help) {
  add_choice(name, value, std::move(choices), help + " (" + op_aliases_note() + ")");
  flags_.back().op_names = true;
}
void ArgParser::add_positional(const std::string& name, std::string* value, const std::string& help, bool required) {
  positionals_.push_back({name, value, help, required});
}
void ArgParser::set_rest(std::vector<std::string>* rest, const std::string& name) {
  rest_ = rest;
  rest_name_ = name;
}

ArgParser::Flag* ArgParser::find(const std::string& name) {
  for (auto& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool ArgParser::given(const std::string& name) const {
  for (const auto& f : flags_) {
    if (f.name == name) return f.given;
  }
  return false;
}

bool ArgParser::assign(Flag& flag, const std::string& text, std::string* error) {
  switch (flag.kind) {
    case Kind::kString: *static_cast<std::string*>(flag.target) = text; return true;
    case Kind::kInt:
      if (!parse_int(text, static_cast<int64_t*>(flag.target))) {
        *error = "--" + flag.name + " wants a whole number, got '" + text + "'";
        return false;
      }
      return true;
    case Kind::kDouble:
      if (!parse_double(text, static_cast<double*>(flag.target))) {
        *error = "--" + flag.name + " wants a number, got '" + text + "'";
        return false;
      }
      return true;
    case Kind::kChoice: {
      const std::string value = flag.op_names ? std::string(canonical_op_name(text)) : text;
      if (std::find(flag.choices.begin(), flag.choices.end(), value) == flag.choices.end()) {
        std::string list;
        for (const auto& c : flag.choices) list += (list.empty() ? "" : "|") + c;
        *error = "--" + flag.name + " must be one of " + list + ", got '" + text + "'";
        return false;
      }
      *static_cast<std::string*>(flag.target) = value;
      return true;
    }
    case Kind::kBool: *static_cast<bool*>(flag.target) = true; return true;
  }
  return false;
}

namespace {

// The command as typed, for the "--help explains every flag" hint: the words of `usage` after
// "exactcoll" up to the first flag or bracket ("sim allreduce"), with a word of alternatives
// ("allreduce|reduce_scatter|allgather") replaced by the one among `args` (the command's argv,
// where it may be argv[0] or a positional), and a flag with a fixed value kept ("bench --op
// fused_rmsnorm"); the path ends before alternatives none of which was given.
std::string command_path(const std::string& usage, const std::vector<std::string>& args) {
  std::istringstream words(usage);
  std::string word, path;
  words >> word;                                      // "exactcoll"
  const auto is_literal = [](const std::string& w) {  // "fused_rmsnorm", not "N" or "FILE"
    return !w.empty() && std::all_of(w.begin(), w.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    });
  };
  while (words >> word) {
    if (word.rfind("--", 0) == 0) {
      // A flag with a fixed value picks a command of its own ("bench --op fused_rmsnorm").
      std::string value;
      if (!(words >> value) || !is_literal(value)) break;
      path += (path.empty() ? "" : " ") + word + " " + value;
      continue;
    }
    if (word.empty() || word[0] == '-' || word[0] == '[' || word[0] == '<') break;
    if (word.find('|') != std::string::npos) {
      std::istringstream alternatives(word);
      std::string alternative;
      bool given = false;
      while (!given && std::getline(alternatives, alternative, '|')) {
        given = std::find(args.begin(), args.end(), alternative) != args.end();
      }
      if (!given) break;
      word = alternative;
    }
    path += (path.empty() ? "" : " ") + word;
  }
  if (path.empty() && !args.empty()) return args[0];
  return path;
}

}  // namespace

bool parse_byte_size(const std::string& text, uint64_t* bytes) {
  constexpr uint64_t kLargest = uint64_t{1} << 40;
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 13 || text.size() > digits + 1) return false;
  uint64_t value = std::stoull(text.substr(0, digits));  // at most 13 digits: below 2^44
  if (text.size() == digits + 1) {
    const char unit = text.back();
    const int shift = unit == 'K' || unit == 'k'   ? 10
                      : unit == 'M' || unit == 'm' ? 20
                      : unit == 'G' || unit == 'g' ? 30
                                                   : -1;
    if (shift < 0 || value > kLargest >> shift) return false;  // checked before the shift: no wrap
    value <<= shift;
  }
  if (value == 0 || value > kLargest) return false;
  *bytes = value;
  return true;
}

std::optional<int> ArgParser::parse(int argc, char** argv) {
  size_t next_positional = 0;
  const std::string help_command = command_path(usage_, std::vector<std::string>(argv, argv + argc));
  auto usage_error = [&](const std::string& message) -> std::optional<int> {
    std::cerr << "exactcoll " << help_command << ": " << message << "\n"
              << "usage: " << usage_ << "\n"
              << "(exactcoll " << help_command << " --help explains every flag)\n";
    return kExitUsage;
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << help();
      return kExitOk;
    }
    if (arg == "--") {
      if (rest_ == nullptr) return usage_error("unexpected '--'");
      for (int j = i + 1; j < argc; ++j) rest_->push_back(argv[j]);
      break;
    }
    if (const auto alias = shorts_.find(arg); alias != shorts_.end()) arg = "--" + alias->second;
    if (arg.rfind("--", 0) == 0) {
      std::string name = arg.substr(2);
      std::optional<std::string> value;
      const size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      Flag* flag = find(name);
      if (flag == nullptr) return usage_error("unknown flag --" + name);
      if (flag->kind == Kind::kBool) {
        if (value) return usage_error("--" + name + " takes no value");
        *static_cast<bool*>(flag->target) = true;
        flag->given = true;
        continue;
      }
      if (!value) {
        if (i + 1 >= argc) return usage_error("--" + name + " needs a value");
        value = argv[++i];
      }
      std::string error;
      if (!assign(*flag, *value, &error)) return usage_error(error);
      flag->given = true;
      continue;
    }
    if (next_positional < positionals_.size()) {
      *positionals_[next_positional++].target = arg;
      continue;
    }
    return usage_error("unexpected argument '" + arg + "'");
  }
  for (size_t p = next_positional; p < positionals_.size(); ++p) {
    if (positionals_[p].required) return usage_error("missing " + positionals_[p].name);
  }
  return std::nullopt;
}

std::string ArgParser::help() const {
  std::ostringstream os;
  os << "usage: " << usage_ << "\n\n" << description_ << "\n";
  if (!positionals_.empty()) {
    os << "\narguments:\n";
    for (const auto& p : positionals_) os << "  " << p.name << "\n      " << p.help << "\n";
  }
  if (!flags_.empty()) {
    os << "\nflags:\n";
    for (const auto& f : flags_) {
      os << "  --" << f.name;
      if (f.kind == Kind::kChoice) {
        std::string list;
        for (const auto& c : f.choices) list += (list.empty() ? "" : "|") + c;
        os << " " << list;
      } else if (f.kind == Kind::kInt) {
        os << " N";
      } else if (f.kind == Kind::kDouble) {
        os << " X";
      } else if (f.kind == Kind::kString) {
        os << " VALUE";
      }
      os << "\n      " << f.help;
      if (f.default_is_note) {
        os << " (" << f.default_text << ")";
      } else if (!f.default_text.empty() && f.help.find("default:") == std::string::npos) {  // help says it
        os << " (default: " << f.default_text << ")";
      }
      os << "\n";
    }
  }
  if (rest_ != nullptr) os << "\n  -- " << rest_name_ << "\n";
  os << "  --help\n      this text\n";
  return os.str();
}

}  // namespace exactcoll::cli
