#pragma once
//! @file
//! What Megatron's `validate_args` (and `TransformerConfig`) derive from flags outside the
//! CUDA-graph options before the graph rules run, ported from Megatron-LM d98e8a64dd:
//! precision and loss scaling (dynamic fp16 loss scaling turns the NaN check off, which rule A1
//! reads), the hybrid layer pattern (it replaces --num-layers and may set virtual pipelining),
//! pipeline and virtual-pipeline sizes, and recompute granularity and method.
//!
//! What Megatron refuses there is recorded in `refused_inputs`, quoting Megatron, in Megatron's
//! order: capscope-check reports the configuration invalid (exit 1), with the rules beside it.
//! docs/conformance.md compares every check here with Megatron itself (the second case set).

#include <capscope/flags/command_line.hpp>
#include <capscope/flags/find_flag.hpp>
#include <capscope/flags/python_values.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace capscope::flags {
namespace detail {

//! Flags read here; capscope-check lists them as read, not ignored.
inline constexpr std::string_view validate_args_input_flags[] = {
    "--fp16", "--bf16", "--loss-scale", "--fp32-residual-connection",
    "--hybrid-layer-pattern", "--hybrid-override-pattern", "--mtp-num-layers", "--position-embedding-type",
    "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--no-overlap-p2p-communication",
    // The pipeline schedule's microbatch count and grouping (pipeline_schedule_inputs.hpp).
    "--micro-batch-size", "--global-batch-size", "--step-batch-size-schedule", "--decrease-batch-size-if-needed",
    "--tensor-model-parallel-size", "--context-parallel-size", "--microbatch-group-size-per-virtual-pipeline-stage",
    "--eval-global-batch-size", "--eval-micro-batch-size", "--seq-length",
    // Generalized tensor parallelism: the weight-shard factor counts toward the model size.
    "--tensor-parallel-num-weight-shards", "--expert-tensor-parallel-num-weight-shards", "--expert-tensor-parallel-size",
    "--fp4-format", "--fp4-param-gather",
};
inline bool is_validate_args_input(std::string_view flag) {
    return std::find(std::begin(validate_args_input_flags), std::end(validate_args_input_flags), flag) !=
           std::end(validate_args_input_flags);
}

class given_inputs {
public:
    explicit given_inputs(const megatron_command_line& line) : line_(line) {}

