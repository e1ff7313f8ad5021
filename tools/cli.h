// The exactcoll command line: a registry of subcommands (one library each) and a small flag parser
// that every subcommand uses, so all of them share --help, error wording and exit codes.
//
// Exit codes: 0 success; 1 a result that is not an error but not success either (e.g. `diff` found
// differences); 2 bad usage or bad input; 3 a runtime failure (a timeout, a GPU error).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace exactcoll::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitDiffer = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitFailure = 3;

struct Command {
  std::string name;
  std::string summary;                  // one line for `exactcoll --help`
  std::function<int(int, char**)> run;  // argv[0] is the subcommand's name
};

// Registers a command at static-initialization time. A library that defines commands must be
// built with alwayslink = True so that its registrar is linked.
struct Registrar {
  explicit Registrar(Command command);
};

// All registered commands, sorted by name.
std::vector<Command> registered_commands();

// Returns path resolved against $BUILD_WORKING_DIRECTORY when it is relative and that variable is
// set (`bazel run` starts binaries in the runfiles tree, not where the user typed the command).
std::string resolve_path(const std::string& path);

// A flag parser with generated help. Flags are `--name value` or `--name=value`; booleans take no
// value. Unknown flags, missing values and malformed numbers are errors naming the flag.
class ArgParser {
 public:
  ArgParser(std::string usage, std::string description);

  void add_string(const std::string& name, std::string* value, const std::string& help);
  void add_int(const std::string& name, int64_t* value, const std::string& help);
  void add_double(const std::string& name, double* value, const std::string& help);
  void add_bool(const std::string& name, bool* value, const std::string& help);
  // A flag whose value is one of `choices`.
  void add_choice(const std::string& name, std::string* value, std::vector<std::string> choices,
                  const std::string& help);
  // A flag whose value is one of the op names `choices` (canonical spellings), given in either
  // spelling (core/registry.h kOpAliases); *value gets the canonical one, and the help says which
  // aliases there are. Example: --op all_reduce sets "allreduce".
  void add_op_choice(const std::string& name, std::string* value, std::vector<std::string> choices,
                     const std::string& help);
  // Positional arguments, in order; required ones must be present.
  void add_positional(const std::string& name, std::string* value, const std::string& help, bool required = true);
  // The help shows "(<note>)" instead of "(default: <initial value>)": for flags whose initial
  // value (0) means "not given", e.g. "required" or "required without --input".
  // Precondition: the flag was added.
  void set_default_note(const std::string& name, const std::string& note);
  void mark_required(const std::string& name) { set_default_note(name, "required"); }
  // `-<letter>` is also `--<name>` (as nccl-tests' -b/-e/-f); the flag's help should say so.
  // Precondition: the flag was added.
  void add_short(char letter, const std::string& name);
  // Everything after a literal `--` goes here (for `launch`).
  void set_rest(std::vector<std::string>* rest, const std::string& name);

  // Parses argv[1..argc). Returns nullopt to go on, or the exit code to return now: 0 after
  // printing --help to stdout, kExitUsage after printing an error and a hint to stderr.
  std::optional<int> parse(int argc, char** argv);

  // Was the flag given on the command line?
  bool given(const std::string& name) const;

  std::string help() const;
  const std::string& usage() const { return usage_; }

 private:
  enum class Kind { kString, kInt, kDouble, kBool, kChoice };
  struct Flag {
    std::string name;
    Kind kind;
    void* target;
    std::string help;
    std::vector<std::string> choices;
    std::string default_text;
    bool default_is_note = false;  // set_default_note: default_text is shown as "(note)"
    bool op_names = false;         // add_op_choice: an alias is taken as its canonical name
    bool given = false;
  };
  struct Positional {
    std::string name;
    std::string* target;
    std::string help;
    bool required;
  };
  Flag* find(const std::string& name);
  bool assign(Flag& flag, const std::string& text, std::string* error);

  std::string usage_;
  std::string description_;
  std::vector<Flag> flags_;
  std::vector<Positional> positionals_;
  std::map<std::string, std::string> shorts_;  // "-b" -> "minbytes"
  std::vector<std::string>* rest_ = nullptr;
  std::string rest_name_;
};

// Parses nccl-tests' size syntax: a whole number of bytes with an optional K, M or G (powers of
// 1024). Returns false for anything else, for zero, and past 2^40 (1T).
// Example: parse_byte_size("128M", &b) sets b = 134217728.
bool parse_byte_size(const std::string& text, uint64_t* bytes);

// The longest --timeout-ms of any command (about 24.8 days, 2^31 - 1 ms): a wait of "forever" is a
// hang, the simulator's deadlines stay far from the clock's end, and the GPU's in-kernel bound far
// from 2^64 ns.
inline constexpr int64_t kLongestTimeoutMs = 2147483647;

// Returns "" or what is wrong with a --timeout-ms value (1..kLongestTimeoutMs).
std::string check_timeout_ms(int64_t timeout_ms);

// Prints "exactcoll <command>: <message>" to stderr and returns `code`.
int fail(const std::string& command, const std::string& message, int code = kExitUsage);

// Runs the registered command argv[1] with argv[1..argc) and returns its exit code: kExitUsage for
// an unknown command. The last line of defence of every main(): an exception that escapes the
// command becomes exit 3 with a message, never an abort — std::bad_alloc "out of memory",
// std::system_error (e.g. no thread could be started) "system error", anything else "internal
// error" (a bug: commands report their own failures). Precondition: argc >= 2.
int run_command(int argc, char** argv);

// Returns the bytes of memory this process may use: the least of the machine's available memory
// (MemAvailable: what other processes hold is not there to take) and the soft RLIMIT_AS and
// RLIMIT_DATA limits (`ulimit -v`, `prlimit --as`).
uint64_t memory_limit_bytes();

// Returns "" when `bytes` fit in memory_limit_bytes(), else a message for the user: what needs
// how many GiB, and the limit. Commands check their largest buffers with it before allocating,
// so that a request the machine cannot hold is bad input (exit 2), not a failure half-way.
// Example: check_memory(input + output, "the inputs and outputs") ->
//   "the inputs and outputs need 16.0 GiB, more than the 4.0 GiB this process may use (...)"
std::string check_memory(uint64_t bytes, const std::string& what);

}  // namespace exactcoll::cli
