// The engine's templates, instantiated for every impl, inference scope and bucket mode, must
// compile without a warning under g++ and nvcc with -Wall -Wextra (tests/meson.build builds this
// file both ways with warnings as errors). Nothing here runs.

#include <capscope/capscope.hpp>
#include <capscope/engine.hpp>

using namespace capscope;

namespace {
using facts = model<experts<4>, moe_pattern<0, 1>, capacity_factor<1.0>, pad_to_capacity>;

template <class Runner>
void use_training(cudaStream_t s) {
    Runner r(training_program{});
    r.step(s);
    r.reset();
    (void)r.plan_text();
    (void)r.plan_dot();
    (void)r.graphs_alive();
    (void)r.graphs_run_eagerly();
    Runner moved(std::move(r));
    r = std::move(moved);
}

template <class Runner>
void use_buckets(cudaStream_t s) {
    Runner r(inference_program{});
    r.run(r.choose(1), s);
    r.capture_all(s);
    r.rebind(inference_program{});
    r.reset();
    (void)r.plan_text();
    (void)r.graphs_alive();
    (void)r.last_update_refusal();
}
} // namespace

void instantiate_everything(cudaStream_t s) {
    use_training<runner<config<impl::eager, facts>>>(s);
    use_training<runner<config<impl::lazy_per_layer, modules<capture::attention>, facts>>>(s);
    use_training<runner<config<impl::ahead_of_time_per_layer, modules<>, facts>>>(s);
    use_training<runner<config<impl::whole_iteration, no_nan_check, facts>>>(s);
    use_training<runner<config<impl::lazy_per_layer, capture_regions<"mine">, on_capture_failure<capture_failure::run_eagerly>>>>(s);
    use_buckets<inference_runner<config<impl::lazy_per_layer, inference::per_layer, buckets<1, 2>>>>(s);
    use_buckets<inference_runner<config<impl::lazy_per_layer, inference::per_block, buckets<1, 2>, bucket_execs<bucket_exec::shared>>>>(s);
    use_buckets<inference_runner<config<impl::eager, buckets<1, 2>>>>(s); // scope none: every stage eagerly
    use_buckets<vision_runner<config<vision<impl::ahead_of_time_per_layer, max_seq_length<64>>, length_buckets<16, 64>>>>(s);
}

int main() {}
