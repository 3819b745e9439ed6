// Activation offloading on the host: what the plan moves (min size, the last groups of each
// name, the fraction), where the copies and waits go under each impl (branch or delayed,
// in-flight cap), the plan text, and rule P11 from the stages.

#include "fake_program.hpp"
#include "plan_helpers.hpp"

#include <capscope/capscope.hpp>
#include <capscope/emit_cpp.hpp>

#include <cmath>
#include <limits>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace capscope;
using namespace plan_helpers;

namespace {

using om = offload_module;

offload_settings policy(offload_module_set modules, double fraction = 1.0, long long min_size = 1) {
    offload_settings o;
    o.enabled = true;
    o.modules = modules;
    o.fraction = fraction;
    o.min_tensor_size = min_size;
    return o;
}

//! Layer l of `layers` dense layers keeps "normed" (qkv_linear, 1000 bytes) and "residual" (mlp_norm, 600 bytes; the MLP keeps it).
std::vector<offload_tensor_decl> dense_tensors(int layers) {
    std::vector<offload_tensor_decl> d;
    for (int l = 0; l < layers; ++l) {
        d.push_back({l, om::qkv_linear, "layer" + std::to_string(l) + ".normed", 1000, 2});
        d.push_back({l, om::mlp_norm, "layer" + std::to_string(l) + ".residual", 600, 2});
    }
    return d;
}

//! The fake model's dense layers with what they keep: attention keeps qkv_linear and makes mlp_norm, which the MLP keeps.
training_program keeping_program(fake::model& m, int layers, int microbatches, std::vector<char>& memory) {
    auto p = m.program(std::string(std::size_t(layers), 'D'), false, microbatches);
    for (auto& list : p.microbatches)
        for (stage& s : list) {
            if (s.layer < 0) continue;
            char* base = memory.data() + 64 * (s.layer % 2); // a ring of two slots: layer l reuses layer l - 2's
            if (s.kind == stage_kind::attention) {
                s.saves = {{om::qkv_linear, {"normed", base, 24}, 2}};
                s.makes = {om::mlp_norm};
            } else {
                s.saves = {{om::mlp_norm, {"residual", base + 32, 24}, 2}};
            }
        }
    return p;
}

//! Copies between the keeping program's slots (`memory`) and a host area of their own per group.
std::vector<offload_copies> fake_copies(const offload_plan& plan, fake::model& m, std::vector<char>& memory, std::vector<char>& host) {
    std::vector<offload_copies> c(plan.groups.size());
    host.assign(64 * plan.groups.size(), 0);
    for (std::size_t g = 0; g < plan.groups.size(); ++g) {
        m.recorders.push_back(std::make_unique<fake::recorder>(fake::recorder{&m.log, "copy" + std::to_string(g)}));
        c[g].out = stream_fn::of<&fake::recorder::forward>(m.recorders.back().get());
        c[g].back = stream_fn::of<&fake::recorder::backward>(m.recorders.back().get());
        const offload_group& grp = plan.groups[g];
        const bool norm = grp.module == om::mlp_norm;
        c[g].device = {{"slot", memory.data() + 64 * (grp.layer % 2) + (norm ? 32 : 0), 24}};
        c[g].host = {{"host copy", host.data() + 64 * g, 32}};
    }
    return c;
}

} // namespace

