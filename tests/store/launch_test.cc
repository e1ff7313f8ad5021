// `launch` end to end: runs launch_test_worker (a stand-in exactcoll with `launch` and
// `store_worker`) as a subprocess and checks its exit status, its stderr and how long it took.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "cuda_backend/store/tcp_store_server.h"
#include "tools/launch/launcher.h"

extern char** environ;

namespace exactcoll {
namespace {

using Clock = std::chrono::steady_clock;

struct RunResult {
  int exit_code = -1;  // -1: did not finish in time (then killed)
  std::string out;     // stdout and stderr together
  std::chrono::milliseconds elapsed{0};
};

std::string worker_binary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return "tests/store/launch_test_worker";
  return std::string(srcdir) + "/" + workspace + "/tests/store/launch_test_worker";
}

// Runs the worker binary with `args` and extra environment `env` ("NAME=value"), capturing its
// output, for at most `limit` (then SIGKILL; launch's workers follow through their death signal).
RunResult run(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
              std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
  std::vector<std::string> argv_strings = {worker_binary()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> argv, envp;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {};
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(fds[1]);
  RunResult result;
  const auto deadline = start + limit;
  bool open = true;
  while (open && Clock::now() < deadline) {  // bounded by the deadline
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      char buffer[4096];
      const ssize_t n = read(fds[0], buffer, sizeof buffer);
      if (n > 0) {
        result.out.append(buffer, static_cast<size_t>(n));
      } else {
        open = false;
      }
    }
  }
  if (open) kill(pid, SIGKILL);  // our own child, by pid
  int status = 0;
  waitpid(pid, &status, 0);
  close(fds[0]);
  result.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  if (!open) result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "output lacks '" << part << "':\n" << text;
}

TEST(LaunchTest, AllWorkersSucceed) {
  const RunResult r = run({"launch", "--nproc", "3", "--", "store_worker"}, {"CUDA_VISIBLE_DEVICES=5,7"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string rank_text = std::to_string(rank);
    expect_contains(r.out, "[rank " + rank_text + "] store_worker: rank " + rank_text + " of 3 ok (local_rank " +
                               rank_text + ", CUDA_VISIBLE_DEVICES=5,7)\n");
  }
  EXPECT_EQ(r.out.find("exactcoll launch:"), std::string::npos) << "a successful job prints nothing itself";
}

TEST(LaunchTest, GivenPortsAndNoPrefix) {
  // MASTER_PORT is held by another server, as torch's TCPStore holds it under torchrun: the store
  // listens on its own port and the job forms.
  TcpStoreServerOptions torch_like;
  torch_like.token = "torch-holds-master-port-000000";
  TcpStoreServer torch_store(torch_like);
  const uint16_t store_port = launch::pick_free_port();
  const RunResult r = run({"launch", "--nproc", "2", "--master-port", std::to_string(torch_store.port()),
                           "--store-port", std::to_string(store_port), "--no-prefix", "--", "store_worker"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  expect_contains(r.out, "store_worker: rank 1 of 2 ok");
  EXPECT_EQ(r.out.find("[rank "), std::string::npos) << r.out;
  const RunResult same = run({"launch", "--nproc", "2", "--master-port", "29999", "--store-port", "29999", "--",
                              "store_worker"});
  EXPECT_EQ(same.exit_code, 2) << same.out;
  expect_contains(same.out, "--store-port and --master-port must differ");
}

TEST(LaunchTest, LaunchReplacesInheritedJobVariables) {
  // Stale torchrun variables in the launcher's environment must not leak into the workers.
  const RunResult r = run({"launch", "--nproc", "2", "--", "store_worker"},
                          {"RANK=7", "WORLD_SIZE=9", "LOCAL_RANK=7", "MASTER_PORT=1", "EXACTCOLL_STORE_PORT=1",
                           "EXACTCOLL_STORE_TOKEN=x"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  expect_contains(r.out, "[rank 1] store_worker: rank 1 of 2 ok");
}

TEST(LaunchTest, FailingRankStopsTheOthers) {
  // Rank 1 exits 3 after the first barrier; ranks 0 and 2 would wait 20 s for its key. Launch must
  // stop them at once and name rank 1 and its status.
  const RunResult r = run({"launch", "--nproc", "3", "--", "store_worker", "--fail-rank", "1"});
  EXPECT_EQ(r.exit_code, 3) << r.out;
  expect_contains(r.out, "[rank 1] store_worker: rank 1 failing on purpose\n");
  expect_contains(r.out, "exactcoll launch: rank 1 exited with status 3; stopped the other workers");
  // Ranks 0 and 2 were stopped. Rank 2 may end by SIGTERM, or on its own a moment earlier when
  // rank 0 (the store's server) died of its SIGTERM; either way it is marked as stopped.
  expect_contains(r.out, "  rank 0: was killed by SIGTERM (stopped by launch)\n");
  expect_contains(r.out, "  rank 1: exited with status 3\n");
  const size_t rank2 = r.out.find("  rank 2: ");
  ASSERT_NE(rank2, std::string::npos) << r.out;
  const std::string rank2_line = r.out.substr(rank2, r.out.find('\n', rank2) - rank2);
  EXPECT_TRUE(rank2_line.ends_with("(stopped by launch)")) << rank2_line;
  EXPECT_LT(r.elapsed, std::chrono::milliseconds(8000)) << r.out;
}

TEST(LaunchTest, RankKilledBySignal) {
  const RunResult r = run({"launch", "--nproc", "2", "--", "store_worker", "--kill-rank", "1"});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.out;
  expect_contains(r.out, "exactcoll launch: rank 1 was killed by SIGKILL");
  EXPECT_LT(r.elapsed, std::chrono::milliseconds(8000)) << r.out;
}

TEST(LaunchTest, JobTimeoutStopsEveryone) {
  const RunResult r = run({"launch", "--nproc", "2", "--timeout-s", "1", "--", "store_worker", "--hang-rank", "1"});
  EXPECT_EQ(r.exit_code, 3) << r.out;
  expect_contains(r.out, "exactcoll launch: timed out after 1 s with rank(s) 0, 1 still running; stopped them");
  EXPECT_GE(r.elapsed, std::chrono::milliseconds(1000));
  EXPECT_LT(r.elapsed, std::chrono::milliseconds(8000)) << r.out;
}

TEST(LaunchTest, WorkerWithoutLaunchNamesTheMissingVariables) {
  const RunResult r = run({"store_worker"}, {}, std::chrono::milliseconds(5000));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  expect_contains(r.out, "RANK is not set");
  expect_contains(r.out, "EXACTCOLL_STORE_TOKEN is not set");
}

TEST(LaunchTest, UsageErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"launch", "--", "store_worker"}, "--nproc is required"},
      {{"launch", "--nproc", "0", "--", "store_worker"}, "--nproc must be 1..1024"},
      {{"launch", "--nproc", "2"}, "no command to run"},
      {{"launch", "--nproc", "2", "store_worker"}, "unexpected argument 'store_worker'"},
      {{"launch", "--nproc", "2", "--master-port", "70000", "--", "store_worker"}, "--master-port must be 0..65535"},
      {{"launch", "--nproc", "2", "--timeout-s", "0", "--", "store_worker"}, "--timeout-s must be > 0"},
      {{"launch", "--nproc", "2", "--", "launch"}, "cannot run `launch`"},
  };
  for (const Case& c : cases) {
    const RunResult r = run(c.args, {}, std::chrono::milliseconds(5000));
    EXPECT_EQ(r.exit_code, 2) << r.out;
    expect_contains(r.out, c.message);
  }
  const RunResult help = run({"launch", "--help"}, {}, std::chrono::milliseconds(5000));
  EXPECT_EQ(help.exit_code, 0);
  expect_contains(help.out, "EXACTCOLL_STORE_TOKEN");
  expect_contains(help.out, "[rank R]");
  expect_contains(help.out, "--timeout-s");
}

TEST(LaunchTest, UnknownWorkerCommandFailsCleanly) {
  const RunResult r = run({"launch", "--nproc", "2", "--", "no_such_command"}, {}, std::chrono::milliseconds(10000));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  expect_contains(r.out, "exactcoll launch: rank ");
  expect_contains(r.out, "exited with status 2");
}

TEST(LauncherTest, ExecFailureIsAWorkerFailure) {
  launch::LaunchOptions options;
  options.executable = "/nonexistent/exactcoll";
  options.argv = {"exactcoll", "verify"};
  options.nproc = 2;
  options.timeout = std::chrono::milliseconds(10000);
  const auto start = Clock::now();
  EXPECT_EQ(launch::run_workers(options), 127);  // the worker's exit status after a failed execve
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(8000));
}

TEST(LauncherTest, TokensAreFreshHex) {
  std::set<std::string> tokens;
  for (int i = 0; i < 8; ++i) {
    const std::string token = launch::random_token_hex(16);
    EXPECT_EQ(token.size(), 32u);
    EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << token;
    tokens.insert(token);
  }
  EXPECT_EQ(tokens.size(), 8u);
}

}  // namespace
}  // namespace exactcoll
