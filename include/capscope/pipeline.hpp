#pragma once
//! @file
//! Pipeline schedules, host-only: a schedule's shape and rules, each rank's passes in Megatron's
//! order, its groups of sends and receives, memory by in-flight slots, the replay check of the
//! sends and receives on their communicators, and the schedule as a type. Builds and tests
//! without CUDA.

#include <capscope/pipeline/activation_slots.hpp>
#include <capscope/pipeline/compute_order.hpp>
#include <capscope/pipeline/edge_plan.hpp>
#include <capscope/pipeline/issued_order.hpp>
#include <capscope/pipeline/p2p_buffer.hpp>
#include <capscope/pipeline/p2p_program.hpp>
#include <capscope/pipeline/phases.hpp>
#include <capscope/pipeline/pipeline_schedule.hpp>
#include <capscope/pipeline/process_grid.hpp>
#include <capscope/pipeline/replay_check.hpp>
#include <capscope/pipeline/schedule_shape.hpp>
