#include "tools/launch/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "tools/cli.h"

extern char** environ;

namespace exactcoll::launch {
namespace {

using Clock = std::chrono::steady_clock;

// A worker's stderr line longer than this is forwarded in pieces (bounds the launcher's memory).
constexpr size_t kMaxPendingLineBytes = 64 << 10;
// How often the supervisor looks at the workers when none of them writes anything.
constexpr int kPollIntervalMs = 50;
// After every worker has exited, their stderr pipes get this long to drain: a grandchild that
// inherited one could otherwise keep the launcher waiting forever.
constexpr auto kDrainAfterExit = std::chrono::seconds(1);
// After SIGKILL, how long the kernel gets to end a worker before the launcher gives up on it.
constexpr auto kReapAfterKill = std::chrono::seconds(5);

// The variables every worker gets from the launcher (replacing inherited ones).
constexpr std::string_view kJobVariables[] = {"RANK",
                                              "WORLD_SIZE",
                                              "LOCAL_RANK",
                                              "MASTER_ADDR",
                                              "MASTER_PORT",
                                              "EXACTCOLL_STORE_PORT",
                                              "EXACTCOLL_STORE_TOKEN",
                                              "LOCAL_WORLD_SIZE",
                                              "GROUP_RANK",
                                              "EXACTCOLL_NODE_RANK",
                                              "EXACTCOLL_STORE_BIND"};

volatile sig_atomic_t g_interrupt_signal = 0;
void on_interrupt(int signal_number) { g_interrupt_signal = signal_number; }

// While alive, SIGINT, SIGTERM and SIGHUP set g_interrupt_signal instead of killing the launcher,
// so that it can stop its workers before it exits. Restores the previous handlers on destruction.
// (Workers get default dispositions back: exec resets caught signals.)
class InterruptGuard {
 public:
  InterruptGuard() {
    g_interrupt_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    for (int i = 0; i < kCount; ++i) sigaction(kSignals[i], &action, &previous_[i]);
  }
  ~InterruptGuard() {
    for (int i = 0; i < kCount; ++i) sigaction(kSignals[i], &previous_[i], nullptr);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  static constexpr int kCount = 3;
  static constexpr int kSignals[kCount] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction previous_[kCount];
};

// Writes all of text to fd; gives up silently if fd is gone (nothing better to do with stderr).
void write_all(int fd, std::string_view text) {
  while (!text.empty()) {  // every pass writes at least one byte, or retries after EINTR, or returns
    const ssize_t written = ::write(fd, text.data(), text.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;
    text.remove_prefix(static_cast<size_t>(written));
  }
}

void say(const std::string& line) { write_all(STDERR_FILENO, "exactcoll launch: " + line + "\n"); }

std::string signal_name(int signal_number) {
  const char* abbreviation = sigabbrev_np(signal_number);
  return abbreviation ? "SIG" + std::string(abbreviation) : "signal " + std::to_string(signal_number);
}

std::string describe_status(int wait_status) {
  if (WIFEXITED(wait_status)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return "was killed by " + signal_name(WTERMSIG(wait_status));
  return "ended with wait status " + std::to_string(wait_status);
}

bool succeeded(int wait_status) { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

int exit_code_for(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return cli::kExitFailure;
}

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  int stderr_fd = -1;   // read end of its stderr pipe; -1 when not forwarding, or after EOF
  std::string pending;  // forwarded bytes of a line not finished yet
  bool running = false;
  bool stopped_by_launch = false;  // it was sent SIGTERM (and maybe SIGKILL) by the launcher
  int wait_status = 0;
};

// Forwards the complete lines in w.pending as "[rank R] line"; with flush_all also the rest.
void forward_lines(Worker& w, bool flush_all) {
  const std::string prefix = "[rank " + std::to_string(w.rank) + "] ";
  std::string out;
  size_t start = 0;
  for (size_t newline; (newline = w.pending.find('\n', start)) != std::string::npos; start = newline + 1) {
    out += prefix;
    out.append(w.pending, start, newline + 1 - start);
  }
  w.pending.erase(0, start);
  if (!w.pending.empty() && (flush_all || w.pending.size() >= kMaxPendingLineBytes)) {
    out += prefix + w.pending + "\n";
    w.pending.clear();
  }
  write_all(STDERR_FILENO, out);
}

void close_pipe(Worker& w) {
  forward_lines(w, true);
  ::close(w.stderr_fd);
  w.stderr_fd = -1;
}

// Forwards what w has written to its stderr pipe (at most 256 KiB per call, then back to poll).
void drain(Worker& w) {
  char buffer[16384];
  for (int reads = 0; reads < 16; ++reads) {
    const ssize_t n = ::read(w.stderr_fd, buffer, sizeof buffer);
    if (n > 0) {
      w.pending.append(buffer, static_cast<size_t>(n));
      forward_lines(w, false);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    close_pipe(w);  // EOF: the worker, and whatever it started, closed its stderr
    return;
  }
}

// Returns the environment of one worker (local index `local` on this node): the launcher's, minus
// the job variables, plus this worker's values of them (torchrun's names, node-major ranks).
std::vector<std::string> worker_environment(const LaunchOptions& options, int local, uint16_t master_port,
                                            uint16_t store_port, const std::string& token) {
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::string_view name = text.substr(0, text.find('='));
    bool ours = false;
    for (const std::string_view job_variable : kJobVariables) ours = ours || name == job_variable;
    if (!ours) env.emplace_back(text);
  }
  env.push_back("RANK=" + std::to_string(options.node_rank * options.nproc + local));
  env.push_back("WORLD_SIZE=" + std::to_string(options.nnodes * options.nproc));
  env.push_back("LOCAL_RANK=" + std::to_string(local));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(options.nproc));
  env.push_back("GROUP_RANK=" + std::to_string(options.node_rank));
  env.push_back("EXACTCOLL_NODE_RANK=" + std::to_string(options.node_rank));
  env.push_back("MASTER_ADDR=" + options.master_addr);
  env.push_back("MASTER_PORT=" + std::to_string(master_port));
  env.push_back("EXACTCOLL_STORE_PORT=" + std::to_string(store_port));
  env.push_back("EXACTCOLL_STORE_TOKEN=" + token);
  if (!options.store_bind.empty()) env.push_back("EXACTCOLL_STORE_BIND=" + options.store_bind);
  return env;
}

std::vector<char*> pointers_to(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// The child's side of fork: only async-signal-safe calls from here to execve.
[[noreturn]] void exec_worker(const char* executable, char* const* argv, char* const* envp, int stderr_write_fd,
                              pid_t launcher_pid, const std::string& exec_failed_message) {
  // If the launcher dies (even by SIGKILL), the worker gets SIGTERM instead of living on.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher_pid) _exit(127);  // it died before prctl took effect
  if (stderr_write_fd >= 0 && dup2(stderr_write_fd, STDERR_FILENO) < 0) _exit(127);
  execve(executable, argv, envp);
  const ssize_t ignored = ::write(STDERR_FILENO, exec_failed_message.data(), exec_failed_message.size());
  (void)ignored;
  _exit(127);
}

enum class StopReason { kNone, kWorkerFailed, kTimeout, kInterrupted, kStartFailed };

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (const int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(duration.count()) / 1000.0);
  return text;
}

}  // namespace

uint16_t pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("cannot create a socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!ok) throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(saved_errno));
  return ntohs(address.sin_port);
}

std::string random_token_hex(size_t bytes) {
  std::vector<unsigned char> random(bytes);
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(std::string("cannot open /dev/urandom: ") + std::strerror(errno));
  size_t filled = 0;
  while (filled < bytes) {  // every pass reads at least one byte, retries after EINTR, or throws
    const ssize_t n = ::read(fd, random.data() + filled, bytes - filled);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("cannot read /dev/urandom");
    }
    filled += static_cast<size_t>(n);
  }
  ::close(fd);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  for (const unsigned char b : random) {
    text += kHex[b >> 4];
    text += kHex[b & 15];
  }
  return text;
}

uint16_t pick_free_port_except(uint16_t taken) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint16_t port = pick_free_port();
    if (port != taken) return port;
  }
  throw std::runtime_error("cannot find a free port other than " + std::to_string(taken));
}

