#include "tests/support/command_runner.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>

namespace exactcoll::test_support {
namespace {

std::string make_temp_dir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/exactcoll_test.XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    std::fprintf(stderr, "test_support::temp_dir: mkdtemp(%s) failed: %s\n", pattern.c_str(), std::strerror(errno));
    std::abort();
  }
  return pattern;
}

// Single-quotes text for /bin/sh.
std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

void flush_all() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

// Points descriptors 1 and 2 at two files for its lifetime; the destructor flushes and restores
// them (also during an exception's unwinding).
class Redirect {
 public:
  Redirect(const std::string& out_path, const std::string& err_path) {
    flush_all();
    saved_out_ = dup(STDOUT_FILENO);
    saved_err_ = dup(STDERR_FILENO);
    point(STDOUT_FILENO, out_path);
    point(STDERR_FILENO, err_path);
  }
  ~Redirect() {
    flush_all();
    dup2(saved_out_, STDOUT_FILENO);
    dup2(saved_err_, STDERR_FILENO);
    close(saved_out_);
    close(saved_err_);
  }
  Redirect(const Redirect&) = delete;
  Redirect& operator=(const Redirect&) = delete;

 private:
  static void point(int fd, const std::string& path) {
    const int file = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (file < 0) return;  // the output then goes where it went; the test sees it missing
    dup2(file, fd);
    close(file);
  }
  int saved_out_ = -1, saved_err_ = -1;
};

}  // namespace

std::string temp_dir() {
  static const std::string dir = make_temp_dir();
  return dir;
}

std::string temp_path(const std::string& name) { return temp_dir() + "/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool file_exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/" + (workspace != nullptr ? workspace : "exactcoll") + "/" +
         path;
}

CommandResult run_in_process(const std::function<int(int, char**)>& main, const std::string& argv0,
                             const std::vector<std::string>& args) {
  std::vector<std::string> strings = {argv0};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  const std::string out_path = temp_path(".command_stdout"), err_path = temp_path(".command_stderr");
  CommandResult result;
  {
    Redirect redirect(out_path, err_path);
    result.code = main(static_cast<int>(strings.size()), argv.data());
  }
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return result;
}

CommandResult run_binary(const std::string& binary, const std::string& args, const std::string& shell_prefix) {
  const std::string out_path = temp_path(".binary_stdout"), err_path = temp_path(".binary_stderr");
  // `exec`: the binary replaces the shell, so that a signal that ends it is seen as one.
  const std::string command = shell_prefix + "exec " + shell_quoted(binary) + " " + args + " >" +
                              shell_quoted(out_path) + " 2>" + shell_quoted(err_path);
  flush_all();
  const int status = std::system(command.c_str());
  CommandResult result;
  result.code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return result;
}

}  // namespace exactcoll::test_support
