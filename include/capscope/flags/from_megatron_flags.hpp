#pragma once
//! @file
//! Megatron-LM command line -> `runtime_config`, following argparse's rules for Megatron's
//! parser: exact flag names (allow_abbrev=False), `--flag value` and `--flag=value`, lists that
//! run to the next option, negative numbers as values, last occurrence wins. The command line
//! is read as Megatron reads it; *validation* is then `validate()`'s job, so a command line that
//! Megatron's parser accepts but its config rejects gives violations (exit 1), and one that its
//! parser rejects gives a `flag_error` (exit 2).

#include <capscope/flags/megatron_flag_table.hpp>
#include <capscope/flags/moe_layer_freq.hpp>
#include <capscope/vocabulary/runtime_config.hpp>

#include <charconv>
#include <functional>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope::flags {

//! The command line is not one Megatron's parser accepts (argparse would exit 2).
class flag_error : public std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

struct parse_options {
    bool ignore_unknown = false; //!< Megatron's `ignore_unknown_args`: report unknown flags instead of failing
};

struct megatron_command_line {
    runtime_config config;
    std::vector<std::string> read;     //!< flags the rules read
    std::vector<std::string> ignored;  //!< known Megatron flags no rule reads
    std::vector<std::string> unknown;  //!< with ignore_unknown: flags Megatron does not have
};

namespace detail {

inline const std::map<std::string, arity, std::less<>>& known_flags() {
    static const auto table = [] {
        std::map<std::string, arity, std::less<>> m;
        auto add = [&](std::string_view list, arity a) {
            std::size_t i = 0;
            while (i < list.size()) {
                while (i < list.size() && std::isspace(static_cast<unsigned char>(list[i]))) ++i;
                std::size_t j = i;
                while (j < list.size() && !std::isspace(static_cast<unsigned char>(list[j]))) ++j;
                if (j > i) m.emplace(std::string(list.substr(i, j - i)), a);
                i = j;
            }
        };
        add(megatron_switches, arity::none);
        add(megatron_single_value, arity::one);
        add(megatron_lists, arity::list);
        return m;
    }();
    return table;
}

//! argparse's test: "-5" and "-.5" are values, not options (Megatron has no flag like them).
inline bool is_negative_number(std::string_view t) {
    if (t.size() < 2 || t[0] != '-') return false;
    bool digits = false, dot = false;
    for (char c : t.substr(1)) {
        if (c == '.' && !dot) dot = true;
        else if (std::isdigit(static_cast<unsigned char>(c))) digits = true;
        else return false;
    }
    return digits;
}
inline bool looks_like_option(std::string_view t) { return t.size() > 1 && t[0] == '-' && !is_negative_number(t); }

struct value_reader {
    std::string_view flag;

    [[noreturn]] void fail(std::string_view what, std::string_view value) const {
        throw flag_error("argument " + std::string(flag) + ": invalid " + std::string(what) + " value: '" +
                         std::string(value) + "'");
    }
    long long integer(std::string_view v) const {
        std::string_view s = v;
        if (!s.empty() && s[0] == '+') s.remove_prefix(1);
        long long out = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
        if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) fail("int", v);
        return out;
    }
    int small_integer(std::string_view v) const {
        long long x = integer(v);
        if (x < -2147483647LL || x > 2147483647LL) fail("int (out of range)", v);
        return static_cast<int>(x);
    }
    double real(std::string_view v) const {
        std::string_view s = v;
        if (!s.empty() && s[0] == '+') s.remove_prefix(1);
        double out = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
        if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) fail("float", v);
        return out;
    }
    template <class Enum>
    Enum choice(std::string_view v) const {
        if (auto e = parse_megatron_name<Enum>(v)) return *e;
        std::string options;
        for (std::string_view n : enum_names<Enum>::megatron) options += (options.empty() ? "'" : ", '") + std::string(n) + "'";
        throw flag_error("argument " + std::string(flag) + ": invalid choice: '" + std::string(v) + "' (choose from " +
                         options + ")");
    }
};

