/* exactcoll: collectives whose every output bit is fixed by a written rounding contract
 * (docs/numerics.md). This is the library's C API: one header, a stable C ABI, usable from C, C++,
 * Python (ctypes; the `exactcoll` package), Rust or anything else that can call C.
 *
 * What it offers:
 *   - communicators over CUDA-IPC-linked GPUs (one process per GPU; ranks may share a GPU, as a
 *     slow correctness mode), bootstrapped through a key-value store that the caller supplies as
 *     callbacks (torch.distributed's store, Ray, MPI, ...) or through the library's own TCP store;
 *   - all-reduce, reduce-scatter, all-gather and fused all-reduce + residual add + RMSNorm on
 *     device pointers and a CUDA stream, with every algorithm and `auto`, buffer registration and
 *     CUDA-graph capture; every call reports what ran;
 *   - the same ops on the CPU simulator: host arrays in, the contract's bits out (no GPU needed).
 *
 * Conventions:
 *   - Every function returns an exactcoll_status; EXACTCOLL_OK (0) is success. On failure,
 *     exactcoll_last_error() returns a message for the calling thread that says what was wrong.
 *     No C++ exception and no abort crosses this boundary; a bad argument (a null pointer, an
 *     unknown dtype or algorithm, a handle that was destroyed) is an error, never undefined
 *     behaviour. (A pointer that is not null but points nowhere cannot be detected.)
 *   - Handles (exactcoll_store, exactcoll_comm) are small structs passed by value. An id is never
 *     reused, so using a handle after its destroy call returns EXACTCOLL_ERROR_INVALID_ARGUMENT.
 *   - Structs that may grow begin with `struct_size`; fill it with sizeof (the *_init functions do)
 *     so that a program built against this header keeps working with later libraries.
 *   - Storage types are bit patterns: bf16 and fp16 are 16-bit, fp32 is IEEE binary32.
 *   - "Collective" calls must be made by every rank of the communicator, with equal arguments
 *     where the function says so, in the same order.
 *
 * Example (C, two processes, the caller's own store):
 *   exactcoll_store store;
 *   exactcoll_store_create(&my_callbacks, rank, world_size, &store);
 *   exactcoll_comm_options options;
 *   exactcoll_comm_options_init(&options);
 *   exactcoll_comm comm;
 *   exactcoll_comm_create(store, rank, world_size, &options, &comm);         // collective
 *   exactcoll_call_info info;
 *   exactcoll_call_info_init(&info);
 *   if (exactcoll_allreduce(comm, d_in, d_out, n, EXACTCOLL_BF16, EXACTCOLL_ALGO_AUTO, stream, -1,
 *                           &info) != EXACTCOLL_OK) {
 *     fprintf(stderr, "%s\n", exactcoll_last_error());
 *   }
 *   exactcoll_comm_destroy(comm);                                             // collective
 *   exactcoll_store_destroy(store);
 */
#ifndef EXACTCOLL_EXACTCOLL_H_
#define EXACTCOLL_EXACTCOLL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define EXACTCOLL_API
#else
#define EXACTCOLL_API __attribute__((visibility("default")))
#endif

/* ---- version ----------------------------------------------------------------------------------- */

#define EXACTCOLL_VERSION_MAJOR 0
#define EXACTCOLL_VERSION_MINOR 2
#define EXACTCOLL_VERSION_PATCH 0
/* Bumped only when a function, struct or enum value of this header changes incompatibly. */
#define EXACTCOLL_ABI_VERSION 1

/* Returns MAJOR * 10000 + MINOR * 100 + PATCH of the loaded library. */
EXACTCOLL_API int exactcoll_version(void);
/* Returns the ABI version of the loaded library (compare with EXACTCOLL_ABI_VERSION). */
EXACTCOLL_API int exactcoll_abi_version(void);
/* Returns e.g. "0.2.0 (cuda)" or "0.2.0 (no cuda)": whether the GPU functions are compiled in. */
EXACTCOLL_API const char* exactcoll_version_string(void);
/* Returns 1 when this library was built with CUDA (the GPU functions work), else 0. */
EXACTCOLL_API int exactcoll_has_cuda(void);
/* Returns sizeof the named struct of this header as the library was built ("exactcoll_call_info",
 * "exactcoll_store_callbacks", "exactcoll_comm_options", "exactcoll_comm_properties",
 * "exactcoll_sim_options", "exactcoll_sim_multinode_options", "exactcoll_sim_multinode_stats",
 * "exactcoll_link_rates", "exactcoll_model_prediction"), or 0 for another
 * name: bindings in other languages check their layouts with it. */
EXACTCOLL_API size_t exactcoll_struct_size(const char* struct_name);

/* ---- errors ------------------------------------------------------------------------------------ */

typedef enum exactcoll_status {
  EXACTCOLL_OK = 0,
  EXACTCOLL_ERROR_INVALID_ARGUMENT = 1, /* null pointer, bad dtype/algo/shape/alignment, dead handle */
  EXACTCOLL_ERROR_TIMEOUT = 2,          /* a peer never arrived: a flag wait or a simulated wait */
  EXACTCOLL_ERROR_STORE = 3,            /* the store failed, refused, or a key never appeared */
  EXACTCOLL_ERROR_CUDA = 4,             /* a CUDA runtime call failed */
  EXACTCOLL_ERROR_UNAVAILABLE = 5,      /* built without CUDA, no NCCL, no IPC path where needed */
  EXACTCOLL_ERROR_UNUSABLE = 6,         /* the communicator saw a timeout earlier and refuses IPC calls */
  EXACTCOLL_ERROR_OUT_OF_MEMORY = 7,    /* host memory */
  EXACTCOLL_ERROR_SIMULATION = 8,       /* the simulator found a deadlock or livelock */
  EXACTCOLL_ERROR_INTERNAL = 9          /* a bug: please report the message */
} exactcoll_status;

/* Returns the calling thread's message for the last call that failed ("" if none). The pointer
 * stays valid until the next exactcoll call on this thread. */
EXACTCOLL_API const char* exactcoll_last_error(void);
/* Returns the status's name, e.g. "EXACTCOLL_ERROR_TIMEOUT"; "unknown status" for other values. */
EXACTCOLL_API const char* exactcoll_status_name(int status);

/* ---- types and algorithms ---------------------------------------------------------------------- */

typedef enum exactcoll_dtype { EXACTCOLL_BF16 = 0, EXACTCOLL_FP16 = 1, EXACTCOLL_FP32 = 2 } exactcoll_dtype;

