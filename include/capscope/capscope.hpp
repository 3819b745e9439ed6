#pragma once
//! @file
//! capscope: declare what to capture into CUDA graphs as types; configurations that cannot
//! work do not compile, and say which rule they break and how to fix it.
//!
//! Layers: vocabulary -> rules -> config (compile time) / validate (run time) -> flags, and the
//! engine's host-only part: stages -> plan. The CUDA runner is <capscope/engine.hpp>.

#include <capscope/version.hpp>
#include <capscope/vocabulary/buckets.hpp>
#include <capscope/vocabulary/capture_module.hpp>
#include <capscope/vocabulary/graph_impl.hpp>
#include <capscope/vocabulary/inference_scope.hpp>
#include <capscope/vocabulary/moe.hpp>
#include <capscope/vocabulary/offload_module.hpp>
#include <capscope/vocabulary/recompute.hpp>
#include <capscope/vocabulary/runtime_config.hpp>
#include <capscope/vocabulary/training.hpp>

#include <capscope/rules/batch_sizes.hpp>
#include <capscope/rules/evaluate.hpp>
#include <capscope/rules/table.hpp>

#include <capscope/config.hpp>

#include <capscope/flags/argument_file.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <capscope/describe.hpp>
#include <capscope/validate.hpp>

#include <capscope/plan.hpp>
#include <capscope/hooks.hpp>
#include <capscope/offload.hpp>
#include <capscope/compose.hpp> // last: a diagnostic's include chain stays short