    //! A store_true / store_false flag's value after the last spelling given.
    bool on(std::string_view dest, bool otherwise = false) const {
        const auto* g = line_.find(dest);
        if (!g) return otherwise;
        const flag_spec* spec = find_flag(g->flag);
        return !spec || spec->action != flag_action::store_false;
    }
    std::optional<long long> integer(std::string_view dest) const {
        const auto* g = line_.find(dest);
        return g && !g->values.empty() ? python_int(g->values.front()) : std::nullopt;
    }
    //! An integer kept in an int: past int's range a usage error, as for the flags that
    //! from_megatron_flags stores (small_integer), never a silent wrap (2^32 read as 0).
    std::optional<int> small_integer(std::string_view dest) const {
        const auto v = integer(dest);
        if (v && !fits_int(*v))
            throw flag_error("argument " + line_.find(dest)->flag + ": invalid int (out of range) value: '" + std::to_string(*v) + "'");
        return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
    }
    std::optional<double> real(std::string_view dest) const {
        const auto* g = line_.find(dest);
        return g && !g->values.empty() ? python_float(g->values.front()) : std::nullopt;
    }
    std::optional<std::string> text(std::string_view dest) const {
        const auto* g = line_.find(dest);
        if (!g) return std::nullopt;
        return g->values.empty() ? std::string() : g->values.front();
    }

private:
    const megatron_command_line& line_;
};

//! Records what Megatron refuses, in Megatron's order, and goes on: every refused input and
//! every rule is reported in one run, where Megatron stops at the first.
class refusals {
public:
    explicit refusals(megatron_command_line& line) : line_(line) {}
    void add(std::string_view where, std::string message, std::string_view fix) {
        line_.refused_inputs.push_back({std::string(where), std::move(message), std::string(fix)});
    }
    //! A validate_args check: records `message` unless `ok`; returns `ok`.
    bool require(bool ok, std::string message, std::string_view fix) {
        if (!ok) add("validate_args", std::move(message), fix);
        return ok;
    }

private:
    megatron_command_line& line_;
};

//! model_parallel_config.py's resolve_tensor_parallel_weight_shards, as validate_args calls it:
//! the weight-shard factor (gtp_weight_remat_size) a --*-num-weight-shards gives over its tensor
//! parallel size, 1 when absent or refused. Megatron names the dense fields in both calls, so the
//! message does too; the fix names the flags to change (`shards_flag`, and `size` for the size).
inline int resolve_weight_shards(refusals& no, std::optional<long long> shards, long long tp, std::string_view shards_flag,
                                 std::string_view size) {
    if (!shards || tp < 1) return 1;
    if (!no.require(*shards >= tp,
                    "tensor_parallel_num_weight_shards (" + std::to_string(*shards) + ") must be >= tensor_model_parallel_size (" +
                        std::to_string(tp) + ").",
                    "give " + std::string(shards_flag) + " as a multiple of " + std::string(size) + ", at least that size"))
        return 1;
    if (!no.require(*shards % tp == 0,
                    "tensor_parallel_num_weight_shards (" + std::to_string(*shards) + ") must be divisible by tensor_model_parallel_size (" +
                        std::to_string(tp) + ").",
                    "give " + std::string(shards_flag) + " as a multiple of " + std::string(size)))
        return 1;
    return fits_int(*shards / tp) ? static_cast<int>(*shards / tp) : 1;
}

//! hybrid_layer_allocation.py's _validate_pattern.
inline void check_hybrid_symbols(refusals& no, std::string_view pattern, std::string_view name, bool allow_pipe) {
    constexpr std::string_view layers = "MG*D+-E";
    for (char c : pattern)
        if (layers.find(c) == std::string_view::npos && !(allow_pipe && c == '|'))
            return no.add("validate_args",
                          "In " + std::string(name) + " pattern, '" + std::string(1, c) + "' is not a valid layer symbol",
                          "use M (Mamba), G (GDN), * (attention), D (DSA), + (MLA), - (MLP), E (MoE), | between pipeline stages");
    if (pattern.find('*') != std::string_view::npos &&
        (pattern.find('D') != std::string_view::npos || pattern.find('+') != std::string_view::npos))
        no.add("validate_args", "Not supported to have both Attention and MLA/DSA in one model",
               "use one attention kind in the pattern");
}

//! The hybrid pattern: it replaces --num-layers, may set virtual pipelining, and its '/' parts
//! are MTP depths (validate_args, "hybrid layer pattern" block).
inline void apply_hybrid_pattern(refusals& no, megatron_command_line& line, const given_inputs& in, std::string pattern, int pp) {
    const std::string main = pattern.substr(0, pattern.find('/'));
    check_hybrid_symbols(no, main, "main", true);
    int depths = 0;
    for (std::size_t at = pattern.find('/'); at != std::string::npos;) {
        const std::size_t next = pattern.find('/', at + 1);
        check_hybrid_symbols(no, pattern.substr(at + 1, next == std::string::npos ? next : next - at - 1), "MTP", false);
        ++depths;
        at = next;
    }
    const int layers = static_cast<int>(std::count_if(main.begin(), main.end(), [](char c) { return c != '|'; }));
    line.config.num_layers = layers;
    const int segments = static_cast<int>(std::count(main.begin(), main.end(), '|')) + 1;
    if (segments > 1) {
        no.require(!in.integer("decoder_first_pipeline_num_layers"),
                "If --hybrid-layer-pattern contains pipe separators, --decoder-first-pipeline-num-layers should not be specified",
                "describe the stages with | in the pattern only");
        no.require(!in.integer("decoder_last_pipeline_num_layers"),
                "If --hybrid-layer-pattern contains pipe separators, --decoder-last-pipeline-num-layers should not be specified",
                "describe the stages with | in the pattern only");
    }
    no.require(!in.integer("num_layers_per_virtual_pipeline_stage"),
            "--num-layers-per-virtual-pipeline-stage should not be used with --hybrid-layer-pattern",
            "describe a number of pipeline segments (|) that is a multiple of the pipeline size instead");
    no.require(!in.integer("num_virtual_stages_per_pipeline_rank"),
            "--num-virtual-stages-per-pipeline-rank should not be used with --hybrid-layer-pattern",
            "virtual stages come from the | segments of the pattern; drop the flag");
    no.require(!in.text("pipeline_model_parallel_layout"),
            "--pipeline-model-parallel-layout should not be used with --hybrid-layer-pattern",
            "describe the stages with | in the pattern");
    no.require(!in.on("account_for_embedding_in_pipeline_split"),
            "--account-for-embedding-in-pipeline-split should not be used with --hybrid-layer-pattern",
            "describe the stages with | in the pattern");
    no.require(!in.on("account_for_loss_in_pipeline_split"),
            "--account-for-loss-in-pipeline-split should not be used with --hybrid-layer-pattern",
            "describe the stages with | in the pattern");
    if (!(segments == 1 && pp > 1)) {
        no.require(segments % pp == 0,
                "The number of hybrid pipeline segments described by --hybrid-layer-pattern must be evenly divisible by "
                "--pipeline-model-parallel-size",
                "use a multiple of the pipeline size as the number of | segments");
        if (segments > pp) line.derived.virtual_pipeline_model_parallel_size = segments / pp;
    }
    if (depths > 0) line.derived.mtp_num_layers = depths;  // the pattern's depths win over --mtp-num-layers
}

//! validate_args's virtual-pipeline block and the divisibility check of an even split.
inline void apply_pipeline(refusals& no, megatron_command_line& line, const given_inputs& in, bool hybrid, int pp) {
    const auto per_stage_flag = in.integer("num_layers_per_virtual_pipeline_stage");
    const auto stages_flag = in.small_integer("num_virtual_stages_per_pipeline_rank");
    const bool layout = in.text("pipeline_model_parallel_layout").has_value();
    no.require(int(per_stage_flag.has_value()) + int(stages_flag.has_value()) + int(layout) <= 1,
            "No more than one of the following arguments can be set at the same time: "
            "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,--pipeline-model-parallel-layout",
            "keep one of them");
    const bool uneven = in.integer("decoder_first_pipeline_num_layers") || in.integer("decoder_last_pipeline_num_layers");
    const int extra = int(in.on("account_for_embedding_in_pipeline_split")) + int(in.on("account_for_loss_in_pipeline_split"));
    const int layers = line.config.num_layers.value_or(0) + extra;
    auto& vpp = line.derived.virtual_pipeline_model_parallel_size;
    if (layout) {
        vpp.reset();  // the layout's stage count is checked when the model is built; not read here
    } else if (per_stage_flag || stages_flag) {
        if (!stages_flag) {
            no.require(!uneven,
                    "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline parallel degree when "
                    "enable uneven pipeline parallelism",
                    "use --num-virtual-stages-per-pipeline-rank with uneven first or last stages");
            no.require(layers % pp == 0, "number of layers of the model must be divisible pipeline model parallel size",
                    "use a layer count that the pipeline size divides");
            const long long per_vstage = *per_stage_flag;
            if (no.require(per_vstage > 0 && (layers / pp) % per_vstage == 0,
                           "number of layers per pipeline stage must be divisible number of layers per virtual pipeline stage",
                           "use a --num-layers-per-virtual-pipeline-stage that divides the layers of one pipeline stage"))
                vpp = static_cast<int>((layers / pp) / per_vstage);
        } else {
            vpp = *stages_flag;
        }
        if (vpp == 1) vpp.reset();
    } else {
        if (!hybrid) vpp.reset();
        if (!uneven && !hybrid && line.config.num_layers)
            no.require(layers % pp == 0, "Number of layers should be divisible by the pipeline-model-parallel size",
                    "use a layer count that the pipeline size divides, or uneven first and last stages");
    }
    if (vpp) {
        if (in.on("overlap_p2p_comm", true))
            no.require(pp > 1, "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1",
                    "use --pipeline-model-parallel-size 2 or more with virtual pipelining, or drop virtual pipelining");
        else
            no.require(pp > 2,
                    "When interleaved schedule is used and p2p communication overlap is disabled, pipeline-model-parallel "
                    "size should be greater than 2",
                    "use --pipeline-model-parallel-size 3 or more, or drop --no-overlap-p2p-communication");
    }
}

//! TransformerConfig's checks of the same inputs, which Megatron makes after validate_args.
inline void check_transformer_config_inputs(refusals& no, const megatron_command_line& line, int pp,
                                            const std::string& moe_layer_freq_refused) {
    const runtime_config& c = line.config;
    const auto refuse = [&](std::string message, std::string_view fix) { no.add("TransformerConfig", std::move(message), fix); };
    if (c.num_layers && *c.num_layers == 0)
        refuse("the model has no layers (float division by zero in the init method's std / sqrt(2 * num_layers))",
               "give --hybrid-layer-pattern at least one layer symbol");
    // A negative count fails in the same place: math.sqrt of a negative number ("math domain error").
    if (c.num_layers && *c.num_layers < 0)
        refuse("the model has " + std::to_string(*c.num_layers) + " layers (math domain error: the init method's std / sqrt(2 * num_layers))",
               "give --num-layers a positive count");
    if (c.cpu_offloading()) {
        if (c.num_layers && c.cpu_offloading_num_layers >= *c.num_layers)
            refuse("CPU offloading can be done only for layers less than " + std::to_string(*c.num_layers),
                   "offload fewer layers than the model has");
        if (pp > 1) refuse("Currently there is no support for Pipeline parallelism with CPU offloading",
                           "drop --cpu-offloading-num-layers or pipeline parallelism");
        if (c.recompute) refuse("CPU offloading does not work when activation recomputation is enabled",
                                "drop --cpu-offloading-num-layers or recompute");
    }
    if (c.recompute == recompute_granularity::full) {
        if (!c.recompute_method_)
            refuse("Using recompute_granularity: full so recompute_method must be \"block\" or \"uniform\"",
                   "add --recompute-method uniform (or block)");
        if (!c.recompute_num_layers)
            refuse("When using recompute_granularity: full recompute_num_layers must be between 1 and "
                   "num_layers_per_pipeline_rank: " + std::to_string(c.num_layers.value_or(0) / pp),
                   "add --recompute-num-layers N");
    } else if (c.recompute == recompute_granularity::selective && c.recompute_num_layers) {
        refuse("When using recompute_granularity: selective recompute_num_layers must be None.",
               "drop --recompute-num-layers (it belongs to full recompute)");
    }
    constexpr std::string_view building = "layer specs (gpt_layer_specs.py, when the model is built)";
    if (c.is_moe() && !moe_layer_freq_refused.empty())
        no.add(building, moe_layer_freq_refused, "write a frequency N >= 1, or a list of 0 (dense) and 1 (MoE) per layer");
    else if (c.is_moe() && c.moe_layers.is_pattern() && c.num_layers && c.moe_layers.pattern_length() != *c.num_layers)
        no.add(building,
                         "Invalid length of moe_layer_pattern: " + std::to_string(c.moe_layers.pattern_length()) +
                   ", expected: " + std::to_string(*c.num_layers),
               "give --moe-layer-freq one entry per layer");
}

} // namespace detail