typedef enum exactcoll_op {
  EXACTCOLL_OP_ALLREDUCE = 0,
  EXACTCOLL_OP_REDUCE_SCATTER = 1,
  EXACTCOLL_OP_ALLGATHER = 2
} exactcoll_op;

/* Collective algorithms. All-reduce: one_shot, two_shot, push_one_shot, push_two_shot,
 * lamport_one_shot and lamport_two_shot (flag in data: no barrier; docs/design.md).
 * Reduce-scatter: direct. All-gather: direct, copy_engine. Every op: auto (the tuned table on GPUs;
 * one_shot / two_shot by size in the simulator: the bits are the same), nccl (GPU only: NCCL,
 * whose sums follow no contract; the call then reports exact = 0). */
typedef enum exactcoll_algo {
  EXACTCOLL_ALGO_AUTO = 0,
  EXACTCOLL_ALGO_ONE_SHOT = 1,
  EXACTCOLL_ALGO_TWO_SHOT = 2,
  EXACTCOLL_ALGO_PUSH_ONE_SHOT = 3,
  EXACTCOLL_ALGO_PUSH_TWO_SHOT = 4,
  EXACTCOLL_ALGO_DIRECT = 5,
  EXACTCOLL_ALGO_COPY_ENGINE = 6,
  EXACTCOLL_ALGO_NCCL = 7,
  EXACTCOLL_ALGO_LAMPORT_ONE_SHOT = 8,
  EXACTCOLL_ALGO_LAMPORT_TWO_SHOT = 9
} exactcoll_algo;

/* Fused all-reduce + residual add + RMSNorm algorithms. The simulator runs one_stage, two_stage,
 * push_one_stage, lamport_one_stage, lamport_two_stage, unfused, one_stage_reg, gather_norm and
 * push_one_stage_reg (auto: one_stage); the GPU runs all but push_one_stage_reg (auto: the tuned table; its
 * push_one_stage is the simulator's push_one_stage_reg kernel).
 * nccl_split (GPU only) is NCCL's all-reduce + the canonical norm: not the contract's bits.
 * The values, names and properties come from one table (core/registry.h). */
typedef enum exactcoll_fused_algo {
  EXACTCOLL_FUSED_AUTO = 0,
  EXACTCOLL_FUSED_ONE_STAGE = 1,
  EXACTCOLL_FUSED_TWO_STAGE = 2,
  EXACTCOLL_FUSED_PUSH_ONE_STAGE = 3,
  EXACTCOLL_FUSED_UNFUSED = 4,
  EXACTCOLL_FUSED_ONE_STAGE_REG = 5,
  EXACTCOLL_FUSED_GATHER_NORM = 6,
  EXACTCOLL_FUSED_NCCL_SPLIT = 7,
  EXACTCOLL_FUSED_LAMPORT_ONE_STAGE = 8,
  EXACTCOLL_FUSED_PUSH_ONE_STAGE_REG = 9,
  EXACTCOLL_FUSED_LAMPORT_TWO_STAGE = 10
} exactcoll_fused_algo;

/* The rounding contracts (docs/numerics.md). The library's own, which every algorithm and backend
 * runs: canonical (ranks folded in rank order in fp32, one rounding; the default) and tree (a
 * balanced binary tree over ranks, every node rounded to storage: the same bits at every TP size
 * when the ranks' inputs are trees over their leaves). The others reproduce another system's
 * rounding of the fused op (simulator reference only). */
typedef enum exactcoll_contract {
  EXACTCOLL_CONTRACT_CANONICAL = 0,
  EXACTCOLL_CONTRACT_F32_RESIDUAL = 1,
  EXACTCOLL_CONTRACT_BF16_ACCUMULATE = 2,
  EXACTCOLL_CONTRACT_ROTATED_TWO_SHOT = 3,
  EXACTCOLL_CONTRACT_TREE = 4
} exactcoll_contract;

/* Names: "bf16"; "allreduce"; "one_shot"; "push_one_stage"; "f32_residual". NULL for a value
 * outside the enum. The *_from_name functions return EXACTCOLL_ERROR_INVALID_ARGUMENT (and list
 * the valid names in the message) for an unknown name. */
EXACTCOLL_API const char* exactcoll_dtype_name(int dtype);
EXACTCOLL_API const char* exactcoll_op_name(int op);
EXACTCOLL_API const char* exactcoll_algo_name(int algo);
EXACTCOLL_API const char* exactcoll_fused_algo_name(int algo);
EXACTCOLL_API const char* exactcoll_contract_name(int contract);
EXACTCOLL_API int exactcoll_dtype_from_name(const char* name, int* dtype);
EXACTCOLL_API int exactcoll_algo_from_name(const char* name, int* algo);
EXACTCOLL_API int exactcoll_fused_algo_from_name(const char* name, int* algo);
EXACTCOLL_API int exactcoll_contract_from_name(const char* name, int* contract);
/* Takes an op in either spelling: "allreduce" or torch's "all_reduce" (and "allgather" or
 * "all_gather"); exactcoll_op_name returns the first. */
EXACTCOLL_API int exactcoll_op_from_name(const char* name, int* op);

/* What one call ran. */
typedef struct exactcoll_call_info {
  size_t struct_size; /* sizeof(exactcoll_call_info) */
  int algo;           /* the exactcoll_algo (collectives) or exactcoll_fused_algo that ran; never auto */
  int allreduce_algo; /* fused unfused / nccl_split: the all-reduce's exactcoll_algo; else -1 */
  int exact;          /* 1: the contract's bits; 0: an NCCL fallback (its sums follow no contract) */
  int staged;         /* 1: the input went through the communicator's staging buffer */
  int launches;       /* kernels launched (more than one when a message ran in chunks) */
  int blocks;         /* the kernel grid (0 for NCCL and copy-engine steps) */
  int threads;
  char note[256]; /* why a fallback happened, or "" */
} exactcoll_call_info;

EXACTCOLL_API void exactcoll_call_info_init(exactcoll_call_info* info);

/* ---- stores: how ranks find each other ---------------------------------------------------------- */

/* The most ranks a store's job may have (1..EXACTCOLL_MAX_STORE_RANKS): the TCP store's job slots,
 * and the bound on what a barrier timeout does to name the ranks that never arrived. The store
 * functions refuse a larger world_size with EXACTCOLL_ERROR_INVALID_ARGUMENT. */
