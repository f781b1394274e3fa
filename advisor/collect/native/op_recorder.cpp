// advisor's op recorder: every op torch runs, recorded from a C++ RecordFunction callback.
//
// The CUPTI collector needs, for each op, its name, input shapes and dtypes, its start and
// end on the host clock, its thread, and an id pushed as a CUPTI external correlation id
// while it runs (so every kernel, copy and set it launches points back at it). Doing that in
// Python for every op (a TorchDispatchMode) costs tens of microseconds an op and makes
// torch.compile run eager; a RecordFunction callback costs about what torch.profiler's own
// costs and is invisible to Dynamo. Built by advisor.collect.native on first use, against the
// torch that runs the script, and driven through ctypes (plain C functions, no Python API).
//
// Rows are kept per thread (the autograd engine's threads record too) and read back once
// recording has stopped. Names and input descriptions repeat op after op, so each is kept
// once and a row holds its index.
#include <ATen/record_function.h>
#include <ATen/core/ivalue.h>

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// cuptiActivityPushExternalCorrelationId / ...Pop...: CUptiResult (*)(kind, id) and (*)(kind, *last).
using PushFn = int (*)(int, uint64_t);
using PopFn = int (*)(int, uint64_t*);

struct Row {
  int64_t start_ns;
  int64_t end_ns;
  int64_t op_id;
  int32_t name;
  int32_t inputs;
  int32_t scope;
  int32_t depth;
};

struct ThreadRows {
  int64_t tid = 0;
  std::mutex lock;  // the owner appends; the reader takes rows only after recording stopped
  std::vector<Row> rows;
  std::unordered_map<std::string, int32_t> known;  // this thread's cache of the string table
  int32_t depth = 0;
};

std::atomic<bool> g_on{false};
std::atomic<int64_t> g_next_id{1};
std::atomic<int64_t> g_dropped{0};
int64_t g_max_rows = 20'000'000;
std::atomic<int64_t> g_rows{0};
PushFn g_push = nullptr;
PopFn g_pop = nullptr;
int g_kind = 0;
bool g_inputs = true;
at::CallbackHandle g_handle = 0;

std::mutex g_strings_lock;
std::vector<std::string> g_strings;
std::unordered_map<std::string, int32_t> g_string_ids;

std::mutex g_threads_lock;
std::vector<std::shared_ptr<ThreadRows>> g_threads;

ThreadRows& thread_rows() {
  // Shared with the registry, so a thread that ends leaves its rows behind to be read.
  thread_local std::shared_ptr<ThreadRows> mine = [] {
    auto rows = std::make_shared<ThreadRows>();
    rows->tid = static_cast<int64_t>(syscall(SYS_gettid));
    std::lock_guard<std::mutex> guard(g_threads_lock);
    g_threads.push_back(rows);
    return rows;
  }();
  return *mine;
}

int32_t intern(ThreadRows& rows, const std::string& text) {
  auto hit = rows.known.find(text);
  if (hit != rows.known.end()) return hit->second;
  int32_t id;
  {
    std::lock_guard<std::mutex> guard(g_strings_lock);
    auto found = g_string_ids.find(text);
    if (found != g_string_ids.end()) {
      id = found->second;
    } else {
      id = static_cast<int32_t>(g_strings.size());
      g_strings.push_back(text);
      g_string_ids.emplace(text, id);
    }
  }
  rows.known.emplace(text, id);
  return id;
}

inline int64_t now_ns() {
  // CLOCK_REALTIME: the clock CUPTI stamps its records with on Linux and Python's
  // time.time_ns() reads, so ops, advisor's ranges and GPU records share one clock.
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void append_shape(std::string& out, c10::IntArrayRef sizes) {
  out += '[';
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(sizes[i]);
  }
  out += ']';
}

// Input Dims and Input type as Kineto writes them (compact JSON), joined by a unit separator.
std::string describe_inputs(const at::RecordFunction& fn) {
  std::string dims = "[";
  std::string types = "[";
  bool first = true;
  for (const c10::IValue& value : fn.inputs()) {
    if (!first) {
      dims += ',';
      types += ',';
    }
    first = false;
    if (value.isTensor()) {
      const at::Tensor& tensor = value.toTensor();
      if (tensor.defined()) {
        append_shape(dims, tensor.sizes());
        types += '"';
        types += std::string(tensor.dtype().name());
        types += '"';
      } else {
        dims += "[]";
        types += "\"\"";
      }
    } else if (value.isTensorList()) {
      dims += '[';
      bool inner_first = true;
      for (const at::Tensor& tensor : value.toTensorList().vec()) {
        if (!inner_first) dims += ',';
        inner_first = false;
        if (tensor.defined()) append_shape(dims, tensor.sizes()); else dims += "[]";
      }
      dims += ']';
      types += "\"TensorList\"";
    } else if (value.isList()) {
      dims += "[]";
      types += "\"ScalarList\"";
    } else if (value.isScalar() || value.isBool()) {
      dims += "[]";
      types += "\"Scalar\"";
    } else {  // None, devices, dtypes, layouts, strings: Kineto leaves these blank
      dims += "[]";
      types += "\"\"";
    }
  }
  dims += ']';
  types += ']';
  dims += '\x1f';
  dims += types;
  return dims;
}