//! Applies validate_args's derivations from the flags outside the CUDA-graph options, in
//! Megatron's order, and records what Megatron refuses there (`refused_inputs`).
inline void apply_validate_args_inputs(megatron_command_line& line, const std::string& moe_layer_freq_refused = {}) {
    const detail::given_inputs in(line);
    detail::refusals no(line);
    runtime_config& c = line.config;
    const long long pp_given = in.integer("pipeline_model_parallel_size").value_or(1);
    no.require(pp_given >= 1 && pp_given <= (1 << 20), "--pipeline-model-parallel-size must be a positive number of stages",
               "use 1 (no pipelining) or more");
    const int pp = pp_given >= 1 && pp_given <= (1 << 20) ? static_cast<int>(pp_given) : 1;
    line.derived.pipeline_model_parallel_size = pp;
    // Generalized tensor parallelism, resolved before the model size (validate_args, first thing).
    const long long tp = in.integer("tensor_model_parallel_size").value_or(1);
    line.derived.gtp_weight_remat_size = detail::resolve_weight_shards(no, in.integer("tensor_parallel_num_weight_shards"), tp,
                                                                       "--tensor-parallel-num-weight-shards", "--tensor-model-parallel-size");

    auto pattern = in.text("hybrid_layer_pattern");
    if (const auto old = in.text("hybrid_override_pattern")) {
        no.require(!pattern,
                        "--hybrid-override-pattern and --hybrid-layer-pattern cannot both be specified. "
                        "--hybrid-override-pattern is deprecated; use --hybrid-layer-pattern instead.",
                        "keep --hybrid-layer-pattern only");
        pattern = old;
    }
    if (pattern) detail::apply_hybrid_pattern(no, line, in, *pattern, pp);
    if (line.derived.mtp_num_layers == 0) line.derived.mtp_num_layers = in.small_integer("mtp_num_layers").value_or(0);
    if (line.derived.mtp_num_layers > 0) {
        const std::string position = in.text("position_embedding_type").value_or("learned_absolute");
        no.require(position == "rope" || position == "none",
                        "Multi-Token Prediction (MTP) is not supported with " + position + " position embedding type.",
                        "add --position-embedding-type rope");
    }
    detail::apply_pipeline(no, line, in, pattern.has_value(), pp);

    const bool fp16 = in.on("fp16"), bf16 = in.on("bf16");
    no.require(!(fp16 && bf16), "--fp16 and --bf16 were both given (validate_args asserts not args.bf16 under fp16)",
                    "keep one precision flag");
    line.derived.params_dtype = fp16 ? "float16" : bf16 ? "bfloat16" : "float32";
    // The expert layers' factor, resolved later in validate_args (expert tp defaults to tp); then
    // GTP with fp4 needs the fp4 parameter gather.
    const std::optional<long long> expert_tp = in.integer("expert_tensor_parallel_size");
    const int expert_gtp = detail::resolve_weight_shards(no, in.integer("expert_tensor_parallel_num_weight_shards"), expert_tp.value_or(tp),
                                                         "--expert-tensor-parallel-num-weight-shards",
                                                         expert_tp ? "--expert-tensor-parallel-size"
                                                                   : "the expert tensor-parallel size (--tensor-model-parallel-size, as "
                                                                     "--expert-tensor-parallel-size is not given)");
    no.require(!((line.derived.gtp_weight_remat_size > 1 || expert_gtp > 1) && in.text("fp4") && !in.on("fp4_param_gather")),
               "GTP (--tensor-parallel-num-weight-shards / --expert-tensor-parallel-num-weight-shards > 1) with --fp4-format requires "
               "--fp4-param-gather so NVFP4 weights are all-gathered as native NVFP4.",
               "add --fp4-param-gather");
    // Dynamic loss scaling (fp16 without a constant --loss-scale, 0 included) signals overflow
    // with NaNs, so Megatron turns its NaN check off: rule A1 then holds under full_iteration.
    if (fp16 && in.real("loss_scale").value_or(0.0) == 0.0) c.check_for_nan_in_loss_and_grad = false;
    no.require(!in.on("fp32_residual_connection") || fp16 || bf16,
                    "residual connection in fp32 only supported when using fp16 or bf16.", "add --bf16 or --fp16");
    no.require(!(c.recompute == recompute_granularity::selective && c.recompute_method_),
                    "recompute method is not yet supported for selective recomputing granularity",
                    "drop --recompute-method, or use --recompute-granularity full");
    no.require(c.inference_batch_times_seqlen_threshold <= -1 || pp > 1,
                    "--inference-batch-times-seqlen-threshold requires setting --pipeline-model-parallel-size > 1.",
                    "drop the threshold, or use pipeline parallelism");
    detail::check_transformer_config_inputs(no, line, pp, moe_layer_freq_refused);
}

} // namespace capscope::flags
