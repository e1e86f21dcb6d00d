/* The cross-rank collective transport over Gloo (dev_gloo.h; issue #16).
 *
 * One transport per mesh epoch. Its groups are Gloo contexts, one per
 * (device set, participant index) on this rank, made on group_get by
 * gloo::rendezvous::Context::connectFullMesh through the mesh's key-value
 * store (a Store over dev_mesh_kv, under a PrefixStore of the transport's
 * prefix and the set: "epoch/3/set/0,1,2,3"), over one TCP device per
 * transport listening on the rank's transport host. Participants of one set
 * on one rank are separate Gloo ranks too (their pairs run over loopback),
 * so every participant is one executor thread, as the engine wants.
 *
 * Gloo reports failures by throwing: gloo::IoException for I/O (a peer that
 * closed its connection, or a timeout: "Timed out waiting ...", "Read
 * timeout", "Application timeout caused pair closure", the Store's "Wait
 * timeout"), gloo::EnforceNotMet / gloo::Exception for misuse. Every call
 * into Gloo here is inside try/catch and becomes a status: IoException ->
 * UNAVAILABLE (peer gone) or DEADLINE_EXCEEDED (its message says timeout),
 * the rendezvous store's own errors keep their code, anything else ->
 * INTERNAL. Messages name the participant and the set, and quote Gloo.
 *
 * A group whose collective failed stays failed (Gloo closes its pairs): the
 * mesh re-forms with a new epoch, hence a new transport, after a rank is
 * lost. Group creation that failed is not cached, but its keys stay in the
 * store, so a retry within the same epoch may meet stale addresses; the
 * engine does not retry within an epoch.
 *
 * Source: Gloo's rendezvous (gloo/rendezvous/context.h, store.h,
 * prefix_store.h), its TCP transport (gloo/transport/tcp/device.h) and its
 * collectives (gloo/allreduce.h, broadcast.h, allgatherv.h). */
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

/* The engine's headers wrap their declarations in extern "C" themselves
 * (after their own #includes, which C++ must see as C++). */
#include "dev_backend.h"
#include "dev_gloo.h"
#include "dev_mesh.h"
#include "device.h"

namespace {

/* An error of the rendezvous store, thrown through Gloo (which calls the
 * Store from connectFullMesh) and caught by the call into Gloo with its
 * code intact. */
struct KvError : public std::runtime_error {
  KvError(pd_code c, const std::string &msg)
      : std::runtime_error(msg), code(c) {}
  pd_code code;
};

/* gloo::rendezvous::Store over the mesh's key-value store. get and wait
 * wait for keys up to the transport's timeout (wait's own timeout when it
 * is given and shorter). One per group creation; not shared. */
class KvStore : public gloo::rendezvous::Store {
 public:
  KvStore(const dev_mesh_kv &kv, double timeout_s)
      : kv_(kv), timeout_s_(timeout_s) {}

  void set(const std::string &key, const std::vector<char> &data) override {
    dev_status st = DEV_STATUS_INIT;
    pd_code c = kv_.set(kv_.arg, key.c_str(), data.data(), data.size(), &st);
    if (c != PD_OK)
      throw KvError(c,
                    "rendezvous: setting key '" + key + "' failed: " + st.msg);
  }

  std::vector<char> get(const std::string &key) override {
    return fetch(key, timeout_s_);
  }

  void wait(const std::vector<std::string> &keys) override {
    wait(keys, std::chrono::milliseconds(0));
  }

  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override {
    double limit = timeout_s_;
    if (timeout.count() > 0 && timeout.count() / 1000.0 < limit)
      limit = timeout.count() / 1000.0;
    auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(limit);
    for (const auto &k : keys) {
      std::chrono::duration<double> left =
          deadline - std::chrono::steady_clock::now();
      fetch(k, left.count() > 0 ? left.count() : 0.001);
    }
  }

