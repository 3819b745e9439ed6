#pragma once
//! @file
//! The example model's layer kinds as capscope layer schemas, for `runner<Config, Schemas>`:
//! the compiler checks each kind's plan under the config, and the runner checks at bind time
//! that the model's stages are these.

#include <capscope/stage/schema.hpp>

namespace gpt::schemas {

using capscope::regions;
using capscope::stage_decl;
using capscope::stage_kind;
namespace capture = capscope::capture;

using om = capscope::offload_module;

//! Attention keeps the QKV input, q, k, v and the probabilities, and the projection's input; it
//! writes the pre-MLP norm's input, which the MLP (or the router) keeps.
using attention = stage_decl<stage_kind::attention, regions<capture::attention>,
                             capscope::saves<om::qkv_linear, om::core_attn, om::attn_proj>, capscope::makes<om::mlp_norm>>;

using dense = capscope::layer_schema<"dense", attention, stage_decl<stage_kind::mlp, regions<capture::mlp>, capscope::saves<om::mlp_norm>>>;

using moe_drop_and_pad =
    capscope::layer_schema<"moe (drop-and-pad)", attention,
                           stage_decl<stage_kind::moe_router, regions<capture::moe, capture::moe_router>, capscope::saves<om::mlp_norm>>,
                           stage_decl<stage_kind::moe_preprocess, regions<capture::moe, capture::moe_preprocess>, capscope::makes<om::expert_fc1>>,
                           stage_decl<stage_kind::moe_experts, regions<capture::moe>, capscope::saves<om::expert_fc1, om::moe_act>>>;

// [snippet moe_dropless]
//! Dropless: the preprocess reads the per-expert counts back to the host, and the expert GEMMs
//! are sized by them.
using moe_dropless =
    capscope::layer_schema<"moe (dropless)", attention,
                           stage_decl<stage_kind::moe_router, regions<capture::moe, capture::moe_router>, capscope::saves<om::mlp_norm>>,
                           stage_decl<stage_kind::moe_preprocess, regions<capture::moe, capture::moe_preprocess>,
                                      capscope::synchronizes_with_host, capscope::makes<om::expert_fc1>>,
                           stage_decl<stage_kind::moe_experts, regions<capture::moe>, capscope::shapes_depend_on_data,
                                      capscope::saves<om::expert_fc1, om::moe_act>>>;
// [snippet moe_dropless]

//! Dropless with a static capacity per expert (model_config::dropless_capacity_factor): the same
//! stages as drop-and-pad, all capturable; a step past the capacity is rerun eagerly.
using moe_dropless_static =
    capscope::layer_schema<"moe (dropless, static capacity)", attention,
                           stage_decl<stage_kind::moe_router, regions<capture::moe, capture::moe_router>, capscope::saves<om::mlp_norm>>,
                           stage_decl<stage_kind::moe_preprocess, regions<capture::moe, capture::moe_preprocess>, capscope::makes<om::expert_fc1>>,
                           stage_decl<stage_kind::moe_experts, regions<capture::moe>, capscope::saves<om::expert_fc1, om::moe_act>>>;

using mamba = capscope::layer_schema<"mamba", stage_decl<stage_kind::mamba, regions<capture::mamba>>>;

using drop_and_pad_model = capscope::layer_schemas<dense, moe_drop_and_pad, mamba>;
using dropless_model = capscope::layer_schemas<dense, moe_dropless, mamba>;
using dropless_static_model = capscope::layer_schemas<dense, moe_dropless_static, mamba>;

} // namespace gpt::schemas
