#pragma once
//! @file
//! A configuration as named fields in Megatron's vocabulary: for messages (`select`), the
//! CLI's text and JSON output, and diffs between two configurations.

#include <capscope/vocabulary/runtime_config.hpp>

#include <charconv>
#include <string>
#include <vector>

namespace capscope {

struct described_field {
    std::string key;                 //!< Megatron's name (argparse dest)
    std::vector<std::string> items;  //!< the value; several items for a list
    bool is_list = false;
    bool is_number = false;          //!< JSON number (or null when items is empty and !is_list)
    bool is_bool = false;

    std::string text() const {
        if (!is_list) return items.empty() ? std::string("null") : items.front();
        std::string t = "[";
        for (std::size_t i = 0; i < items.size(); ++i) t += (i ? ", " : "") + items[i];
        return t + "]";
    }
    friend bool operator==(const described_field&, const described_field&) = default;
};

namespace detail {
//! Shortest text that reads back as the same double.
inline std::string number_text(double v) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}
template <class Set>
std::vector<std::string> set_names(Set s) {
    std::vector<std::string> out;
    s.for_each([&](auto e) {
        if constexpr (requires { e.view(); }) out.emplace_back(e.view()); // an offload name
        else out.emplace_back(megatron_name(e));
    });
    return out;
}
} // namespace detail

//! The normalized fields the rules read, in a fixed order.
inline std::vector<described_field> describe(const runtime_config& c) {
    std::vector<described_field> f;
    auto text = [&](std::string key, std::string v) { f.push_back({std::move(key), {std::move(v)}}); };
    auto list = [&](std::string key, std::vector<std::string> v) { f.push_back({std::move(key), std::move(v), true}); };
    auto number = [&](std::string key, auto v) {
        described_field d{std::move(key), {}, false, true};
        if constexpr (std::is_floating_point_v<decltype(v)>) d.items.push_back(detail::number_text(v));
        else d.items.push_back(std::to_string(v));
        f.push_back(std::move(d));
    };
    auto optional_number = [&](std::string key, const auto& v) {
        if (v) number(std::move(key), *v);
        else f.push_back({std::move(key), {}, false, true});
    };
    auto optional_name = [&](std::string key, const auto& v) {
        if (v) text(std::move(key), std::string(megatron_name(*v)));
        else f.push_back({std::move(key), {}});
    };
    auto flag = [&](std::string key, bool v) { f.push_back({std::move(key), {v ? "true" : "false"}, false, false, true}); };

    text("impl", std::string(c.unknown_impl.empty() ? megatron_name(c.impl) : c.unknown_impl.view()));
    list("modules", detail::set_names(c.modules.modules));
    optional_name("inference_scope", c.inference);
    number("warmup_steps", c.warmup_steps);
    optional_number("num_layers", c.num_layers);
    optional_number("num_experts", c.num_experts);
    if (c.moe_layers.is_pattern()) {
        std::vector<std::string> bits;
        for (int i = 0; i < c.moe_layers.pattern_length(); ++i) bits.push_back(c.moe_layers.pattern_moe(i) ? "1" : "0");
        list("moe_layer_freq", bits);
    } else {
        number("moe_layer_freq", c.moe_layers.frequency());
    }
    optional_number("moe_expert_capacity_factor", c.expert_capacity_factor);
    flag("moe_pad_expert_input_to_capacity", c.pad_expert_input_to_capacity);
    text("moe_token_dispatcher_type", std::string(megatron_name(c.dispatcher)));
    flag("moe_router_padding_for_fp8", c.router_padding_for_fp8);
    optional_number("moe_input_jitter_eps", c.input_jitter_eps);
    optional_number("moe_shared_expert_intermediate_size", c.shared_expert_intermediate_size);
    flag("overlap_moe_expert_parallel_comm", c.overlap_moe_expert_parallel_comm);
    flag("use_transformer_engine_op_fuser", c.te_op_fuser);
    number("attention_dropout", c.attention_dropout);
    number("hidden_dropout", c.hidden_dropout);
    optional_name("recompute_granularity", c.recompute);
    if (c.recompute) list("recompute_modules", detail::set_names(c.effective_recompute_modules()));
    else f.push_back({"recompute_modules", {}});
    optional_name("recompute_method", c.recompute_method_);
    optional_number("recompute_num_layers", c.recompute_num_layers);
    number("cpu_offloading_num_layers", c.cpu_offloading_num_layers);
    flag("check_for_nan_in_loss_and_grad", c.check_for_nan_in_loss_and_grad);
    if (c.nan_check_on_device) flag("nan_check_on_device", true); // capscope's own: no command line sets it
    if (c.static_expert_capacity) flag("static_expert_capacity", true); // capscope's own too
    number("inference_batch_times_seqlen_threshold", c.inference_batch_times_seqlen_threshold);
    number("inference_dynamic_batching_num_cuda_graphs", c.inference_dynamic_batching_num_cuda_graphs);
    text("transformer_impl", std::string(megatron_name(c.transformer)));
    optional_name("fp8", c.fp8);
    text("fp8_recipe", std::string(megatron_name(c.fp8_scaling)));
    text("megatron_fsdp", std::string(megatron_name(c.fsdp.mode)));
    flag("fsdp_double_buffer", c.fsdp.double_buffer);
    flag("fsdp_db_use_persist_buf_on_alloc_fail", c.fsdp.persistent_buffer_on_alloc_fail);
    flag("nccl_ub", c.fsdp.nccl_user_buffers);
    flag("megatron_fsdp_max_pool_double_buffer", c.fsdp.max_pool_double_buffer);
    flag("fine_grained_activation_offloading", c.offload.enabled);
    list("offload_modules", detail::set_names(c.offload.modules));
    number("min_offloaded_tensor_size", c.offload.min_tensor_size);
    number("activation_offload_fraction", c.offload.fraction);
    number("delta_offload_bytes_across_pp_ranks", c.offload.delta_bytes_across_pp_ranks);
    flag("delay_offload_until_cuda_graph", c.offload.delay_until_cuda_graph);
    optional_number("fine_grained_offloading_max_inflight_offloads", c.offload.max_inflight);
    text("vision_cuda_graph_impl",
         std::string(c.vision.unknown_impl.empty() ? megatron_name(c.vision.impl) : c.vision.unknown_impl.view()));
    list("vision_cuda_graph_scope", detail::set_names(c.vision.modules));
    optional_number("max_vision_cuda_graph_seq_length", c.vision.max_seq_length);
    return f;
}

//! `key=value` pairs where `a` and `b` differ, as "key: a vs b".
inline std::vector<std::string> describe_differences(const runtime_config& a, const runtime_config& b) {
    std::vector<std::string> out;
    auto fa = describe(a), fb = describe(b);
    for (std::size_t i = 0; i < fa.size() && i < fb.size(); ++i)
        if (!(fa[i] == fb[i])) out.push_back(fa[i].key + ": " + fa[i].text() + " vs " + fb[i].text());
    return out;
}

} // namespace capscope
