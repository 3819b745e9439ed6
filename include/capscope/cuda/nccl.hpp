#pragma once
//! @file
//! NCCL: checked calls (the same `CAPSCOPE_CHECK` as CUDA and cuBLAS), a move-only communicator
//! (one rank of a communicator, or every GPU of this process with `ncclCommInitAll`), and the
//! check that every rank planned the same step, so that they capture the same collectives in
//! the same order: a mismatch is an error on every rank, never a hang.

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/cuda/mem_op_kernel.hpp>
#include <capscope/cuda/nccl_abort.hpp>
#include <capscope/cuda/nccl_graph_mixing.hpp>
#include <capscope/detail/breakage.hpp>
#include <capscope/detail/fnv1a.hpp>
#include <capscope/detail/unique_handle.hpp>

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace capscope::cuda::detail {
inline void check_status(ncclResult_t status, const char* call, const char* file, int line) {
    if (status != ncclSuccess) raise(library::nccl, static_cast<int>(status), ncclGetErrorString(status), call, file, line);
}
//! Destroys a communicator; while an exception unwinds or is being handled, aborts it instead:
//! `ncclCommDestroy` may wait for collectives whose peers, on a failing job, never come;
//! `ncclCommAbort` does not.
inline ncclResult_t destroy_or_abort(ncclComm_t comm) {
    return std::uncaught_exceptions() > 0 || std::current_exception() ? ncclCommAbort(comm) : ncclCommDestroy(comm);
}

} // namespace capscope::cuda::detail

namespace capscope::cuda {

//! How many SMs NCCL's collectives may take from compute (`ncclConfig_t::CTAPolicy`).
enum class nccl_cta_policy {
    nccl_default, //!< NCCL's choice: as many CTAs as its fastest algorithm wants
    efficiency,   //!< the fewest CTAs that still perform decently
    //! No CTA where NCCL can (NCCL 2.28+): all-gathers between buffers in symmetric windows
    //! (nccl_window.hpp) become copy-engine copies, which leave every SM to compute.
    zero,
};

struct nccl_options {
    nccl_cta_policy cta_policy = nccl_cta_policy::nccl_default;
    //! At most this many CTAs per collective (`ncclConfig_t::maxCTAs`); 0: NCCL's choice. With
    //! the all-gathers on copy engines (`zero`), what is left on SMs is the reduce-scatters.
    int max_ctas = 0;
};

class nccl_communicator {
public:
    //! Rank `rank` of `ranks`, joined through `id` (from rank 0's `ncclGetUniqueId`). The current
    //! device is the rank's GPU.
    nccl_communicator(int ranks, const ncclUniqueId& id, int rank, nccl_options options = {}) : options_(options) {
        if (options.max_ctas < 0)
            throw std::invalid_argument("nccl_communicator: max_ctas " + std::to_string(options.max_ctas) + " -- fix: 0 (NCCL's choice) or a positive count");
        if (options.cta_policy == nccl_cta_policy::nccl_default && options.max_ctas == 0) {
            CAPSCOPE_CHECK(ncclCommInitRank(comm_.out(), ranks, id, rank));
            return;
        }
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        if (options.max_ctas > 0) config.maxCTAs = options.max_ctas, config.minCTAs = 1;
        if (options.cta_policy == nccl_cta_policy::nccl_default) {
            CAPSCOPE_CHECK(ncclCommInitRankConfig(comm_.out(), ranks, id, rank, &config));
            return;
        }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
        config.CTAPolicy = options.cta_policy == nccl_cta_policy::zero ? NCCL_CTA_POLICY_ZERO : NCCL_CTA_POLICY_EFFICIENCY;
#elif NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
        if (options.cta_policy == nccl_cta_policy::zero)
            throw std::invalid_argument("nccl_communicator: the zero-CTA policy needs NCCL 2.28 or later (this is " + std::to_string(NCCL_MAJOR) + "." +
                                        std::to_string(NCCL_MINOR) + ") -- fix: nccl_cta_policy::efficiency or nccl_default, or a newer NCCL");
        config.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
#else
        throw std::invalid_argument("nccl_communicator: a CTA policy needs NCCL 2.27 or later (this is " + std::to_string(NCCL_MAJOR) + "." +
                                    std::to_string(NCCL_MINOR) + ") -- fix: nccl_cta_policy::nccl_default, or a newer NCCL");
#endif
        CAPSCOPE_CHECK(ncclCommInitRankConfig(comm_.out(), ranks, id, rank, &config));
        // Copy-engine collectives order the ranks' copies with memory operations, which graph
        // copies run as a kernel where it is loaded (mem_op_kernel.hpp); loaded now, while the
        // device is idle, as its load waits for the context's queued work.
        if (options.cta_policy == nccl_cta_policy::zero) (void)prepare_mem_op_kernel();
    }

