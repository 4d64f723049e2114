// emu_exec.h - the execution engine of the MSL emulator.
//
// One fiber per GPU thread; the threads of one threadgroup run on
// one host thread, cooperatively.  A fiber runs until it reaches a
// synchronisation point (a simd_* collective, simdgroup_barrier,
// threadgroup_barrier) or returns.  The scheduler then
//   * resolves a simdgroup collective once no lane of that simdgroup can still
//     run: the lanes waiting at the same call site take part, every other lane
//     counts as inactive (exactly the active-mask rule of real hardware);
//   * releases a threadgroup barrier once every thread of the threadgroup is
//     waiting at it, and reports an error if some thread returned instead or
//     the threads wait at different barriers.
// The next fiber to run is the lowest-numbered runnable one ("forward") or the
// highest ("reverse"), so one simdgroup runs as far ahead of the others as the
// synchronisation allows: a missing barrier shows up as a read of poisoned
// threadgroup memory or as a value overwritten too early.
//
// Threadgroup memory is `static thread_local` storage (the source rewrite puts
// every `threadgroup` variable there) and is filled with 0xFF bytes - NaN for
// every floating type - before each threadgroup starts.  Threadgroups are
// spread over a few host threads; each host thread owns its own copy.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <source_location>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace emu {

struct Dim3 {
  uint32_t x, y, z;
};

// Everything a kernel parameter attribute can ask for.
struct Coords {
  Dim3 threads_per_grid;
  Dim3 threadgroups_per_grid;
  Dim3 dispatch_threads_per_threadgroup;
  Dim3 threads_per_threadgroup;  // actual size (smaller at a ragged grid edge)
  Dim3 threadgroup_position_in_grid;
  Dim3 thread_position_in_threadgroup;
  Dim3 thread_position_in_grid;
  uint32_t thread_index_in_threadgroup;
  uint32_t thread_index_in_simdgroup;
  uint32_t simdgroup_index_in_threadgroup;
  uint32_t simdgroups_per_threadgroup;
  uint32_t threads_per_simdgroup;
};

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kMaxThreadsPerThreadgroup = 1024;
constexpr size_t kFiberStack = 128 * 1024;

// ---------------------------------------------------------------------------
// Fiber contexts.  On x86-64 a six-register switch (no system call); elsewhere
// ucontext.  Define EMU_USE_UCONTEXT to force ucontext.

#if defined(__x86_64__) && !defined(EMU_USE_UCONTEXT)
extern "C" void emu_ctx_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .type emu_ctx_switch,@function
emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_ctx_switch, .-emu_ctx_switch
)");

struct Context {
  void* sp = nullptr;
};
// Make `c` start `entry` (which must never return) on the given stack.
inline void context_start(Context& c, char* stack, size_t size, void (*entry)(), Context*) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  void** p = reinterpret_cast<void**>(top);
  *--p = nullptr;                          // return address slot of `entry`
  *--p = reinterpret_cast<void*>(entry);   // where emu_ctx_switch returns to
  for (int i = 0; i < 6; ++i) *--p = nullptr;  // rbp rbx r12 r13 r14 r15
  c.sp = p;
}
inline void context_switch(Context& from, Context& to) { emu_ctx_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
inline void context_start(Context& c, char* stack, size_t size, void (*entry)(), Context* link) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = &link->uc;
  makecontext(&c.uc, entry, 0);
}
inline void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// Parameter kinds: a buffer binding or one of the thread-position attributes.
enum ParamKind : int {
  A_buffer = 0,
  A_thread_position_in_grid,
  A_thread_position_in_threadgroup,
  A_threadgroup_position_in_grid,
  A_threads_per_grid,
  A_threads_per_threadgroup,
  A_threadgroups_per_grid,
  A_dispatch_threads_per_threadgroup,
  A_thread_index_in_threadgroup,
  A_thread_index_in_simdgroup,
  A_simdgroup_index_in_threadgroup,
  A_simdgroups_per_threadgroup,
  A_threads_per_simdgroup,
  A_thread_execution_width,
};

struct ParamSpec {
  int kind;
  int index;  // buffer index for A_buffer
};

struct LaunchArgs {
  void* const* buffers;
  int nbuffers;
  Dim3 grid;   // total threads
  Dim3 group;  // threads per threadgroup
  int schedule;  // 0 forward, 1 reverse
};

using InvokeFn = void (*)(void (*)(), const ParamSpec*, const LaunchArgs&, const Coords&);

