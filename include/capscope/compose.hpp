#pragma once
//! @file
//! Composition (host-only): a trainer's program with its hooks, activation offload and sharding
//! policy named in one place, each part kept as a type and checked against the configuration
//! where it is named (capscope/compose/composition.hpp). Above hooks, offload and parallel.

#include <capscope/compose/composition.hpp>
