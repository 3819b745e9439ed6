#include "pipeline_report.hpp"

#include <algorithm>

#include <capscope/pipeline/activation_slots.hpp>
#include <capscope/pipeline/schedule_text.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace capscope::check {

namespace {
using pipeline::schedule_kind;

std::string shape_words(const flags::pipeline_schedule_inputs& p) {
    const pipeline::schedule_shape& s = *p.shape;
    std::string out = fmt::format("{}: {} ranks", pipeline::name_of(s.kind), s.ranks);
    if (s.kind == schedule_kind::interleaved_1f1b && p.group_given < 0)
        out += fmt::format(" x {} chunks, a microbatch group below 1 or past 2^20 (Megatron refuses it at the first step)", s.virtual_stages);
    else if (s.kind == schedule_kind::interleaved_1f1b)
        out += fmt::format(" x {} chunks, microbatches in groups of {}{}", s.virtual_stages, s.group_size(), p.group_given == 0 ? " (the default: the ranks)" : "");
    return out;
}

//! The communicators' verdict, the bubble and rank 0's memory for one microbatch count.
std::string batch_words(const flags::pipeline_schedule_inputs& p, const flags::pipeline_batch& b) {
    const pipeline::schedule_shape& s = *p.shape;
    std::string out = fmt::format("global batch {}: {} microbatch{}", b.global_batch, b.microbatches, b.microbatches == 1 ? "" : "es");
    if (b.rule != pipeline::schedule_rule::none)
        return out + fmt::format(" -- refused ({}: {})", pipeline::rule_id(b.rule), pipeline::describe(b.rule));
    const pipeline::slot_plan slots = pipeline::plan_slots(s, 0, b.microbatches);
    out += fmt::format("; bubble in theory {:.1f}%; rank 0 warms up with {} forward{} and keeps [{}] activation slots per chunk",
                       100.0 * pipeline::theoretical_bubble(s, b.microbatches), pipeline::warmup_forwards(s, 0, b.microbatches),
                       pipeline::warmup_forwards(s, 0, b.microbatches) == 1 ? "" : "s", fmt::join(slots.slots, ", "));
    out += b.communicators.verdict.completes()
               ? fmt::format("; replayed, every send and receive completes on {} communicator{}",
                             b.communicators.layout == pipeline::communicator_layout::shared ? "one shared" : "per-edge",
                             b.communicators.layout == pipeline::communicator_layout::shared ? "" : "s")
               : "; replay check: " + pipeline::describe(b.communicators.verdict);
    return out;
}
} // namespace

std::string pipeline_schedule_text(const flags::pipeline_schedule_inputs& p) {
    if (!p.shown) return "";
    std::string out = "\npipeline schedule (as Megatron's schedules.py runs it):\n";
    if (!p.shape)
        return out + "  not derived: --pipeline-model-parallel-layout gives the stages, which capscope does not read\n";
    out += "  " + shape_words(p) + "\n";
    if (p.data_parallel > 0 && p.micro_batch > 0 && p.replicas != p.data_parallel)
        out += fmt::format("  data parallel {} (replicas {} x the weight shards' factor {}), micro batch {}: a microbatch is {} samples across "
                           "the data-parallel ranks\n",
                           p.data_parallel, p.replicas, p.data_parallel / std::max(p.replicas, 1), p.micro_batch,
                           static_cast<long long>(p.data_parallel) * p.micro_batch);
    else if (p.data_parallel > 0 && p.micro_batch > 0)
        out += fmt::format("  data parallel {}, micro batch {}: a microbatch is {} samples across the data-parallel ranks\n", p.data_parallel,
                           p.micro_batch, static_cast<long long>(p.data_parallel) * p.micro_batch);
    for (const flags::pipeline_batch& b : p.batches) out += "  " + batch_words(p, b) + "\n";
    if (p.eval_microbatches > 0) out += fmt::format("  evaluation: {} microbatch{} a step (forward only, the same schedule)\n", p.eval_microbatches, p.eval_microbatches == 1 ? "" : "es");
    if (!p.not_known.empty()) out += "  " + p.not_known + "\n";
    if (p.overlap_p2p)
        out += "  Megatron overlaps sends and receives with compute here (its default with interleaving): the replay check models the "
               "batched groups of --no-overlap-p2p-communication, not the overlapped path\n";
    return out;
}

nlohmann::json pipeline_schedule_json(const flags::pipeline_schedule_inputs& p) {
    if (!p.shown) return nullptr;
    if (!p.shape) return {{"not_known", "--pipeline-model-parallel-layout gives the stages, which capscope does not read"}};
    const pipeline::schedule_shape& s = *p.shape;
    nlohmann::json batches = nlohmann::json::array();
    for (const flags::pipeline_batch& b : p.batches) {
        nlohmann::json j{{"global_batch", b.global_batch}, {"microbatches", b.microbatches}};
        if (b.rule != pipeline::schedule_rule::none) {
            j["rule"] = pipeline::rule_id(b.rule);
        } else {
            j["bubble"] = pipeline::theoretical_bubble(s, b.microbatches);
            j["communicators"] = pipeline::name_of(b.communicators.layout);
            j["replay"] = pipeline::describe(b.communicators.verdict);
            j["replay_completes"] = b.communicators.verdict.completes();
            j["rank0_activation_slots"] = pipeline::plan_slots(s, 0, b.microbatches).slots;
        }
        batches.push_back(j);
    }
    nlohmann::json out{{"kind", pipeline::name_of(s.kind)}, {"ranks", s.ranks}, {"virtual_stages", s.virtual_stages},
                       {"overlap_p2p", p.overlap_p2p}, {"batches", batches}};
    if (s.kind == schedule_kind::interleaved_1f1b) out["group"] = s.group_size();
    if (p.data_parallel > 0) out["data_parallel"] = p.data_parallel;
    if (p.replicas > 0) out["replicas"] = p.replicas;
    if (p.micro_batch > 0) out["micro_batch"] = p.micro_batch;
    if (p.eval_microbatches > 0) out["eval_microbatches"] = p.eval_microbatches;
    if (!p.not_known.empty()) out["not_known"] = p.not_known;
    return out;
}

} // namespace capscope::check