struct KernelEntry {
  const char* name;
  InvokeFn invoke;
  void (*fn)();
  const ParamSpec* specs;
  int nparams;
};

// ---------------------------------------------------------------------------
// Threadgroup memory.

struct TgRegistry {
  std::vector<std::pair<void*, size_t>> items;
  void poison() {
    for (auto& it : items) std::memset(it.first, 0xFF, it.second);
  }
};
inline thread_local TgRegistry tls_tg_registry;

template <class T>
struct TgStorage {
  alignas(16) T value;
  TgStorage() {
    std::memset(static_cast<void*>(&value), 0xFF, sizeof(T));
    tls_tg_registry.items.push_back({static_cast<void*>(&value), sizeof(T)});
  }
};

// ---------------------------------------------------------------------------
// Fibers and the scheduler.

enum class LaneState : uint8_t { Runnable, AtSimd, AtBarrier, Done };

struct SimdCall;
using SimdApply = void (*)(SimdCall** lanes);  // lanes[i] == nullptr: inactive

struct SimdCall {
  SimdApply apply;
  const void* in;
  void* out;
  int32_t arg;  // lane index, delta or mask, per op
  const char* file;
  uint32_t line;
  uint32_t column;
};

struct Lane {
  Context ctx;
  char* stack = nullptr;
  LaneState state = LaneState::Done;
  SimdCall* call = nullptr;
  const char* site_file = nullptr;
  uint32_t site_line = 0;
  Coords coords{};
};

// Fiber stacks are kept for reuse across launches (their pages stay mapped).
class StackPool {
 public:
  char* take() {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!free_.empty()) {
        char* s = free_.back();
        free_.pop_back();
        return s;
      }
    }
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, kFiberStack + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    mprotect(p, page, PROT_NONE);  // guard page below the stack
    return static_cast<char*>(p) + page;
  }
  void give(char* s) {
    std::lock_guard<std::mutex> g(mu_);
    free_.push_back(s);
  }

 private:
  std::mutex mu_;
  std::vector<char*> free_;
};
inline StackPool& stack_pool() {
  static StackPool* pool = new StackPool;  // never freed: stacks live as long as the library
  return *pool;
}

class Worker;
inline thread_local Worker* tls_worker = nullptr;

class Worker {
 public:
  Worker() = default;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() {
    for (auto& l : lanes_)
      if (l.stack) stack_pool().give(l.stack);
  }

  std::string error;

  void run_group(const KernelEntry& k, const LaunchArgs& a, Dim3 gpos);

  Lane* current() { return current_; }
  void switch_to_scheduler() { context_switch(current_->ctx, sched_); }

  void fail(const std::string& msg) {
    if (error.empty()) error = msg;
    current_->state = LaneState::Done;
    switch_to_scheduler();
  }

 private:
  static void fiber_main();
  void prepare_lanes(uint32_t n);
  void make_ready(uint32_t i) {
    ready_[i >> 6] |= uint64_t(1) << (i & 63);
  }
  bool pick(uint32_t* out);
  void after_block(uint32_t i);
  void resolve_simd(uint32_t sg);
  void release_barrier();
  std::string describe_waits() const;

  Context sched_;
  std::vector<Lane> lanes_;
  std::vector<uint64_t> ready_;
  Lane* current_ = nullptr;
  const KernelEntry* kernel_ = nullptr;
  const LaunchArgs* args_ = nullptr;
  uint32_t n_ = 0;
  uint32_t n_done_ = 0;
  uint32_t n_barrier_ = 0;
};

inline void Worker::fiber_main() {
  Worker* w = tls_worker;
  Lane* l = w->current_;
  w->kernel_->invoke(w->kernel_->fn, w->kernel_->specs, *w->args_, l->coords);
  l->state = LaneState::Done;
  w->switch_to_scheduler();
}

inline void Worker::prepare_lanes(uint32_t n) {
  if (lanes_.size() < n) lanes_.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    Lane& l = lanes_[i];
    if (!l.stack) {
      l.stack = stack_pool().take();
      if (!l.stack) {
        error = "emulator: cannot allocate fiber stacks";
        return;
      }
    }
    context_start(l.ctx, l.stack, kFiberStack, &Worker::fiber_main, &sched_);
    l.state = LaneState::Runnable;
    l.call = nullptr;
  }
}