inline module_request read_modules(const std::vector<std::string>& values) {
    module_request r;
    for (const std::string& v : values) {
        ++r.entries;
        add_module_name(r, v);
    }
    return r;
}

struct pending {
    bool recompute_activations = false;
    bool megatron_fsdp = false;
    bool fully_shard_api = false;
};

using handler = void (*)(runtime_config&, pending&, const value_reader&, const std::vector<std::string>&);

inline const std::map<std::string, handler, std::less<>>& rule_flags() {
    using V = const std::vector<std::string>&;
    using R = const value_reader&;
    static const std::map<std::string, handler, std::less<>> m = {
        {"--cuda-graph-impl", [](runtime_config& c, pending&, R r, V v) { c.impl = r.choice<graph_impl>(v[0]); }},
        {"--cuda-graph-modules", [](runtime_config& c, pending&, R, V v) { c.modules = read_modules(v); }},
        {"--cuda-graph-scope", [](runtime_config& c, pending&, R, V v) { c.deprecated_scope = read_modules(v); }},
        {"--enable-cuda-graph", [](runtime_config& c, pending&, R, V) { c.enable_cuda_graph = true; }},
        {"--external-cuda-graph", [](runtime_config& c, pending&, R, V) { c.external_cuda_graph = true; }},
        {"--inference-cuda-graph-scope", [](runtime_config& c, pending&, R r, V v) { c.inference = r.choice<inference_scope>(v[0]); }},
        {"--cuda-graph-warmup-steps", [](runtime_config& c, pending&, R r, V v) { c.warmup_steps = r.small_integer(v[0]); }},
        {"--num-layers", [](runtime_config& c, pending&, R r, V v) { c.num_layers = r.small_integer(v[0]); }},
        {"--num-experts", [](runtime_config& c, pending&, R r, V v) { c.num_experts = r.small_integer(v[0]); }},
        {"--moe-layer-freq", [](runtime_config& c, pending&, R r, V v) {
             try { c.moe_layers = parse_moe_layer_freq(v[0]); }
             catch (const std::invalid_argument& e) { throw flag_error("argument " + std::string(r.flag) + ": " + e.what()); }
         }},
        {"--moe-expert-capacity-factor", [](runtime_config& c, pending&, R r, V v) { c.expert_capacity_factor = r.real(v[0]); }},
        {"--moe-pad-expert-input-to-capacity", [](runtime_config& c, pending&, R, V) { c.pad_expert_input_to_capacity = true; }},
        {"--moe-token-dispatcher-type", [](runtime_config& c, pending&, R r, V v) { c.dispatcher = r.choice<token_dispatcher>(v[0]); }},
        {"--moe-router-padding-for-fp8", [](runtime_config& c, pending&, R, V) { c.router_padding_for_fp8 = true; }},
        {"--moe-input-jitter-eps", [](runtime_config& c, pending&, R r, V v) { c.input_jitter_eps = r.real(v[0]); }},
        {"--moe-shared-expert-intermediate-size", [](runtime_config& c, pending&, R r, V v) { c.shared_expert_intermediate_size = r.small_integer(v[0]); }},
        {"--overlap-moe-expert-parallel-comm", [](runtime_config& c, pending&, R, V) { c.overlap_moe_expert_parallel_comm = true; }},
        {"--use-transformer-engine-op-fuser", [](runtime_config& c, pending&, R, V) { c.te_op_fuser = true; }},
        {"--attention-dropout", [](runtime_config& c, pending&, R r, V v) { c.attention_dropout = r.real(v[0]); }},
        {"--hidden-dropout", [](runtime_config& c, pending&, R r, V v) { c.hidden_dropout = r.real(v[0]); }},
        {"--recompute-granularity", [](runtime_config& c, pending&, R r, V v) { c.recompute = r.choice<recompute_granularity>(v[0]); }},
        {"--recompute-activations", [](runtime_config&, pending& p, R, V) { p.recompute_activations = true; }},
        {"--recompute-modules", [](runtime_config& c, pending&, R r, V v) {
             recompute_module_set s;
             for (const std::string& name : v) s.insert(r.choice<recompute_module>(name));
             c.recompute_modules = s;
         }},
        {"--recompute-method", [](runtime_config& c, pending&, R r, V v) { c.recompute_method_ = r.choice<recompute_method>(v[0]); }},
        {"--recompute-num-layers", [](runtime_config& c, pending&, R r, V v) { c.recompute_num_layers = r.small_integer(v[0]); }},
        {"--cpu-offloading-num-layers", [](runtime_config& c, pending&, R r, V v) { c.cpu_offloading_num_layers = r.small_integer(v[0]); }},
        {"--no-check-for-nan-in-loss-and-grad", [](runtime_config& c, pending&, R, V) { c.check_for_nan_in_loss_and_grad = false; }},
        {"--inference-batch-times-seqlen-threshold", [](runtime_config& c, pending&, R r, V v) { c.inference_batch_times_seqlen_threshold = r.small_integer(v[0]); }},
        {"--inference-dynamic-batching-num-cuda-graphs", [](runtime_config& c, pending&, R r, V v) { c.inference_dynamic_batching_num_cuda_graphs = r.small_integer(v[0]); }},
        {"--transformer-impl", [](runtime_config& c, pending&, R r, V v) { c.transformer = r.choice<transformer_impl>(v[0]); }},
        {"--use-megatron-fsdp", [](runtime_config&, pending& p, R, V) { p.megatron_fsdp = true; }},
        {"--use-fully-shard-api", [](runtime_config&, pending& p, R, V) { p.fully_shard_api = true; }},
        {"--fsdp-double-buffer", [](runtime_config& c, pending&, R, V) { c.fsdp.double_buffer = true; }},
        {"--fsdp-db-use-persist-buf-on-alloc-fail", [](runtime_config& c, pending&, R, V) { c.fsdp.persistent_buffer_on_alloc_fail = true; }},
        {"--nccl-ub", [](runtime_config& c, pending&, R, V) { c.fsdp.nccl_user_buffers = true; }},
        {"--megatron-fsdp-max-pool-double-buffer", [](runtime_config& c, pending&, R, V) { c.fsdp.max_pool_double_buffer = true; }},
        {"--fine-grained-activation-offloading", [](runtime_config& c, pending&, R, V) { c.offload.enabled = true; }},
        {"--offload-modules", [](runtime_config& c, pending&, R, V v) {
             c.offload.modules = offload_module_set{};
             c.offload.unknown_module = {};
             for (const std::string& name : v) {
                 if (auto m = parse_megatron_name<offload_module>(name)) c.offload.modules.insert(*m);
                 else if (c.offload.unknown_module.empty()) c.offload.unknown_module = capscope::detail::short_text(name);
             }
         }},
        {"--min-offloaded-tensor-size", [](runtime_config& c, pending&, R r, V v) { c.offload.min_tensor_size = r.integer(v[0]); }},
        {"--activation-offload-fraction", [](runtime_config& c, pending&, R r, V v) { c.offload.fraction = r.real(v[0]); }},
        {"--delta-offload-bytes-across-pp-ranks", [](runtime_config& c, pending&, R r, V v) { c.offload.delta_bytes_across_pp_ranks = r.integer(v[0]); }},
        {"--delay-offload-until-cuda-graph", [](runtime_config& c, pending&, R, V) { c.offload.delay_until_cuda_graph = true; }},
        {"--fine-grained-offloading-max-inflight-offloads", [](runtime_config& c, pending&, R r, V v) { c.offload.max_inflight = r.small_integer(v[0]); }},
        // Megatron-Bridge vision-encoder provider fields (spec §6), spelled as flags.
        {"--vision-cuda-graph-impl", [](runtime_config& c, pending&, R, V v) {
             if (auto i = parse_megatron_name<graph_impl>(v[0])) c.vision.impl = *i;
             else c.vision.unknown_impl = capscope::detail::short_text(v[0]);
         }},
        {"--vision-cuda-graph-scope", [](runtime_config& c, pending&, R, V v) {
             c.vision.modules = capture_module_set{};
             for (const std::string& name : v) {
                 if (auto m = parse_megatron_name<capture_module>(name)) c.vision.modules.insert(*m);
                 else if (c.vision.unknown_module.empty()) c.vision.unknown_module = capscope::detail::short_text(name);
             }
         }},
        {"--max-vision-cuda-graph-seq-length", [](runtime_config& c, pending&, R r, V v) { c.vision.max_seq_length = r.small_integer(v[0]); }},
    };
    return m;
}

