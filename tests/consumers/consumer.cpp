// A program that uses capscope as an installed (or subproject) library would: the umbrella
// header, a checked configuration, and the version.
#include <capscope/capscope.hpp>

#include <cstdio>

using namespace capscope;
using my_config = config<impl::ahead_of_time_per_layer, modules<capture::attention>>;
static_assert(my_config::impl == graph_impl::ahead_of_time_per_layer);
static_assert(!is_valid_config<impl::lazy_per_layer, modules<capture::moe_preprocess>>); // S1 wants moe_router too

int main() {
    std::printf("capscope %s consumer: ok\n", CAPSCOPE_VERSION_STRING);
    return capscope::version.major == CAPSCOPE_VERSION_MAJOR ? 0 : 1;
}