 private:
  /* The value of `key`, waiting up to timeout_s; kept, since the
   * rendezvous waits for a key and then gets it. */
  std::vector<char> fetch(const std::string &key, double timeout_s) {
    auto it = seen_.find(key);
    if (it != seen_.end()) return it->second;
    dev_status st = DEV_STATUS_INIT;
    void *value = nullptr;
    size_t len = 0;
    pd_code c = kv_.get(kv_.arg, key.c_str(), timeout_s, &value, &len, &st);
    if (c == PD_NOT_FOUND)
      throw KvError(PD_DEADLINE_EXCEEDED,
                    "rendezvous: a peer did not publish key '" + key +
                        "' within " + std::to_string(timeout_s) +
                        " s (it has not joined the set): " + st.msg);
    if (c != PD_OK)
      throw KvError(c,
                    "rendezvous: reading key '" + key + "' failed: " + st.msg);
    std::vector<char> v(static_cast<char *>(value),
                        static_cast<char *>(value) + len);
    free(value);
    seen_[key] = v;
    return v;
  }

  dev_mesh_kv kv_;
  double timeout_s_;
  std::map<std::string, std::vector<char>> seen_;
};

/* One participant's Gloo context for one set. Every call on it takes the
 * next tag (`calls`), the same on every participant while they make the
 * same calls in the same order (the engine's one-order rule), so each
 * collective has slots of its own: after a failure, when participants may
 * no longer agree on which call comes next (one gave up on the failure
 * flag, a peer went on to the data), a message of one call can never land
 * in another's buffer. That was an uncaught gloo::EnforceNotMet in Gloo's
 * network thread ("op.preamble.length <= op.nbytes. 88 vs 4"), which
 * aborted surviving daemons when a rank died mid-AllReduce (trial finding
 * B11). After a failure the group is `poisoned`: its context is destroyed
 * at once (its peers' calls then fail at once with a closed connection
 * instead of waiting for the timeout or receiving strays) and every later
 * call fails fast with the first error until the mesh re-forms (a new
 * epoch, a new transport). */
struct Group {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::string who; /* "participant 1 (device 1) of set [0, 1, 2, 3]" */
  int index;
  int size;
  uint32_t calls = 0;
  bool poisoned = false;
  pd_code poison_code = PD_OK;
  std::string poison_msg;
};

/* The next call's tag, or the group's first failure (false). */
bool group_begin(Group *g, uint32_t *tag, dev_status *st) {
  if (g->poisoned) {
    dev_error(st, g->poison_code,
              "%s: this set's collectives failed earlier in this epoch of "
              "the mesh (%s); they work again once the mesh re-forms",
              g->who.c_str(), g->poison_msg.c_str());
    return false;
  }
  *tag = ++g->calls;
  return true;
}

/* Records a failed call: poisons the group (above). Returns `rc`. */
pd_code group_failed(Group *g, pd_code rc, const dev_status *st) {
  if (rc == PD_OK || g->poisoned) return rc;
  g->poisoned = true;
  g->poison_code = rc == PD_INVALID_ARGUMENT ? PD_UNAVAILABLE : rc;
  g->poison_msg = st->msg;
  try {
    g->ctx.reset(); /* closes its connections */
  } catch (...) {
  }
  return rc;
}

struct Transport {
  dev_mesh_transport pub;
  std::atomic<int> refs{1};
  dev_mesh_kv kv;
  std::string prefix;
  std::string host;
  double timeout_s;
  std::shared_ptr<gloo::transport::Device> device;
  std::mutex mu; /* guards groups */
  std::map<std::string, std::unique_ptr<Group>> groups;
};

Transport *impl(dev_mesh_transport *t) {
  return static_cast<Transport *>(t->impl);
}

/* "0,1,2,3" (sep ",") for keys, "0, 1, 2, 3" for messages. */
std::string set_key(const dev_devset *set, const char *sep = ",") {
  std::string s;
  for (int i = 0; i < set->n; i++) {
    if (i) s += sep;
    s += std::to_string(set->dev[i]);
  }
  return s;
}

bool says_timeout(const char *what) {
  std::string m(what);
  std::transform(m.begin(), m.end(), m.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  return m.find("timeout") != std::string::npos ||
         m.find("timed out") != std::string::npos;
}

/* Runs `fn` (calls into Gloo), turning whatever it throws into a status
 * naming `who` and `what` was being done. */
template <typename Fn>
pd_code guarded(const std::string &who, const char *what, dev_status *st,
                Fn fn) {
  try {
    fn();
    return PD_OK;
  } catch (const KvError &e) {
    return dev_error(st, e.code, "%s: %s: %s", who.c_str(), what, e.what());
  } catch (const gloo::IoException &e) {
    if (says_timeout(e.what()))
      return dev_error(st, PD_DEADLINE_EXCEEDED,
                       "%s: %s: no progress within the collective timeout "
                       "(a peer stalled or is gone); Gloo: %s",
                       who.c_str(), what, e.what());
    return dev_error(st, PD_UNAVAILABLE,
                     "%s: %s: a peer closed its connection (its rank "
                     "went away); Gloo: %s",
                     who.c_str(), what, e.what());
  } catch (const std::exception &e) {
    return dev_error(st, PD_INTERNAL, "%s: %s: Gloo failed: %s", who.c_str(),
                     what, e.what());
  } catch (...) {
    return dev_error(st, PD_INTERNAL, "%s: %s: Gloo threw an unknown exception",
                     who.c_str(), what);
  }
}

/* --- Reductions Gloo has no type for: bfloat16 and bool ------------------- */

template <int Red>
void bf16_reduce(void *c_, const void *a_, const void *b_, size_t n) {
  uint16_t *c = static_cast<uint16_t *>(c_);
  const uint16_t *a = static_cast<const uint16_t *>(a_);
  const uint16_t *b = static_cast<const uint16_t *>(b_);
  for (size_t i = 0; i < n; i++) {
    float x = dev_bfloat16_to_float(a[i]), y = dev_bfloat16_to_float(b[i]);
    float r;
    switch (Red) {
      case DEV_RED_SUM: r = x + y; break;
      case DEV_RED_PROD: r = x * y; break;
      case DEV_RED_MAX: r = (x != x || x > y) ? x : y; break;
      default: r = (x != x || x < y) ? x : y; break;
    }
    c[i] = dev_float_to_bfloat16(r);
  }
}

void bool_or(void *c_, const void *a_, const void *b_, size_t n) {
  uint8_t *c = static_cast<uint8_t *>(c_);
  const uint8_t *a = static_cast<const uint8_t *>(a_);
  const uint8_t *b = static_cast<const uint8_t *>(b_);
  for (size_t i = 0; i < n; i++) c[i] = (a[i] || b[i]) ? 1 : 0;
}

void bool_and(void *c_, const void *a_, const void *b_, size_t n) {
  uint8_t *c = static_cast<uint8_t *>(c_);
  const uint8_t *a = static_cast<const uint8_t *>(a_);
  const uint8_t *b = static_cast<const uint8_t *>(b_);
  for (size_t i = 0; i < n; i++) c[i] = (a[i] && b[i]) ? 1 : 0;
}

using ReduceFn = void (*)(void *, const void *, const void *, size_t);

/* Max and min of floating types that propagate NaN, as the engine's own
 * collectives and the Maximum / Minimum ops do: gloo::max / gloo::min are
 * std::max / std::min, which keep whichever operand a comparison with NaN
 * leaves, so a NaN on one device vanished, or took its neighbours' values
 * with it, on a mesh only (trial finding B9). */
inline bool is_nan(float x) { return x != x; }
inline bool is_nan(double x) { return x != x; }
inline bool is_nan(const gloo::float16 &x) {
  float f = gloo::cpu_half2float(x);
  return f != f;
}

template <typename T, bool Max>
void nan_extreme(void *c_, const void *a_, const void *b_, size_t n) {
  T *c = static_cast<T *>(c_);
  const T *a = static_cast<const T *>(a_);
  const T *b = static_cast<const T *>(b_);
  for (size_t i = 0; i < n; i++) {
    if (is_nan(a[i]))
      c[i] = a[i];
    else if (is_nan(b[i]))
      c[i] = b[i];
    else
      c[i] = Max ? (b[i] < a[i] ? a[i] : b[i]) : (a[i] < b[i] ? a[i] : b[i]);
  }
}

/* Gloo's typed reductions (gloo/math.h) for T; for floating T, max and min
 * that propagate NaN. */
template <typename T>
ReduceFn gloo_reduce(int red) {
  constexpr bool floating = std::is_floating_point<T>::value ||
                            std::is_same<T, gloo::float16>::value;
  switch (red) {
    case DEV_RED_SUM: return static_cast<ReduceFn>(&gloo::sum<T>);
    case DEV_RED_PROD: return static_cast<ReduceFn>(&gloo::product<T>);
    case DEV_RED_MAX:
      if constexpr (floating) return &nan_extreme<T, true>;
      return static_cast<ReduceFn>(&gloo::max<T>);
    case DEV_RED_MIN:
      if constexpr (floating) return &nan_extreme<T, false>;
      return static_cast<ReduceFn>(&gloo::min<T>);
    default: return nullptr;
  }
}

ReduceFn bf16_fn(int red) {
  switch (red) {
    case DEV_RED_SUM: return &bf16_reduce<DEV_RED_SUM>;
    case DEV_RED_PROD: return &bf16_reduce<DEV_RED_PROD>;
    case DEV_RED_MAX: return &bf16_reduce<DEV_RED_MAX>;
    case DEV_RED_MIN: return &bf16_reduce<DEV_RED_MIN>;
    default: return nullptr;
  }
}

ReduceFn bool_fn(int red) {
  switch (red) {
    case DEV_RED_SUM:
    case DEV_RED_MAX: return &bool_or;
    case DEV_RED_PROD:
    case DEV_RED_MIN: return &bool_and;
    default: return nullptr;
  }
}

/* The element size and reduction of (dtype, red); false when unsupported. */
bool reduction_for(pd_dtype dt, int red, size_t *elem, ReduceFn *fn) {
  switch (dt) {
    case PD_FLOAT32:
      *elem = 4;
      *fn = gloo_reduce<float>(red);
      break;
    case PD_FLOAT64:
      *elem = 8;
      *fn = gloo_reduce<double>(red);
      break;
    case PD_FLOAT16:
      *elem = 2;
      *fn = gloo_reduce<gloo::float16>(red);
      break;
    case PD_INT32:
      *elem = 4;
      *fn = gloo_reduce<int32_t>(red);
      break;
    case PD_INT64:
      *elem = 8;
      *fn = gloo_reduce<int64_t>(red);
      break;
    case PD_UINT8:
      *elem = 1;
      *fn = gloo_reduce<uint8_t>(red);
      break;
    case PD_BFLOAT16:
      *elem = 2;
      *fn = bf16_fn(red);
      break;
    case PD_BOOL:
      *elem = 1;
      *fn = bool_fn(red);
      break;
    default: return false;
  }
  return *fn != nullptr;
}

std::chrono::milliseconds timeout_ms(double s) {
  return std::chrono::milliseconds(static_cast<long long>(s * 1000.0 + 0.5));
}

/* --- The dev_mesh_transport functions --------------------------------------- */

pd_code t_group_get_body(dev_mesh_transport *t, const dev_devset *set,
                         int index, void **group, dev_status *st) {
  Transport *tr = impl(t);
  if (!set || set->n < 1 || index < 0 || index >= set->n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "group_get: participant %d of a set of %d devices; "
                     "expected 0 <= index < the set's size",
                     index, set ? set->n : 0);
  std::string members = set_key(set);
  std::string key = members + "#" + std::to_string(index);
  {
    std::lock_guard<std::mutex> lk(tr->mu);
    auto it = tr->groups.find(key);
    if (it != tr->groups.end()) {
      *group = it->second.get();
      return PD_OK;
    }
  }
  std::unique_ptr<Group> g(new Group());
  g->index = index;
  g->size = set->n;
  g->who = "participant " + std::to_string(index) + " (device " +
           std::to_string(set->dev[index]) + ") of set [" + set_key(set, ", ") +
           "]";
  if (set->n == 1) {
    /* A set of one: no peers, every collective is the identity. */
  } else {
    pd_code c = guarded(g->who, "joining the set's Gloo group", st, [&] {
      KvStore base(tr->kv, tr->timeout_s);
      gloo::rendezvous::PrefixStore store(tr->prefix + "set/" + members, base);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(index, set->n);
      ctx->setTimeout(timeout_ms(tr->timeout_s));
      ctx->connectFullMesh(store, tr->device);
      g->ctx = std::move(ctx);
    });
    if (c != PD_OK) return c;
  }
  std::lock_guard<std::mutex> lk(tr->mu);
  auto &slot = tr->groups[key];
  if (!slot) /* one thread per (set, index): never taken meanwhile */
    slot = std::move(g);
  *group = slot.get();
  return PD_OK;
}

pd_code t_all_reduce_body(dev_mesh_transport *t, void *group, void *buf,
                          size_t count, pd_dtype dtype, int red,
                          dev_status *st) {
  Group *g = static_cast<Group *>(group);
  size_t elem = 0;
  ReduceFn fn = nullptr;
  if (!reduction_for(dtype, red, &elem, &fn))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: all_reduce of %s with reduction %d: expected "
                     "float32, float64, float16, bfloat16, int32, int64, "
                     "uint8 or bool with SUM, PROD, MAX or MIN (0..3)",
                     g->who.c_str(), pd_dtype_name(dtype), red);
  uint32_t tag = 0;
  if (!group_begin(g, &tag, st)) return st->code;
  if (!g->ctx || count == 0) return PD_OK;
  char what[96];
  snprintf(what, sizeof what, "all_reduce of %zu elements", count);
  return group_failed(g, guarded(g->who, what, st, [&] {
    gloo::AllreduceOptions opts(g->ctx);
    opts.setTag(tag);
    switch (elem) {
      case 1: opts.setOutput(static_cast<uint8_t *>(buf), count); break;
      case 2: opts.setOutput(static_cast<uint16_t *>(buf), count); break;
      case 4: opts.setOutput(static_cast<uint32_t *>(buf), count); break;
      default: opts.setOutput(static_cast<uint64_t *>(buf), count); break;
    }
    opts.setReduceFunction(fn);
    gloo::allreduce(opts);
  }), st);
}

pd_code t_broadcast_body(dev_mesh_transport *t, void *group, void *buf,
                         size_t bytes, int root, dev_status *st) {
  Group *g = static_cast<Group *>(group);
  if (root < 0 || root >= g->size)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: broadcast from participant %d; expected 0..%d",
                     g->who.c_str(), root, g->size - 1);
  uint32_t tag = 0;
  if (!group_begin(g, &tag, st)) return st->code;
  if (!g->ctx || bytes == 0) return PD_OK;
  char what[96];
  snprintf(what, sizeof what, "broadcast of %zu bytes from participant %d",
           bytes, root);
  return group_failed(g, guarded(g->who, what, st, [&] {
    gloo::BroadcastOptions opts(g->ctx);
    opts.setTag(tag);
    opts.setOutput(static_cast<uint8_t *>(buf), bytes);
    opts.setRoot(root);
    gloo::broadcast(opts);
  }), st);
}