TEST_CASE("the offload plan: eligible tensors, the last groups of each name stay, the fraction leaves the latest, one ring per name") {
    const auto all = plan_offload(policy({om::qkv_linear, om::mlp_norm}), dense_tensors(4));
    REQUIRE(all.groups.size() == 8);
    CHECK(all.copied_groups() == 4); // layers 0 and 1 of each name; layers 2 and 3 keep their slots
    for (const auto& g : all.groups) {
        CHECK(g.copied == (g.layer < 2));
        CHECK(g.member == g.layer);
        CHECK(g.slot == g.layer % 2);
        CHECK(g.lane == 2 + g.layer % 2);
    }
    CHECK(all.ring_bytes == 2 * 1024 + 2 * 768);
    CHECK(all.own_bytes == 0);
    CHECK(all.host_bytes == 2 * 1024 + 2 * 768);
    CHECK(all.device_bytes_saved() == all.bytes_without_offload - all.ring_bytes);
    CHECK(all.device_bytes_saved() == 2 * 1024 + 2 * 768);

    // Half of the 4 candidates: the latest two (layer 1's) stay on the device with memory of their own.
    const auto half = plan_offload(policy({om::qkv_linear, om::mlp_norm}, 0.5), dense_tensors(4));
    CHECK(half.copied_groups() == 2);
    for (const auto& g : half.groups) {
        CHECK(g.copied == (g.layer == 0));
        CHECK(g.member == (g.layer < 3 ? g.layer : -1)); // ring: layer 0 and the two after it
    }
    CHECK(half.ring_bytes == all.ring_bytes);
    CHECK(half.own_bytes == 1024 + 768); // layer 3's

    // Tensors under min_offloaded_tensor_size elements (600 bytes = 300 elements) are not eligible.
    const auto big = plan_offload(policy({om::qkv_linear, om::mlp_norm}, 1.0, 400), dense_tensors(4));
    CHECK(big.groups.size() == 4);
    CHECK(big.copied_groups() == 2);
    CHECK(big.own_bytes == 4 * 768);
    // Off: an allocator, every tensor in memory of its own.
    const auto off = plan_offload(offload_settings{}, dense_tensors(4));
    CHECK(off.groups.empty());
    CHECK(off.own_bytes == off.bytes_without_offload);
    CHECK(off.device_bytes_saved() == 0);
    // Three slots from lane 2: lanes 2..4; eight slots from lane 2 do not fit.
    CHECK(plan_offload(policy({om::qkv_linear}), dense_tensors(6), {3, 2}).groups[3].lane == 2);
    CHECK_THROWS_WITH_AS(plan_offload(policy({om::qkv_linear}), dense_tensors(6), {8, 2}),
                         doctest::Contains("needs lanes 2..9, outside 1..8"), std::invalid_argument);
}

TEST_CASE("copies under transformer_engine: a branch of the writer's graph, back ahead of the keeper, the keeper waits for it") {
    fake::model m;
    std::vector<char> memory(64 * 4);
    const auto p = keeping_program(m, 4, 1, memory);
    const auto plan = plan_offload(policy({om::qkv_linear, om::mlp_norm}), dense_tensors(4));
    using te = config<impl::ahead_of_time_per_layer, modules<>>;
    std::vector<char> host;
    const auto copies = fake_copies(plan, m, memory, host);
    const auto q = with_offload(p, plan, copies, capture_scope_of<te>);
    const auto tp = plan_for<te>(q);
    CHECK(summary(tp, q, phase::forward, 0) ==
          "e:embedding g0:layer0.attention+layer0.qkv_linear.to_host+layer0.mlp_norm.to_host+layer0.mlp "
          "g1:layer1.attention+layer1.qkv_linear.to_host+layer1.mlp_norm.to_host+layer1.mlp "
          "g2:layer2.attention+layer2.mlp g3:layer3.attention+layer3.mlp e:head");
    CHECK(summary(tp, q, phase::backward, 0) ==
          "e:head g4:layer3.mlp+layer3.attention g5:layer1.mlp_norm.to_device+layer1.qkv_linear.to_device "
          "g6:layer2.mlp+layer2.attention g7:layer0.mlp_norm.to_device+layer0.qkv_linear.to_device "
          "g8:layer1.mlp+layer1.attention g9:layer0.mlp+layer0.attention e:embedding");
    // Lanes: copies of slot 0 on lane 2, of slot 1 on lane 3. The keepers' backwards wait for the
    // copies back (derived: they read the slot the copy writes). Layer 2 rewrites layer 0's slot
    // while its copies out are still... joined: they are branches of g0, so g2 needs no wait.
    const std::string text = to_text(tp, q);
    CHECK(text.find("graph g5     layer1.mlp_norm.to_device layer1.qkv_linear.to_device  [side lane 3]") != std::string::npos);
    CHECK(text.find("graph g8     layer1.mlp layer1.attention  [waits for layer1.mlp_norm.to_device on lane 3]\n") != std::string::npos);
    CHECK(text.find("graph g9     layer0.mlp layer0.attention  [waits for layer0.mlp_norm.to_device on lane 2]\n") != std::string::npos);
    CHECK(text.find("graph g2     layer2.attention layer2.mlp\n") != std::string::npos);
    CHECK(tp.waits.size() == 2);
    CHECK(text.find("graph g0     layer0.attention layer0.qkv_linear.to_host layer0.mlp_norm.to_host layer0.mlp  [branches joined at the "
                    "segment's end: layer0.qkv_linear.to_host on lane 2, layer0.mlp_norm.to_host on lane 2]") != std::string::npos);
    const std::string dot = to_dot(tp, q);
    CHECK(dot.find("layer0.qkv_linear.to_host [lane 2]") != std::string::npos);
}