#define EXACTCOLL_MAX_STORE_RANKS 1024

/* A key-value store that every rank of a job reaches, given as callbacks. Each returns 0 on
 * success or a nonzero exactcoll_status (EXACTCOLL_ERROR_TIMEOUT when `get` waited timeout_ms in
 * vain); it may call exactcoll_set_store_error first to say why. The library calls them only from
 * the threads that call it (communicator creation, registration, destroy, exactcoll_store_barrier),
 * never from a CUDA stream, and never concurrently for one store: the calls of one store run one
 * at a time, whichever threads make them (a `get` that waits holds the store's other callers until
 * it returns; a callback that calls the library on its own store gets EXACTCOLL_ERROR_STORE rather
 * than waiting for itself). Values are bytes (any byte may occur), at most 16 MiB. A callback that returns 0
 * with an impossible result fails the call with EXACTCOLL_ERROR_STORE naming the key, never passes
 * it: a `get` that leaves *value_bytes unset or reports more than 16 MiB, an `add` whose count a
 * barrier finds negative or not grown. */
typedef struct exactcoll_store_callbacks {
  size_t struct_size; /* sizeof(exactcoll_store_callbacks) */
  void* user_data;    /* passed to every callback */
  /* Sets key to value (overwrites). */
  int (*set)(void* user_data, const char* key, const void* value, size_t value_bytes);
  /* Waits until key is set (at most timeout_ms), then copies min(capacity, length) bytes of its
   * value into buffer and its full length into *value_bytes (always, on success). When
   * *value_bytes > capacity the library calls again with a buffer of that size. */
  int (*get)(void* user_data, const char* key, int64_t timeout_ms, void* buffer, size_t capacity, size_t* value_bytes);
  /* Adds delta to the integer stored at key (missing = 0) and stores the new value in *result. */
  int (*add)(void* user_data, const char* key, int64_t delta, int64_t* result);
  /* Deletes key and sets *existed to 1 if it was there. May be NULL: keys are then left behind. */
  int (*erase)(void* user_data, const char* key, int* existed);
} exactcoll_store_callbacks;

typedef struct exactcoll_store {
  uint64_t id;
} exactcoll_store;

/* Called from inside a store callback: the message the failing call will report. */
EXACTCOLL_API void exactcoll_set_store_error(const char* message);

/* A store over the caller's callbacks (copied; user_data must stay valid until destroy). rank and
 * world_size are this process's place in the job (1 <= world_size <= EXACTCOLL_MAX_STORE_RANKS,
 * 0 <= rank < world_size; EXACTCOLL_ERROR_INVALID_ARGUMENT otherwise): the store's barriers name the
 * ranks that never arrived. */
EXACTCOLL_API int exactcoll_store_create(const exactcoll_store_callbacks* callbacks, int rank, int world_size,
                                         exactcoll_store* store);

/* The library's own TCP store: rank 0 serves it on bind_address:port (bind_address NULL means
 * 127.0.0.1; "0.0.0.0" for ranks on other hosts) and every rank connects to host:port, presenting
 * token (at least 16 characters, the same on every rank). Ranks retry connecting for
 * connect_timeout_ms (1..2^31 - 1; EXACTCOLL_ERROR_STORE after it). rank and world_size as for
 * exactcoll_store_create. Use a port of its own: torch's store already holds MASTER_PORT. */
EXACTCOLL_API int exactcoll_store_create_tcp(const char* host, int port, const char* bind_address, const char* token,
                                             int rank, int world_size, int64_t connect_timeout_ms,
                                             exactcoll_store* store);

/* The TCP store configured from the environment the way the exactcoll CLI's workers are: RANK,
 * WORLD_SIZE (at most EXACTCOLL_MAX_STORE_RANKS), MASTER_ADDR, EXACTCOLL_STORE_PORT (default:
 * MASTER_PORT + 1), EXACTCOLL_STORE_TOKEN, EXACTCOLL_STORE_BIND (`exactcoll launch` sets them all;
 * under torchrun export the token), and EXACTCOLL_STORE_CONNECT_TIMEOUT_MS: how long a rank retries
 * connecting, a whole number of milliseconds in 1..2147483647 (unset: 60000). A variable missing or
 * malformed is EXACTCOLL_ERROR_INVALID_ARGUMENT naming it, before any connection; no connection
 * within the timeout is EXACTCOLL_ERROR_STORE. rank and world_size, when not NULL, receive the
 * environment's values. */
EXACTCOLL_API int exactcoll_store_create_from_env(exactcoll_store* store, int* rank, int* world_size);

/* Collective: returns once every rank of the store's job has entered barrier `name` (a name may be
 * reused; every rank counts its uses). EXACTCOLL_ERROR_STORE after timeout_ms, naming the ranks that
 * never arrived, on either kind of store (e.g. "barrier 'user/start': rank 1 never arrived within
 * 500 ms (2 of 3 waiting: ranks 0, 2)"); naming them reads at most world_size + 1 keys, so the call
 * returns soon after timeout_ms. Useful to line ranks up, and to check a store's callbacks before
 * making a communicator on it. */
EXACTCOLL_API int exactcoll_store_barrier(exactcoll_store store, const char* name, int64_t timeout_ms);

/* Releases the store. Communicators made on it keep it alive until they are destroyed. */
EXACTCOLL_API int exactcoll_store_destroy(exactcoll_store store);

/* ---- GPU communicators (EXACTCOLL_ERROR_UNAVAILABLE in a library built without CUDA) ------------ */

typedef struct exactcoll_comm {
  uint64_t id;
} exactcoll_comm;

