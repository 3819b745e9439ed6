#pragma once
//! @file
//! Hook pipelines (host-only): hooks whose phase and placement are part of their type, composed
//! in declaration order, checked against a configuration (rules H0, H1, H2, H4), and on a pipelined model's passes (H5; docs/hooks.md).

#include <capscope/hooks/hook.hpp>
#include <capscope/hooks/hook_context.hpp>
#include <capscope/hooks/hook_phase.hpp>
#include <capscope/hooks/hook_pipeline.hpp>
#include <capscope/hooks/hooks_fit.hpp>
#include <capscope/hooks/with_hooks.hpp>
#include <capscope/hooks/with_pass_hooks.hpp>
