#pragma once
//! @file
//! The compile-time configuration alone: `config<...>` and its options, checked against the rule
//! table when it is named. A third of <capscope/capscope.hpp>'s compile time, for a translation
//! unit that only names configurations (capscope-check --emit-cpp writes one).

#include <capscope/config/capture_options.hpp>
#include <capscope/config/config.hpp>
#include <capscope/config/engine_options.hpp>
#include <capscope/config/inference_options.hpp>
#include <capscope/config/model_options.hpp>
#include <capscope/config/offload_options.hpp>
#include <capscope/config/select.hpp>
#include <capscope/config/training_options.hpp>
#include <capscope/config/vision_options.hpp>
