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
#include <thread>
#include <vector>

#include "store/tcp_store_server.h"
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
  if (srcdir == nullptr || workspace == nullptr) return "tests/tools/launch/launch_test_worker";
  return std::string(srcdir) + "/" + workspace + "/tests/tools/launch/launch_test_worker";
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
  const RunResult same =
      run({"launch", "--nproc", "2", "--master-port", "29999", "--store-port", "29999", "--", "store_worker"});
  EXPECT_EQ(same.exit_code, 2) << same.out;
  expect_contains(same.out, "--store-port and --master-port must differ");
}

TEST(LaunchTest, LaunchReplacesInheritedJobVariables) {
  // Stale torchrun variables in the launcher's environment must not leak into the workers.
  const RunResult r = run(
      {"launch", "--nproc", "2", "--", "store_worker"},
      {"RANK=7", "WORLD_SIZE=9", "LOCAL_RANK=7", "MASTER_PORT=1", "EXACTCOLL_STORE_PORT=1", "EXACTCOLL_STORE_TOKEN=x"});
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

// ---- Without a launcher (torchrun style): every worker started here, each on its own ---------------

// Starts one store_worker per rank with the torchrun variables set, waits for all (at most
// `limit`), and returns each one's result, its elapsed time measured from the common start.
std::vector<RunResult> run_torchrun_style(int world_size, const std::vector<std::string>& flags,
                                          std::chrono::milliseconds limit) {
  // The store's port is picked free too: its default, MASTER_PORT + 1, may be anyone's (a test
  // beside this one once held it: "bind: Address already in use").
  const uint16_t port = launch::pick_free_port();
  const uint16_t store_port = launch::pick_free_port_except(port);
  const std::string token = launch::random_token_hex(16);
  std::vector<std::thread> threads;
  std::vector<RunResult> results(static_cast<size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<std::string> args = {"store_worker"};
      args.insert(args.end(), flags.begin(), flags.end());
      results[static_cast<size_t>(rank)] =
          run(args,
              {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world_size),
               "LOCAL_RANK=" + std::to_string(rank), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
               "EXACTCOLL_STORE_PORT=" + std::to_string(store_port), "EXACTCOLL_STORE_TOKEN=" + token},
              limit);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(TorchrunStyleTest, ABarrierTimeoutNamesTheRankThatNeverArrived) {
  // Issue 15, item 11: rank 2 dies before the first barrier; ranks 0 and 1 said only
  // "barrier 'start': only 2 of 3 callers arrived".
  const auto results = run_torchrun_style(3, {"--kill-rank", "2", "--kill-at", "start", "--timeout-ms", "1500"},
                                          std::chrono::milliseconds(15000));
  EXPECT_EQ(results[2].exit_code, 128 + SIGKILL) << results[2].out;
  // Rank 0 hosts the store, so it always gets its timeout reply.
  EXPECT_EQ(results[0].exit_code, 3) << results[0].out;
  expect_contains(results[0].out, "barrier 'start': rank 2 never arrived within 1500 ms (");
  // Rank 1 is named too: still waiting, or, when its own 1500 ms ran out a moment before rank 0's
  // (the two deadlines start when each arrives, and which arrives first is the machine's
  // choice), as one that came and left.
  const bool rank1_waiting = results[0].out.find("(2 of 3 waiting: ranks 0, 1)") != std::string::npos;
  const bool rank1_left =
      results[0].out.find("(1 of 3 waiting: rank 0; rank 1 came but left before the end") != std::string::npos;
  EXPECT_TRUE(rank1_waiting || rank1_left) << results[0].out;
  // Rank 1's deadline: by then rank 0 may have given up (rank 1 then names rank 2 as missing and
  // rank 0 as one that came and left), or left with its server.
  EXPECT_EQ(results[1].exit_code, 3) << results[1].out;
  const bool rank1_named =
      results[1].out.find("barrier 'start': rank 2 never arrived within 1500 ms") != std::string::npos ||
      results[1].out.find("closed the connection: rank 0 exited or died") != std::string::npos;
  EXPECT_TRUE(rank1_named) << results[1].out;
}

TEST(TorchrunStyleTest, WhenRankZeroDiesTheOthersExitWithinTheirTimeoutAndNameIt) {
  // Issue 15, item 5: rank 0 hosts the store. It dies after the first barrier, while ranks 1 and
  // 2 wait for its key; they must exit within their timeout + 1 s, naming rank 0.
  const auto timeout = std::chrono::milliseconds(4000);
  const auto results = run_torchrun_style(3, {"--kill-rank", "0", "--timeout-ms", std::to_string(timeout.count())},
                                          std::chrono::milliseconds(20000));
  EXPECT_EQ(results[0].exit_code, 128 + SIGKILL) << results[0].out;
  for (int rank = 1; rank < 3; ++rank) {
    const RunResult& r = results[static_cast<size_t>(rank)];
    EXPECT_EQ(r.exit_code, 3) << r.out;
    expect_contains(r.out, "(run by rank 0) closed the connection: rank 0 exited or died");
    EXPECT_LT(r.elapsed, timeout + std::chrono::milliseconds(1000)) << r.out;
  }
}

TEST(LaunchTest, KillingTheLauncherEndsItsWorkers) {
  // The launcher is killed (SIGKILL: it cannot clean up). Its workers get SIGTERM through their
  // parent-death signal; the pipe they share with it (their stdout) then reaches its end. Rank 1
  // would otherwise sleep 60 s, and rank 0 wait 20 s for it.
  std::vector<std::string> argv_strings = {worker_binary(), "launch",      "--nproc", "2", "--",
                                           "store_worker",  "--hang-rank", "1"};
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  const pid_t launcher = fork();
  if (launcher == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the workers are up
  const auto killed_at = Clock::now();
  ASSERT_EQ(kill(launcher, SIGKILL), 0);  // our own child, by pid
  int status = 0;
  waitpid(launcher, &status, 0);
  bool eof = false;
  while (!eof && Clock::now() - killed_at < std::chrono::seconds(10)) {  // bounded
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buffer[4096];
      eof = read(fds[0], buffer, sizeof buffer) <= 0;
    }
  }
  close(fds[0]);
  EXPECT_TRUE(eof) << "a worker outlived its killed launcher by 10 s";
  EXPECT_LT(Clock::now() - killed_at, std::chrono::seconds(5));
}

}  // namespace
}  // namespace exactcoll