pd_code t_all_gather_body(dev_mesh_transport *t, void *group, const void *in,
                          const size_t *in_bytes, void *out, dev_status *st) {
  Group *g = static_cast<Group *>(group);
  uint32_t tag = 0;
  if (!group_begin(g, &tag, st)) return st->code;
  std::vector<size_t> counts(in_bytes, in_bytes + g->size);
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (!g->ctx) {
    if (in_bytes[0]) memcpy(out, in, in_bytes[0]);
    return PD_OK;
  }
  if (total == 0) return PD_OK;
  char what[96];
  snprintf(what, sizeof what, "all_gather of %zu bytes", total);
  return group_failed(g, guarded(g->who, what, st, [&] {
    gloo::AllgathervOptions opts(g->ctx);
    opts.setTag(tag);
    opts.setInput(static_cast<uint8_t *>(const_cast<void *>(in)),
                  counts[g->index]);
    opts.setOutput(static_cast<uint8_t *>(out), counts);
    gloo::allgatherv(opts);
  }), st);
}

/* The entry points: the bodies above, with nothing thrown past them (their
 * own bookkeeping may run out of memory; Gloo's calls are guarded inside). */
template <typename Fn>
pd_code no_throw(const char *what, dev_status *st, Fn fn) {
  try {
    return fn();
  } catch (const std::bad_alloc &) {
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the Gloo transport's %s: out of host memory", what);
  } catch (const std::exception &e) {
    return dev_error(st, PD_INTERNAL, "the Gloo transport's %s: %s", what,
                     e.what());
  } catch (...) {
    return dev_error(st, PD_INTERNAL, "the Gloo transport's %s failed", what);
  }
}

