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

  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& { assert(!ok()); return std::get<1>(v_); }
  Error&& error() && { assert(!ok()); return std::get<1>(std::move(v_)); }

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
  const Error& error() const& { assert(!ok()); return *e_; }
  Error&& error() && { assert(!ok()); return std::move(*e_); }

 private:
  std::optional<Error> e_;
};

}  // namespace hp

/// Propagates a failed Status/Expected out of the current function.
#define HP_TRY(expr)                                   \
  do {                                                 \
    auto&& hp_try_result_ = (expr);                    \
    if (!hp_try_result_.ok()) return std::move(hp_try_result_).error(); \
  } while (0)