inline bool Worker::pick(uint32_t* out) {
  const size_t words = ready_.size();
  if (args_->schedule == 1) {
    for (size_t w = words; w-- > 0;) {
      if (ready_[w]) {
        int b = 63 - __builtin_clzll(ready_[w]);
        ready_[w] &= ~(uint64_t(1) << b);
        *out = static_cast<uint32_t>(w * 64 + b);
        return true;
      }
    }
    return false;
  }
  for (size_t w = 0; w < words; ++w) {
    if (ready_[w]) {
      int b = __builtin_ctzll(ready_[w]);
      ready_[w] &= ready_[w] - 1;
      *out = static_cast<uint32_t>(w * 64 + b);
      return true;
    }
  }
  return false;
}

inline void Worker::run_group(const KernelEntry& k, const LaunchArgs& a, Dim3 gpos) {
  kernel_ = &k;
  args_ = &a;
  Dim3 size{std::min(a.group.x, a.grid.x - gpos.x * a.group.x),
            std::min(a.group.y, a.grid.y - gpos.y * a.group.y),
            std::min(a.group.z, a.grid.z - gpos.z * a.group.z)};
  n_ = size.x * size.y * size.z;
  prepare_lanes(n_);
  if (!error.empty()) return;
  tls_tg_registry.poison();
  Dim3 groups{(a.grid.x + a.group.x - 1) / a.group.x, (a.grid.y + a.group.y - 1) / a.group.y,
              (a.grid.z + a.group.z - 1) / a.group.z};
  ready_.assign((n_ + 63) / 64, 0);
  for (uint32_t i = 0; i < n_; ++i) {
    Coords& c = lanes_[i].coords;
    uint32_t lx = i % size.x, ly = (i / size.x) % size.y, lz = i / (size.x * size.y);
    c.threads_per_grid = a.grid;
    c.threadgroups_per_grid = groups;
    c.dispatch_threads_per_threadgroup = a.group;
    c.threads_per_threadgroup = size;
    c.threadgroup_position_in_grid = gpos;
    c.thread_position_in_threadgroup = {lx, ly, lz};
    c.thread_position_in_grid = {gpos.x * a.group.x + lx, gpos.y * a.group.y + ly,
                                 gpos.z * a.group.z + lz};
    c.thread_index_in_threadgroup = i;
    c.thread_index_in_simdgroup = i % kSimdWidth;
    c.simdgroup_index_in_threadgroup = i / kSimdWidth;
    c.simdgroups_per_threadgroup = (n_ + kSimdWidth - 1) / kSimdWidth;
    c.threads_per_simdgroup = kSimdWidth;
    make_ready(i);
  }
  n_done_ = 0;
  n_barrier_ = 0;
  uint32_t i;
  while (pick(&i)) {
    current_ = &lanes_[i];
    context_switch(sched_, current_->ctx);
    current_ = nullptr;
    if (!error.empty()) return;
    after_block(i);
    if (!error.empty()) return;
  }
  if (n_done_ != n_) error = "emulator: threads left waiting (deadlock): " + describe_waits();
}

inline void Worker::after_block(uint32_t i) {
  Lane& l = lanes_[i];
  if (l.state == LaneState::Done) ++n_done_;
  if (l.state == LaneState::AtBarrier) ++n_barrier_;
  resolve_simd(i / kSimdWidth);
  if (n_barrier_ > 0 && n_barrier_ + n_done_ == n_) release_barrier();
}

inline void Worker::resolve_simd(uint32_t sg) {
  const uint32_t lo = sg * kSimdWidth;
  const uint32_t hi = std::min(n_, lo + kSimdWidth);
  // Any lane still able to run may yet join the collective: wait for it.
  uint64_t word = ready_[lo >> 6] >> (lo & 63);
  if (word & 0xFFFFFFFFull) return;
  for (;;) {
    SimdCall* group[kSimdWidth] = {};
    SimdCall* first = nullptr;
    for (uint32_t j = lo; j < hi; ++j) {
      Lane& l = lanes_[j];
      if (l.state != LaneState::AtSimd) continue;
      if (!first) first = l.call;
      // Lanes at the same call site form one collective (divergent lanes
      // that reach another site run as a separate, later collective).
      if (l.call->file == first->file && l.call->line == first->line &&
          l.call->column == first->column && l.call->apply == first->apply)
        group[j - lo] = l.call;
    }
    if (!first) return;
    first->apply(group);
    for (uint32_t j = lo; j < hi; ++j) {
      if (group[j - lo]) {
        lanes_[j].state = LaneState::Runnable;
        lanes_[j].call = nullptr;
        make_ready(j);
      }
    }
  }
}