inline const removed_flag* find_removed(std::string_view name) {
    for (const removed_flag& r : megatron_removed_flags)
        if (r.name == name) return &r;
    return nullptr;
}

} // namespace detail

//! Reads a Megatron-LM command line (without the program name).
inline megatron_command_line from_megatron_flags(std::span<const std::string> args, parse_options options = {}) {
    megatron_command_line out;
    detail::pending pending;
    const auto& known = detail::known_flags();
    const auto& handlers = detail::rule_flags();
    auto remember = [](std::vector<std::string>& list, const std::string& name) {
        for (const auto& s : list) if (s == name) return;
        list.push_back(name);
    };

    for (std::size_t i = 0; i < args.size();) {
        const std::string& token = args[i++];
        if (token == "--" || !detail::looks_like_option(token))
            throw flag_error("unrecognized arguments: " + token + " (Megatron-LM takes no positional arguments)");
        std::string name = token;
        std::optional<std::string> inline_value;
        if (auto eq = token.find('='); eq != std::string::npos && token.starts_with("--")) {
            name = token.substr(0, eq);
            inline_value = token.substr(eq + 1);
        }
        if (const auto* removed = detail::find_removed(name))
            throw flag_error("unrecognized arguments: " + name + " (removed from Megatron-LM; use " +
                             std::string(removed->replacement) + ")");
        auto it = known.find(name);
        if (it == known.end()) {
            if (!options.ignore_unknown)
                throw flag_error("unrecognized arguments: " + name +
                                 " (not a Megatron-LM flag; flags must be spelled in full)");
            remember(out.unknown, name);
            while (!inline_value && i < args.size() && !detail::looks_like_option(args[i])) ++i;
            continue;
        }
        std::vector<std::string> values;
        switch (it->second) {
        case arity::none:
            if (inline_value) throw flag_error("argument " + name + ": ignored explicit argument '" + *inline_value + "'");
            break;
        case arity::one:
            if (inline_value) values.push_back(*inline_value);
            else if (i < args.size() && !detail::looks_like_option(args[i])) values.push_back(args[i++]);
            else throw flag_error("argument " + name + ": expected one argument");
            break;
        case arity::list:
            if (inline_value) values.push_back(*inline_value);
            else while (i < args.size() && !detail::looks_like_option(args[i])) values.push_back(args[i++]);
            break;
        }
        if (auto h = handlers.find(name); h != handlers.end()) {
            h->second(out.config, pending, detail::value_reader{name}, values);
            remember(out.read, name);
        } else {
            remember(out.ignored, name);
        }
    }
    // Megatron's validate_args: --recompute-activations means selective recompute.
    if (pending.recompute_activations) out.config.recompute = recompute_granularity::selective;
    if (pending.megatron_fsdp) out.config.fsdp.mode = pending.fully_shard_api ? fsdp_mode::v2 : fsdp_mode::v1;
    return out;
}

} // namespace capscope::flags