namespace {

// One job on this node: its workers and why, if at all, the launcher is stopping them (what the
// steps of run_workers share).
struct Job {
  explicit Job(const LaunchOptions& o) : options(o), workers(static_cast<size_t>(o.nproc)) {}
  const LaunchOptions& options;
  std::vector<Worker> workers;
  StopReason stop_reason = StopReason::kNone;
  int culprit = -1;  // the rank whose failure stopped the job
  int culprit_status = 0;
  std::string start_error;
  std::vector<int> running_at_timeout;
  Clock::time_point kill_at{};
};

bool any_running(const Job& job) {
  for (const Worker& w : job.workers) {
    if (w.running) return true;
  }
  return false;
}

// Sends SIGTERM to every running worker (only to our own children, by pid) and schedules SIGKILL.
void begin_stop(Job& job, StopReason reason) {
  job.stop_reason = reason;
  job.kill_at = Clock::now() + job.options.kill_grace;
  for (Worker& w : job.workers) {
    if (!w.running) continue;
    if (reason == StopReason::kTimeout) job.running_at_timeout.push_back(w.rank);
    ::kill(w.pid, SIGTERM);
    w.stopped_by_launch = true;
  }
}

// Step 2 of run_workers: starts the workers, each with its job variables (port, store_port,
// token). Everything the child needs is built before fork. A worker that cannot be started stops
// those already started (StopReason::kStartFailed).
void start_workers(Job& job, uint16_t port, uint16_t store_port, const std::string& token) {
  const LaunchOptions& options = job.options;
  std::vector<std::string> argv_strings = options.argv;
  const std::vector<char*> argv = pointers_to(argv_strings);
  const pid_t launcher_pid = ::getpid();
  for (int local = 0; local < options.nproc; ++local) {
    const int rank = options.node_rank * options.nproc + local;
    Worker& w = job.workers[static_cast<size_t>(local)];
    w.rank = rank;
    std::vector<std::string> env_strings = worker_environment(options, local, port, store_port, token);
    const std::vector<char*> envp = pointers_to(env_strings);
    const std::string exec_failed =
        "exactcoll launch: rank " + std::to_string(rank) + " could not execute " + options.executable + "\n";
    int pipe_fds[2] = {-1, -1};
    if (options.prefix_stderr && ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
      job.start_error = "could not start rank " + std::to_string(rank) + ": pipe: " + std::strerror(errno);
      break;
    }
    const pid_t pid = ::fork();
    if (pid == 0)
      exec_worker(options.executable.c_str(), argv.data(), envp.data(), pipe_fds[1], launcher_pid, exec_failed);
    const int fork_errno = errno;
    if (pipe_fds[1] >= 0) ::close(pipe_fds[1]);
    if (pid < 0) {
      if (pipe_fds[0] >= 0) ::close(pipe_fds[0]);
      job.start_error = "could not start rank " + std::to_string(rank) + ": fork: " + std::strerror(fork_errno);
      break;
    }
    w.pid = pid;
    w.running = true;
    if (pipe_fds[0] >= 0) {
      ::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
      w.stderr_fd = pipe_fds[0];
    }
  }
  if (!job.start_error.empty()) begin_stop(job, StopReason::kStartFailed);
}

// Steps 3a and 3b: waits at most one poll interval for the workers' output and forwards it.
void forward_output(Job& job) {
  std::vector<pollfd> fds;
  std::vector<Worker*> owners;
  for (Worker& w : job.workers) {
    if (w.stderr_fd < 0) continue;
    fds.push_back({w.stderr_fd, POLLIN, 0});
    owners.push_back(&w);
  }
  const int ready = ::poll(fds.data(), fds.size(), kPollIntervalMs);
  for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
    if (fds[i].revents != 0) drain(*owners[i]);
  }
}