pd_code t_group_get(dev_mesh_transport *t, const dev_devset *set, int index,
                    void **group, dev_status *st) {
  return no_throw("group_get", st,
                  [&] { return t_group_get_body(t, set, index, group, st); });
}

pd_code t_all_reduce(dev_mesh_transport *t, void *group, void *buf,
                     size_t count, pd_dtype dtype, int red, dev_status *st) {
  return no_throw("all_reduce", st, [&] {
    return t_all_reduce_body(t, group, buf, count, dtype, red, st);
  });
}

pd_code t_broadcast(dev_mesh_transport *t, void *group, void *buf, size_t bytes,
                    int root, dev_status *st) {
  return no_throw("broadcast", st, [&] {
    return t_broadcast_body(t, group, buf, bytes, root, st);
  });
}

pd_code t_all_gather(dev_mesh_transport *t, void *group, const void *in,
                     const size_t *in_bytes, void *out, dev_status *st) {
  return no_throw("all_gather", st, [&] {
    return t_all_gather_body(t, group, in, in_bytes, out, st);
  });
}

void t_retain(dev_mesh_transport *t) {
  impl(t)->refs.fetch_add(1, std::memory_order_relaxed);
}

void t_release(dev_mesh_transport *t) {
  if (!t) return;
  Transport *tr = impl(t);
  if (tr->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  try {
    tr->groups.clear(); /* closes the contexts' pairs */
    tr->device.reset();
  } catch (...) {
    /* a destructor that throws: nothing left to tell */
  }
  delete tr;
}

/* Whether `host` resolves to an address this machine can listen on, as
 * Gloo's TCP device will try (getaddrinfo, then bind each result); checked
 * first so that the error says which, and because Gloo's own failure path
 * leaks getaddrinfo's list. */
pd_code check_host(const char *host, dev_status *st) {
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo *res = nullptr;
  int rc = getaddrinfo(host, nullptr, &hints, &res);
  if (rc != 0)
    return dev_error(st, PD_UNAVAILABLE,
                     "the Gloo transport's host '%s' does not resolve (%s); "
                     "expected this rank's address (an IP or a name) the "
                     "other ranks can reach",
                     host, gai_strerror(rc));
  bool ok = false;
  for (struct addrinfo *a = res; a && !ok; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    ok = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(res);
  if (!ok)
    return dev_error(st, PD_UNAVAILABLE,
                     "the Gloo transport cannot listen on '%s': none of its "
                     "addresses belongs to this machine; expected this "
                     "rank's own address (transport_host)",
                     host);
  return PD_OK;
}

}  // namespace

extern "C" bool dev_gloo_available(void) { return true; }

extern "C" pd_code dev_gloo_transport_create(
    const dev_mesh_kv *kv, const char *prefix, const char *hostname,
    double timeout_s, dev_mesh_transport **out, dev_status *st) {
  if (!kv || !kv->set || !kv->get || !out)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_gloo_transport_create: expected a key-value store "
                     "with set and get, and an out pointer");
  if (!(timeout_s > 0))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_gloo_transport_create: timeout_s is %g; expected "
                     "a positive number of seconds",
                     timeout_s);
  if (!hostname || !*hostname)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_gloo_transport_create: empty hostname; expected "
                     "this rank's address (an IP or a name) the other ranks "
                     "can reach");
  pd_code hc = check_host(hostname, st);
  if (hc != PD_OK) return hc;
  std::unique_ptr<Transport> tr;
  try {
    tr.reset(new Transport());
  } catch (const std::exception &) {
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "dev_gloo_transport_create: out of memory");
  }
  tr->kv = *kv;
  tr->prefix = prefix ? prefix : "";
  tr->host = hostname;
  tr->timeout_s = timeout_s;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = tr->host;
    tr->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception &e) {
    /* Gloo's TCP device throws when the name does not resolve or bind. */
    return dev_error(st, PD_UNAVAILABLE,
                     "the Gloo transport cannot listen on '%s' (this rank's "
                     "transport host: it must resolve to an address of this "
                     "machine): %s",
                     hostname, e.what());
  }
  Transport *raw = tr.release();
  raw->pub.struct_size = DEV_MESH_TRANSPORT_STRUCT_SIZE;
  raw->pub.impl = raw;
  raw->pub.group_get = t_group_get;
  raw->pub.all_reduce = t_all_reduce;
  raw->pub.broadcast = t_broadcast;
  raw->pub.all_gather = t_all_gather;
  raw->pub.retain = t_retain;
  raw->pub.release = t_release;
  *out = &raw->pub;
  return PD_OK;
}
