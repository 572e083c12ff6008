// gmlake/backend/forwarding.hpp - the base of every PhysicalBackend decorator.
//
// What holds for all of it:
//  - `forwarding<Parent>` forwards every concept call to its parent unchanged: same
//    results, same errors; a decorator derives from it and declares only the calls
//    it changes (its declaration hides the base's), as snmalloc's range decorators do;
//  - `Parent` is a backend held by value, or a pointer to one the decorator does not
//    own (the backend then outlives the decorator);
//  - BackendDiagnostics is forwarded when the parent has it;
//  - members of the parent outside the concept (test hooks, inspection) are reached
//    through `parent()`.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../concepts.hpp"
#include "../errors.hpp"

namespace gmlake::backend {

template <class Parent>
  requires PhysicalBackend<std::remove_pointer_t<Parent>>
class forwarding {
 public:
  using parent_type = std::remove_pointer_t<Parent>;
  using chunk_type = typename parent_type::chunk_type;
  using stream_type = typename parent_type::stream_type;
  using event_type = typename parent_type::event_type;

  /// @brief Makes the parent from `args` (or takes the pointer to it).
  template <class... A> requires std::constructible_from<Parent, A...>
  explicit forwarding(A&&... args) noexcept(noexcept(Parent(std::forward<A>(args)...)))
      : parent_(std::forward<A>(args)...) {}

  /// @brief The decorated backend, for its members outside the concept.
  [[nodiscard]] parent_type& parent() noexcept {
    if constexpr (std::is_pointer_v<Parent>) return *parent_;
    else return parent_;
  }
  [[nodiscard]] const parent_type& parent() const noexcept {
    if constexpr (std::is_pointer_v<Parent>) return *parent_;
    else return parent_;
  }

  // ------------------------------------------------------------ BackendSizes

  [[nodiscard]] std::size_t granularity() const noexcept { return parent().granularity(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return parent().capacity(); }

  // ------------------------------------------------------------ BackendAddressSpace

  [[nodiscard]] result<std::uintptr_t> reserve(std::size_t n) noexcept { return parent().reserve(n); }
  [[nodiscard]] errc address_free(std::uintptr_t va, std::size_t n) noexcept { return parent().address_free(va, n); }

  // ------------------------------------------------------------ BackendChunks

  [[nodiscard]] result<chunk_type> create(std::size_t n) noexcept { return parent().create(n); }
  [[nodiscard]] errc release(chunk_type c) noexcept { return parent().release(c); }

  // ------------------------------------------------------------ BackendMapping

  [[nodiscard]] errc map(std::uintptr_t va, std::size_t n, chunk_type c) noexcept { return parent().map(va, n, c); }
  [[nodiscard]] errc set_access(std::uintptr_t va, std::size_t n) noexcept { return parent().set_access(va, n); }
  [[nodiscard]] errc unmap(std::uintptr_t va, std::size_t n) noexcept { return parent().unmap(va, n); }

  // ------------------------------------------------------------ BackendStreams

  [[nodiscard]] result<event_type> record(stream_type s) noexcept { return parent().record(s); }
  [[nodiscard]] result<bool> query(event_type e) noexcept { return parent().query(e); }
  [[nodiscard]] errc synchronize(event_type e) noexcept { return parent().synchronize(e); }
  void destroy(event_type e) noexcept { parent().destroy(e); }

  // ------------------------------------------------------------ stream identity (if the parent has it)

  [[nodiscard]] std::uint64_t stream_key(stream_type s) noexcept
    requires requires(parent_type& p) { p.stream_key(s); } {
    return parent().stream_key(s);
  }

  // ------------------------------------------------------------ BackendDiagnostics (if the parent has it)

  [[nodiscard]] const char* failure() const noexcept requires BackendDiagnostics<parent_type> {
    return parent().failure();
  }
  void clear_failure() noexcept requires BackendDiagnostics<parent_type> { parent().clear_failure(); }

 private:
  Parent parent_;
};

} // namespace gmlake::backend