// Step 3c: reaps the workers that ended; the first failure stops the others. An interrupt is
// looked at first: a Ctrl-C reaches the workers too, and their deaths are not the cause.
void reap_workers(Job& job) {
  if (job.stop_reason == StopReason::kNone && g_interrupt_signal != 0) begin_stop(job, StopReason::kInterrupted);
  for (Worker& w : job.workers) {
    if (!w.running) continue;
    int status = 0;
    const pid_t reaped = ::waitpid(w.pid, &status, WNOHANG);
    if (reaped == 0 || (reaped < 0 && errno == EINTR)) continue;
    w.running = false;
    w.wait_status = reaped == w.pid ? status : (127 << 8);
    if (job.stop_reason == StopReason::kNone && !succeeded(w.wait_status)) {
      job.culprit = w.rank;
      job.culprit_status = w.wait_status;
      begin_stop(job, StopReason::kWorkerFailed);
    }
  }
}

// Step 3 of run_workers: supervises until every worker is reaped and its output forwarded.
// Bounded: the job timeout (deadline) starts a stop, a stop ends in SIGKILL after kill_grace, and
// kReapAfterKill / kDrainAfterExit bound what follows.
void supervise(Job& job, Clock::time_point deadline) {
  std::vector<Worker>& workers = job.workers;
  std::optional<Clock::time_point> give_up_at;
  std::optional<Clock::time_point> drain_until;
  for (;;) {
    // 3a. Wait for output, at most one poll interval. 3b. Forward it.
    forward_output(job);
    // 3c. Reap the workers that ended; the first failure stops the others.
    reap_workers(job);
    // 3d. The job timeout, the end of the grace period.
    const Clock::time_point now = Clock::now();
    if (job.stop_reason == StopReason::kNone && now >= deadline) begin_stop(job, StopReason::kTimeout);
    if (job.stop_reason != StopReason::kNone && !give_up_at && now >= job.kill_at) {
      for (Worker& w : workers) {
        if (w.running) ::kill(w.pid, SIGKILL);
      }
      give_up_at = now + kReapAfterKill;
    }
    // 3e. Done?
    bool any_pipe = false;
    for (const Worker& w : workers) any_pipe = any_pipe || w.stderr_fd >= 0;
    if (!any_running(job)) {
      if (!any_pipe) break;
      if (!drain_until) drain_until = now + kDrainAfterExit;
      if (now >= *drain_until) {
        for (Worker& w : workers) {
          if (w.stderr_fd >= 0) close_pipe(w);
        }
        break;
      }
    }
    if (give_up_at && now >= *give_up_at) {
      for (Worker& w : workers) {
        if (w.running)
          say("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
              ") did not end even after SIGKILL; giving up on it");
        if (w.stderr_fd >= 0) close_pipe(w);
      }
      break;
    }
  }
}