TEST_CASE("delay_offload_until_cuda_graph: the copy out is a graph of its own after the writer's; the slot's next writer waits for it") {
    fake::model m;
    std::vector<char> memory(64 * 4);
    const auto p = keeping_program(m, 4, 1, memory);
    auto o = policy({om::qkv_linear});
    o.delay_until_cuda_graph = true;
    const auto plan = plan_offload(o, dense_tensors(4));
    using te = config<impl::ahead_of_time_per_layer, modules<>>;
    std::vector<char> host;
    const auto copies = fake_copies(plan, m, memory, host);
    const auto q = with_offload(p, plan, copies, capture_scope_of<te>);
    const auto tp = plan_for<te>(q);
    CHECK(summary(tp, q, phase::forward, 0) ==
          "e:embedding g0:layer0.attention+layer0.mlp g1:layer0.qkv_linear.to_host g2:layer1.attention+layer1.mlp "
          "g3:layer1.qkv_linear.to_host g4:layer2.attention+layer2.mlp g5:layer3.attention+layer3.mlp e:head");
    // Layer 2 rewrites the slot layer 0's copy out reads, on another stream: it waits for it.
    const std::string text = to_text(tp, q);
    CHECK(text.find("graph g4     layer2.attention layer2.mlp  [waits for layer0.qkv_linear.to_host on lane 2]\n") != std::string::npos);
    CHECK(text.find("graph g5     layer3.attention layer3.mlp  [waits for layer1.qkv_linear.to_host on lane 3]\n") != std::string::npos);
    // At most none in flight: the next stage reads the host copy, so it waits for the copy out,
    // and then the slot's next writer needs no wait of its own.
    o.max_inflight = 0;
    const auto limited_plan = plan_offload(o, dense_tensors(4));
    const auto limited = with_offload(p, limited_plan, copies, capture_scope_of<te>);
    const auto lp = plan_for<te>(limited);
    CHECK(summary(lp, limited, phase::forward, 0) ==
          "e:embedding g0:layer0.attention+layer0.mlp g1:layer0.qkv_linear.to_host g2:layer0.qkv_linear.wait_inflight+layer1.attention+layer1.mlp "
          "g3:layer1.qkv_linear.to_host g4:layer1.qkv_linear.wait_inflight+layer2.attention+layer2.mlp g5:layer3.attention+layer3.mlp e:head");
    const std::string limited_text = to_text(lp, limited);
    CHECK(limited_text.find("graph g2     layer0.qkv_linear.wait_inflight layer1.attention layer1.mlp  [waits for layer0.qkv_linear.to_host on lane 2]\n") !=
          std::string::npos);
    CHECK(limited_text.find("graph g4     layer1.qkv_linear.wait_inflight layer2.attention layer2.mlp  [waits for layer1.qkv_linear.to_host on lane 3]\n") !=
          std::string::npos);
    // Under the whole iteration nothing is delayed: one graph, the copies forked inside it.
    using whole = config<impl::whole_iteration, no_nan_check>;
    const auto w = with_offload(p, plan, copies, capture_scope_of<whole>);
    const auto wp = plan_for<whole>(w);
    CHECK(wp.graph_count == 1);
    int branches = 0;
    for (const auto& list : w.microbatches)
        for (const stage& s : list) branches += s.branch ? 1 : 0;
    CHECK(branches == 2);
}