typedef struct exactcoll_comm_options {
  size_t struct_size;       /* sizeof(exactcoll_comm_options) */
  const char* name;         /* store key prefix, unique per communicator in a job; NULL: "exactcoll" */
  size_t buffer_bytes;      /* staging and scratch per rank; 128 MiB. Larger messages run in chunks */
  uint64_t flag_timeout_ms; /* bound on every in-kernel wait for a peer; 5000, and at least 60000
                               when ranks share a GPU (they run by time slicing) */
  int64_t store_timeout_ms; /* bound on every store wait; 120000 */
  int use_nccl;             /* 1: create NCCL (baseline, fallback; skipped when ranks share a GPU) */
  int programmatic_launch;  /* 1: launch kernels with programmatic dependent launch */
  int device;               /* the CUDA device; -1: the calling thread's current device. The library
                               links its own CUDA runtime: a program that selects devices with its
                               own runtime (torch, a static cudart) should name the device here */
  /* Newer fields, read only when struct_size covers them. A job that spans nodes: ranks are
   * numbered node-major (node k holds ranks k*L .. k*L+L-1, L ranks per node). With more than one
   * node the communicator is the multi-node one: the IPC kernels inside each node, NCCL
   * point-to-point between nodes, the same contract bits (docs/numerics.md "Past one node"). */
  int node;             /* this rank's node; -1: from GROUP_RANK (torchrun), EXACTCOLL_NODE_RANK or
                           NODE_RANK, and node 0 when none is set */
  int local_world_size; /* ranks per node L; 0: from LOCAL_WORLD_SIZE, else world_size (one node) */
  int contract;         /* the contract every exact call of the communicator folds under:
                           EXACTCOLL_CONTRACT_CANONICAL (default) or EXACTCOLL_CONTRACT_TREE (across
                           nodes: nodes and local_world_size powers of two, else INVALID_ARGUMENT);
                           the fused op's residual add and RMSNorm are canonical under both. Under
                           tree a reduction the exact path cannot run (no IPC, a buffer too small)
                           fails with EXACTCOLL_ERROR_UNAVAILABLE instead of falling back to NCCL's
                           sums; algo nccl, asked for, still runs NCCL. Others are INVALID_ARGUMENT */
  int reserved;         /* 0. Makes the struct longer than the one before `contract`, whose tail
                           padding `contract` occupies, so that struct_size tells them apart */
  int graph_in_place;   /* 1 (default): an out-of-place call captured into a CUDA graph whose peers
                           read its input (one_shot, two_shot, direct; two_shot in place too) leaves
                           the input where it is once every rank
                           has called exactcoll_comm_register_graph_buffers after the capture (before
                           that, replays copy it as uncaptured calls do). 0: such calls always copy
                           the input through the communicator's buffer. The algorithms `auto` picks for all-reduce
                           (push_*, lamport_one_shot) read the input in place anyway: their peers
                           never read it */
  int reserved2;        /* 0, as `reserved` for graph_in_place */
  int eager_in_place;   /* 1 (default): an uncaptured call with no registered buffer whose peers read
                           its input (one_shot, two_shot, direct; two_shot in place too), of 2 MiB
                           (on 4 or more ranks: two_shot 512 KiB, reduce-scatter 1 MiB of input;
                           rank 0's EXACTCOLL_EAGER_MIN_BYTES, where set, for all) up to buffer_bytes, leaves the input
                           where it is   once every peer has mapped the input's allocation: the first call with a new
                           cudaMalloc   allocation copies it through the communicator's buffer and shares the   allocation,
                           the calls after read it in place (torch's caching allocator   reuses its allocations). Needs
                           shared memory (/dev/shm) between the   ranks; without it (or with 0) every such call copies its
                           input */
  int reserved3;        /* 0, as `reserved` for eager_in_place */
} exactcoll_comm_options;

EXACTCOLL_API void exactcoll_comm_options_init(exactcoll_comm_options* options);

/* Collective: every rank of the job calls it with the same options, world_size and store, on its
 * own process. Ranks may share a GPU (a correctness mode: kernels then interleave by time slicing,
 * milliseconds per barrier; NCCL is left out and nccl_ready is 0).
 * A job of several nodes (options node / local_world_size, or the launcher's variables) gets the
 * multi-node communicator. It needs NCCL (EXACTCOLL_ERROR_UNAVAILABLE without it) and offers: the
 * collectives and the fused op with algo auto (the carry chain; a collective's info->algo is -1,
 * the fused op's EXACTCOLL_FUSED_UNFUSED, and info->note names "carry_chain" or
 * "direct_exchange") or nccl; no registered buffers (INVALID_ARGUMENT). A bad layout (nodes of
 * unequal size, ranks not node-major) is EXACTCOLL_ERROR_INVALID_ARGUMENT on every rank, naming
 * every problem. */
EXACTCOLL_API int exactcoll_comm_create(exactcoll_store store, int rank, int world_size,
                                        const exactcoll_comm_options* options, exactcoll_comm* comm);

/* Collective (a store barrier, so that no peer still reads this rank's buffers). */
EXACTCOLL_API int exactcoll_comm_destroy(exactcoll_comm comm);

typedef struct exactcoll_comm_properties {
  size_t struct_size; /* sizeof(exactcoll_comm_properties) */
  int rank;
  int world_size;
  int device;
  int ipc_ready;  /* every rank reaches every peer's memory: the exact kernels can run */
  int nccl_ready; /* NCCL was created (baseline and fallback) */
  int shared_gpu; /* some ranks share a GPU */
  size_t buffer_bytes;
  uint64_t flag_timeout_ms; /* in effect (raised when ranks share a GPU) */
  char arch[16];            /* e.g. "sm90" */
  char ipc_unavailable_reason[256];
  char nccl_unavailable_reason[256];
  /* Newer fields, filled only when struct_size covers them. */
  int nodes; /* 1, or the nodes of a multi-node communicator (ipc_ready etc. describe this
                rank's node, of local_world_size ranks) */
  int local_world_size;
  int contract;                       /* the exactcoll_contract its exact calls fold under */
  int reserved;                       /* 0. Keeps the next field out of the tail padding of the
                                         struct before it: a struct_size reaching past a field
                                         means the library filled it */
  char eager_unavailable_reason[256]; /* "" when eager calls read their inputs in place
                                         (options.eager_in_place), else why not */
} exactcoll_comm_properties;

EXACTCOLL_API int exactcoll_comm_properties_get(exactcoll_comm comm, exactcoll_comm_properties* properties);

/* Caps the grid of the communicator's later all-reduce, reduce-scatter and all-gather launches:
 * a launch whose tuned grid has more than max_blocks blocks runs with max_blocks (0, the default:
 * the tuned grid). For collectives that run beside other kernels, such as the all-reduces that
 * overlap a product's next rows (exactcoll.linear's TreeRowParallelLinear): fewer blocks leave
 * SMs to the product. Bits never change (no fold depends on the grid). Collective state: every
 * rank sets the same value before the same calls. A capture records the grid in force while it
 * captured. A multi-node communicator applies it to its node communicator's launches (a one-node
 * job's calls); the kernels of its calls across nodes keep their own grid. *previous (may be NULL)
 * receives the value before. max_blocks < 0 is EXACTCOLL_ERROR_INVALID_ARGUMENT. */
