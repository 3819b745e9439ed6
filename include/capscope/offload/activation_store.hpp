#pragma once
//! @file
//! `activation_store`: the device memory of the tensors a trainer's layers keep for their
//! backward, and the activation copies that the offload policy asks for.
//!
//! Set-up, once: each layer `declare`s its offloadable tensors (by module input), then
//! `allocate(policy)` plans them (capscope/offload/offload_plan.hpp) and allocates three arenas:
//! the device ring, the device memory of the tensors that stay, and the pinned host pool of the
//! copied groups, sized from the plan. Addresses never change after that, so graphs replay on
//! them; the layers read theirs with `data(id)` when they bind. `with_offload(program, scope)`
//! then adds the copies to a training program (capscope/offload/with_offload.hpp). A step
//! allocates nothing: copies are memcpy calls (memcpy nodes when captured) between fixed
//! addresses.
//!
//! With offloading off, the store is an allocator: every tensor in memory of its own, no copy.

#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/offload/offload_plan.hpp>
#include <capscope/offload/with_offload.hpp>

#include <cstddef>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope {

class activation_store {
public:
    using id = int;

    activation_store() = default;
    activation_store(const activation_store&) = delete;
    activation_store& operator=(const activation_store&) = delete;

    //! Declares a tensor that layer `layer` keeps for its backward as module input `module`
    //! (Megatron's `offload_module::core_attn`, or a name of the trainer's own: a literal, or a
    //! string that outlives the store, since the name is kept as a view).
    id declare(int layer, offload_name module, std::string name, std::size_t bytes, std::size_t element_bytes) {
        if (allocated_) throw std::logic_error("capscope::activation_store: declare '" + name + "' after allocate() -- fix: declare every tensor first");
        decls_.push_back({layer, module, std::move(name), bytes, element_bytes});
        return id(decls_.size()) - 1;
    }

    //! Plans the declared tensors under `policy` and allocates the arenas (once). A policy that
    //! is on but would move nothing is refused, with the reason (`require_moves_something`).
    void allocate(const offload_settings& policy, offload_ring ring = {}) {
        if (allocated_) throw std::logic_error("capscope::activation_store: allocate() runs once");
        plan_ = plan_offload(policy, decls_, ring);
        require_moves_something(plan_);
        ring_ = cuda::device_buffer<std::byte>(plan_.ring_bytes);
        own_ = cuda::device_buffer<std::byte>(plan_.own_bytes);
        host_ = cuda::pinned_buffer<std::byte>(plan_.host_bytes);
        // The copies of each copied group: a job per group at a fixed address (the stage binds it).
        copies_.resize(plan_.groups.size());
        for (std::size_t g = 0; g < plan_.groups.size(); ++g) {
            const offload_group& grp = plan_.groups[g];
            if (!grp.copied) continue;
            copy_job& job = jobs_.emplace_back();
            std::size_t host_at = grp.host_offset;
            for (int t : grp.tensors) {
                const auto& d = plan_.tensors[std::size_t(t)];
                void* device = data(t);
                void* host = host_.data() + host_at;
                job.pieces.push_back({device, host, d.bytes});
                copies_[g].device.push_back({d.name, device, d.bytes});
                copies_[g].host.push_back({d.name + " (host)", host, d.bytes});
                host_at += detail::round_up(d.bytes, offload_plan::alignment);
            }
            copies_[g].out = stream_fn::of_function<&copy_out>(&job);
            copies_[g].back = stream_fn::of_function<&copy_back>(&job);
        }
        allocated_ = true;
    }

    //! The device address of a declared tensor (after allocate()).
    void* data(id t) const {
        if (plan_.where.empty()) throw std::logic_error("capscope::activation_store: data() before allocate(), or nothing declared");
        const offload_placement& w = plan_.where.at(std::size_t(t));
        return (w.in_ring ? ring_.data() : own_.data()) + w.offset;
    }
    template <class T>
    T* data_as(id t) const { return static_cast<T*>(data(t)); }
    //! The tensor as a stage names it in its saves.
    saved_tensor saved(id t) const {
        const auto& d = plan_.tensors.at(std::size_t(t));
        return {d.module, {d.name, data(t), d.bytes}, d.element_bytes};
    }

    //! `program` with the copies as stages, placed for `scope` (`capture_scope_of<Config>`).
    //! Every stage's saved tensors must be this store's.
    training_program with_offload(const training_program& program, const capture_scope& scope) const {
        for (const auto& list : program.microbatches)
            for (const stage& s : list)
                for (const saved_tensor& t : s.saves) check_known(s, t);
        return capscope::with_offload(program, plan_, copies_, scope);
    }

    const offload_plan& plan() const noexcept { return plan_; }
    //! Device bytes of the arenas (ring and tensors of their own), and of the pinned host pool.
    std::size_t device_bytes() const noexcept { return plan_.ring_bytes + plan_.own_bytes; }
    std::size_t host_bytes() const noexcept { return plan_.host_bytes; }

private:
    struct piece {
        void* device;
        void* host;
        std::size_t bytes;
    };
    struct copy_job {
        std::vector<piece> pieces;
    };
    static void copy_out(copy_job* job, stream_handle s) {
        for (const piece& p : job->pieces) CAPSCOPE_CHECK(cudaMemcpyAsync(p.host, p.device, p.bytes, cudaMemcpyDeviceToHost, s));
    }
    static void copy_back(copy_job* job, stream_handle s) {
        for (const piece& p : job->pieces) CAPSCOPE_CHECK(cudaMemcpyAsync(p.device, p.host, p.bytes, cudaMemcpyHostToDevice, s));
    }
    void check_known(const stage& s, const saved_tensor& t) const {
        for (std::size_t i = 0; i < plan_.tensors.size(); ++i)
            if (data(id(i)) == t.tensor.data && plan_.tensors[i].module == t.module && plan_.tensors[i].layer == s.layer) return;
        throw std::invalid_argument("capscope::activation_store: stage '" + s.name + "' keeps '" + t.tensor.name + "' as " +
                                    (t.module.empty() ? std::string("(no name)") : std::string(t.module.view())) + ", which is not a tensor this store declared for layer " +
                                    std::to_string(s.layer) + " -- fix: declare it here and name it with saved(id)");
    }

    std::vector<offload_tensor_decl> decls_;
    offload_plan plan_;
    cuda::device_buffer<std::byte> ring_, own_;
    cuda::pinned_buffer<std::byte> host_;
    std::deque<copy_job> jobs_; //!< stable addresses: the copy stages point at them
    std::vector<offload_copies> copies_;
    bool allocated_ = false;
};

} // namespace capscope
