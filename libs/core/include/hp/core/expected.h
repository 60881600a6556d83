// A minimal Expected<T> (C++20 has no std::expected): a value or an hp::Error.
#pragma once

#include <cassert>
#include <optional>
#include <utility>
#include <variant>

#include "hp/core/error.h"

namespace hp {

template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  Expected(Error error) : v_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& {
    assert(!ok());
    return std::get<1>(v_);
  }
  Error&& error() && {
    assert(!ok());
    return std::get<1>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

/// Expected<void>: success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : e_(std::move(e)) {}
  static Status success() { return {}; }
  bool ok() const { return !e_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const& {
    assert(!ok());
    return *e_;
  }
  Error&& error() && {
    assert(!ok());
    return std::move(*e_);
  }

 private:
  std::optional<Error> e_;
};

}  // namespace hp

/// Propagates a failed Status/Expected out of the current function.
#define HP_TRY(expr)                                                    \
  do {                                                                  \
    auto&& hp_try_result_ = (expr);                                     \
    if (!hp_try_result_.ok()) return std::move(hp_try_result_).error(); \
  } while (0)

/// Declares or assigns `lhs` from an Expected, or returns its Error from the current function:
///   HP_ASSIGN_OR_RETURN(auto model, model::load_model(path));   // model is a model::Model
///   HP_ASSIGN_OR_RETURN(plan.stages, build_stages(...));        // assigns an existing variable
/// The value is moved out of the Expected. `lhs` must not contain an unparenthesised comma.
#define HP_ASSIGN_OR_RETURN(lhs, expr) \
  HP_ASSIGN_OR_RETURN_IMPL_(HP_CONCAT_(hp_expected_, __LINE__), lhs, expr)
#define HP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).error();   \
  lhs = std::move(*tmp)
#define HP_CONCAT_(a, b) HP_CONCAT_INNER_(a, b)
#define HP_CONCAT_INNER_(a, b) a##b
