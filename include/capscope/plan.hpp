#pragma once
//! @file
//! The host-only part of the engine: the stage seam (`stage`, `training_program`, layer
//! schemas) and the plans computed from it (segments, capture order, text and DOT; inference
//! buckets and padding). Builds and tests without CUDA.

#include <capscope/plan/buckets.hpp>
#include <capscope/plan/capture_region.hpp>
#include <capscope/plan/inference_plan.hpp>
#include <capscope/plan/inference_settings.hpp>
#include <capscope/plan/layer_plan.hpp>
#include <capscope/plan/match_schemas.hpp>
#include <capscope/plan/model_facts.hpp>
#include <capscope/plan/offload_placement.hpp>
#include <capscope/plan/plan_error.hpp>
#include <capscope/plan/print.hpp>
#include <capscope/plan/recorded_program.hpp>
#include <capscope/plan/segment.hpp>
#include <capscope/plan/training_plan.hpp>
#include <capscope/stage/marked_region.hpp>
#include <capscope/stage/program.hpp>
#include <capscope/stage/schema.hpp>
#include <capscope/stage/stage.hpp>
