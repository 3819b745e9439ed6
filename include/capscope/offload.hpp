#pragma once
//! @file
//! Activation offloading: the plan of what moves and where tensors live
//! (`offload/offload_plan.hpp`), the copies as stages of a training program
//! (`offload/with_offload.hpp`), both host-only, and the CUDA store that allocates the ring, the
//! pinned pool and the copies (`offload/activation_store.hpp`, in capscope/engine.hpp).

#include <capscope/offload/offload_plan.hpp>
#include <capscope/offload/with_offload.hpp>