inline void Worker::release_barrier() {
  const Lane* ref = nullptr;
  for (uint32_t j = 0; j < n_; ++j) {
    const Lane& l = lanes_[j];
    if (l.state != LaneState::AtBarrier) continue;
    if (!ref) {
      ref = &l;
    } else if (l.site_file != ref->site_file || l.site_line != ref->site_line) {
      error = "threadgroup_barrier: threads of one threadgroup wait at different barriers (" +
              std::string(ref->site_file) + ":" + std::to_string(ref->site_line) + " and " +
              l.site_file + ":" + std::to_string(l.site_line) + ")";
      return;
    }
  }
  if (n_done_ > 0) {
    error = "threadgroup_barrier at " + std::string(ref->site_file) + ":" +
            std::to_string(ref->site_line) + ": " + std::to_string(n_done_) + " of " +
            std::to_string(n_) + " threads returned without reaching it";
    return;
  }
  for (uint32_t j = 0; j < n_; ++j) {
    lanes_[j].state = LaneState::Runnable;
    make_ready(j);
  }
  n_barrier_ = 0;
}

inline std::string Worker::describe_waits() const {
  std::string s;
  for (uint32_t j = 0; j < n_ && s.size() < 400; ++j) {
    const Lane& l = lanes_[j];
    if (l.state == LaneState::AtSimd)
      s += "thread " + std::to_string(j) + " at simd op " + l.call->file + ":" +
           std::to_string(l.call->line) + "; ";
    if (l.state == LaneState::AtBarrier)
      s += "thread " + std::to_string(j) + " at barrier " + l.site_file + ":" +
           std::to_string(l.site_line) + "; ";
  }
  return s;
}

// Called from kernel code (inside a fiber).
inline Lane& this_lane() { return *tls_worker->current(); }

[[noreturn]] inline void fail(const std::string& msg) {
  tls_worker->fail(msg);
  __builtin_unreachable();
}

inline void barrier_wait(const std::source_location& loc) {
  Lane& l = this_lane();
  l.state = LaneState::AtBarrier;
  l.site_file = loc.file_name();
  l.site_line = loc.line();
  tls_worker->switch_to_scheduler();
}

inline void simd_wait(SimdCall* call) {
  Lane& l = this_lane();
  l.call = call;
  l.state = LaneState::AtSimd;
  tls_worker->switch_to_scheduler();
}

// ---------------------------------------------------------------------------
// Kernel parameters.

template <class P>
P attr_value(const Coords& c, int kind) {
  Dim3 v{0, 0, 0};
  switch (kind) {
    case A_thread_position_in_grid: v = c.thread_position_in_grid; break;
    case A_thread_position_in_threadgroup: v = c.thread_position_in_threadgroup; break;
    case A_threadgroup_position_in_grid: v = c.threadgroup_position_in_grid; break;
    case A_threads_per_grid: v = c.threads_per_grid; break;
    case A_threads_per_threadgroup: v = c.threads_per_threadgroup; break;
    case A_threadgroups_per_grid: v = c.threadgroups_per_grid; break;
    case A_dispatch_threads_per_threadgroup: v = c.dispatch_threads_per_threadgroup; break;
    case A_thread_index_in_threadgroup: v.x = c.thread_index_in_threadgroup; break;
    case A_thread_index_in_simdgroup: v.x = c.thread_index_in_simdgroup; break;
    case A_simdgroup_index_in_threadgroup: v.x = c.simdgroup_index_in_threadgroup; break;
    case A_simdgroups_per_threadgroup: v.x = c.simdgroups_per_threadgroup; break;
    case A_threads_per_simdgroup:
    case A_thread_execution_width: v.x = c.threads_per_simdgroup; break;
    default: break;
  }
  if constexpr (std::is_arithmetic_v<P>) {
    return static_cast<P>(v.x);
  } else {
    return P::from_dim3(v.x, v.y, v.z);
  }
}

template <class P>
P make_arg(const ParamSpec& s, const LaunchArgs& a, const Coords& c) {
  if constexpr (std::is_pointer_v<P>) {
    return static_cast<P>(a.buffers[s.index]);
  } else if constexpr (std::is_reference_v<P>) {
    return *static_cast<std::remove_reference_t<P>*>(a.buffers[s.index]);
  } else {
    if (s.kind == A_buffer) return *static_cast<const P*>(a.buffers[s.index]);
    return attr_value<P>(c, s.kind);
  }
}

