#pragma once
//! @file
//! The pipeline schedule a Megatron-LM command line runs, and what Megatron refuses about it after
//! start-up, ported from Megatron-LM d98e8a64dd:
//! - the microbatch count: the global batch over micro batch x data-parallel size
//!   (num_microbatches_calculator.py at start-up), for each batch size of a
//!   `--step-batch-size-schedule`, the data-parallel size being the world over tp x pp x cp (with
//!   `--tensor-parallel-num-weight-shards`, the world must divide by tp x pp x cp x the shards'
//!   factor, and the calculator is still given the world over tp x pp x cp);
//! - the interleaved schedule's group rules (schedules.py, raised at the first step that runs the
//!   count, so a step schedule's later batch size fails hours into training);
//! - capscope's replay check of the sends and receives (replay_check.hpp).
//!
//! The world size is no flag: Megatron reads WORLD_SIZE, so the count is known only when the
//! caller gives it (capscope-check --world-size). Without it the schedule's shape is still shown.

#include <capscope/flags/validate_args_inputs.hpp>
#include <capscope/pipeline/replay_check.hpp>
#include <capscope/pipeline/schedule_shape.hpp>

#include <algorithm>
#include <limits>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

namespace capscope::flags {

namespace detail {

//! StepBatchsizeNumMicroBatchesCalculator._parse_numeric_value: K, M, B, T suffixes, then int(float(...)).
inline std::optional<long long> step_schedule_number(std::string text) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(text.begin());
    for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    double scale = 1;
    if (!text.empty()) {
        const char last = text.back();
        scale = last == 'T' ? 1e12 : last == 'B' ? 1e9 : last == 'M' ? 1e6 : last == 'K' ? 1e3 : 1;
        if (scale != 1) text.pop_back();
    }
    const std::optional<double> v = python_float(text);
    if (!v || !(*v * scale < 9.2e18 && *v * scale > -9.2e18)) return std::nullopt;
    return static_cast<long long>(*v * scale);
}

//! The batch sizes of a step schedule ("THRESHOLD:BS ..."), sorted by threshold as Megatron
//! sorts them; a refusal for an entry Megatron refuses.
inline std::vector<long long> step_schedule_batches(refusals& no, const std::string& schedule, std::optional<long long> seq_length) {
    std::string text = schedule;
    std::replace(text.begin(), text.end(), ',', ' ');
    std::vector<std::pair<long long, long long>> entries;
    std::size_t at = 0;
    constexpr std::string_view where = "num_microbatches_calculator.py, at start-up";
    while (at < text.size()) {
        while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
        if (at == text.size()) break;
        std::size_t end = at;
        while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
        const std::string entry = text.substr(at, end - at);
        at = end;
        const std::size_t colon = entry.find(':');
        const auto threshold = colon == std::string::npos ? std::nullopt : step_schedule_number(entry.substr(0, colon));
        const auto batch = colon == std::string::npos ? std::nullopt : step_schedule_number(entry.substr(colon + 1));
        if (!threshold || !batch) {
            no.add(where, "Invalid schedule entry \"" + entry + "\". Expected format: \"THRESHOLD:BATCH_SIZE\"",
                   "write each entry of --step-batch-size-schedule as THRESHOLD:BATCH_SIZE, e.g. 0:768 250B:1536");
            return {};
        }
        // Thresholds are tokens when Megatron passes a sequence length (it always does: args.seq_length).
        entries.push_back({seq_length && *seq_length > 0 ? *threshold / *seq_length : *threshold, *batch});
    }
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    if (entries.empty()) {
        no.add(where, "schedule must have at least one entry", "give --step-batch-size-schedule at least one THRESHOLD:BATCH_SIZE");
        return {};
    }
    if (entries.front().first != 0) {
        no.add(where, "first schedule entry must have threshold 0, got " + std::to_string(entries.front().first),
               "start --step-batch-size-schedule with 0:BATCH_SIZE");
        return {};
    }
    for (std::size_t i = 1; i < entries.size(); ++i)
        if (entries[i].first <= entries[i - 1].first) {
            no.add(where, "schedule thresholds must be strictly increasing, got " + std::to_string(entries[i - 1].first) + " before " +
                              std::to_string(entries[i].first),
                   "give each threshold once (in samples: tokens divided by --seq-length)");
            return {};
        }
    std::vector<long long> batches;
    for (const auto& [threshold, batch] : entries) {
        if (batch <= 0) {
            no.add(where, "batch size must be positive, got " + std::to_string(batch), "give every batch size of the schedule as 1 or more");
            return {};
        }
        batches.push_back(batch);
    }
    return batches;
}

//! schedules.py's refusal of an interleaved count, in Megatron's words (its typo kept).
inline std::string megatron_schedule_message(const pipeline::schedule_shape& s, int microbatches, int group) {
    if (group > microbatches || group < s.ranks)
        return "The number of contiguous micro-batches in a virtual pipeline stageshould range in [PP=" + std::to_string(s.ranks) +
               " , M=" + std::to_string(microbatches) + "]";
    return "The remainder of M (the total micro-batches) divided by N (number of contiguous micro-batches in a virtual pipeline stage) "
           "should be 0, or larger than or equal to the pipeline-parallel size, but it is " +
           std::to_string(microbatches % group) + ". Otherwise, it introduces dependency bubbles in the pipeline and reduces throughput.";
}

} // namespace detail