// Step 4 of run_workers: after a stop, why and every worker's end on stderr. Returns the exit
// code: 0 when nothing stopped the job, the failed rank's own code, 128 + the signal after an
// interrupt, else kExitFailure.
int report(const Job& job) {
  const StopReason stop_reason = job.stop_reason;
  if (stop_reason == StopReason::kNone) return cli::kExitOk;
  switch (stop_reason) {
    case StopReason::kWorkerFailed:
      say("rank " + std::to_string(job.culprit) + " " + describe_status(job.culprit_status) +
          "; stopped the other workers");
      break;
    case StopReason::kTimeout:
      say("timed out after " + seconds_text(job.options.timeout) + " s with rank(s) " +
          rank_list(job.running_at_timeout) + " still running; stopped them");
      break;
    case StopReason::kInterrupted:
      say("interrupted by " + signal_name(g_interrupt_signal) + "; stopped the workers");
      break;
    case StopReason::kStartFailed: say(job.start_error + "; stopped the workers already started"); break;
    case StopReason::kNone: break;
  }
  for (const Worker& w : job.workers) {
    if (w.pid < 0) continue;
    std::string line = "  rank " + std::to_string(w.rank) + ": ";
    line += w.running ? "still running" : describe_status(w.wait_status);
    if (w.stopped_by_launch) line += " (stopped by launch)";
    write_all(STDERR_FILENO, line + "\n");
  }
  switch (stop_reason) {
    case StopReason::kWorkerFailed:
      return exit_code_for(job.culprit_status) != 0 ? exit_code_for(job.culprit_status) : cli::kExitFailure;
    case StopReason::kInterrupted: return 128 + g_interrupt_signal;
    default: return cli::kExitFailure;
  }
}

}  // namespace

int run_workers(const LaunchOptions& options) {
  // 1. The job's ports (MASTER_PORT for torch in the workers, and the exactcoll store's own, never
  //    the same) and token.
  uint16_t port = options.master_port;
  uint16_t store_port = options.store_port;
  std::string token;
  try {
    if (port == 0) port = pick_free_port();
    if (store_port == 0 || store_port == port) store_port = pick_free_port_except(port);
    token = options.token.empty() ? random_token_hex(16) : options.token;
  } catch (const std::exception& e) {
    say(e.what());
    return cli::kExitFailure;
  }

  InterruptGuard interrupt_guard;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options.timeout;
  Job job(options);
  // 2. Start the workers.
  start_workers(job, port, store_port, token);
  // 3. Supervise until every worker is reaped and its output forwarded.
  supervise(job, deadline);
  // 4. Report.
  return report(job);
}

}  // namespace exactcoll::launch