EXACTCOLL_API int exactcoll_comm_set_max_blocks(exactcoll_comm comm, int max_blocks, int* previous);

/* Collective: every rank registers its own buffer of the same size, in the same order. Peers then
 * read inputs inside it in place (no staging copy): pass *id as registered_id to the ops. Buffer:
 * 16-byte aligned device memory from cudaMalloc (not from cudaMallocAsync pools or VMM). */
EXACTCOLL_API int exactcoll_comm_register_buffer(exactcoll_comm comm, const void* buffer, size_t bytes, int* id);

/* Collective: every rank calls it after capturing the same calls into its CUDA graph(s) and before
 * the first replay (options.graph_in_place). It exports the allocations behind the inputs captured
 * in place since the last call, exchanges them once, and lets the replays read every rank's input
 * where it lies: no staging copy. *registered (may be NULL): how many captured launches it
 * registered (0 on a multi-node communicator, or when nothing was captured in place). It first
 * waits for all work on this GPU: call it with no replay in flight and nothing queued that waits
 * on another rank (an NCCL recv). A failure after the ranks agreed (a peer that never came, a rank
 * that could not fill its rows) leaves the communicator refusing further calls
 * (EXACTCOLL_ERROR_UNUSABLE), since the ranks' registrations may no longer line up. Fails on
 * every rank with EXACTCOLL_ERROR_INVALID_ARGUMENT when some rank's inputs cannot be exported
 * (cudaMallocAsync pools, expandable segments: capture with graph_in_place 0), when ranks captured
 * different sequences of calls (or set graph_in_place differently), or during a capture. The
 * launches it covered are consumed even then: their replays copy the inputs, as every replay does
 * until this has run (through the communicator's buffer, as uncaptured calls do: same bits, the
 * copy's cost). */
EXACTCOLL_API int exactcoll_comm_register_graph_buffers(exactcoll_comm comm, size_t* registered);

/* The ops, on device pointers of this rank's GPU, enqueued on stream (a cudaStream_t; NULL is the
 * legacy default stream). Collective, with equal count, dtype, algo and registered-or-not on every
 * rank. Input and output are 16-byte aligned, and disjoint or in the op's in-place form (all-reduce
 * output == input; reduce-scatter output = input + rank x output bytes; all-gather input = output +
 * rank x input bytes); another overlap is EXACTCOLL_ERROR_INVALID_ARGUMENT. registered_id: -1, or
 * a buffer that holds input (at the same offset on every rank). info: NULL, or filled with what ran. Nothing
 * synchronizes, so a call may be captured in a CUDA graph and replayed; exactcoll_comm_check reports a peer that never
 * arrived. One communicator's calls share its buffers, so they must run one after another on the
 * GPU: issue them on one stream, or order the streams (an event) when a call's stream differs from
 * the previous call's (exactcoll.torch does that for its callers). Sizes are in elements: count =
 * per-rank input elements.
 *   allreduce:      output[i] = the contract's fold over ranks of input_r[i],       i < count
 *   reduce_scatter: output[j] = fold over ranks of input_r[rank * count/n + j],     j < count/n
 *                   (count a multiple of the world size n)
 *   allgather:      output[r * count + i] = input_r[i]                               (bits kept) */
EXACTCOLL_API int exactcoll_allreduce(exactcoll_comm comm, const void* input, void* output, size_t count, int dtype,
                                      int algo, void* stream, int registered_id, exactcoll_call_info* info);
EXACTCOLL_API int exactcoll_reduce_scatter(exactcoll_comm comm, const void* input, void* output, size_t count,
                                           int dtype, int algo, void* stream, int registered_id,
                                           exactcoll_call_info* info);
EXACTCOLL_API int exactcoll_allgather(exactcoll_comm comm, const void* input, void* output, size_t count, int dtype,
                                      int algo, void* stream, int registered_id, exactcoll_call_info* info);

/* Fused all-reduce + residual add + RMSNorm (docs/numerics.md): x [rows, hidden] this rank's
 * partial sums, residual [rows, hidden] (equal on every rank), weight [hidden], eps;
 *   residual_out = round(float(allreduce(x)) + float(residual)),  out = RMSNorm(residual_out).
 * hidden: a positive multiple of 8 (bf16, fp16) or 4 (fp32). All pointers 16-byte aligned; x and
 * the outputs must not overlap; eps finite and >= 0. registered_id: -1, or a registered buffer
 * that holds x. */
EXACTCOLL_API int exactcoll_fused_add_rmsnorm(exactcoll_comm comm, const void* x, const void* residual,
                                              const void* weight, void* residual_out, void* out, int64_t rows,
                                              int64_t hidden, float eps, int dtype, int algo, void* stream,
                                              int registered_id, exactcoll_call_info* info);

/* The canonical residual add + RMSNorm alone, on one GPU (no communicator, no peers):
 *   residual_out = round(float(x) + float(residual)),  out = RMSNorm(residual_out),
 * with the fused ops' rounding and reduction tree, so a single-GPU program (or the norm after any
 * all-reduce) gets the bits of the tensor-parallel paths: the same as the fused op on one rank.
 * x [rows, hidden] may be the same buffer as out; shapes, alignment and eps as for
 * exactcoll_fused_add_rmsnorm. device: the GPU that holds the tensors and stream (-1: the calling
 * thread's current device; name it when the program selects devices with its own CUDA runtime). */
EXACTCOLL_API int exactcoll_add_rmsnorm(const void* x, const void* residual, const void* weight, void* residual_out,
                                        void* out, int64_t rows, int64_t hidden, float eps, int dtype, int device,
                                        void* stream);

/* Waits for stream, then reports (EXACTCOLL_ERROR_TIMEOUT, naming rank, block and peer) a kernel
 * wait that timed out since the last check; the communicator then refuses further IPC calls.
 * Not allowed while stream is being captured. */
EXACTCOLL_API int exactcoll_comm_check(exactcoll_comm comm, void* stream);

/* ---- the simulator: the same algorithms on CPU threads, bit for bit with the GPU --------------- */

/* The most elements one simulator call traces (as the CLI's --trace-elements): each traced element
 * adds its folds to the trace, so a bounded list keeps a traced run's cost near an untraced one's. */
#define EXACTCOLL_MAX_TRACE_ELEMENTS 4096