template <class... P>
struct Thunk {
  template <size_t... I>
  static void call(void (*fn)(), const ParamSpec* s, const LaunchArgs& a, const Coords& c,
                   std::index_sequence<I...>) {
    reinterpret_cast<void (*)(P...)>(fn)(make_arg<P>(s[I], a, c)...);
  }
  static void invoke(void (*fn)(), const ParamSpec* s, const LaunchArgs& a, const Coords& c) {
    call(fn, s, a, c, std::index_sequence_for<P...>{});
  }
};

template <class... P>
KernelEntry make_entry(const char* name, void (*fn)(P...), const ParamSpec* specs) {
  return KernelEntry{name, &Thunk<P...>::invoke, reinterpret_cast<void (*)()>(fn), specs,
                     static_cast<int>(sizeof...(P))};
}

// ---------------------------------------------------------------------------
// Launch: threadgroups are handed out to `workers` host threads in turn.

inline int launch(const KernelEntry& k, const LaunchArgs& a, int workers, std::string* err) {
  if (a.grid.x == 0 || a.grid.y == 0 || a.grid.z == 0) return 0;
  const uint64_t tg = uint64_t(a.group.x) * a.group.y * a.group.z;
  if (a.group.x == 0 || a.group.y == 0 || a.group.z == 0 || tg > kMaxThreadsPerThreadgroup) {
    *err = "threadgroup size " + std::to_string(tg) + " is not in [1, " +
           std::to_string(kMaxThreadsPerThreadgroup) + "]";
    return 1;
  }
  for (int i = 0; i < k.nparams; ++i) {
    const ParamSpec& s = k.specs[i];
    if (s.kind == A_buffer && (s.index >= a.nbuffers || !a.buffers[s.index])) {
      *err = std::string("kernel ") + k.name + " reads [[buffer(" + std::to_string(s.index) +
             ")]] but no argument was bound there";
      return 1;
    }
  }
  const uint64_t gx = (a.grid.x + a.group.x - 1) / a.group.x;
  const uint64_t gy = (a.grid.y + a.group.y - 1) / a.group.y;
  const uint64_t gz = (a.grid.z + a.group.z - 1) / a.group.z;
  const uint64_t ngroups = gx * gy * gz;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::string first_error;
  std::atomic_flag error_lock = ATOMIC_FLAG_INIT;
  auto body = [&]() {
    Worker w;
    tls_worker = &w;
    for (;;) {
      if (failed.load()) break;
      uint64_t g = next.fetch_add(1);
      if (g >= ngroups) break;
      Dim3 pos{static_cast<uint32_t>(g % gx), static_cast<uint32_t>((g / gx) % gy),
               static_cast<uint32_t>(g / (gx * gy))};
      w.run_group(k, a, pos);
      if (!w.error.empty()) {
        if (!error_lock.test_and_set()) {
          first_error = "threadgroup (" + std::to_string(pos.x) + "," + std::to_string(pos.y) +
                        "," + std::to_string(pos.z) + "): " + w.error;
          failed.store(true);
        }
        break;
      }
    }
    tls_worker = nullptr;
  };
  const uint64_t nw = std::max<uint64_t>(1, std::min<uint64_t>(workers, ngroups));
  std::vector<std::thread> pool;
  for (uint64_t i = 0; i < nw; ++i) pool.emplace_back(body);
  for (auto& t : pool) t.join();
  if (failed.load()) {
    *err = first_error;
    return 1;
  }
  return 0;
}

}  // namespace emu

// ---------------------------------------------------------------------------
// The C entry point the Python runner calls through ctypes.
EMU_EXPORT int emu_launch(const emu::KernelEntry* k, void* const* buffers, int nbuffers,
                          const uint32_t* grid, const uint32_t* group, int schedule, int workers,
                          char* err, int errlen) {
  emu::LaunchArgs a{buffers, nbuffers, {grid[0], grid[1], grid[2]},
                    {group[0], group[1], group[2]}, schedule};
  std::string msg;
  int rc = emu::launch(*k, a, workers, &msg);
  if (rc && errlen > 0) {
    std::snprintf(err, static_cast<size_t>(errlen), "%s", msg.c_str());
  }
  return rc;
}
