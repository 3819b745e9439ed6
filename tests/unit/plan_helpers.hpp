#pragma once
// What the plan tests share: a plan in one line per phase, a plan for a config, a plan's error.

#include <capscope/capscope.hpp>

#include <string>

namespace plan_helpers {
using namespace capscope;

//! One token per segment: "g3:layer0.attention+layer0.mlp" or "e:embedding".
inline std::string summary(const training_plan& plan, const training_program& program, phase only, int microbatch) {
    std::string out;
    for (const plan_segment& s : plan.segments) {
        if (s.part != step_part::microbatch || s.direction != only || s.microbatch != microbatch) continue;
        out += out.empty() ? "" : " ";
        out += s.graphed ? "g" + std::to_string(s.graph) + (s.shared ? "s" : "") + ":" : std::string("e:");
        for (int k = 0; k < s.call_count; ++k)
            out += (k ? "+" : "") + stage_of(program, plan.calls[std::size_t(s.first_call + k)]).name;
    }
    return out;
}

template <class Config>
training_plan plan_for(const training_program& p) {
    return make_training_plan(capture_scope_of<Config>, Config::warmup_steps, p);
}

inline std::string plan_error_text(const capture_scope& scope, const training_program& p) {
    try {
        make_training_plan(scope, 0, p);
    } catch (const plan_error& e) {
        return e.what();
    }
    return "(no error)";
}

} // namespace plan_helpers