typedef struct exactcoll_sim_options {
  size_t struct_size;             /* sizeof(exactcoll_sim_options) */
  int blocks;                     /* blocks per rank, 1..128; 1 */
  int seeded_schedule;            /* 0: a thread per rank; 1: fibers interleaved by a PRNG from schedule_seed */
  uint64_t schedule_seed;         /* 1 */
  int64_t timeout_ms;             /* threads schedule: bound on one wait for a peer; 20000 */
  const char* trace_path;         /* NULL, or a JSON-lines trace file to write (docs/design.md section 7) */
  const char* chrome_trace_path;  /* NULL, or a Chrome/Perfetto trace file to write */
  const uint64_t* trace_elements; /* element indices whose folds and roundings are traced */
  size_t num_trace_elements;      /* 0..EXACTCOLL_MAX_TRACE_ELEMENTS; more is INVALID_ARGUMENT */
  /* Newer field, read only when struct_size covers it. */
  int contract; /* exactcoll_sim_collective's contract: canonical (default) or tree (a traced
                   element then records a tree_node event per internal node, then its round) */
  /* Newer fields, read only when struct_size covers them. */
  uint64_t max_steps;    /* seeded schedule: scheduling steps before the run is reported as a livelock
                            (EXACTCOLL_ERROR_SIMULATION); 100000000 */
  int fail_rank;         /* fault injection: -1 (none, the default), or a rank that stops, as a killed
                            process would, at its fail_at_step-th synchronization step (a flag signal
                            or wait). The call then fails (EXACTCOLL_ERROR_SIMULATION, or _TIMEOUT when
                            a threads-schedule wait runs out first), its message naming the dead rank;
                            a run that ends before that step is INVALID_ARGUMENT ("fail_at_step K was
                            never reached: rank R took S synchronization steps in this run"). The
                            traces are written either way; the outputs are undefined. A call with
                            nothing to run (count or rows 0) takes no step and ignores it. */
  uint64_t fail_at_step; /* >= 1 when fail_rank >= 0; 0 */
  /* NULL, or called with progress_user_data and the run's units of work done and in all (a unit:
   * one rank's launch or block; total is 0 while the run is set up), for a progress bar: from a
   * thread of the library's, about every 100 ms while the simulated run lasts, never after the
   * call returns, so progress_user_data need live only as long as the call. It must return
   * quickly and must not call exactcoll functions (from Python's ctypes: a CDLL handle, since the
   * calling thread waits for the callback's thread). */
  void (*progress)(void* progress_user_data, uint64_t done, uint64_t total);
  void* progress_user_data;
  /* Newer fields, read only when struct_size covers them. */
  int threads;  /* exactcoll_sim_fused_add_rmsnorm: threads per block, 1..1024, or 0 (the default):
                   the algorithm's own (the RMSNorm tree's lanes, 32 x ceil(min(hidden / pack, 1024)
                   / 32), for one_stage_reg, gather_norm and push_one_stage_reg, whose register path
                   runs only at that count; 1 for the others, lamport_one_stage and
                   lamport_two_stage included, whose register path runs where threads is its lanes and the row has at
                   most as many  packs as lanes). Every  count gives the same bits. 0 under an alternative contract;
                   exactcoll_sim_collective  runs one thread per block and takes 0 or 1 */
  int reserved; /* 0: keeps the struct free of tail padding, so that a later field grows struct_size */
} exactcoll_sim_options;

EXACTCOLL_API void exactcoll_sim_options_init(exactcoll_sim_options* options);

/* Runs one collective on `ranks` simulated ranks (1..16). inputs: ranks x count elements, rank r's
 * at r * count. outputs: ranks x output elements (count, count / ranks, ranks x count for
 * allreduce, reduce_scatter, allgather), every rank's result. options: NULL for the defaults. */
EXACTCOLL_API int exactcoll_sim_collective(int op, int algo, int dtype, int ranks, size_t count, const void* inputs,
                                           void* outputs, const exactcoll_sim_options* options,
                                           exactcoll_call_info* info);

/* The fused op on the simulator: x [ranks, rows, hidden], residual [rows, hidden], weight [hidden];
 * residual_out and out [ranks, rows, hidden] (every rank's copy). contract: canonical, or an
 * alternative (computed by the scalar reference; algo must then be auto, and options may not ask
 * for blocks, threads, a seeded schedule, traces or fault injection). */
EXACTCOLL_API int exactcoll_sim_fused_add_rmsnorm(int algo, int contract, int dtype, int ranks, int64_t rows,
                                                  int64_t hidden, float eps, const void* x, const void* residual,
                                                  const void* weight, void* residual_out, void* out,
                                                  const exactcoll_sim_options* options, exactcoll_call_info* info);

/* The multi-node collectives (docs/design.md section 8) on the simulator: `nodes` nodes of
 * ranks_per_node ranks, numbered node-major; inside a node the ranks share memory (the IPC
 * kernels), between nodes an unrounded fp32 carry travels the chain in rank order over a simulated
 * network (the canonical contract), or, under the tree contract, every node folds its ranks' subtree
 * and the nodes combine them by recursive doubling (halving for reduce_scatter); all-gather is a
 * copy under both. Same bits as exactcoll_sim_collective on nodes x ranks_per_node ranks under the
 * same contract (tree: nodes and ranks_per_node powers of two). The fields the multi-node run adds
 * to exactcoll_sim_options; _init fills the defaults. */
typedef struct exactcoll_sim_multinode_options {
  size_t struct_size;    /* sizeof(exactcoll_sim_multinode_options) */
  size_t chunk_elements; /* elements per pipeline step (one message), a positive multiple of 64; 1048576 */
} exactcoll_sim_multinode_options;

EXACTCOLL_API void exactcoll_sim_multinode_options_init(exactcoll_sim_multinode_options* options);

/* What crossed the simulated network, filled by exactcoll_sim_multinode_collective (also when the
 * run failed: what was posted until then). */
typedef struct exactcoll_sim_multinode_stats {
  size_t struct_size;        /* sizeof(exactcoll_sim_multinode_stats) */
  uint64_t messages;         /* messages posted (every one crosses a node boundary) */
  uint64_t cross_node_bytes; /* their bytes */
} exactcoll_sim_multinode_stats;

EXACTCOLL_API void exactcoll_sim_multinode_stats_init(exactcoll_sim_multinode_stats* stats);

