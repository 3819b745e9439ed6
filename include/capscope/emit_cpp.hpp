#pragma once
//! @file
//! A `runtime_config` as C++ source: the `config<…>` that means the same thing, in a
//! self-contained translation unit that compiles if and only if the configuration is valid.

#include <capscope/describe.hpp>
#include <capscope/vocabulary/runtime_config.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace capscope {

namespace detail {
inline std::string cpp_double(double v) {
    if (std::isinf(v)) return v > 0 ? "__builtin_inf()" : "-__builtin_inf()";
    if (std::isnan(v)) return "__builtin_nan(\"\")";
    std::string t = number_text(v);
    if (t.find_first_of(".eE") == std::string::npos) t += ".0";
    return t;
}
//! A finite `v` as `fraction{m, 1, e}`, m * 2^e exactly (m: the significand, odd or 0).
inline std::string cpp_binary_fraction(double v) {
    int e = 0;
    const double f = std::frexp(v, &e); // v = f * 2^e, 0.5 <= |f| < 1
    auto m = static_cast<long long>(std::ldexp(f, 53));
    e -= 53;
    while (m != 0 && m % 2 == 0) m /= 2, ++e;
    return "fraction{" + std::to_string(m) + ", 1, " + std::to_string(m == 0 ? 0 : e) + "}";
}
//! A real-valued option's argument as `fraction{n, d}`, which every C++20 compiler takes (clang 14
//! takes no `double` template argument): n/d is the shortest decimal that reads back as `v`.
//! Where no such n/d gives back exactly `v` (1e-30), `fraction{m, 1, e}`, the double's own
//! significand and power of two; inf and NaN, which no fraction spells, as themselves (g++ only).
inline std::string cpp_real(double v) {
    if (!std::isfinite(v)) return cpp_double(v);
    std::string t = number_text(std::fabs(v)); // shortest round trip: "1.25", "1e-05", "3e+20"
    std::string digits;
    int exponent = 0;
    auto e = t.find_first_of("eE");
    if (e != std::string::npos) exponent = std::stoi(t.substr(e + 1));
    for (std::size_t i = 0; i < std::min(e, t.size()); ++i) {
        if (t[i] == '.') exponent -= int(std::min(e, t.size()) - i - 1);
        else digits += t[i];
    }
    constexpr long long limit = 1'000'000'000'000'000'000LL; // 10^18: n and d fit a long long
    if (digits.size() > 18) return cpp_binary_fraction(v);          // "12345678901234567168": past 10^18
    long long n = std::stoll(digits), d = 1;
    for (; exponent > 0; --exponent) {
        if (n > limit / 10) return cpp_binary_fraction(v);
        n *= 10;
    }
    for (; exponent < 0; ++exponent) {
        if (d > limit / 10) return cpp_binary_fraction(v);
        d *= 10;
    }
    long long g = std::gcd(n, d);
    if (g > 1) n /= g, d /= g;
    if (v < 0) n = -n;
    if (double(n) / double(d) != v) return cpp_binary_fraction(v); // n or d past 2^53: not exact
    return "fraction{" + std::to_string(n) + ", " + std::to_string(d) + "}";
}
inline std::string cpp_string(std::string_view s) {
    std::string out = "\"";
    for (char ch : s) {
        if (ch == '"' || ch == '\\') out += '\\';
        if (static_cast<unsigned char>(ch) < 0x20) out += '?';
        else out += ch;
    }
    return out + "\"";
}
template <class Enum>
std::string cpp_enum(std::string_view type, Enum e) {
    return std::string(type) + "::" + std::string(enum_names<Enum>::cpp[static_cast<std::size_t>(e)]);
}
inline std::string join(const std::vector<std::string>& xs) {
    std::string s;
    for (std::size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + xs[i];
    return s;
}
//! The entries of a module list; duplicates are repeated so the entry count survives.
inline std::string cpp_modules(const module_request& r, std::string_view wrapper) {
    std::vector<std::string> items;
    r.modules.for_each([&](capture_module m) { items.push_back("capture::" + std::string(enum_names<capture_module>::cpp[static_cast<std::size_t>(m)])); });
    if (r.full) items.push_back("deprecated::full");
    if (r.full_iteration) items.push_back("deprecated::full_iteration");
    if (r.full_iteration_inference) items.push_back("deprecated::full_iteration_inference");
    if (!r.unknown_name.empty()) items.push_back("module_named<" + cpp_string(r.unknown_name.view()) + ">");
    if (r.non_module_entry) items.push_back("int");
    while (!items.empty() && static_cast<int>(items.size()) < r.entries) items.push_back(items.front());
    return std::string(wrapper) + "<" + join(items) + ">";
}
inline std::string cpp_impl(graph_impl i, const short_text& unknown) {
    if (!unknown.empty()) return "impl_named<" + cpp_string(unknown.view()) + ">";
    return cpp_enum("impl", i);
}
} // namespace detail

//! The options of the `config<…>` equivalent to `c` (defaults left out).
inline std::vector<std::string> cpp_options(const runtime_config& c) {
    using namespace detail;
    const runtime_config d{};
    std::vector<std::string> o;
    o.push_back(cpp_impl(c.impl, c.unknown_impl));
    if (c.enable_cuda_graph) o.push_back("deprecated::enable_cuda_graph");
    if (c.external_cuda_graph) o.push_back("deprecated::external_cuda_graph");
    if (!c.modules.empty()) o.push_back(cpp_modules(c.modules, "modules"));
    if (c.deprecated_scope) o.push_back(cpp_modules(*c.deprecated_scope, "deprecated::cuda_graph_scope"));
    if (c.inference) o.push_back(cpp_enum("inference", *c.inference));
    if (c.warmup_steps != d.warmup_steps) o.push_back("warmup_steps<" + std::to_string(c.warmup_steps) + ">");

    std::vector<std::string> facts;
    if (c.num_layers) facts.push_back("layers<" + std::to_string(*c.num_layers) + ">");
    if (c.num_experts) facts.push_back("experts<" + std::to_string(*c.num_experts) + ">");
    if (c.moe_layers.is_pattern()) {
        std::vector<std::string> bits;
        for (int i = 0; i < c.moe_layers.pattern_length(); ++i) bits.push_back(c.moe_layers.pattern_moe(i) ? "1" : "0");
        facts.push_back("moe_pattern<" + join(bits) + ">");
    } else if (c.moe_layers != d.moe_layers) {
        facts.push_back("moe_every<" + std::to_string(c.moe_layers.frequency()) + ">");
    }
    if (c.expert_capacity_factor) facts.push_back("capacity_factor<" + cpp_real(*c.expert_capacity_factor) + ">");
    if (c.pad_expert_input_to_capacity) facts.push_back("pad_to_capacity");
    if (c.dispatcher != d.dispatcher) facts.push_back("dispatcher<" + cpp_enum("token_dispatcher", c.dispatcher) + ">");
    if (c.router_padding_for_fp8) facts.push_back("router_padding_for_fp8");
    if (c.input_jitter_eps) facts.push_back("input_jitter<" + cpp_real(*c.input_jitter_eps) + ">");
    if (c.shared_expert_intermediate_size) facts.push_back("shared_experts<" + std::to_string(*c.shared_expert_intermediate_size) + ">");
    if (c.overlap_moe_expert_parallel_comm) facts.push_back("expert_parallel_comm_overlap");
    if (c.te_op_fuser) facts.push_back("te_op_fuser");
    if (c.attention_dropout != d.attention_dropout) facts.push_back("attention_dropout<" + cpp_real(c.attention_dropout) + ">");
    if (c.hidden_dropout != d.hidden_dropout) facts.push_back("hidden_dropout<" + cpp_real(c.hidden_dropout) + ">");
    if (!facts.empty()) o.push_back("model<" + join(facts) + ">");

    if (c.recompute && !c.unknown_recompute_module.empty()) {
        // A name Megatron does not know can only be spelled by name (rule R0 rejects it).
        std::string r = "recompute_named<" + cpp_enum("recompute_granularity", *c.recompute);
        if (c.recompute_modules)
            c.recompute_modules->for_each([&](recompute_module m) { r += ", " + cpp_string(megatron_name(m)); });
        o.push_back(r + ", " + cpp_string(c.unknown_recompute_module.view()) + ">");
    } else if (c.recompute) {
        std::string r = "recompute<" + cpp_enum("recompute_granularity", *c.recompute);
        if (c.recompute_modules)
            c.recompute_modules->for_each([&](recompute_module m) { r += ", " + cpp_enum("recompute_module", m); });
        o.push_back(r + ">");
    }
    if (c.recompute_method_)
        o.push_back("recompute_plan<" + cpp_enum("recompute_method", *c.recompute_method_) + ", " +
                    std::to_string(c.recompute_num_layers.value_or(-1)) + ">");
    else if (c.recompute_num_layers)
        o.push_back("recompute_layers<" + std::to_string(*c.recompute_num_layers) + ">");
    if (c.cpu_offloading_num_layers != d.cpu_offloading_num_layers)
        o.push_back("layer_cpu_offloading<" + std::to_string(c.cpu_offloading_num_layers) + ">");
    if (!c.check_for_nan_in_loss_and_grad) o.push_back("no_nan_check");
    else if (c.nan_check_on_device) o.push_back("nan_check_on_device");
    if (c.static_expert_capacity) o.push_back("static_expert_capacity");
    if (c.inference_batch_times_seqlen_threshold != d.inference_batch_times_seqlen_threshold)
        o.push_back("pipeline_parallel_inference<" + std::to_string(c.inference_batch_times_seqlen_threshold) + ">");
    if (c.inference_dynamic_batching_num_cuda_graphs != d.inference_dynamic_batching_num_cuda_graphs)
        o.push_back("dynamic_batching_graphs<" + std::to_string(c.inference_dynamic_batching_num_cuda_graphs) + ">");
    if (c.transformer != d.transformer) o.push_back("transformer<" + cpp_enum("transformer_impl", c.transformer) + ">");
    if (c.fp8) o.push_back("fp8<" + cpp_enum("fp8_format", *c.fp8) + ">");
    if (c.fp8_scaling != d.fp8_scaling) o.push_back("fp8_scaling<" + cpp_enum("fp8_recipe", c.fp8_scaling) + ">");
    if (c.fsdp != d.fsdp) {
        std::string f = "megatron_fsdp<" + cpp_enum("fsdp_mode", c.fsdp.mode);
        if (c.fsdp.double_buffer) f += ", fsdp_double_buffer";
        if (c.fsdp.persistent_buffer_on_alloc_fail) f += ", fsdp_persistent_buffer_on_alloc_fail";
        if (c.fsdp.nccl_user_buffers) f += ", fsdp_nccl_user_buffers";
        if (c.fsdp.max_pool_double_buffer) f += ", fsdp_max_pool_double_buffer";
        o.push_back(f + ">");
    }
    if (c.offload.enabled) {
        const offload_settings& od = d.offload;
        std::vector<std::string> parts;
        std::vector<std::string> mods, own;
        c.offload.modules.for_each([&](offload_name n) {
            if (const auto m = n.megatron()) mods.push_back(cpp_enum("offload_module", *m));
            else own.push_back(cpp_string(n.view()));
        });
        if (!mods.empty()) parts.push_back("offload_modules<" + join(mods) + ">");
        if (!own.empty()) parts.push_back("offload_tensors<" + join(own) + ">");
        if (!c.offload.unknown_module.empty()) parts.push_back("offload_module_named<" + cpp_string(c.offload.unknown_module.view()) + ">");
        if (c.offload.fraction != od.fraction) parts.push_back("offload_fraction<" + cpp_real(c.offload.fraction) + ">");
        if (c.offload.min_tensor_size != od.min_tensor_size) parts.push_back("min_offloaded_tensor_size<" + std::to_string(c.offload.min_tensor_size) + "LL>");
        if (c.offload.delta_bytes_across_pp_ranks != od.delta_bytes_across_pp_ranks)
            parts.push_back("delta_offload_bytes_across_pp_ranks<" + std::to_string(c.offload.delta_bytes_across_pp_ranks) + "LL>");
        if (c.offload.max_inflight) parts.push_back("max_inflight_offloads<" + std::to_string(*c.offload.max_inflight) + ">");
        if (c.offload.delay_until_cuda_graph) parts.push_back("delay_offload_until_cuda_graph");
        o.push_back("offload<" + join(parts) + ">");
    }
    if (!(c.vision == d.vision)) {
        std::vector<std::string> parts{cpp_impl(c.vision.impl, c.vision.unknown_impl)};
        module_request vm;
        vm.modules = c.vision.modules;
        vm.unknown_name = c.vision.unknown_module;
        vm.entries = c.vision.modules.size() + (c.vision.unknown_module.empty() ? 0 : 1);
        if (!vm.empty()) parts.push_back(cpp_modules(vm, "modules"));
        if (c.vision.max_seq_length) parts.push_back("max_seq_length<" + std::to_string(*c.vision.max_seq_length) + ">");
        o.push_back("vision<" + join(parts) + ">");
    }
    return o;
}

namespace detail {
//! One line of a `//` comment, whatever the text: a line break in it would end the comment (and
//! the rest would compile), and a backslash at its end would splice the next line into it.
inline std::string comment_line(const std::string& text) {
    std::string out = "// ";
    for (const char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            static constexpr char hex[] = "0123456789abcdef";
            out += std::string("\\x") + hex[u >> 4] + hex[u & 15];
        } else {
            out += c;
        }
    }
    // GCC splices at a backslash followed by spaces too.
    if (out[out.find_last_not_of(' ')] == '\\') out += " (a backslash ends this line)";
    return out + "\n";
}
} // namespace detail

//! A translation unit that instantiates the config (and so runs the rules at compile time).
inline std::string emit_cpp_translation_unit(const runtime_config& c, const std::vector<std::string>& header_comment) {
    std::string tu = "// Generated by capscope-check --emit-cpp.\n";
    for (const auto& line : header_comment) tu += detail::comment_line(line);
    tu += "#include <capscope/config.hpp>\n\nusing namespace capscope;\n\nusing megatron_config = config<\n";
    auto opts = cpp_options(c);
    for (std::size_t i = 0; i < opts.size(); ++i) tu += "    " + opts[i] + (i + 1 < opts.size() ? ",\n" : ">;\n");
    // Naming the normalized configuration as a constant runs every rule; comparing it with itself
    // did too, but a NaN value (--attention-dropout nan, which Megatron's parser takes) is unequal
    // to itself, so a valid configuration's file did not compile.
    tu += "\n// Instantiating the config runs every rule at compile time.\n"
          "[[maybe_unused]] constexpr const auto& megatron_normalized = megatron_config::normalized;\n\n"
          "int main() { return 0; }\n";
    return tu;
}

} // namespace capscope