//! Derives `line.pipeline` and records what Megatron refuses about the schedule after start-up.
//! `world_size`: Megatron's WORLD_SIZE, when known.
inline void apply_pipeline_schedule_inputs(megatron_command_line& line, std::optional<int> world_size) {
    pipeline_schedule_inputs& p = line.pipeline;
    const int pp = line.derived.pipeline_model_parallel_size;
    p = {};
    p.shown = pp > 1;
    if (!p.shown) return;
    const detail::given_inputs in(line);
    detail::refusals no(line);

    // The shape. Megatron's own divisibility checks are validate_args's (validate_args_inputs.hpp);
    // here the layers only label the chunks, so an uneven split is given as one layer a chunk.
    const int vpp = line.derived.virtual_pipeline_model_parallel_size.value_or(1);
    // Megatron's default (ModelParallelConfig) applies only when the flag is absent: a 0 given
    // stays 0, and schedules.py refuses it. A group past 2^20 exceeds any microbatch count here.
    const std::optional<long long> group_flag = in.integer("microbatch_group_size_per_vp_stage");
    const long long group = group_flag.value_or(0);
    p.group_given = !group_flag ? 0 : group > 0 && group <= (1 << 20) ? int(group) : -1;
    p.overlap_p2p = vpp > 1 && in.on("overlap_p2p_comm", true);
    if (!in.text("pipeline_model_parallel_layout")) {
        pipeline::schedule_shape s;
        s.kind = vpp > 1 ? pipeline::schedule_kind::interleaved_1f1b : pipeline::schedule_kind::one_f_one_b;
        s.ranks = pp;
        s.virtual_stages = vpp;
        const int layers = line.config.num_layers.value_or(0);
        s.layers = layers > 0 && layers % s.stages() == 0 ? layers : s.stages();
        s.group = group > 0 && group <= (1 << 20) ? int(group) : pp; // Megatron's default: the pipeline size
        p.shape = s;
    }

    if (!world_size) {
        p.not_known = "the microbatch count is not known: Megatron divides the global batch by micro batch x data-parallel size, and the "
                      "data-parallel size comes from the world size (WORLD_SIZE) -- give --world-size N to check the schedule for it";
        return;
    }
    const long long tp = in.integer("tensor_model_parallel_size").value_or(1), cp = in.integer("context_parallel_size").value_or(1);
    // Generalized tensor parallelism's weight-shard factor counts toward the model size; the
    // replicas are what is left, and the microbatch calculator is given replicas x factor.
    const long long gtp = line.derived.gtp_weight_remat_size;
    long long model = 0;
    if (tp < 1 || cp < 1 || __builtin_mul_overflow(tp, static_cast<long long>(pp), &model) || __builtin_mul_overflow(model, cp, &model) ||
        __builtin_mul_overflow(model, gtp, &model))
        model = 0; // no world size divides it
    if (model < 1 || *world_size % model != 0) {
        no.require(false,
                   "world size (" + std::to_string(*world_size) + ") is not divisible by total_model_size (total_model_size=" +
                       (model > 0 ? std::to_string(model) : "tp x pp x cp x the weight-shard factor, past 2^63") + ")",
                   gtp > 1 ? "use a world size that is a multiple of tensor x pipeline x context parallel sizes x the weight shards' factor "
                             "(--tensor-parallel-num-weight-shards / tp)"
                           : "use a world size that is a multiple of tensor x pipeline x context parallel sizes");
        p.not_known = "the data-parallel size is not known: the world size is not a multiple of the model size";
        return;
    }
    p.replicas = static_cast<int>(*world_size / model);
    p.data_parallel = static_cast<int>(*world_size / model * gtp);
    const auto micro = in.integer("micro_batch_size");
    if (!micro || *micro < 1 || !detail::fits_int(*micro)) {
        no.require(false, micro ? "assert args.micro_batch_size > 0" : "assert args.micro_batch_size is not None",
                   "give --micro-batch-size, 1 or more");
        p.not_known = "the microbatch count is not known without a micro batch size";
        return;
    }
    p.micro_batch = static_cast<int>(*micro);
    const long long per_step = *micro * p.data_parallel; // samples in one microbatch across the data-parallel ranks
    const bool decrease = in.on("decrease_batch_size_if_needed");
    constexpr std::string_view calculator = "num_microbatches_calculator.py, at start-up";

    std::vector<long long> batches;
    bool step_schedule = false;
    if (const auto schedule = in.text("step_batch_size_schedule")) {
        step_schedule = true;
        if (line.find("global_batch_size")) {
            no.require(false, "Cannot specify both --step-batch-size-schedule and --global-batch-size", "keep one of them");
            p.not_known = "the batch sizes are not known: Megatron refuses the step schedule with a global batch size";
            return;
        }
        if (decrease) {
            no.add(calculator, "Cannot specify both --step-batch-size-schedule and --decrease-batch-size-if-needed",
                   "drop --decrease-batch-size-if-needed");
            p.not_known = "the batch sizes are not known: Megatron refuses the step schedule with --decrease-batch-size-if-needed";
            return;
        }
        batches = detail::step_schedule_batches(no, *schedule, in.integer("seq_length"));
        if (batches.empty()) {
            p.not_known = "the batch sizes are not known: Megatron refuses the step schedule";
            return;
        }
    } else {
        // validate_args's default: micro batch x the replicas (without the weight-shard factor).
        const long long global = in.integer("global_batch_size").value_or(*micro * p.replicas);
        if (global <= 0) {
            no.require(false, "assert args.global_batch_size > 0", "give --global-batch-size, 1 or more");
            p.not_known = "the microbatch count is not known without a positive global batch size";
            return;
        }
        batches.push_back(global);
    }

    // validate_args's start-up check of the evaluation batch (its default: the global batch before
    // any rounding; with a step schedule, micro batch x the replicas), and its count.
    const long long eval_micro = in.integer("eval_micro_batch_size").value_or(*micro);
    const long long eval_global = in.integer("eval_global_batch_size").value_or(step_schedule ? *micro * p.replicas : batches.front());
    long long eval_per_step = 0;
    if (eval_micro > 0 && eval_global > 0 && !__builtin_mul_overflow(eval_micro, static_cast<long long>(p.data_parallel), &eval_per_step)) {
        if (eval_global % eval_per_step != 0)
            no.require(false,
                       "eval_global_batch_size (" + std::to_string(eval_global) + ") must be divisible by eval_micro_batch_size (" +
                           std::to_string(eval_micro) + ") * data_parallel_size (" + std::to_string(p.replicas) +
                           ") * gtp_weight_remat_size (" + std::to_string(gtp) + ")",
                       "give --eval-global-batch-size as a multiple of " + std::to_string(eval_per_step));
        else if (detail::fits_int(eval_global / eval_per_step))
            p.eval_microbatches = static_cast<int>(eval_global / eval_per_step);
    }

    long long previous_m = 0;
    for (const long long global : batches) {
        // The step schedule: update_num_microbatches(consistency_check=True) on every iteration
        // (training.py) asserts divisibility when the schedule reaches the size, and the count may not fall.
        if (step_schedule && global % per_step != 0) {
            no.add("training.py, when the step schedule reaches a global batch of " + std::to_string(global),
                   "current global batch size (" + std::to_string(global) + ") is not divisible by micro_batch_size (" + std::to_string(*micro) +
                       ") * data_parallel_size (" + std::to_string(p.data_parallel) + ")",
                   "give every batch size of the schedule as a multiple of " + std::to_string(per_step));
            continue;
        }
        if (step_schedule && global / per_step < previous_m)
            no.add("training.py, when the step schedule reaches a global batch of " + std::to_string(global),
                   "Number of microbatches should not decrease; going from " + std::to_string(previous_m) + " to " +
                       std::to_string(global / per_step),
                   "give the schedule's batch sizes in increasing order");
        if (step_schedule) previous_m = global / per_step;
        if (std::any_of(p.batches.begin(), p.batches.end(), [&](const pipeline_batch& b) { return b.global_batch == global; })) continue;
        long long running = global;
        if (!step_schedule && decrease) running = global / per_step * per_step;
        if (!step_schedule && !decrease && global % per_step != 0) {
            no.add(calculator,
                   "global batch size (" + std::to_string(global) + ") is not divisible by micro batch size (" + std::to_string(*micro) +
                       ") times data parallel size (" + std::to_string(p.data_parallel) + ")",
                   "use a global batch size that is a multiple of " + std::to_string(per_step) + ", or --decrease-batch-size-if-needed");
            p.not_known = "the microbatch count is not known: the global batch is no multiple of micro batch x data-parallel size";
            return;
        }
        const long long m = running / per_step;
        if (m < 1) {
            no.add(calculator, "number of microbatches should be at least 1, got " + std::to_string(m) + ".",
                   "use a global batch size of at least " + std::to_string(per_step));
            p.not_known = "the microbatch count is 0";
            return;
        }
        if (!detail::fits_int(m)) {
            p.not_known = "the microbatch count " + std::to_string(m) + " is past the int range capscope checks schedules in";
            return;
        }
        pipeline_batch b{global, static_cast<int>(m)};
        if (p.shape) {
            b.rule = pipeline::check_shape(*p.shape, b.microbatches);
            // Megatron takes a group below 1 as given; capscope's shape reads 0 as "the ranks".
            if (p.shape->kind == pipeline::schedule_kind::interleaved_1f1b && p.group_given < 0) b.rule = pipeline::schedule_rule::PP4;
            if (b.rule == pipeline::schedule_rule::PP4) {
                const int g = p.group_given < 0 ? (group > 0 ? std::numeric_limits<int>::max() : 0) : p.shape->group_size();
                no.add(step_schedule ? "schedules.py, at the first step with a global batch of " + std::to_string(global)
                                     : std::string("schedules.py, at the first training step"),
                       detail::megatron_schedule_message(*p.shape, b.microbatches, g),
                       "use a --microbatch-group-size-per-virtual-pipeline-stage from " + std::to_string(pp) + " to the microbatch count (" +
                           std::to_string(b.microbatches) + ") whose remainder is 0 or at least " + std::to_string(pp) +
                           ", or a global batch that makes such a count");
            } else if (b.rule == pipeline::schedule_rule::none) {
                b.communicators = pipeline::choose_communicators(*p.shape, b.microbatches);
            }
        }
        p.batches.push_back(b);
    }
    // evaluate() runs the same schedule, forward only, with the evaluation count: the same group rules.
    if (p.shape && p.shape->kind == pipeline::schedule_kind::interleaved_1f1b && p.group_given >= 0 && p.eval_microbatches > 0 &&
        pipeline::check_shape(*p.shape, p.eval_microbatches) == pipeline::schedule_rule::PP4)
        no.add("schedules.py, at the first evaluation (" + std::to_string(p.eval_microbatches) + " microbatches)",
               detail::megatron_schedule_message(*p.shape, p.eval_microbatches, p.shape->group_size()),
               "give --eval-global-batch-size a count of microbatches that the group rules accept (at least the group, remainder 0 or at least " +
                   std::to_string(pp) + ")");
}

} // namespace capscope::flags
