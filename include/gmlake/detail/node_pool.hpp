// gmlake/detail/node_pool.hpp - nodes for the intrusive indexes, in slabs.
//
// An operation first reserves the nodes it may need (the only step that can fail),
// then takes them without failing, so a half-done split never has to be undone.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace gmlake::detail {

template <class T>
class node_pool {
 public:
  node_pool() = default;
  node_pool(const node_pool&) = delete;
  node_pool& operator=(const node_pool&) = delete;

  /// Makes sure `n` nodes can be taken without allocating. False if memory ran out.
  [[nodiscard]] bool reserve(std::size_t n) noexcept {
    while (free_count_ < n) {
      auto slab = std::unique_ptr<slot[]>(new (std::nothrow) slot[slab_nodes]);
      if (!slab) return false;
      try {
        slabs_.push_back(std::move(slab));
      } catch (...) {
        return false;
      }
      slot* s = slabs_.back().get();
      for (std::size_t i = 0; i < slab_nodes; ++i) push(&s[i]);
    }
    return true;
  }

  /// A default-constructed node. Pre: reserve() said there is one.
  [[nodiscard]] T* take() noexcept {
    slot* s = head_;
    head_ = s->next;
    --free_count_;
    return ::new (static_cast<void*>(s->storage)) T{};
  }

  void give(T* node) noexcept {
    node->~T();
    push(reinterpret_cast<slot*>(node));
  }

 private:
  static constexpr std::size_t slab_nodes = 256;
  union slot {
    slot* next;
    alignas(T) unsigned char storage[sizeof(T)];
  };
  void push(slot* s) noexcept {
    s->next = head_;
    head_ = s;
    ++free_count_;
  }

  std::vector<std::unique_ptr<slot[]>> slabs_;
  slot* head_ = nullptr;
  std::size_t free_count_ = 0;
};

} // namespace gmlake::detail
