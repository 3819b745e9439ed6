#pragma once
// The pipeline schedule Megatron-LM would run from this command line
// (capscope/flags/pipeline_schedule_inputs.hpp), for the text and JSON outputs. Shown with
// --pipeline-model-parallel-size above 1; its refusals are among the line's refused inputs.

#include <capscope/flags/command_line.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace capscope::check {

std::string pipeline_schedule_text(const flags::pipeline_schedule_inputs& p);
nlohmann::json pipeline_schedule_json(const flags::pipeline_schedule_inputs& p);

} // namespace capscope::check
