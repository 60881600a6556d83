// One candidate file, step by step. Each step either advances or sets the record's verdict and
// reason and stops. The reasons are meant for users: they quote dlerror verbatim, name the symbol
// or member that is missing, and state both ABI versions on a mismatch.
#include "load_steps.h"

#include <dlfcn.h>

#include <fmt/core.h>

#include <cstddef>
#include <cstring>

namespace hp::plugin::detail {

namespace {

/// Mandatory members of ABI 1.0, checked for NULL before the table is used.
struct Member {
  const char* name;
  std::size_t offset;
};

#define HP_MEMBER(m) \
  Member { #m, offsetof(hp_backend_v1, m) }
constexpr Member kMandatory[] = {
    HP_MEMBER(status_code),    HP_MEMBER(status_message),
    HP_MEMBER(status_free),    HP_MEMBER(open),
    HP_MEMBER(close),          HP_MEMBER(device_count),
    HP_MEMBER(device_info),    HP_MEMBER(supports),
    HP_MEMBER(alloc),          HP_MEMBER(free_mem),
    HP_MEMBER(stream_create),  HP_MEMBER(stream_sync),
    HP_MEMBER(stream_destroy), HP_MEMBER(event_create),
    HP_MEMBER(event_record),   HP_MEMBER(stream_wait_event),
    HP_MEMBER(event_sync),     HP_MEMBER(event_destroy),
    HP_MEMBER(copy_async),     HP_MEMBER(gemm),
    HP_MEMBER(elementwise),
};
#undef HP_MEMBER

bool member_is_null(const hp_backend_v1* t, std::size_t offset) {
  void (*fn)(void) = nullptr;
  std::memcpy(&fn, reinterpret_cast<const char*>(t) + offset, sizeof fn);
  return fn == nullptr;
}

void reject(PluginRecord& rec, Verdict v, std::string reason) {
  rec.verdict = v;
  rec.reason = std::move(reason);
}

/// Other majors we know the symbol name of, to say "implements ABI N" rather than "not a backend".
int other_major(void* handle) {
  for (int major = 2; major <= 9; ++major)
    if (dlsym(handle, fmt::format("hp_backend_entry_v{}", major).c_str())) return major;
  return 0;
}

/// Opens the library; nullptr with the verdict set on failure.
void* open_library(PluginRecord& rec) {
  dlerror();
  void* handle = dlopen(rec.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle) return handle;
  const char* err = dlerror();
  std::string text = err ? err : "dlopen failed";
  if (is_missing_dependency(text, rec.path.string()))
    reject(rec, Verdict::unavailable, fmt::format("a library it needs is not installed: {}", text));
  else
    reject(rec, Verdict::not_library, text);
  return nullptr;
}

/// Looks up the entry and validates the table; nullptr with the verdict set on failure.
const hp_backend_v1* resolve_table(PluginRecord& rec, void* handle) {
  auto entry = reinterpret_cast<hp_backend_entry_v1_fn>(dlsym(handle, "hp_backend_entry_v1"));
  if (!entry) {
    if (int major = other_major(handle))
      reject(rec, Verdict::abi_mismatch,
             fmt::format("plugin {} implements ABI {}, hp supports {}",
                         rec.path.filename().string(), major, HP_ABI_MAJOR));
    else
      reject(rec, Verdict::not_backend,
             "not an hp backend, or an unsupported ABI (no hp_backend_entry_v1 symbol)");
    return nullptr;
  }
  const hp_backend_v1* t = entry(HP_ABI_MINOR);
  if (!t) {
    reject(rec, Verdict::abi_mismatch,
           fmt::format("hp_backend_entry_v1 returned no table for host ABI {}.{}", HP_ABI_MAJOR,
                       HP_ABI_MINOR));
    return nullptr;
  }
  rec.abi_major = t->abi_major;
  rec.abi_minor = t->abi_minor;
  if (t->abi_major != HP_ABI_MAJOR) {
    reject(rec, Verdict::abi_mismatch,
           fmt::format("plugin {} implements ABI {}, hp supports {}", rec.path.filename().string(),
                       t->abi_major, HP_ABI_MAJOR));
    return nullptr;
  }
  if (t->struct_size < HP_BACKEND_V1_0_SIZE) {
    reject(rec, Verdict::bad_table,
           fmt::format("function table is {} bytes, ABI 1.0 needs at least {}", t->struct_size,
                       HP_BACKEND_V1_0_SIZE));
    return nullptr;
  }
  for (const auto& m : kMandatory) {
    if (member_is_null(t, m.offset)) {
      reject(rec, Verdict::bad_table, fmt::format("mandatory member '{}' is null", m.name));
      return nullptr;
    }
  }
  if (t->name && *t->name) rec.name = t->name;
  rec.version = t->version ? t->version : "";
  return t;
}

}  // namespace
}  // namespace hp::plugin::detail

namespace hp::plugin {

bool is_missing_dependency(const std::string& text, const std::string& file) {
  // glibc: "<file>: <dep>: cannot open shared object file: No such file or directory" when a
  // DT_NEEDED library is missing; "<file>: cannot open shared object file" when the file itself is
  // missing.
  static const std::string kMissing = "cannot open shared object file";
  auto pos = text.find(kMissing);
  if (pos == std::string::npos) return false;
  std::string head = file + ": ";
  return !(text.rfind(head, 0) == 0 && text.compare(head.size(), kMissing.size(), kMissing) == 0);
}

}  // namespace hp::plugin

namespace hp::plugin::detail {

void run_load_steps(PluginRecord& rec, const std::vector<std::string>& open_options) {
  void* handle = open_library(rec);
  if (!handle) return;
  // From here on the handle is deliberately never closed (see registry.h).
  const hp_backend_v1* t = resolve_table(rec, handle);
  if (!t) return;
  if (auto probe = reinterpret_cast<hp_backend_probe_fn>(dlsym(handle, "hp_backend_probe")))
    rec.probe_score = probe();

  std::vector<const char*> kv;
  for (const auto& o : open_options) kv.push_back(o.c_str());
  hp_ctx* ctx = nullptr;
  if (hp_status* st = t->open(kv.data(), kv.size(), &ctx)) {
    rec.code = t->status_code(st);
    const char* msg = t->status_message(st);
    std::string text = msg && *msg ? msg : code_name(rec.code);
    t->status_free(st);
    if (rec.code == HP_UNAVAILABLE || rec.code == HP_VERSION)
      reject(rec, Verdict::unavailable, text);
    else
      reject(rec, Verdict::open_failed, fmt::format("{}: {}", code_name(rec.code), text));
    return;
  }
  auto backend = std::make_shared<Backend>(t, ctx, rec.path.string());
  auto count = backend->device_count();
  if (!count) {
    reject(rec, Verdict::open_failed, count.error().message());
    return;
  }
  if (*count <= 0) {
    reject(rec, Verdict::no_devices, fmt::format("{} plugin reports no devices", rec.name));
    return;
  }
  for (int dev = 0; dev < *count; ++dev) {
    auto info = backend->device_info(dev);
    if (!info) {
      reject(rec, Verdict::open_failed, info.error().message());
      return;
    }
    rec.devices.push_back(std::move(info.value()));
  }
  rec.backend = std::move(backend);
  rec.verdict = Verdict::loaded;
  rec.reason.clear();
}

}  // namespace hp::plugin::detail
