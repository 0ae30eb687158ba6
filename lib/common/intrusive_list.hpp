// SPDX-License-Identifier: MIT
// Intrusive doubly linked lists over objects with `next`/`prev` members (pages, huge spans):
// a stack (head only) and a queue (head and tail). No allocation, no ownership.
#pragma once

namespace cxlpool::detail {

template <class T>
void list_push(T*& head, T* x) noexcept {
  x->prev = nullptr;
  x->next = head;
  if (head) head->prev = x;
  head = x;
}

template <class T>
void list_remove(T*& head, T* x) noexcept {
  if (x->prev)
    x->prev->next = x->next;
  else
    head = x->next;
  if (x->next) x->next->prev = x->prev;
  x->next = x->prev = nullptr;
}

template <class T>
void queue_push_back(T*& head, T*& tail, T* x) noexcept {
  x->next = nullptr;
  x->prev = tail;
  if (tail)
    tail->next = x;
  else
    head = x;
  tail = x;
}

template <class T>
void queue_remove(T*& head, T*& tail, T* x) noexcept {
  if (x->prev)
    x->prev->next = x->next;
  else
    head = x->next;
  if (x->next)
    x->next->prev = x->prev;
  else
    tail = x->prev;
  x->next = x->prev = nullptr;
}

}  // namespace cxlpool::detail