/* Runs op (allreduce, reduce_scatter, allgather) on nodes (1..1024) x ranks_per_node (1..16)
 * simulated ranks; inputs and outputs as exactcoll_sim_collective's for ranks = nodes x
 * ranks_per_node (reduce_scatter: count a multiple of that). options: NULL for the defaults;
 * blocks (every node kernel's), the schedule (seeded: the order in which messages cross node
 * boundaries), timeout_ms, max_steps, contract (canonical or tree), trace_path (every message, with
 * the boundary it crossed, and every node kernel; written also after a failed run) and
 * trace_elements (input element indices: under canonical their fold events in global rank order
 * along the chain and the last node's round; under tree a tree_node event per node of the tree a
 * rank computes, then the round on each rank that computes the root) apply; chrome_trace_path
 * must be NULL, fail_rank -1 (the multi-node simulator kills no rank) and threads 0 or 1; progress
 * is never called. multinode: NULL for its defaults. stats: NULL, or filled. info: algo -1 (the
 * carry chain, the tree's exchange and the direct exchange have no exactcoll_algo), note
 * "carry_chain", "tree_doubling", "tree_halving" or "direct_exchange". */
EXACTCOLL_API int exactcoll_sim_multinode_collective(int op, int dtype, int nodes, int ranks_per_node, size_t count,
                                                     const void* inputs, void* outputs,
                                                     const exactcoll_sim_options* options,
                                                     const exactcoll_sim_multinode_options* multinode,
                                                     exactcoll_sim_multinode_stats* stats, exactcoll_call_info* info);

/* The fused op (exactcoll_sim_fused_add_rmsnorm's) across nodes: the multi-node all-reduce above of
 * x (the carry chain, or under the tree contract the tree's exchange by recursive doubling), then
 * on every rank residual_out = s + residual and out = RMSNorm(residual_out) * weight, locally: the
 * bits of every one-node fused algorithm on nodes x ranks_per_node ranks under the same contract.
 * x [nodes x ranks_per_node, rows, hidden] (rank r's at r * rows * hidden), residual [rows, hidden],
 * weight [hidden]; residual_out and out [nodes x ranks_per_node, rows, hidden] (every rank's copy).
 * contract: the argument, as for exactcoll_sim_fused_add_rmsnorm (options->contract is not read):
 * canonical or tree (nodes and ranks_per_node powers of two); the emulations run on one node only
 * (exactcoll_sim_fused_add_rmsnorm's reference). rows 0..16777216 (0 runs nothing), hidden a
 * positive multiple of the dtype's pack, eps finite and >= 0. options: NULL for the defaults;
 * blocks, the schedule, timeout_ms, max_steps and trace_path (every message and node kernel;
 * written also after a failed run) apply; num_trace_elements must be 0 (the fused op across nodes
 * records no element), chrome_trace_path NULL, fail_rank -1, threads 0 or 1; progress is never
 * called. multinode: NULL for its defaults. stats: NULL, or filled (also after a failed run).
 * info: algo and allreduce_algo -1, note "carry_chain" or "tree_doubling". */
EXACTCOLL_API int exactcoll_sim_multinode_fused_add_rmsnorm(
    int contract, int dtype, int nodes, int ranks_per_node, int64_t rows, int64_t hidden, float eps, const void* x,
    const void* residual, const void* weight, void* residual_out, void* out, const exactcoll_sim_options* options,
    const exactcoll_sim_multinode_options* multinode, exactcoll_sim_multinode_stats* stats, exactcoll_call_info* info);

/* ---- the multi-node performance model ---------------------------------------------------------- */

/* An alpha-beta model of the multi-node collectives on M nodes of L GPUs: exactcoll's carry chain
 * (and, for the all-reduce, the direct reduce-scatter + all-gather it is compared with) beside
 * NCCL's ring and tree, then the tree contract's exchange (docs/design.md, "The performance model";
 * `exactcoll model` prints it).
 * _init fills the defaults: NVLink 390 GB/s per direction (measured on one H200), a 50 GB/s NIC
 * per GPU (400 Gb/s, rail-optimized), 5 us per network step, 4 us per node kernel, 1 us per NCCL
 * step inside a node. */
typedef struct exactcoll_link_rates {
  size_t struct_size;        /* sizeof(exactcoll_link_rates) */
  double nvlink_gbps;        /* GB/s per direction of one GPU's NVLink, > 0 */
  double network_gbps;       /* GB/s per direction of one GPU's NIC, > 0 */
  double network_latency_us; /* one network step, >= 0 */
  double kernel_latency_us;  /* one node kernel (launch + IPC barrier), >= 0 */
  double nvlink_step_us;     /* one NCCL step inside a node, >= 0 */
} exactcoll_link_rates;

#define EXACTCOLL_MODEL_MAX_PREDICTIONS 8

typedef struct exactcoll_model_prediction {
  char algorithm[32];      /* "exactcoll chain"; "chain, overlapped" and, for the all-reduce,
                            * "exactcoll direct" (not built: what they would buy); "nccl ring";
                            * "nccl tree" (the all-reduce only); last, "exactcoll tree" (the tree
                            * contract's exchange, other bits than the chain's: recursive doubling
                            * for the all-reduce, halving for the reduce-scatter; only where nodes
                            * and gpus_per_node are powers of two; not for the all-gather) */
  double time_us;          /* predicted time of one op */
  double nic_bytes;        /* bytes through the busiest NIC, one direction */
  uint64_t chunk_elements; /* the carry chain's or the tree's chunk; 0 for the others */
} exactcoll_model_prediction;

EXACTCOLL_API void exactcoll_link_rates_init(exactcoll_link_rates* rates);

/* Predicts op (EXACTCOLL_OP_*) of `bytes` per rank (64..2^40) of dtype on `nodes` nodes (1..1024)
 * of gpus_per_node GPUs (1..16). rates: NULL for the defaults. Writes the predictions, exactcoll's
 * first, to predictions[0 .. *count); capacity: room there, at least the number of predictions
 * (EXACTCOLL_MODEL_MAX_PREDICTIONS always suffices), else INVALID_ARGUMENT naming it. */
EXACTCOLL_API int exactcoll_model_multinode(int op, int dtype, int nodes, int gpus_per_node, size_t bytes,
                                            const exactcoll_link_rates* rates, exactcoll_model_prediction* predictions,
                                            int capacity, int* count);

/* ---- TP-invariant matrix products (issue 25; EXACTCOLL_ERROR_UNAVAILABLE without CUDA) -------- */

