#pragma once
// Counts every host allocation through operator new in the program that includes this (one
// translation unit per executable): the replay path must make none. Read `host_allocations`.

// g++ cannot see that operator new and delete below are a matched pair (malloc and free).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <atomic>
#include <cstdlib>
#include <new>

inline std::atomic<long> host_allocations{0};

void* operator new(std::size_t n) {
    host_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
