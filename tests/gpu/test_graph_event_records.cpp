// Event records in a copied graph (cuda/graph_event_records.hpp): of a chain of records of one
// event, as NCCL's graph-mixing support leaves one after each collective, the copy keeps the last
// only, and work that waits on the event after a launch still waits for all of it. Where the
// graph holds any other shape, every record stays.

#include <capscope/cuda.hpp>
#include <capscope/cuda/graph_copy.hpp>

#include "engine_kernels.hpp"
#include "mem_ops.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

using namespace capscope;
namespace k = engine_kernels;

namespace {

void record_external(const cuda::event& e, cudaStream_t s) { CAPSCOPE_CHECK(cudaEventRecordWithFlags(e.get(), s, cudaEventRecordExternal)); }
void wait_external(const cuda::event& e, cudaStream_t s) { CAPSCOPE_CHECK(cudaStreamWaitEvent(s, e.get(), cudaEventWaitExternal)); }

} // namespace

TEST_CASE("a chain of records of one event in a copied graph: the last stands for all, and work waiting on the event waits for the whole chain") {
    // NCCL's shape: a wait on the event at the root, then a record of it after each of `chained`
    // steps; the last step is slow (2 ms). After each launch, another stream waits on the event and
    // reads what the last step wrote: as captured and as copied, it must read this launch's values.
    // Broken on purpose (first_event_record_kept), the copy keeps the first record instead, and the
    // reader does not wait for the slow step.
    constexpr int chained = 6, n = 1 << 16, launches = 3;
    cuda::stream s, reader;
    const cuda::event serial;
    serial.record(reader); // (recorded once, as NCCL does before its first capture)
    reader.synchronize();
    cuda::device_buffer<int> counter(1), staging(n), out(n);
    auto body = [&](cudaStream_t on) {
        wait_external(serial, on);
        for (int i = 0; i < chained; ++i) {
            k::add_one(counter.data(), on);
            record_external(serial, on);
        }
        k::fill_from(staging.data(), counter.data(), 0, n, on);
        k::slow_copy(out.data(), staging.data(), n, 2'000'000, on);
        record_external(serial, on);
    };
    struct way {
        const char* name;
        bool copied;
    };
    for (const way w : {way{"as captured", false}, way{"copied", true}}) {
        INFO(w.name);
        cuda::graph g = cuda::capture(s, body);
        if (w.copied) {
            cuda::copy_result c = cuda::without_user_objects(std::move(g));
            REQUIRE(c.refused.empty());
            CHECK(c.event_records_dropped == std::size_t(chained)); // of chained + 1
            g = std::move(c.copy);
            CHECK(mem_ops::nodes_of_type(g, cudaGraphNodeTypeEventRecord) == 2); // the chain's last, and the copy's own at its end
        } else CHECK(mem_ops::nodes_of_type(g, cudaGraphNodeTypeEventRecord) == std::size_t(chained) + 1);
        const cuda::graph_exec exec(g);
        counter.fill_bytes(0, s);
        out.fill_bytes(0, s);
        s.synchronize();
        std::vector<int> got(n);
        for (int launch = 1; launch <= launches; ++launch) {
            exec.launch(s);
            serial.wait_on(reader);
            out.copy_to_host(got, reader);
            reader.synchronize();
            const long wrong = long(std::count_if(got.begin(), got.end(), [&](int v) { return v != launch * chained; }));
            INFO("launch ", launch, ": ", wrong, " of ", n, " elements read before the graph had written them (element 0: ", got[0], ", expected ",
                 launch * chained, ")");
            CHECK(wrong == 0);
        }
        s.synchronize();
    }
    std::printf("  a chain of %d records of one event: the copy keeps the last; a stream waiting on the event after each of %d launches read "
                "the whole graph's work, as captured and copied\n", chained + 1, launches);
}

TEST_CASE("records of one event that are not a chain, that a wait follows or runs beside, or that a child graph shares, all stay in the copy") {
    cuda::stream s, side;
    const cuda::event e, fork, join;
    e.record(side);
    side.synchronize();
    cuda::device_buffer<int> a(1), b(1);
    auto records_dropped = [&](auto body) {
        cuda::copy_result c = cuda::without_user_objects(cuda::capture(s, body));
        REQUIRE(c.refused.empty());
        return c.event_records_dropped;
    };
    // `on_main` and `on_side` on two branches of one graph, side by side.
    auto branches = [&](auto on_main, auto on_side) {
        return [&, on_main, on_side](cudaStream_t on) {
            fork.record(on);
            fork.wait_on(side);
            on_main(on);
            on_side(side.get());
            join.record(side);
            join.wait_on(on);
        };
    };
    // Two records on branches that run side by side: neither comes after the other.
    CHECK(records_dropped(branches(
              [&](cudaStream_t on) {
                  k::add_one(a.data(), on);
                  record_external(e, on);
              },
              [&](cudaStream_t on) {
                  k::add_one(b.data(), on);
                  record_external(e, on);
              })) == 0);
    // A wait on the event between two of its records.
    CHECK(records_dropped([&](cudaStream_t on) {
              k::add_one(a.data(), on);
              record_external(e, on);
              wait_external(e, on);
              k::add_one(a.data(), on);
              record_external(e, on);
          }) == 0);
    // A wait on the event on a branch beside the first record (neither before nor after it).
    CHECK(records_dropped(branches(
              [&](cudaStream_t on) {
                  for (int i = 0; i < 2; ++i) {
                      k::add_one(a.data(), on);
                      record_external(e, on);
                  }
              },
              [&](cudaStream_t on) {
                  wait_external(e, on);
                  k::add_one(b.data(), on);
              })) == 0);
    // The shape the copy thins, for contrast: the same without a wait.
    CHECK(records_dropped([&](cudaStream_t on) {
              k::add_one(a.data(), on);
              record_external(e, on);
              k::add_one(a.data(), on);
              record_external(e, on);
          }) == 1);
    // A chain in the graph, and a record of the same event in a child graph.
    cuda::graph child = cuda::capture(s, [&](cudaStream_t on) {
        k::add_one(b.data(), on);
        record_external(e, on);
    });
    cuda::graph parent = cuda::capture(s, [&](cudaStream_t on) {
        k::add_one(a.data(), on);
        record_external(e, on);
        k::add_one(a.data(), on);
        record_external(e, on);
    });
    cudaGraphNode_t child_node = nullptr;
    CAPSCOPE_CHECK(cudaGraphAddChildGraphNode(&child_node, parent.get(), nullptr, 0, child.get()));
    const cuda::copy_result with_child = cuda::without_user_objects(std::move(parent));
    REQUIRE(with_child.refused.empty());
    CHECK(with_child.event_records_dropped == 0);
    s.synchronize();
    std::printf("  records of one event on parallel branches, around or beside a wait on it, or shared with a child graph: every one kept\n");
}
