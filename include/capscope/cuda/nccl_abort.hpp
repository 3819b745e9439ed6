#pragma once
//! @file
//! Aborting NCCL communicators so that no rank keeps waiting: a communicator's family (those
//! split from it, `nccl_communicator::split`), aborted with it, and every abort at once, with a
//! bound on the wait for NCCL's teardown. `nccl_communicator::abort` and `abort_all`
//! (capscope/cuda/nccl.hpp) use it; the step watchdog calls them from its thread.

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

namespace capscope::cuda::detail {

//! The communicators split from one (`nccl_communicator::split`), so that aborting it aborts them
//! too: a watchdog that knows only the world's communicator still frees a rank waiting on a
//! pipeline edge's. Each child is listed while it lives, with its own list (grandchildren).
//! Shared by the parent and its children, so that a child outliving its parent still finds it.
//! One lock for every family, held only to list and to claim, never during an abort: aborts and
//! removals are rare, and one lock cannot be taken in two orders.
class split_family {
public:
    struct member {
        ncclComm_t comm;
        std::shared_ptr<std::atomic<bool>> aborted; //!< also the member's identity (a freed comm's address may come back)
        std::shared_ptr<split_family> children;
    };
    //! Never destroyed: a communicator released during the process's exit may still take it.
    static std::mutex& lock() {
        static std::mutex& m = *new std::mutex;
        return m;
    }
    void add(member m) {
        const std::lock_guard held(lock());
        members_.push_back(std::move(m));
    }
    //! Before the child is destroyed or given up: an abort no longer reaches it.
    void remove(const std::atomic<bool>* identity) noexcept {
        const std::lock_guard held(lock());
        std::erase_if(members_, [identity](const member& m) { return m.aborted.get() == identity; });
    }
    //! With lock() held: the descendants, each with its flag, for claim().
    void list(std::vector<std::pair<ncclComm_t, std::atomic<bool>*>>& out) const {
        for (const member& m : members_) {
            m.children->list(out);
            out.emplace_back(m.comm, m.aborted.get());
        }
    }

private:
    std::vector<member> members_;
};

//! Aborts `comms` at once, each on a thread of its own, and waits at most `bound` for them
//! (0: for as long as they take); true when every abort has returned. One after another would
//! not do: an abort may wait for the device, where another communicator's kernels still wait for
//! a rank that stopped, until that one is aborted too. The bound is there because NCCL's teardown
//! of a communicator with a live connection to a rank that stopped can itself wait (measured
//! with NCCL 2.28.3 on a pipeline edge): its kernels end, but the call does not return. Threads
//! still waiting are left to the process's end, which had better come by `_exit`, `quick_exit` or
//! `MPI_Abort`, not by a return from main while they are inside NCCL.
inline bool abort_together(std::span<const ncclComm_t> comms, std::chrono::milliseconds bound) noexcept {
    if (comms.empty()) return true;
    if (comms.size() == 1 && bound.count() == 0) return ncclCommAbort(comms[0]), true;
    struct progress {
        std::mutex mutex;
        std::condition_variable done;
        std::size_t left = 0;
    };
    std::shared_ptr<progress> p;
    std::size_t started = 0;
    try {
        p = std::make_shared<progress>();
        p->left = comms.size();
        for (; started < comms.size(); ++started) {
            const ncclComm_t c = comms[started];
            std::thread([c, p] {
                (void)ncclCommAbort(c);
                const std::lock_guard held(p->mutex);
                if (--p->left == 0) p->done.notify_all();
            }).detach();
        }
    } catch (...) { // no more threads: the rest here, one after another (may wait, as above)
        for (std::size_t i = started; i < comms.size(); ++i) (void)ncclCommAbort(comms[i]);
        if (!p) return true;
        const std::lock_guard held(p->mutex);
        p->left -= comms.size() - started;
    }
    std::unique_lock held(p->mutex);
    if (bound.count() == 0) return p->done.wait(held, [&] { return p->left == 0; }), true;
    return p->done.wait_for(held, bound, [&] { return p->left == 0; });
}
} // namespace capscope::cuda::detail