    //! One communicator per device of this process (`ncclCommInitAll`): several GPUs without MPI.
    static std::vector<nccl_communicator> for_devices(std::span<const int> devices) {
        std::vector<ncclComm_t> raw(devices.size());
        CAPSCOPE_CHECK(ncclCommInitAll(raw.data(), int(devices.size()), devices.data()));
        std::vector<nccl_communicator> out;
        out.reserve(raw.size());
        for (ncclComm_t c : raw) out.push_back(nccl_communicator(c));
        return out;
    }

    //! The ranks of `parent` that give one `color` (>= 0), as a communicator of their own, ranked
    //! by `key` (`ncclCommSplit`); nothing for a rank that gives `no_color`. Every rank of
    //! `parent` calls it, in the same order as its other collectives.
    static constexpr int no_color = NCCL_SPLIT_NOCOLOR;
    //! The child is the parent's: aborting the parent aborts it too (and what is split from it).
    static std::optional<nccl_communicator> split(const nccl_communicator& parent, int color, int key) {
        ncclComm_t child = nullptr;
        CAPSCOPE_CHECK(ncclCommSplit(parent.get(), color, key, &child, nullptr));
        if (!child) return std::nullopt;
        nccl_communicator c(child);
        c.options_ = parent.options_; // ncclCommSplit with no config: the parent's
        c.parent_ = parent.children_;
        c.parent_->add({child, c.aborted_, c.children_});
        return c;
    }

    nccl_communicator(nccl_communicator&&) noexcept = default;
    nccl_communicator& operator=(nccl_communicator&& o) noexcept {
        if (this != &o) {
            release();
            comm_ = std::move(o.comm_);
            aborted_ = std::move(o.aborted_);
            children_ = std::move(o.children_);
            parent_ = std::move(o.parent_);
            options_ = o.options_;
        }
        return *this;
    }
    ~nccl_communicator() { release(); }

