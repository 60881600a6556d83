// Finding CANN at run time. The ascend plugin has no DT_NEEDED entry for any CANN library, so it
// loads on every machine; open() then looks for the three libraries it needs, in this order each:
//   1. an explicit path from the environment: HP_ASCEND_LIB (libascendcl.so),
//   HP_ASCEND_NNOPBASE_LIB,
//      HP_ASCEND_OPAPI_LIB; the latter two default to the directory of HP_ASCEND_LIB when it is
//      set, which is how the tests point the plugin at the fake runtime in one variable
//   2. $ASCEND_TOOLKIT_HOME/lib64/<lib> (set by CANN's set_env.sh)
//   3. the bare soname, i.e. LD_LIBRARY_PATH and the system loader path
// When nothing loads the reason lists every attempt with its dlerror text and says how to fix it
// (HP_UNAVAILABLE); when a library loads but lacks a required symbol the runtime is too old
// (HP_VERSION). This is NCCL's libibverbs pattern, rather than linking CANN at build time as ggml
// does.
#include <dlfcn.h>

#include <cstdlib>

#include "ascend_internal.h"

namespace hp_ascend {
namespace {

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

/// Candidate paths for one library, in search order, each with a label for messages.
std::vector<std::pair<std::string, std::string>> candidates(const char* lib, const char* env_var) {
  std::vector<std::pair<std::string, std::string>> out;
  if (const char* v = std::getenv(env_var); v && *v)
    out.emplace_back(v, std::string("$") + env_var);
  const char* main_lib = std::getenv("HP_ASCEND_LIB");
  if (std::string(env_var) != "HP_ASCEND_LIB" && main_lib && *main_lib && !dir_of(main_lib).empty())
    out.emplace_back(dir_of(main_lib) + lib, "dir of $HP_ASCEND_LIB");
  if (const char* home = std::getenv("ASCEND_TOOLKIT_HOME"); home && *home)
    out.emplace_back(std::string(home) + "/lib64/" + lib, "$ASCEND_TOOLKIT_HOME");
  out.emplace_back(lib, "soname");
  return out;
}

/// dlopens the first candidate that loads; on failure returns an HP_UNAVAILABLE status.
hp_status* open_lib(const char* lib, const char* env_var, void** handle, std::string* loaded) {
  std::string tried;
  for (const auto& [path, label] : candidates(lib, env_var)) {
    dlerror();
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *handle = h;
      *loaded = path;
      return nullptr;
    }
    const char* err = dlerror();
    if (!tried.empty()) tried += "; ";
    tried += label == "soname" ? path : label + "=" + path;
    tried += ": ";
    tried += err ? err : "dlopen failed";
  }
  return hp_common::make_status(HP_UNAVAILABLE,
                                "ascend: CANN runtime not found (%s missing; tried %s); source "
                                "<toolkit>/set_env.sh (ASCEND_TOOLKIT_HOME) or set %s",
                                lib, tried.c_str(), env_var);
}

template <class Fn>
bool resolve(void* handle, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  return fn != nullptr;
}

hp_status* missing(const char* lib, const char* sym) {
  return hp_common::make_status(
      HP_VERSION, "ascend: %s lacks %s; CANN too old or not a CANN library", lib, sym);
}

hp_status* load_once(AclApi& api) {
  void *acl = nullptr, *nnop = nullptr, *opapi = nullptr;
  std::string path;
  if (hp_status* st = open_lib("libascendcl.so", "HP_ASCEND_LIB", &acl, &path)) return st;
  api.libraries.push_back(path);
  if (hp_status* st = open_lib("libnnopbase.so", "HP_ASCEND_NNOPBASE_LIB", &nnop, &path)) return st;
  api.libraries.push_back(path);
  if (hp_status* st = open_lib("libopapi.so", "HP_ASCEND_OPAPI_LIB", &opapi, &path)) return st;
  api.libraries.push_back(path);
  // Handles stay open for the life of the process: ACL owns threads.
#define HP_RESOLVE_REQ(lib, handle, fn) \
  if (!resolve(handle, #fn, api.fn)) return missing(lib, #fn);
#define HP_ACL_REQ(fn) HP_RESOLVE_REQ("libascendcl.so", acl, fn)
#define HP_NNOP_REQ(fn) HP_RESOLVE_REQ("libnnopbase.so", nnop, fn)
#define HP_OPAPI_REQ(fn) HP_RESOLVE_REQ("libopapi.so", opapi, fn)
#define HP_ACL_OPT(fn) resolve(acl, #fn, api.fn);
#define HP_OPAPI_OPT(Op)                                                           \
  resolve(opapi, "aclnn" #Op "GetWorkspaceSize", api.aclnn##Op##GetWorkspaceSize); \
  resolve(opapi, "aclnn" #Op, api.aclnn##Op);
  HP_ACL_REQUIRED(HP_ACL_REQ)
  HP_ACL_OPTIONAL(HP_ACL_OPT)
  HP_NNOPBASE_REQUIRED(HP_NNOP_REQ)
  HP_OPAPI_REQUIRED(HP_OPAPI_REQ)
  HP_OPAPI_OPT(Baddbmm)
  HP_ACLNN_BINARY_ALPHA(HP_OPAPI_OPT)
  HP_ACLNN_BINARY(HP_OPAPI_OPT)
  HP_ACLNN_UNARY(HP_OPAPI_OPT)
  HP_OPAPI_OPT(Muls)
#undef HP_RESOLVE_REQ
#undef HP_ACL_REQ
#undef HP_NNOP_REQ
#undef HP_OPAPI_REQ
#undef HP_ACL_OPT
#undef HP_OPAPI_OPT
  return nullptr;
}

}  // namespace

hp_status* load_api(const AclApi** out) {
  static std::mutex mu;
  static AclApi* loaded = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) {
    auto* api = new AclApi();
    if (hp_status* st = load_once(*api)) {
      delete api;
      return st;
    }
    // aclInit once per process; a second call reports ACL_ERROR_REPEAT_INITIALIZE, which is fine.
    aclError err = api->aclInit(nullptr);
    if (err != ACL_SUCCESS && err != ACL_ERROR_REPEAT_INITIALIZE) {
      hp_status* st = hp_common::make_status(HP_UNAVAILABLE, "ascend: %s",
                                             acl_error_text(*api, "aclInit", err).c_str());
      delete api;
      return st;
    }
    loaded = api;
  }
  *out = loaded;
  return nullptr;
}

bool runtime_present() {
  void* handle = nullptr;
  std::string path;
  hp_status* st = open_lib("libascendcl.so", "HP_ASCEND_LIB", &handle, &path);
  hp_common::status_free(st);
  return st == nullptr;
}

std::string acl_error_text(const AclApi& api, const char* call, int err) {
  std::string text = std::string(call) + " failed (error " + std::to_string(err);
  const char* recent = api.aclGetRecentErrMsg ? api.aclGetRecentErrMsg() : nullptr;
  if (recent && *recent) text += std::string(": ") + recent;
  return text + ")";
}

}  // namespace hp_ascend
