#pragma once
//! @file
//! capscope's thin CUDA layer: checked calls and move-only owners of streams, events, graphs
//! and memory. NCCL is opt-in: include <capscope/cuda/nccl.hpp>.

#include <capscope/cuda/blas.hpp>
#include <capscope/cuda/buffer.hpp>
#include <capscope/cuda/device.hpp>
#include <capscope/cuda/error.hpp>
#include <capscope/cuda/event.hpp>
#include <capscope/cuda/graph.hpp>
#include <capscope/cuda/graph_copy.hpp>
#include <capscope/cuda/nccl_graph_mixing.hpp>
#include <capscope/cuda/stream.hpp>
