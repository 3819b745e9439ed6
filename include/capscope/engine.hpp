#pragma once
//! @file
//! capscope's engine: the stage seam, the plan (pure host) and the runner (CUDA). Include
//! <capscope/plan.hpp> alone for the host-only part.

#include <capscope/offload/activation_store.hpp>
#include <capscope/plan.hpp>
#include <capscope/run/bucket_runner.hpp>
#include <capscope/run/capture_failed.hpp>
#include <capscope/run/counters.hpp>
#include <capscope/run/in_place_runner.hpp>
#include <capscope/run/inference_runner.hpp>
#include <capscope/run/runner.hpp>
#include <capscope/run/scratch.hpp>
#include <capscope/run/step_meter.hpp>
