// The example model's configuration checks run on the host, before anything touches a GPU:
// each bad field is named, with what it must be.

#include <gpt/config.hpp>

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

namespace {
template <class Config> std::string rejection(const Config& c) {
    try {
        c.validate();
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "";
}
} // namespace

TEST_CASE("the default model and vision configs are valid") {
    CHECK(rejection(gpt::model_config{}).empty());
    CHECK(rejection(gpt::vision_config{}).empty());
}

TEST_CASE("a bad model field is named, with what it must be") {
    gpt::model_config c;
    c.layer_pattern = "DXM";
    CHECK(rejection(c) == "model config: layer_pattern = \"DXM\": unknown layer kind 'X'; use D (dense), E (MoE) or M (Mamba)");
    c = {};
    c.layer_pattern = "";
    CHECK(rejection(c).find("needs at least one layer") != std::string::npos);
    c = {};
    c.hidden = 30;
    c.heads = 4;
    CHECK(rejection(c) == "model config: hidden = 30: must be a multiple of heads (4)");
    c = {};
    c.hidden = 1024;
    c.heads = 4; // heads of 256: wider than the fused attention's tile
    CHECK(rejection(c) == "model config: heads = 4: gives heads of 256 (hidden / heads) but attention takes at most 128; use at least 8 heads");
    c.heads = 8;
    CHECK(rejection(c).empty());
    c = {};
    c.top_k = 5;
    c.experts = 4;
    CHECK(rejection(c) == "model config: top_k = 5: must be in [1, experts]");
    c = {};
    c.experts = 65;
    CHECK(rejection(c) == "model config: experts = 65: must be in [1, 64]");
    c = {};
    c.capacity_factor = 0;
    CHECK(rejection(c).find("capacity_factor") != std::string::npos);
    c.moe_mode = gpt::moe_mode::dropless; // dropless has no capacity
    CHECK(rejection(c).empty());
    c = {};
    c.batch = 0;
    CHECK(rejection(c) == "model config: batch = 0: must be positive");
    c = {};
    c.layer_pattern = "DM"; // no MoE layer: expert fields are not read
    c.experts = 0;
    CHECK(rejection(c).empty());
}

TEST_CASE("drop-and-pad capacity is ceil(capacity_factor * tokens * top_k / experts)") {
    gpt::model_config c;
    c.batch = 4;
    c.seq_len = 16;
    c.experts = 4;
    c.top_k = 2;
    c.capacity_factor = 1.25;
    CHECK(c.expert_capacity() == 40);
    c.capacity_factor = 0.25;
    CHECK(c.expert_capacity() == 8);
    c.capacity_factor = 0.26;
    CHECK(c.expert_capacity() == 9);
}

TEST_CASE("a static dropless capacity: ceil(factor * tokens * top_k / experts), dropless only, never negative") {
    gpt::model_config c;
    c.batch = 4;
    c.seq_len = 16;
    c.experts = 4;
    c.top_k = 2;
    c.moe_mode = gpt::moe_mode::dropless;
    c.dropless_capacity_factor = 1.5;
    CHECK(rejection(c).empty());
    CHECK(c.dropless_capacity() == 48);
    c.dropless_capacity_factor = -1;
    CHECK(rejection(c).find("dropless_capacity_factor = -1") != std::string::npos);
    c.dropless_capacity_factor = 1.5;
    c.moe_mode = gpt::moe_mode::drop_and_pad;
    CHECK(rejection(c).find("moe_mode is drop_and_pad") != std::string::npos);
}

TEST_CASE("dynamic loss scaling needs the finite check and a power-of-two scale") {
    gpt::model_config c;
    c.loss_scale.dynamic = true;
    CHECK(rejection(c).find("loss_scale.dynamic = true: needs check_finite_on_device = true") != std::string::npos);
    c.check_finite_on_device = true;
    CHECK(rejection(c).empty());
    c.loss_scale.initial = 3000.f;
    CHECK(rejection(c).find("loss_scale.initial = 3000.000000: must be a power of two in [1, 2^24]") != std::string::npos);
    c.loss_scale.initial = 0.5f;
    CHECK(rejection(c).find("loss_scale.initial = 0.500000") != std::string::npos);
    c.loss_scale.initial = 33554432.f; // 2^25
    CHECK(rejection(c).find("must be a power of two in [1, 2^24]") != std::string::npos);
    c.loss_scale.initial = 16777216.f;
    CHECK(rejection(c).empty());
    c.loss_scale.growth_interval = 0;
    CHECK(rejection(c) == "model config: loss_scale.growth_interval = 0: must be positive");
}

TEST_CASE("a vision head wider than attention takes is rejected with the fix") {
    gpt::vision_config v;
    v.hidden = 512;
    v.heads = 2;
    CHECK(rejection(v) == "vision config: heads = 2 gives heads of 256 (hidden / heads) but attention takes at most 128; use more heads");
    v.heads = 4;
    CHECK(rejection(v).empty());
}

TEST_CASE("a vision bucket larger than the position table is rejected with the fix") {
    gpt::vision_config v;
    v.max_patches = 16;
    v.padded_len = 32;
    CHECK(rejection(v) ==
          "vision config: padded_len = 32: exceeds max_patches = 16 (the position table); raise max_patches or pad to a smaller length");
}