TEST_CASE("rule P11 from the stages: a tensor written in one graph and kept in another is an error naming it, both stages and the fix") {
    fake::model m;
    std::vector<char> memory(64 * 4);
    const auto p = keeping_program(m, 4, 1, memory);
    const auto plan = plan_offload(policy({om::mlp_norm}), dense_tensors(4));
    std::vector<char> host;
    const auto copies = fake_copies(plan, m, memory, host);
    using attn_only = config<impl::ahead_of_time_per_layer, modules<capture::attention>>;
    CHECK_THROWS_WITH_AS(with_offload(p, plan, copies, capture_scope_of<attn_only>),
                         doctest::Contains("offloaded tensor mlp_norm of layer 0 is written by stage 'layer0.attention' (captured) and kept for "
                                           "the backward by stage 'layer0.mlp' (eager)"),
                         plan_error);
    using both = config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::mlp>>;
    CHECK_NOTHROW(with_offload(p, plan, copies, capture_scope_of<both>));
    // Compile time: the same facts in a schema.
    using dense = layer_schema<"dense", stage_decl<stage_kind::attention, regions<capture::attention>, saves<om::qkv_linear>, makes<om::mlp_norm>>,
                               stage_decl<stage_kind::mlp, regions<capture::mlp>, saves<om::mlp_norm>>>;
    using moe_facts = model<experts<4>, moe_pattern<0, 1>, capacity_factor<fraction{1, 1}>, pad_to_capacity>;
    using offload_norm = offload<offload_modules<om::mlp_norm>, min_offloaded_tensor_size<1>>;
    constexpr auto s = find_offload_straddle(capture_scope_of<attn_only>, {om::mlp_norm}, dense::facts());
    static_assert(s.found() && s.producer == 0 && s.keeper == 1 && s.module == om::mlp_norm);
    static_assert(layer_plan<config<impl::ahead_of_time_per_layer, modules<capture::attention, capture::mlp>, offload_norm, warmup_steps<1>>, dense>::graphs == 1);
    (void)sizeof(moe_facts);
}

TEST_CASE("under the whole iteration the copy back sits right before the stage that frees its slot") {
    fake::model m;
    std::vector<char> memory(64 * 4);
    const auto p = keeping_program(m, 4, 1, memory);
    auto o = policy({om::qkv_linear});
    o.max_inflight = 1;
    const auto plan = plan_offload(o, dense_tensors(4));
    std::vector<char> host;
    const auto copies = fake_copies(plan, m, memory, host);
    const auto w = with_offload(p, plan, copies, capture_scope_of<config<impl::whole_iteration, no_nan_check>>);
    std::string order;
    for (const stage& s : w.microbatches[0]) order += s.name + " ";
    // One copy out may be in flight: layer 1's waits for layer 0's.
    CHECK(order == "embedding layer0.attention layer0.qkv_linear.to_host layer0.mlp "
                   "layer1.attention layer1.qkv_linear.to_host layer1.qkv_linear.wait_inflight layer1.mlp "
                   "layer0.qkv_linear.to_device layer2.attention layer2.mlp "
                   "layer1.qkv_linear.to_device layer3.attention layer3.mlp head ");
}

TEST_CASE("a policy that is on but moves nothing is refused, with the reason") {
    // Every tensor under the minimum size (Megatron's default, 2^20 elements).
    auto tiny = policy({om::qkv_linear});
    tiny.min_tensor_size = 1048576;
    CHECK_THROWS_WITH_AS(require_moves_something(plan_offload(tiny, dense_tensors(4))),
                         doctest::Contains("all 4 of their tensors hold fewer than min_offloaded_tensor_size (1048576 elements)"),
                         std::invalid_argument);
    // Eligible, but the last two groups keep their slots and the fraction keeps the rest.
    CHECK_THROWS_WITH_AS(require_moves_something(plan_offload(policy({om::qkv_linear}, 0.0), dense_tensors(4))),
                         doctest::Contains("every eligible group stays on the device"), std::invalid_argument);
    // A module no layer declared.
    CHECK_THROWS_WITH_AS(require_moves_something(plan_offload(policy({om::core_attn}), dense_tensors(4))),
                         doctest::Contains("no layer declared a tensor of those module inputs"), std::invalid_argument);
    CHECK_NOTHROW(require_moves_something(plan_offload(policy({om::qkv_linear}), dense_tensors(4))));
    CHECK_NOTHROW(require_moves_something(plan_offload({}, dense_tensors(4)))); // off: nothing to say
}

TEST_CASE("an offload fraction outside [0, 1], or NaN, is refused where it enters, naming it") {
    for (const double f : {-0.5, 1.5, std::nan(""), std::numeric_limits<double>::infinity()})
        CHECK_THROWS_WITH_AS(plan_offload(policy({om::qkv_linear}, f), dense_tensors(4)), doctest::Contains("outside [0, 1]"),
                             std::invalid_argument);
    CHECK_NOTHROW(plan_offload(policy({om::qkv_linear}, 0.0), dense_tensors(4)));
    CHECK_NOTHROW(plan_offload(policy({om::qkv_linear}, 1.0), dense_tensors(4)));
}