/* C[i] = A[i] @ B[i] for i in 0..batch-1, row-major, on one GPU (no communicator), with every
 * output element's bits a function of its row of A, its column of B and k alone: the same for any
 * m, n, batch, leading dimension or position in memory (the building block of the tree contract's
 * TP-invariant linear layers: a column-parallel shard of N, or a row-parallel layer's leaves as
 * one batch, gives the bits of the whole product). bf16 or fp16 operands, float accumulation, each
 * output rounded once to the storage type. By default exactcoll's own kernel computes it
 * (cuda_backend/linear/tile_matmul.h: blocks of C, K in order from 0 by tensor-core MMAs with
 * fp32 accumulation: every element's order of operations is fixed by construction).
 * With EXACTCOLL_INVARIANT_MATMUL=cublaslt (an experiment), cuBLASLt (libcublasLt.so.13, loaded on
 * first use) runs it with ONE configuration pinned per (device, dtype, k): split-K 1, no
 * reduction, no workspace, chosen the first time that k is used (cuda_backend/linear/
 * invariant_matmul.h says how and what is assumed); a product that configuration cannot run in one
 * call runs in blocks of C's rows and columns, each with that configuration; one it cannot run
 * even so is refused with INVALID_ARGUMENT, never run with another configuration.
 *   A[i] at a + i * stride_a, m rows of k elements, rows lda apart (lda >= k);
 *   B[i] at b + i * stride_b, k rows of n, ldb apart (ldb >= n); stride_b may be 0 (one B);
 *   C[i] at c + i * stride_c, m rows of n, ldc apart (ldc >= n); the batches' C must not overlap,
 *   and C's span (its first to its last element over every batch entry) must not meet A's or B's
 *   (INVALID_ARGUMENT).
 * (strides and leading dimensions in elements). 0 <= m, 1 <= k, n <= 2^31 - 1, 1 <= batch <= 65535;
 * pointers 16-byte aligned and every leading dimension and stride a multiple of 8 elements;
 * m == 0 does nothing. dtype: EXACTCOLL_BF16 or EXACTCOLL_FP16. device: the GPU that holds the
 * operands and stream (-1: the calling thread's current device). Enqueued on stream; may be
 * captured in a CUDA graph once the (dtype, k) and shape have run eagerly (the first call of a k
 * asks cuBLASLt's heuristic). */
EXACTCOLL_API int exactcoll_invariant_matmul(const void* a, const void* b, void* c, int64_t m, int64_t k, int64_t n,
                                             int64_t batch, int64_t lda, int64_t ldb, int64_t ldc, int64_t stride_a,
                                             int64_t stride_b, int64_t stride_c, int dtype, int device, void* stream);

/* The first level of the tree contract's leaf tree fused into the product: for p in 0..pairs-1,
 *   C[p] = round(float(P[2p]) + float(P[2p+1])),   P[l] = A[l] @ B[l] rounded once to the dtype,
 * every P[l] bit for bit the product exactcoll_invariant_matmul computes for that leaf (same kernel,
 * same K), and the node the tree contract's (core/contract.h tree_node: one fp32 add, one rounding;
 * a NaN anywhere gives the dtype's NaN, 0x7FFF), which is also torch's bf16 / fp16 `P[2p] + P[2p+1]`
 * on CUDA. So the tree over C[0 .. pairs-1] (exactcoll.linear.tree_sum) is the tree over the
 * 2 * pairs leaves, and with pairs == 1, C[0] is the tree over the two. A row-parallel layer's rank passes its
 * leaves: A[l] = x's columns [l k, (l+1) k), B[l] = W^T's rows [l k, (l+1) k).
 * Returns EXACTCOLL_OK, or: INVALID_ARGUMENT for a bad argument (as exactcoll_invariant_matmul, the
 * messages naming pairs, stride_a_leaf, stride_b_leaf, stride_c_pair), UNAVAILABLE without CUDA or,
 * with cublaslt, without cuBLASLt, CUDA for a failed launch or allocation.
 * Preconditions (checked, INVALID_ARGUMENT otherwise, before any GPU work):
 *   leaf l (0 <= l < 2 pairs): A[l] at a + l * stride_a_leaf, m rows of k elements, lda apart
 *   (lda >= k); B[l] at b + l * stride_b_leaf, k rows of n, ldb apart (ldb >= n); stride_b_leaf may
 *   be 0 (one B for every leaf);
 *   pair p: C[p] at c + p * stride_c_pair, m rows of n, ldc apart (ldc >= n); the pairs' C must not
 *   overlap, and C's span must not meet A's or B's (over every leaf);
 *   1 <= pairs <= 32767; m, k, n, dtype, device, alignment (every leading dimension and stride a
 *   multiple of 8 elements; stride_c_pair only when pairs > 1) as exactcoll_invariant_matmul;
 *   m == 0 does nothing.
 * By default, from m = 256 (and wherever the large blocks serve the shape), exactcoll's kernels
 * compute each block's two leaves in turn (the first rounded and kept on chip), so the leaf products
 * are never written to memory. Below that (the mid-M blocks, which have no pair mode) and with
 * EXACTCOLL_INVARIANT_MATMUL=cublaslt, the even leaves run as one product call into C, the odd ones
 * into a stream-ordered scratch (cudaMallocAsync, pairs x m x n rounded up to 8 elements, freed on
 * the stream), then an elementwise kernel adds them: the same bits as two exactcoll_invariant_matmul
 * calls and the node. Enqueued on stream; capturable as exactcoll_invariant_matmul is (the scratch
 * then becomes the graph's memory alloc and free nodes). */
EXACTCOLL_API int exactcoll_invariant_matmul_pairs(const void* a, const void* b, void* c, int64_t m, int64_t k,
                                                   int64_t n, int64_t pairs, int64_t lda, int64_t ldb, int64_t ldc,
                                                   int64_t stride_a_leaf, int64_t stride_b_leaf, int64_t stride_c_pair,
                                                   int dtype, int device, void* stream);

/* Writes the kernel exactcoll_invariant_matmul (and _pairs) runs for (dtype, k) on device: exactcoll's tiles
 * ("exactcoll tiles: C blocks of 64 columns, ..."), or with cublaslt the configuration it pins (choosing it
 * if no call has yet), e.g. "bf16 K=4096: algo 66 tile 20 splitK 1 reduction 0 ... (candidate 0 of
 * 12 at m=256 n=4096; cuBLASLt 130000)", into text (size bytes, truncated, NUL-terminated): two
 * runs whose bits are compared must show the same text for every k they use. */
EXACTCOLL_API int exactcoll_invariant_matmul_config(int dtype, int64_t k, int device, char* text, size_t size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXACTCOLL_EXACTCOLL_H_ */
