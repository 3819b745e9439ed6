#pragma once
//! @file
//! Megatron-LM command line -> `runtime_config`, following argparse's rules for Megatron's
//! parser, whose every option string is in the generated `megatron_flag_table`: exact flag
//! names (allow_abbrev=False), `--flag value` and `--flag=value`, each flag's nargs (none, one,
//! `?`, `+`, `*`, N), values converted by the flag's type (int, float; Megatron's own
//! converters for the values the rules read) and checked against its choices, negative numbers
//! as values, and, when two spellings write one dest, the last one wins. The command line
//! is read as Megatron reads it; *validation* is then `validate()`'s job, so a command line that
//! Megatron's parser accepts but its config rejects gives violations (exit 1), and one that its
//! parser rejects gives a `flag_error` (exit 2). Inputs of the rules that validate_args refuses
//! first (precision, layer pattern, pipeline, recompute) are `refused_inputs` (validate_args_inputs.hpp).

#include <capscope/flags/command_line.hpp>
#include <capscope/flags/find_flag.hpp>
#include <capscope/flags/megatron_flag_table.hpp>
#include <capscope/flags/moe_layer_freq.hpp>
#include <capscope/flags/python_values.hpp>
#include <capscope/flags/removed_flags.hpp>
#include <capscope/flags/pipeline_schedule_inputs.hpp>
#include <capscope/flags/validate_args_inputs.hpp>
#include <capscope/vocabulary/runtime_config.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace capscope::flags {