    ncclComm_t get() const noexcept { return comm_.get(); }
    //! Aborts the communicator, from any thread (the step watchdog's): NCCL's kernels that wait
    //! for peers give up, and later calls on it fail. Once; the destructor then leaves it alone.
    //! The communicators split from it are aborted with it, so that no rank keeps waiting on one.
    //! Waits at most `bound` for NCCL's aborts to return (0: as long as they take), and says
    //! whether they did: past the bound, the kernels that waited have ended, and the process had
    //! better end too (what NCCL still holds is left to its end).
    bool abort(std::chrono::milliseconds bound = std::chrono::milliseconds(0)) const noexcept {
        const nccl_communicator* self = this;
        return abort_all(std::span<const nccl_communicator* const>(&self, 1), bound);
    }
    //! Aborts `comms` and those split from them, all at once (detail::abort_together): for a
    //! caller with several communicators, such as a pipeline's edges.
    static bool abort_all(std::span<const nccl_communicator* const> comms, std::chrono::milliseconds bound) noexcept {
        std::vector<ncclComm_t> claimed;
        try {
            std::vector<std::pair<ncclComm_t, std::atomic<bool>*>> candidates;
            {
                // Listed and claimed under the lock, aborted after it: a claimed child's release()
                // sees the flag and gives its handle up, so nothing needs the lock meanwhile.
                const std::lock_guard held(detail::split_family::lock());
                for (const nccl_communicator* c : comms) {
                    if (!c || !c->comm_ || !c->aborted_) continue;
                    if (c->children_ && !capscope::detail::installed_breakage().abort_parent_only) c->children_->list(candidates);
                    candidates.emplace_back(c->comm_.get(), c->aborted_.get());
                }
                claimed.reserve(candidates.size()); // the last allocation: nothing is claimed until it has succeeded
                for (const auto& [comm, flag] : candidates)
                    if (!flag->exchange(true)) claimed.push_back(comm);
            }
        } catch (...) { // no memory for the lists (nothing claimed): these alone, here
            for (const nccl_communicator* c : comms)
                if (c && c->comm_ && c->aborted_ && !c->aborted_->exchange(true)) (void)ncclCommAbort(c->comm_.get());
            return true;
        }
        return detail::abort_together(claimed, bound);
    }
    bool aborted() const noexcept { return aborted_ && aborted_->load(); }
    //! Averages `count` floats in place over the communicator's ranks (`ncclAllReduce` with
    //! `ncclAvg`) on `s`, eagerly or inside a capture (eagerly after the last graph holding NCCL
    //! work finished, where NCCL's graph mixing is off: cuda/nccl_graph_mixing.hpp).
    void average_in_place(float* data, std::size_t count, cudaStream_t s) const {
        order_.eager(s, [&] { CAPSCOPE_CHECK(ncclAllReduce(data, data, count, ncclFloat32, ncclAvg, comm_.get(), s)); });
    }
    //! Whether it was aborted, readable after the communicator itself moved.
    std::shared_ptr<const std::atomic<bool>> aborted_flag() const noexcept { return aborted_; }
    //! The options it was made with (NCCL_CTA_POLICY in the environment overrides the CTA policy).
    const nccl_options& options() const noexcept { return options_; }
    int rank() const {
        int r = 0;
        CAPSCOPE_CHECK(ncclCommUserRank(comm_.get(), &r));
        return r;
    }
    int size() const {
        int n = 0;
        CAPSCOPE_CHECK(ncclCommCount(comm_.get(), &n));
        return n;
    }

private:
    explicit nccl_communicator(ncclComm_t adopted) { *comm_.out() = adopted; }
    //! Out of its parent's family first (so that the parent's abort no longer reaches it); then
    //! destroyed, or, aborted, NCCL's no more: given up, not destroyed a second time.
    void release() noexcept {
        if (parent_ && aborted_) parent_->remove(aborted_.get());
        parent_.reset();
        if (aborted()) (void)comm_.release();
        comm_ = {}; // destroys it, or aborts it while an exception is in flight
    }
    capscope::detail::unique_handle<ncclComm_t, &detail::destroy_or_abort> comm_;
    //! Atomic, as abort() may run on a watchdog's thread; on the heap, as an atomic does not move.
    //! Shared with what must know after the communicator moved (a symmetric buffer's release).
    std::shared_ptr<std::atomic<bool>> aborted_ = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<detail::split_family> children_ = std::make_shared<detail::split_family>(); //!< split from this one
    std::shared_ptr<detail::split_family> parent_; //!< the family of the one this was split from
    nccl_options options_{};
    nccl_launch_order order_; //!< NCCL's graph-mixing setting, read once
};

//! Runs `calls()` as one NCCL group (`ncclGroupStart` ... `ncclGroupEnd`), which NCCL launches as
//! one operation. The group is ended even when a call in it throws, so that NCCL is not left
//! inside a group.
template <class Calls>
void in_nccl_group(Calls&& calls) {
    CAPSCOPE_CHECK(ncclGroupStart());
    struct group_end {
        bool armed = true;
        ~group_end() {
            if (armed) (void)ncclGroupEnd();
        }
    } end;
    calls();
    end.armed = false;
    CAPSCOPE_CHECK(ncclGroupEnd());
}

//! Ranks that would capture different collectives (their plans differ).
class plan_mismatch : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

//! A 64-bit FNV-1a hash (of a plan's text, of results to compare across ranks).
constexpr std::uint64_t fingerprint(std::string_view text) { return capscope::detail::fnv1a(text); }

//! Compares `plan_hash` across the ranks of `comm` with one all-reduce (every rank makes the same
//! call whatever its plan, so this cannot hang), and throws `plan_mismatch` on every rank when
//! two ranks differ. Set-up, not replay: it synchronizes `s`.
inline void require_same_plan(const nccl_communicator& comm, std::uint64_t plan_hash, cudaStream_t s) {
    // min(h) over the ranks and min(~h) = ~max(h): equal everywhere iff min == max.
    const std::uint64_t mine[2] = {plan_hash, ~plan_hash};
    std::uint64_t all[2] = {0, 0};
    device_buffer<std::uint64_t> buffer(2);
    buffer.copy_from_host(std::span<const std::uint64_t>(mine), s);
    nccl_launch_order().before_eager(s); // (NCCL's rules without graph mixing: nccl_graph_mixing.hpp)
    CAPSCOPE_CHECK(ncclAllReduce(buffer.data(), buffer.data(), 2, ncclUint64, ncclMin, comm.get(), s));
    buffer.copy_to_host(std::span<std::uint64_t>(all), s);
    CAPSCOPE_CHECK(cudaStreamSynchronize(s));
    const std::uint64_t low = all[0], high = ~all[1];
    if (low != high) {
        char text[240];
        std::snprintf(text, sizeof text,
                      "the ranks planned different steps (this rank %d: plan %016llx; plans range from %016llx to %016llx), "
                      "so they would capture different collectives -- fix: build the same program and config on every rank",
                      comm.rank(), static_cast<unsigned long long>(plan_hash), static_cast<unsigned long long>(low),
                      static_cast<unsigned long long>(high));
        throw plan_mismatch(text);
    }
}

} // namespace capscope::cuda