struct Open : at::ObserverContext {
  int64_t start_ns = 0;
  int64_t op_id = 0;
  int32_t name = 0;
  int32_t inputs = -1;
  bool pushed = false;
};

bool is_own_range(const char* name) {
  // Python's record_function enters and exits through these two ops; the range itself is
  // recorded (USER_SCOPE), its plumbing is not.
  return std::strncmp(name, "profiler::_record_function", 26) == 0;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (!g_on.load(std::memory_order_relaxed)) return nullptr;
  const char* name = fn.name();
  if (name == nullptr || is_own_range(name)) return nullptr;
  ThreadRows& rows = thread_rows();
  auto open = std::make_unique<Open>();
  open->name = intern(rows, name);
  if (g_inputs && (fn.scope() == at::RecordScope::FUNCTION || fn.scope() == at::RecordScope::BACKWARD_FUNCTION)) {
    open->inputs = intern(rows, describe_inputs(fn));
  }
  open->op_id = g_next_id.fetch_add(1, std::memory_order_relaxed);
  rows.depth += 1;
  if (g_push != nullptr) {
    open->pushed = g_push(g_kind, static_cast<uint64_t>(open->op_id)) == 0;
  }
  open->start_ns = now_ns();
  return open;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* context) {
  auto* open = static_cast<Open*>(context);
  if (open == nullptr) return;
  int64_t end = now_ns();
  if (open->pushed && g_pop != nullptr) {
    uint64_t last = 0;
    g_pop(g_kind, &last);
  }
  ThreadRows& rows = thread_rows();
  rows.depth -= 1;
  if (g_rows.fetch_add(1, std::memory_order_relaxed) >= g_max_rows) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::lock_guard<std::mutex> guard(rows.lock);
  rows.rows.push_back(Row{open->start_ns, end, open->op_id, open->name, open->inputs,
                          static_cast<int32_t>(fn.scope()), rows.depth});
}

}  // namespace

extern "C" {

// Version of this file's C interface; advisor.collect.native refuses a library with another.
int advisor_ops_abi() { return 1; }

// Where to push each op's id (null: push nothing), with CUPTI's external correlation kind.
void advisor_ops_configure(void* push, void* pop, int kind, int record_inputs, int64_t max_rows) {
  g_push = reinterpret_cast<PushFn>(push);
  g_pop = reinterpret_cast<PopFn>(pop);
  g_kind = kind;
  g_inputs = record_inputs != 0;
  if (max_rows > 0) g_max_rows = max_rows;
}

// Start recording: registers the callback the first time, then switches it on.
int advisor_ops_start() {
  if (g_handle == 0) {
    at::RecordFunctionCallback callback(on_enter, on_exit);
    callback.needsInputs(g_inputs).needsIds(false).scopes(
        {at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE,
         at::RecordScope::TORCHSCRIPT_FUNCTION});
    g_handle = at::addGlobalCallback(std::move(callback));
  }
  g_on.store(true);
  return 0;
}

// Stop recording and remove the callback (ops already inside it still finish their rows).
void advisor_ops_stop() {
  g_on.store(false);
  if (g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
}

int64_t advisor_ops_next_id() { return g_next_id.load(); }
int64_t advisor_ops_dropped() { return g_dropped.load(); }

int64_t advisor_ops_count() {
  int64_t total = 0;
  std::lock_guard<std::mutex> guard(g_threads_lock);
  for (auto& rows : g_threads) {
    std::lock_guard<std::mutex> row_guard(rows->lock);
    total += static_cast<int64_t>(rows->rows.size());
  }
  return total;
}

// Copies up to `capacity` rows into the arrays (each `capacity` long) and forgets them;
// returns how many were copied.
int64_t advisor_ops_take(int64_t capacity, int64_t* start_ns, int64_t* end_ns, int64_t* tid, int64_t* op_id,
                         int32_t* name, int32_t* inputs, int32_t* scope, int32_t* depth) {
  int64_t n = 0;
  std::lock_guard<std::mutex> guard(g_threads_lock);
  for (auto& rows : g_threads) {
    std::lock_guard<std::mutex> row_guard(rows->lock);
    size_t taken = 0;
    for (const Row& row : rows->rows) {
      if (n >= capacity) break;
      start_ns[n] = row.start_ns;
      end_ns[n] = row.end_ns;
      tid[n] = rows->tid;
      op_id[n] = row.op_id;
      name[n] = row.name;
      inputs[n] = row.inputs;
      scope[n] = row.scope;
      depth[n] = row.depth;
      ++n;
      ++taken;
    }
    rows->rows.erase(rows->rows.begin(), rows->rows.begin() + static_cast<std::ptrdiff_t>(taken));
  }
  g_rows.store(0);
  return n;
}

int64_t advisor_ops_strings() {
  std::lock_guard<std::mutex> guard(g_strings_lock);
  return static_cast<int64_t>(g_strings.size());
}

// The interned string `index` (valid until the library is unloaded; strings are never freed).
const char* advisor_ops_string(int64_t index) {
  std::lock_guard<std::mutex> guard(g_strings_lock);
  if (index < 0 || index >= static_cast<int64_t>(g_strings.size())) return "";
  return g_strings[static_cast<size_t>(index)].c_str();
}

}  // extern "C"