namespace detail {

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
        auto x = python_int(v);
        if (!x) fail("int", v);
        return *x;
    }
    int small_integer(std::string_view v) const {
        long long x = integer(v);
        if (!fits_int(x)) fail("int (out of range)", v);
        return static_cast<int>(x);
    }
    double real(std::string_view v) const {
        auto x = python_float(v);
        if (!x) fail("float", v);
        return *x;
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

//! argparse's conversion and choices check of one value; throws `flag_error` in argparse's words.
inline void check_value(const flag_spec& spec, std::string_view value) {
    auto invalid = [&](std::string_view what) {
        throw flag_error("argument " + std::string(spec.flag) + ": invalid " + std::string(what) + " value: '" + std::string(value) + "'");
    };
    std::string shown = "'" + std::string(value) + "'"; // repr() of the converted value
    if (spec.type == value_type::integer) {
        auto x = python_int(value);
        if (!x) invalid("int");
        shown = std::to_string(*x);
    } else if (spec.type == value_type::real) {
        if (!python_float(value)) invalid("float");
    }
    if (spec.choices.empty()) return;
    std::string_view rest = spec.choices;
    std::string options;
    bool found = false;
    while (true) {
        const std::size_t bar = rest.find('|');
        const std::string_view choice = rest.substr(0, bar);
        if (spec.type == value_type::integer) {
            found = found || python_int(choice) == python_int(value);
            options += (options.empty() ? "" : ", ") + std::string(choice);
        } else {
            found = found || choice == value;
            options += (options.empty() ? "'" : ", '") + std::string(choice) + "'";
        }
        if (bar == std::string_view::npos) break;
        rest.remove_prefix(bar + 1);
    }
    if (!found) throw flag_error("argument " + std::string(spec.flag) + ": invalid choice: " + shown + " (choose from " + options + ")");
}

inline module_request read_modules(const std::vector<std::string>& values) {
    module_request r;
    for (const std::string& v : values) {
        ++r.entries;
        add_module_name(r, v);
    }
    return r;
}

struct pending {
    std::string moe_layer_freq_refused; //!< what building the layers would refuse
    bool recompute_activations = false;
    bool moe_layer_recompute = false;
    bool megatron_fsdp = false;
    int megatron_fsdp_version = 1;
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
        {"--moe-layer-freq", [](runtime_config& c, pending& p, R r, V v) {
             try {
                 read_moe_layer_freq_result freq = read_moe_layer_freq(v[0]);
                 c.moe_layers = freq.layout;
                 p.moe_layer_freq_refused = std::move(freq.refused);
             } catch (const std::invalid_argument& e) { throw flag_error("argument " + std::string(r.flag) + ": " + e.what()); }
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
        {"--moe-layer-recompute", [](runtime_config&, pending& p, R, V) { p.moe_layer_recompute = true; }},
        {"--recompute-modules", [](runtime_config& c, pending&, R, V v) {
             // Megatron's parser takes any names; its TransformerConfig rejects unknown ones (rule R0).
             recompute_module_set s;
             c.unknown_recompute_module = {};
             for (const std::string& name : v) {
                 if (auto m = parse_megatron_name<recompute_module>(name)) s.insert(*m);
                 else if (c.unknown_recompute_module.empty()) c.unknown_recompute_module = capscope::detail::unknown_name(name);
             }
             c.recompute_modules = s;
         }},
        {"--recompute-method", [](runtime_config& c, pending&, R r, V v) { c.recompute_method_ = r.choice<recompute_method>(v[0]); }},
        {"--recompute-num-layers", [](runtime_config& c, pending&, R r, V v) { c.recompute_num_layers = r.small_integer(v[0]); }},
        {"--cpu-offloading-num-layers", [](runtime_config& c, pending&, R r, V v) { c.cpu_offloading_num_layers = r.small_integer(v[0]); }},
        {"--no-check-for-nan-in-loss-and-grad", [](runtime_config& c, pending&, R, V) { c.check_for_nan_in_loss_and_grad = false; }},
        {"--inference-batch-times-seqlen-threshold", [](runtime_config& c, pending&, R r, V v) { c.inference_batch_times_seqlen_threshold = r.small_integer(v[0]); }},
        {"--inference-dynamic-batching-num-cuda-graphs", [](runtime_config& c, pending&, R r, V v) { c.inference_dynamic_batching_num_cuda_graphs = r.small_integer(v[0]); }},
        {"--transformer-impl", [](runtime_config& c, pending&, R r, V v) { c.transformer = r.choice<transformer_impl>(v[0]); }},
        {"--fp8-format", [](runtime_config& c, pending&, R r, V v) { c.fp8 = r.choice<fp8_format>(v[0]); }},
        {"--fp8-recipe", [](runtime_config& c, pending&, R r, V v) { c.fp8_scaling = r.choice<fp8_recipe>(v[0]); }},
        {"--use-megatron-fsdp", [](runtime_config&, pending& p, R, V) { p.megatron_fsdp = true; }},
        {"--megatron-fsdp-version", [](runtime_config&, pending& p, R r, V v) { p.megatron_fsdp_version = r.small_integer(v[0]); }},
        {"--fsdp-double-buffer", [](runtime_config& c, pending&, R, V) { c.fsdp.double_buffer = true; }},
        {"--fsdp-db-use-persist-buf-on-alloc-fail", [](runtime_config& c, pending&, R, V) { c.fsdp.persistent_buffer_on_alloc_fail = true; }},
        {"--use-nccl-ub", [](runtime_config& c, pending&, R, V) { c.fsdp.nccl_user_buffers = true; }},
        {"--megatron-fsdp-max-pool-double-buffer", [](runtime_config& c, pending&, R, V) { c.fsdp.max_pool_double_buffer = true; }},
        {"--fine-grained-activation-offloading", [](runtime_config& c, pending&, R, V) { c.offload.enabled = true; }},
        {"--offload-modules", [](runtime_config& c, pending&, R, V v) {
             c.offload.modules = offload_module_set{};
             c.offload.unknown_module = {};
             for (const std::string& name : v) {
                 if (auto m = parse_megatron_name<offload_module>(name)) c.offload.modules.insert(*m);
                 else if (c.offload.unknown_module.empty()) c.offload.unknown_module = capscope::detail::unknown_name(name);
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
             else c.vision.unknown_impl = capscope::detail::unknown_name(v[0]);
         }},
        {"--vision-cuda-graph-scope", [](runtime_config& c, pending&, R, V v) {
             c.vision.modules = capture_module_set{};
             for (const std::string& name : v) {
                 if (auto m = parse_megatron_name<capture_module>(name)) c.vision.modules.insert(*m);
                 else if (c.vision.unknown_module.empty()) c.vision.unknown_module = capscope::detail::unknown_name(name);
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
    if (options.world_size && *options.world_size < 1)
        throw flag_error("a world size of " + std::to_string(*options.world_size) + ": give the number of processes, 1 or more");
    megatron_command_line out;
    detail::pending pending;
    const auto& handlers = detail::rule_flags();
    auto remember = [](std::vector<std::string>& list, const std::string& name) {
        for (const auto& s : list) if (s == name) return;
        list.push_back(name);
    };
    // The last occurrence of each dest, in the order dests first appeared: argparse's "last wins",
    // also across two spellings of one dest (--flag / --no-flag).
    struct occurrence {
        const flag_spec* spec;
        std::vector<std::string> values;
    };
    std::vector<std::pair<std::string_view, occurrence>> last;

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
            throw flag_error("unrecognized arguments: " + name + " (" + std::string(removed->why) + "; use " +
                             std::string(removed->replacement) + ")");
        const flag_spec* spec = detail::find_flag(name);
        if (!spec) {
            if (!options.ignore_unknown)
                throw flag_error("unrecognized arguments: " + name + " (not a flag of Megatron-LM " + std::string(megatron_commit) +
                                 "; flags must be spelled in full)");
            remember(out.unknown, name);
            while (!inline_value && i < args.size() && !detail::looks_like_option(args[i])) ++i;
            continue;
        }
        if (spec->action == flag_action::help)
            throw flag_error(name + ": Megatron-LM would print its help and exit; capscope-check --help describes capscope-check");
        std::vector<std::string> values;
        auto take_following = [&](std::size_t at_most) {
            while (values.size() < at_most && i < args.size() && !detail::looks_like_option(args[i])) values.push_back(args[i++]);
        };
        switch (spec->arity) {
        case flag_arity::none:
            if (inline_value) throw flag_error("argument " + name + ": ignored explicit argument '" + *inline_value + "'");
            break;
        case flag_arity::one:
            if (inline_value) values.push_back(*inline_value);
            else take_following(1);
            if (values.empty()) throw flag_error("argument " + name + ": expected one argument");
            break;
        case flag_arity::optional:
            if (inline_value) values.push_back(*inline_value);
            else take_following(1);
            break;
        case flag_arity::one_or_more:
        case flag_arity::any:
            if (inline_value) values.push_back(*inline_value);
            else take_following(args.size());
            if (spec->arity == flag_arity::one_or_more && values.empty())
                throw flag_error("argument " + name + ": expected at least one argument");
            break;
        case flag_arity::exactly:
            if (inline_value) values.push_back(*inline_value);
            else take_following(std::size_t(spec->count));
            if (values.size() != std::size_t(spec->count))
                throw flag_error("argument " + name + ": expected " + std::to_string(spec->count) + " arguments");
            break;
        }
        for (const std::string& v : values) detail::check_value(*spec, v);
        auto at = std::find_if(last.begin(), last.end(), [&](const auto& e) { return e.first == spec->dest; });
        if (at == last.end()) last.push_back({spec->dest, {spec, std::move(values)}});
        else at->second = {spec, std::move(values)};
        remember(handlers.count(name) || detail::is_validate_args_input(name) ? out.read : out.ignored, name);
    }
    for (const auto& [dest, o] : last) {
        out.given.push_back({std::string(dest), {std::string(o.spec->flag), o.values}});
        if (auto h = handlers.find(o.spec->flag); h != handlers.end())
            h->second(out.config, pending, detail::value_reader{o.spec->flag}, o.values);
    }
    // Megatron's validate_args: --recompute-activations means selective recompute.
    if (pending.recompute_activations) out.config.recompute = recompute_granularity::selective;
    // TransformerConfig: the deprecated --moe-layer-recompute is selective recompute of the
    // listed modules (default core_attn) plus moe.
    if (pending.moe_layer_recompute) {
        if (out.config.recompute == recompute_granularity::full)
            throw flag_error("--moe-layer-recompute cannot be combined with --recompute-granularity full "
                             "(Megatron: Do not set --moe-layer-recompute with full recompute granularity); "
                             "use --recompute-granularity selective --recompute-modules moe");
        out.config.recompute = recompute_granularity::selective;
        recompute_module_set modules = out.config.effective_recompute_modules();
        modules.insert(recompute_module::moe);
        out.config.recompute_modules = modules;
    }
    if (pending.megatron_fsdp) out.config.fsdp.mode = pending.megatron_fsdp_version == 2 ? fsdp_mode::v2 : fsdp_mode::v1;
    apply_validate_args_inputs(out, pending.moe_layer_freq_refused);
    apply_pipeline_schedule_inputs(out, options.world_size);
    return out;
}

} // namespace capscope::flags