// A trainer's own names: regions "mixer"/"ffn" and an activation "mixer_in" that no Megatron rule knows.
namespace {
using own_local = config<impl::lazy_per_layer, capture_regions<"mixer", "ffn">, offload<offload_tensors<"mixer_in">, min_offloaded_tensor_size<1>>,
                         warmup_steps<1>>;
// Megatron's offload rules are about Megatron's names: local offloading of qkv_linear is OC1, of
// the trainer's own tensor nothing (capscope's engine moves it; P11 checks where its copies go).
static_assert(is_valid_config<impl::lazy_per_layer, capture_regions<"mixer", "ffn">, offload<offload_tensors<"mixer_in">>, warmup_steps<1>>);
static_assert(rejecting_rule<impl::lazy_per_layer, capture_regions<"mixer">, offload<offload_modules<om::qkv_linear>>, warmup_steps<1>> == "OC1");
// The rule table sees capture_regions<...>: local with named regions is not a whole-layer capture (OC2).
static_assert(is_valid_config<impl::lazy_per_layer, capture_regions<"mixer">, offload<offload_modules<om::moe_act>>, warmup_steps<1>>);
static_assert(rejecting_rule<impl::lazy_per_layer, offload<offload_modules<om::moe_act>>, warmup_steps<1>> == "OC2");
// ... whatever the order of the options (modules<...> replaces the module list whole).
static_assert(is_valid_config<impl::lazy_per_layer, modules<>, capture_regions<"mixer">, offload<offload_modules<om::moe_act>>, warmup_steps<1>>);
static_assert(is_valid_config<impl::lazy_per_layer, capture_regions<"mixer">, modules<>, offload<offload_modules<om::moe_act>>, warmup_steps<1>>);
static_assert(same_config<config<impl::lazy_per_layer, modules<capture::mlp>, capture_regions<"mixer">>,
                          config<impl::lazy_per_layer, capture_regions<"mixer">, modules<capture::mlp>>>);
static_assert(own_local::normalized.offload.modules.contains("mixer_in"));
static_assert(own_local::normalized.offload.modules.megatron().empty());
static_assert(offload_name("core_attn") == offload_name(om::core_attn) && offload_name("mixer_in").megatron() == std::nullopt);
} // namespace

TEST_CASE("a trainer's own offload names: planned, copied and checked like Megatron's, under its own regions") {
    fake::model m;
    std::vector<char> memory(64 * 4);
    auto p = m.program("DDDD", false, 1);
    for (auto& list : p.microbatches)
        for (stage& s : list) {
            if (s.layer < 0) continue;
            s.captured_by = region_set{s.kind == stage_kind::attention ? std::string_view("mixer") : std::string_view("ffn")};
            if (s.kind == stage_kind::attention) s.saves = {{"mixer_in", {"mixer_in", memory.data() + 64 * (s.layer % 2), 24}, 2}};
        }
    std::vector<offload_tensor_decl> decls;
    for (int l = 0; l < 4; ++l) decls.push_back({l, "mixer_in", "layer" + std::to_string(l) + ".mixer_in", 1000, 2});
    const auto plan = plan_offload(own_local::normalized.offload, decls);
    CHECK(plan.copied_groups() == 2);
    CHECK(plan.groups[0].module == offload_name("mixer_in"));
    std::vector<char> host;
    const auto copies = fake_copies(plan, m, memory, host);
    const auto q = with_offload(p, plan, copies, capture_scope_of<own_local>);
    const auto tp = plan_for<own_local>(q);
    const std::string text = to_text(tp, q);
    INFO(text);
    CHECK(text.find("layer0.mixer_in.to_host") != std::string::npos);
    CHECK(text.find("layer0.mixer_in.to_device") != std::string::npos);
    CHECK_FALSE(find_order_violation(tp, q));
    // The C++ spelling round-trips through --emit-cpp.
    std::string options;
    for (const std::string& o : cpp_options(own_local::normalized)) options += o + " ";
    CHECK(options.find("offload_tensors<\"mixer_in\">") != std::string::npos);
    // A saved tensor without a name cannot be offloaded.
    decls.push_back({0, {}, "unnamed", 100, 2});
    CHECK_THROWS_WITH_AS(plan_offload(own_local::normalized.offload, decls), doctest::Contains("tensor 'unnamed' of layer 0 has no offload name"),
                         std::invalid_argument);
}
